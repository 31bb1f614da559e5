"""Agent sessions for `bench --workload agent|DIR`: whole conversations replayed turn by turn on one prefix.

- The shipped session (`agent`): what a coding agent sends, written for bostudio. A system prompt with the
  agent's rules and a map of the repository, tool schemas of real size (together about 18k tokens on the
  Gemma tokenizer by default), then a task and turns of tool calls, tool results and code edits on
  bostudio's own source. It is generated at run time from the package's files (deterministic: the same
  package gives the same session), so the repository stays small. Each request carries every message so
  far, like a real agent: the prefix is shared, the conversation grows.
- A recorded session (a directory): what `bostudio daemon --record DIR` saved, one request body per file,
  replayed in the order it was received.

`replay_request` turns a session's request into what a llama-server child serves (it natively serves
/v1/chat/completions, /v1/messages, /v1/responses, /v1/completions): the child's model name, streaming on,
greedy, the output capped to the bench's token count. Pure except for reading files.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

from bostudio.bench.workloads import _sources
from bostudio.errors import ConfigError

AGENT = "agent"
DEFAULT_PREFIX_TOKENS = 18000  # Claude Code's first request is ~20k tokens, Codex's ~10k, opencode's ~8k
DEFAULT_TURNS = 12  # the seeds' agent task: 12 turns
MIN_PREFIX_TOKENS = 256
READ_LINES = 100  # a read_file result: the first 100 lines of a module (12 turns on an 18k prefix fit 32k)
CHARS_PER_TOKEN = 3.4  # code and English prose on the Gemma tokenizer (the bench reports the real count)
RECORD_SUFFIX = ".json"
# Routes a recorded request is replayed on, and which of its fields caps the output.
ROUTES = {"/v1/chat/completions": ("/v1/chat/completions", "max_tokens"),
          "/chat/completions": ("/v1/chat/completions", "max_tokens"),
          "/v1/messages": ("/v1/messages", "max_tokens"),
          "/v1/responses": ("/v1/responses", "max_output_tokens"),
          "/v1/completions": ("/v1/completions", "max_tokens"),
          "/completions": ("/v1/completions", "max_tokens"),
          "/api/chat": ("/v1/chat/completions", "max_tokens"),
          "/api/generate": ("/v1/completions", "max_tokens")}


@dataclass(frozen=True)
class Request:
    """One request of a session: the route it was sent to and its JSON body, as the client sent it."""

    route: str
    body: dict
    note: str = ""  # what this turn does (shipped) or where it was recorded from


@dataclass(frozen=True)
class Session:
    name: str
    source: str  # "shipped" or the recording's directory
    requests: tuple[Request, ...]
    skipped: tuple[str, ...] = ()  # recorded requests that are not generations (count_tokens, embeddings)


# ------------------------------------------------------------------------------------------ shipped

_RULES = """You are bostudio-agent, an interactive coding agent working in the repository of bostudio, a runtime
manager for llama.cpp's llama-server written in Python. You help the user with software engineering tasks:
fixing bugs, adding features, refactoring, explaining code and writing tests.

# How you work
- Read before you write. Use read_file and grep to find the code a change touches; never guess a function's
  signature or a module's layout.
- Keep changes small and focused. Match the existing style: type hints, frozen dataclasses for domain values,
  short comments that say why, BostudioError(message, hint) for every error a user can cause.
- After an edit, run the tests that cover it with run_tests. If a test fails, read the failure, fix the cause,
  and run it again. Never weaken a test to make it pass.
- Pure core, thin edges: planner/, pairing/ and gguf/describe import no httpx, psutil or subprocess.
- One launch decision in one place; no import cycles; a module imports only its own layer or lower ones.
- Answer in the user's language. Be concise: the user reads your messages in a terminal.
- When you call a tool, call it with exactly the arguments its schema describes. One tool call per message
  unless the calls are independent.
- Do not invent file contents. If a file is too long, read it in parts with offset and limit.
- Before you finish, summarise what you changed, which tests you ran and their results.

