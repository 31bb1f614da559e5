"""The edge of `bostudio launch AGENT`: start the daemon if none runs, load the model with the context the
memory plan gives, build the agent's configuration (bostudio.agents, pure), write bostudio's own config
files for it, and run the agent in the foreground (exec)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bostudio import paths
from bostudio.agents import AgentConfig, AgentTarget, configure, max_output_for
from bostudio.errors import BostudioError

DEFAULT_MODEL = "gemma-3-270m-q4_k_m"


def agent_config_dir() -> Path:
    """Where bostudio keeps the files it generates for agents (never the user's own config)."""
    return paths.state_dir() / "agents"


def planned_ctx(model: str) -> int:
    """The context the memory plan gives `model` on this machine (as `bostudio plan MODEL` shows it):
    the daemon's default (4096) is too small for an agent's first request (~20k tokens)."""
    from bostudio.catalog.resolve import resolve_model
    from bostudio.engine.discover import find_engine
    from bostudio.gguf import describe
    from bostudio.launch import decide_launch
    from bostudio.speculation import parse_spec

    path = resolve_model(model, log=lambda _: None)
    return decide_launch(describe(path), parse_spec("off"), find_engine(None)).ctx


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
        want = ctx or planned_ctx(model)
        # A model already loaded with less context (e.g. the daemon's default 4096 from an earlier
        # request) is loaded again with the planned one; one with as much or more is used as it is.
        if loaded is not None and loaded.get("state") == "ready" and \
                (loaded["ctx"] == want if ctx is not None else loaded["ctx"] >= want):
            inst = loaded
        else:
            inst = client.start(model, ctx=want)
            if inst["ctx"] != want:  # it kept running with its old context: load it again with the new one
                inst = client.restart(model)
    n_ctx = int(inst["ctx"])
    out = max(16, min(max_output, n_ctx // 2)) if max_output else max_output_for(n_ctx)
    target = AgentTarget(rec.url, read_token(), inst["model"], n_ctx, out)
    return configure(agent, target, agent_config_dir()), inst


def write_files(cfg: AgentConfig) -> None:
    for name, content in cfg.files.items():
        path = Path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(content)
        os.replace(tmp, path)


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


__all__ = ["prepare", "write_files", "exec_agent", "find_binary", "agent_config_dir", "planned_ctx", "DEFAULT_MODEL"]
