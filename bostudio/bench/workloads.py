"""The workloads shipped with bostudio: prompts written for this project, over its own source files.

Each task has a fixed output length (the server is asked to ignore end-of-sequence), so both sides of a
comparison decode the same number of tokens. Prompts are fresh for each run (`variant` picks another
function, module or topic) so that n-gram state from earlier runs does not flatter the figures; pass the same
variant to repeat a prompt on purpose (`bostudio bench --repeat`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bostudio.errors import ConfigError

PACKAGE = Path(__file__).resolve().parent.parent  # bostudio/: the source the code tasks read
WORKLOADS = ("code", "edit", "chat")


@dataclass(frozen=True)
class Task:
    """One prompt family: `prompt(variant)` gives a fresh prompt per run; `tokens` is the fixed output length."""

    workload: str
    name: str
    tokens: int
    prompt: Callable[[int], str]


@lru_cache(maxsize=1)
def _sources() -> tuple[tuple[str, str], ...]:
    """(relative path, text) of the project's own modules, in a stable order, skipping tiny files."""
    out = []
    for p in sorted(PACKAGE.rglob("*.py")):
        text = p.read_text(encoding="utf-8")
        if 1500 <= len(text) <= 40000:
            out.append((str(p.relative_to(PACKAGE.parent)), text))
    return tuple(out)


@lru_cache(maxsize=1)
def _functions() -> tuple[tuple[str, str], ...]:
    """(qualified name, source) of the project's functions of 8 to 40 lines, in a stable order."""
    out = []
    for path, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                lines = node.end_lineno - node.lineno + 1
                if 8 <= lines <= 40:
                    src = ast.get_source_segment(text, node)
                    if src:
                        out.append((f"{path}:{node.name}", src))
    return tuple(out)


def _pick(items: tuple, variant: int, stride: int) -> tuple:
    # A stride coprime with the length walks every item before repeating one.
    return items[(variant * stride) % len(items)]


def _review(variant: int) -> str:
    name, src = _pick(_functions(), variant, 7)
    return (f"You are reviewing a pull request to bostudio, a runtime manager for llama.cpp.\n"
            f"Function `{name}`:\n\n```python\n{src}\n```\n\n"
            "List the edge cases this function does not handle, one per line, each with the input that "
            "triggers it and what goes wrong.\n\n1.")


def _tests(variant: int) -> str:
    path, text = _pick(_sources(), variant, 5)
    head = text[:3000]
    return (f"Module `{path}` of bostudio:\n\n```python\n{head}\n```\n\n"
            "Write pytest tests for this module. Cover the error paths, not only the happy path.\n\n"
            "```python\nimport pytest\n\n")


def _refactor(variant: int) -> str:
    name, src = _pick(_functions(), variant, 11)
    return (f"Refactor `{name}` from bostudio for readability without changing its behaviour. Keep the "
            f"signature; split long conditions into well-named helpers.\n\n```python\n{src}\n```\n\n"
            "Refactored version:\n\n```python\n")


def _edit(variant: int) -> str:
    # The agent pattern: the code is already in the context, the answer rewrites it with a small change.
    name, src = _pick(_functions(), variant, 13)
    return (f"Here is `{name}`:\n\n```python\n{src}\n```\n\n"
            "Return the whole function again, unchanged except that every comment is in upper case and "
            "the docstring ends with the line `Edited by bostudio bench.`\n\n```python\n")


_TOPICS = (
    "a lighthouse keeper who collects lost letters", "the first winter of a village on Mars",
    "a chess tournament played by retired sailors", "a bakery that only opens during thunderstorms",
    "an orchestra rehearsing in an abandoned railway station", "a botanist mapping moss on city walls",
    "two rival beekeepers forced to share a meadow", "a translator working on a language with no verbs",
    "a night ferry whose passengers swap stories", "a cartographer drawing a map of sounds",
    "a glassblower's apprentice and a broken commission", "a library that lends out weather",
)


def _chat(variant: int) -> str:
    topic = _TOPICS[variant % len(_TOPICS)]
    return (f"Write an original short story about {topic}. Vary the sentence length, use concrete sensory "
            "detail, and avoid cliches.\n\n")


SHIPPED: dict[str, tuple[Task, ...]] = {
    "code": (Task("code", "review", 128, _review), Task("code", "tests", 128, _tests),
             Task("code", "refactor", 128, _refactor)),
    "edit": (Task("edit", "rewrite", 160, _edit),),
    "chat": (Task("chat", "story", 128, _chat),),
}


def file_tasks(files: list[Path], tokens: int = 128) -> tuple[Task, ...]:
    """A workload from the user's own prompt files: one task per file (variant cannot vary a fixed file)."""
    tasks = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read prompt file {f}: {exc}", "pass a UTF-8 text file as --workload") from exc
        if not text.strip():
            raise ConfigError(f"prompt file {f} is empty", "write the prompt into the file")
        tasks.append(Task(f.name, f.name, tokens, lambda variant, t=text: t))
    return tuple(tasks)


def resolve_workloads(names: list[str]) -> dict[str, tuple[Task, ...]]:
    """`code`, `edit`, `chat` or prompt files, in the order given."""
    out: dict[str, tuple[Task, ...]] = {}
    for n in names:
        if n in SHIPPED:
            out[n] = SHIPPED[n]
        elif Path(n).expanduser().is_file():
            p = Path(n).expanduser()
            out[p.name] = file_tasks([p])
        else:
            raise ConfigError(f"unknown workload {n!r}", "use code, edit, chat, or the path of a prompt file")
    return out


def filler_code(variant: int) -> str:
    """Real code to fill a long context: the project's modules, starting at a different one per run."""
    src = _sources()
    start = variant % len(src)
    ordered = src[start:] + src[:start]
    return "".join(f"# file: {p}\n{t}\n" for p, t in ordered)


def context_prompt(text: str, question: str) -> str:
    return f"{text}\n\n{question}"


CONTEXT_QUESTION = ("Above is part of the bostudio source. Write a new function that lists every module above "
                    "with its public functions.\n\n```python\ndef list_modules():\n")