# Tone
Short, direct, no filler. Never apologise for tool output. Code references as `path:line`.
"""

_TOOLS = [
    ("read_file", "Reads a file from the local filesystem. The path must be relative to the repository root. "
                  "By default it reads up to 2000 lines from the beginning of the file; give offset and limit "
                  "for long files. Lines longer than 2000 characters are truncated. The result is shown with "
                  "line numbers starting at 1, in the cat -n format. You can read several files in one message "
                  "when they are independent. Reading a file you have not read before is always allowed; "
                  "reading one you just edited shows the edit.",
     {"path": ("string", "the file to read, relative to the repository root"),
      "offset": ("integer", "the line number to start reading from (1-based)"),
      "limit": ("integer", "the number of lines to read")}),
    ("edit_file", "Performs an exact string replacement in a file. You must have read the file in this "
                  "conversation before editing it. old_string must occur exactly once in the file, or the edit "
                  "fails: give more surrounding context to make it unique, or set replace_all to change every "
                  "occurrence. Preserve the exact indentation as it appears after the line-number prefix of "
                  "read_file's output; never include the prefix itself. Prefer editing existing files to "
                  "creating new ones.",
     {"path": ("string", "the file to modify"), "old_string": ("string", "the text to replace"),
      "new_string": ("string", "the text to replace it with (must differ from old_string)"),
      "replace_all": ("boolean", "replace every occurrence of old_string (default false)")}),
    ("write_file", "Writes a file to the local filesystem, overwriting an existing one. If the file exists you "
                   "must have read it first. Never create documentation files unless the user asks for them.",
     {"path": ("string", "the file to write"), "content": ("string", "the whole content of the file")}),
    ("grep", "A search tool built on ripgrep. Supports full regex syntax (e.g. \"log.*Error\", "
             "\"function\\\\s+\\\\w+\"). Filter files with glob (e.g. \"*.py\") or type (e.g. \"py\"). Output modes: "
             "content shows matching lines, files_with_matches shows only file paths (default), count shows "
             "match counts. Use it instead of running grep through the shell.",
     {"pattern": ("string", "the regular expression to search for"),
      "path": ("string", "a file or directory to search in (default: the repository root)"),
      "glob": ("string", "a glob pattern to filter files"),
      "output_mode": ("string", "content | files_with_matches | count"),
      "context": ("integer", "lines of context around each match (content mode)")}),
    ("glob", "Fast file pattern matching that works with any codebase size. Supports patterns like "
             "\"**/*.py\" or \"bostudio/**/*.toml\". Returns matching file paths sorted by modification time.",
     {"pattern": ("string", "the glob pattern"), "path": ("string", "the directory to search in")}),
    ("run_tests", "Runs the project's tests with pytest and returns the summary and the failures. Always pass "
                  "the narrowest selection that covers your change: a file, or a file and -k expression. The "
                  "machine is shared: never run the whole suite. Timeouts in tests are hang guards.",
     {"selection": ("string", "test files and options, e.g. tests/test_bench.py -k agent"),
      "timeout_s": ("integer", "give up after this many seconds (default 600)")}),
    ("bash", "Executes a bash command in a persistent shell session with an optional timeout. Use it for "
             "git, package managers and project scripts; use read_file, grep and glob for reading and "
             "searching. Quote paths that contain spaces. Never run interactive commands, never use "
             "--no-verify, never push unless the user asks. Commands that print more than 30000 characters "
             "are truncated.",
     {"command": ("string", "the command to run"), "timeout_ms": ("integer", "timeout in milliseconds"),
      "description": ("string", "what the command does, in 5-10 words")}),
    ("todo_write", "Creates and updates the task list of this session: use it for tasks of three steps or "
                   "more, mark a task in_progress before starting it and completed as soon as it is done.",
     {"todos": ("array", "the whole list: each item has content, status (pending | in_progress | completed) "
                         "and an id")}),
]


def tool_schemas() -> list[dict]:
    """The shipped session's tools, in the OpenAI function format."""
    out = []
    for name, desc, params in _TOOLS:
        props = {}
        for p, (typ, d) in params.items():
            props[p] = {"type": typ, "description": d}
            if typ == "array":
                props[p]["items"] = {"type": "object"}
        required = [p for p in params if p in ("path", "pattern", "command", "selection", "old_string",
                                                 "new_string", "content", "todos")]
        out.append({"type": "function", "function": {"name": name, "description": desc, "parameters": {
            "type": "object", "properties": props, "required": required}}})
    return out


