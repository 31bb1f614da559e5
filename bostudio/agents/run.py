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
from bostudio.display import escape_terminal, human_duration
from bostudio.errors import BostudioError
from bostudio.files import write_private

DEFAULT_MODEL = DEFAULT_NAME  # the embedded default (bostudio.catalog.embedded)
AGENT_NAMES = {"claude": "Claude Code", "codex": "Codex", "opencode": "opencode"}


def agent_config_dir() -> Path:
    """Where bostudio keeps the files it generates for agents (never the user's own config)."""
    return paths.state_dir() / "agents"


def prepare(agent: str, model: str | None, ctx: int | None = None, host: str = "127.0.0.1",
            port: int | None = None, max_output: int | None = None,
            instructions: str = "auto") -> tuple[AgentConfig, dict]:
    """Daemon up, model loaded, the agent's configuration; returns it and the instance."""
    from bostudio.daemon import DEFAULT_PORT
    from bostudio.daemon.client import DaemonClient
    from bostudio.daemon.http.security import read_token
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
    target = AgentTarget(rec.url, read_token(), inst["model"], n_ctx, out,
                         n_params=(inst.get("plan") or {}).get("n_params"), instructions=instructions)
    return configure(agent, target, agent_config_dir()), inst


def first_turn_note(cfg: AgentConfig, inst: dict) -> str:
    """What `launch` tells the user before it hands the terminal to the agent: the first request is a long
    prompt that takes a while on a CPU (estimated from the model's last long prefill when there is one),
    later ones reuse its cached prefix, and where to watch the progress."""
    name = AGENT_NAMES.get(cfg.agent, cfg.agent)
    tokens = cfg.first_turn_tokens
    size = f"about {tokens / 1000:.1f}k tokens" if tokens else "thousands of tokens"
    rate = (inst.get("stats") or {}).get("long_prefill_tok_s")
    if rate and tokens:
        took = f"at the {rate:.0f} tok/s {inst['model']} last processed a prompt, that is ~{human_duration(tokens / rate)}"
    else:
        took = "on a CPU that can take minutes"
    restored = int((inst.get("prompts") or {}).get("restored_tokens") or 0)
    reuse = f" ({restored:,} prompt tokens restored from an earlier session are reused where they match)" \
        if restored else ""
    return escape_terminal(f"bostudio: {name}'s first request is a long prompt ({size}: its instructions and tools); {took} "
            f"before the first answer{reuse}. Later turns reuse the processed prefix. Watch the progress from "
            f"another terminal: `bostudio ps --watch` (or the TUI, `bostudio`, F4).")


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
    env = {**os.environ, **cfg.env}
    if Path(env.get("PWD", "")).resolve() != Path.cwd().resolve():
        env["PWD"] = os.getcwd()  # opencode takes its project directory from PWD: never a stale one
    os.execvpe(binary, [binary, *cfg.args, *user_args], env)


__all__ = ["prepare", "write_files", "exec_agent", "find_binary", "agent_config_dir", "first_turn_note",
           "DEFAULT_MODEL"]
