"""The edge of `bostudio launch AGENT`: start the daemon if none runs, load the model with its launch plan
(the context the memory plan gives), build the agent's configuration (bostudio.agents, pure), write bostudio's own config
files for it, and run the agent in the foreground (exec)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bostudio import paths
from bostudio.agents import AgentConfig, AgentTarget, configure, max_output_for
from bostudio.catalog.embedded import DEFAULT_NAME
from bostudio.errors import BostudioError
from bostudio.files import write_private

DEFAULT_MODEL = DEFAULT_NAME  # the embedded default (bostudio.catalog.embedded)


def agent_config_dir() -> Path:
    """Where bostudio keeps the files it generates for agents (never the user's own config)."""
    return paths.state_dir() / "agents"


def prepare(agent: str, model: str | None, ctx: int | None = None, host: str = "127.0.0.1",
            port: int | None = None, max_output: int | None = None) -> tuple[AgentConfig, dict]:
    """Daemon up, model loaded, the agent's configuration; returns it and the instance."""
    from bostudio.daemon import DEFAULT_PORT
    from bostudio.daemon.client import DaemonClient
    from bostudio.daemon.security import read_token
    from bostudio.daemon.service import DaemonOptions, start_background

    model = model or DEFAULT_MODEL
    if Path(model).expanduser().is_file():
        model = str(Path(model).expanduser().resolve())  # the daemon may run in another directory
    rec = start_background(DaemonOptions(host=host, port=port or DEFAULT_PORT))
    with DaemonClient(rec.url) as client:
        loaded = {i["model"]: i for i in client.instances()}.get(model)
        # The daemon loads a model with its launch plan: the largest context that fits, up to the trained
        # one (bostudio.launch). A model already running is used as it runs, unless --ctx asks otherwise.
        if loaded is not None and loaded.get("state") == "ready" and (ctx is None or loaded["ctx"] == ctx):
            inst = loaded
        else:
            inst = client.start(model, ctx=ctx)
            if ctx is not None and inst["ctx"] != ctx:  # it kept running with its old context: reload it
                inst = client.restart(model)
    n_ctx = int(inst["ctx"])
    out = max(16, min(max_output, n_ctx // 2)) if max_output else max_output_for(n_ctx)
    target = AgentTarget(rec.url, read_token(), inst["model"], n_ctx, out)
    return configure(agent, target, agent_config_dir()), inst


def write_files(cfg: AgentConfig) -> None:
    for name, content in cfg.files.items():
        write_private(Path(name), content)  # they hold the daemon's token: 0600, even over a 0644 file


def find_binary(cfg: AgentConfig) -> str:
    """The agent's executable on PATH; a missing one says the exact npm command that installs it."""
    found = shutil.which(cfg.binary)
    if found is None:
        raise BostudioError(f"{cfg.binary} is not installed (bostudio launches it, it does not install it)",
                            f"install it with: npm install -g {cfg.npm_package}")
    return found


def exec_agent(cfg: AgentConfig, user_args: list[str]) -> None:
    """Replace this process with the agent, its configuration in the environment."""
    binary = find_binary(cfg)
    write_files(cfg)
    os.execvpe(binary, [binary, *cfg.args, *user_args], {**os.environ, **cfg.env})


__all__ = ["prepare", "write_files", "exec_agent", "find_binary", "agent_config_dir", "DEFAULT_MODEL"]