def _outline(path: str, text: str) -> str:
    """A module's public outline: its docstring's first line and its top-level signatures."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ""
    doc = (ast.get_docstring(tree) or "").strip().splitlines()
    lines = [f"## {path}" + (f": {doc[0]}" if doc else "")]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            kind = "class" if isinstance(node, ast.ClassDef) else "def"
            first = (ast.get_docstring(node) or "").strip().splitlines()
            args = ""
            if not isinstance(node, ast.ClassDef):
                args = "(" + ", ".join(a.arg for a in node.args.args) + ")"
            lines.append(f"- {kind} {node.name}{args}" + (f": {first[0]}" if first else ""))
    return "\n".join(lines)


def system_prompt(prefix_tokens: int, variant: int = 0) -> str:
    """The rules, the tool schemas (in the text: a chat template without tool support, like Gemma 3's, would
    otherwise drop them and the prefix would not be the size agents send), then the repository map (module
    outlines, then whole modules) until it reaches about `prefix_tokens` tokens. `variant` starts the map at
    another module (a fresh prefix)."""
    budget = int(prefix_tokens * CHARS_PER_TOKEN)
    tools = "\n".join(json.dumps(t["function"]) for t in tool_schemas())
    head = (_RULES + "\n# Tools\nCall a tool with a tool call naming one of these functions; its JSON schema:\n"
            + tools + f"\n\n# Session\nsession id: bench-{variant}\n\n# Repository map (bostudio/)\n")
    src = _sources()
    parts, used = [head], len(head)
    k = 0
    while used < budget and k < 4 * len(src):
        path, text = src[(variant + k) % len(src)]
        outline = _outline(path, text) if k < len(src) else f"## {path}\n{text}"
        if outline:
            parts.append(outline + "\n\n")
            used += len(outline) + 2
        k += 1
    return "".join(parts)[: max(len(head), budget)]


def _functions_of(text: str) -> list[tuple[str, str]]:
    out = []
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            seg = ast.get_source_segment(text, node)
            if seg and 4 <= seg.count("\n") <= 40:
                out.append((node.name, seg))
    return out


def module_of_turn(variant: int, turn: int, modules: int, turns: int) -> int:
    """The module turn `turn` (from 0) of the shipped session's `variant` reads: `variant + turn * stride`, with
    stride = modules // turns, so that one pass reads modules spread over the whole package (sorted by path:
    agents, bench, catalog, daemon ...) and passes 0 to stride-1 read modules no other one reads. Bench passes
    count up from 0 and tune's count down from -1 (tune_sessions.SESSION_VARIANT), so that tune never chooses on
    the modules the bench then measures (with 89 modules and 12 turns: up to 7 passes in all). Consecutive
    modules were read before (turn k of pass r read module r + k), so the bench's passes shared 11 of their 12
    modules and were one sample of the content: ngram-mod drafted 36-51% accepted on every bench pass of four
    agent-session runs (modules 0-13, the bench's own), 68% on tune's screen (modules 21-32), 44% on modules 50-61."""
    stride = max(1, modules // max(1, turns))
    return (variant % stride + turn * stride) % modules  # pass `stride` reads pass 0's modules (other functions)


def shipped_session(prefix_tokens: int = DEFAULT_PREFIX_TOKENS, turns: int = DEFAULT_TURNS,
                    variant: int = 0) -> Session:
    """The shipped agent session: `turns` requests on one growing conversation (see the module docstring);
    `variant` picks the modules it reads (module_of_turn) and where the system prompt's map starts."""
    if prefix_tokens < MIN_PREFIX_TOKENS:
        raise ConfigError(f"--prefix-tokens {prefix_tokens} is too small for an agent session",
                          f"use {MIN_PREFIX_TOKENS} or more")
    if not 1 <= turns <= 200:
        raise ConfigError(f"--session-turns {turns} is out of range", "use 1 to 200 turns")
    src = [(p, t) for p, t in _sources() if _functions_of(t)]
    messages: list[dict] = [
        {"role": "system", "content": system_prompt(prefix_tokens, variant)},
        {"role": "user", "content": "The bench's per-request errors say which configuration failed but not which "
                                    "prompt. Go through the modules that send requests, make every error name "
                                    "the workload and the prompt, and keep the tests passing."}]
    requests = []
    call = 0
    for k in range(turns):
        requests.append(Request("/v1/chat/completions", {"model": "bench", "messages": list(messages)},
                                f"turn {k + 1}"))
        path, text = src[module_of_turn(variant, k, len(src), turns)]
        name, func = _functions_of(text)[(variant + k) % len(_functions_of(text))]
        step = k % 3
        call += 1
        cid = f"call_{call:04d}"
        if step == 0:  # read the module
            args = {"path": path, "limit": READ_LINES}
            numbered = "\n".join(f"{i + 1:6d}\t{line}" for i, line in enumerate(text.splitlines()[:READ_LINES]))
            result = numbered
            say = f"I'll read `{path}` to see how it reports errors."
            tool = "read_file"
        elif step == 1:  # edit one function in it
            new = func.replace('"""', '"""(bench) ', 1) if '"""' in func else "# checked by the agent\n" + func
            args = {"path": path, "old_string": func, "new_string": new}
            result = f"The file {path} has been updated. Here's the result of running `cat -n` on a snippet:\n" + \
                "\n".join(f"{i + 1:6d}\t{line}" for i, line in enumerate(new.splitlines()))
            say = f"`{name}` needs the prompt in its error; editing it."
            tool = "edit_file"
        else:  # run the tests of the module
            stem = Path(path).stem
            args = {"selection": f"tests/test_{stem}.py -q", "timeout_s": 600}
            result = (f"tests/test_{stem}.py " + "." * (8 + k % 7) + f"  [100%]\n{8 + k % 7} passed in "
                      f"{1.2 + k / 10:.2f}s")
            say = f"Running the tests of `{stem}`."
            tool = "run_tests"
        messages.append({"role": "assistant", "content": say, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}]})
        messages.append({"role": "tool", "tool_call_id": cid, "content": result})
    return Session(AGENT, "shipped", tuple(requests))


# ------------------------------------------------------------------------------------------ recorded

def recorded_session(directory: Path) -> Session:
    """The requests `bostudio daemon --record DIR` saved, in the order received (the file names' order)."""
    d = directory.expanduser()
    if not d.is_dir():
        raise ConfigError(f"recorded session {d} is not a directory", "record one with `bostudio daemon --record DIR`")
    files = sorted(p for p in d.iterdir() if p.suffix == RECORD_SUFFIX)
    if not files:
        raise ConfigError(f"{d} holds no recorded requests (*.json)", "record one with `bostudio daemon --record DIR`")
    requests, skipped = [], []
    for f in files:
        try:
            rec = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"recorded request {f} is unreadable: {exc}", "remove it or record the session again") from exc
        if not isinstance(rec, dict) or not isinstance(rec.get("body"), dict) or not isinstance(rec.get("route"), str):
            raise ConfigError(f"recorded request {f} has no route and body", "record the session again")
        if rec["route"] not in ROUTES:
            skipped.append(f"{f.name} ({rec['route']})")
            continue
        requests.append(Request(rec["route"], rec["body"], f.name))
    if not requests:
        raise ConfigError(f"{d} holds no generation requests (only {', '.join(skipped)})",
                          "record a session in which the agent generates")
    return Session(d.name, str(d), tuple(requests), tuple(skipped))


def resolve_session(name: str, prefix_tokens: int, turns: int, variant: int = 0) -> Session:
    if name == AGENT:
        return shipped_session(prefix_tokens, turns, variant)
    return recorded_session(Path(name))


def is_session(name: str) -> bool:
    """`agent` or a directory (a recorded session), as --workload takes them."""
    return name == AGENT or Path(name).expanduser().is_dir()


def replay_request(req: Request, model: str, tokens: int) -> tuple[str, dict]:
    """(route, body) for a llama-server child: its model name, streaming, greedy, at most `tokens` output
    tokens and exactly that many (ignore_eos), so that every configuration decodes the same amount. An
    Ollama body becomes the OpenAI one llama-server serves."""
    route, cap_field = ROUTES[req.route]
    src = req.body
    if req.route == "/api/chat":
        body: dict = {"messages": src.get("messages", []), **({"tools": src["tools"]} if src.get("tools") else {})}
    elif req.route == "/api/generate":
        body = {"prompt": (src.get("system", "") + "\n\n" if src.get("system") else "") + str(src.get("prompt", ""))}
    else:
        body = {k: v for k, v in src.items() if k not in ("max_completion_tokens", "stream_options", "n")}
    body.update({"model": model, "stream": True, "temperature": 0.0, cap_field: tokens, "ignore_eos": True})
    if route == "/v1/chat/completions":
        body["stream_options"] = {"include_usage": True}
    return route, body


__all__ = ["AGENT", "Request", "Session", "shipped_session", "recorded_session", "resolve_session", "is_session",
           "replay_request", "tool_schemas", "system_prompt", "DEFAULT_PREFIX_TOKENS", "DEFAULT_TURNS"]
