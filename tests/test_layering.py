"""The structure stays straight: no import cycles between bostudio's modules, and no module imports a layer
above its own, imports inside functions included.

In the spirit of import-linter's contracts (harlequin keeps its UI-free core that way), done with an AST walk
so that no tool is needed: every `import` and `from ... import` anywhere in a module (top level, functions,
`if TYPE_CHECKING:` blocks), relative forms resolved, and `importlib.import_module("literal")`. LAYERS below is
the order, bottom first; docs/architecture.md ("Layers") describes it in words.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "bostudio"

# Bottom first. A module may import its own component and any component of a lower layer. The components of
# one layer are independent: they may not import each other (import-linter's `a | b`). A component is a set of
# module names; each also covers the modules below it (a package), and the longest name that matches decides,
# so "bostudio.pairing.core" is the pairing core and "bostudio.pairing.edge" the edge, whatever modules each
# folder holds. "bostudio" alone is only the package's own __init__ (the version).
LAYERS: tuple[dict[str, tuple[str, ...]], ...] = (
    {"errors": ("bostudio", "bostudio.errors")},
    # where things live, whole-file writes, showing untrusted text
    {"paths": ("bostudio.paths",), "files": ("bostudio.files",), "display": ("bostudio.display",)},
    # config.toml: each part above reads its own table (hardware its [devices] caps)
    {"config": ("bostudio.config",)},
    # GGUF headers, devices, what a speculator is
    {"gguf": ("bostudio.gguf",), "hardware": ("bostudio.hardware",), "speculation": ("bostudio.speculation",)},
    # the pure memory model: below the pairing core, which prices speculators with it (pairing.core.cost)
    {"planner": ("bostudio.planner",)},
    # pairing/core/: pairings.toml schema, compatibility, candidate costs, guardrails, select()
    {"pairing core": ("bostudio.pairing", "bostudio.pairing.core")},
    {"catalog": ("bostudio.catalog",), "engine": ("bostudio.engine",), "runtime": ("bostudio.runtime",)},
    # rpc probes workers through the engine and runs rpc-server with runtime; the profile store is keyed
    # by the engine build and read by the pairing edge, up, the daemon and bench, and written by tune
    {"rpc": ("bostudio.rpc",), "profiles": ("bostudio.profiles",)},
    # pairing/edge/: pair (local files, the engine's tools), probe (tokenizers), fetch (the hub)
    {"pairing edge": ("bostudio.pairing.edge",)},
    {"launch": ("bostudio.launch",)},
    # the daemon's modules beside its two halves: its defaults, the pid/state file, which paths the control
    # API may load
    {"daemon core": ("bostudio.daemon", "bostudio.daemon.state",
                     "bostudio.daemon.modelpaths")},
    # supervision of the children (lifecycle, effects, policy, stats, events) knows nothing of HTTP ...
    {"daemon supervise": ("bostudio.daemon.supervise",)},
    # ... and the HTTP edge (app, limits, auth, Host/Origin, field allow-list, routes) asks it for children
    {"daemon http": ("bostudio.daemon.http",)},
    # the daemon process (serve, start/stop in the background) wires both; its client is what the CLI uses
    {"up": ("bostudio.up",), "daemon": ("bostudio.daemon.service", "bostudio.daemon.client"),
     "bench": ("bostudio.bench",)},
    # clients of the daemon: the TUI talks to it through its client; `launch AGENT` points an agent CLI at it
    {"tui": ("bostudio.tui",), "agents": ("bostudio.agents",)},
    # the CLI opens the TUI (`bostudio` alone)
    {"cli": ("bostudio.cli", "bostudio.__main__")},
)

# Imports that break the order and wait for another branch, each with who removes it and why.
ALLOWED: dict[tuple[str, str], str] = {}

# The pure core: no process, network or UI library, at any level of the code (DESIGN.md: "planner/, pairing/
# and gguf/describe import no httpx, psutil, pynvml or subprocess"). Hardware's probes are I/O; its Device is not.
PURE_COMPONENTS = ("errors", "paths", "files", "display", "config", "gguf", "speculation", "planner", "pairing core")
PURE_MODULES = ("bostudio.hardware", "bostudio.hardware.device",
                # the supervisor's decisions: its lifecycle table and its eviction/idle/speculation policy
                "bostudio.daemon.supervise.lifecycle", "bostudio.daemon.supervise.policy")
IO_LIBRARIES = ("httpx", "psutil", "pynvml", "amdsmi", "subprocess", "socket", "textual", "uvicorn", "starlette",
                "huggingface_hub", "llama_cpp")


@dataclass(frozen=True)
class Import:
    module: str  # the importer
    target: str  # a bostudio module, or the top-level name of another package
    line: int
    in_function: bool


def module_files(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _imports_of(name: str, path: Path, modules: set[str]) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)

    def resolve(dotted: str) -> str:
        """The longest bostudio module `dotted` names (a `from pkg import name` may name a module or not)."""
        if not dotted.startswith("bostudio"):
            return dotted.partition(".")[0]
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted

    out = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
        elif isinstance(node, ast.Call):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if fname in ("import_module", "__import__"):
                arg = node.args[0] if node.args else None
                assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), (
                    f"{name}:{node.lineno} imports a module named at run time: use a plain import, so that "
                    "this test sees the dependency")
                targets = [arg.value]
        for t in targets:
            target = resolve(t)
            if target and target != name:
                out.append(Import(name, target, node.lineno, id(node) in in_function))
    return out


def import_graph() -> list[Import]:
    files = module_files()
    return [imp for name, path in files.items() for imp in _imports_of(name, path, set(files))]


def placement(module: str) -> tuple[int, str] | None:
    """(layer index, component) of a bostudio module, or None when LAYERS does not place it."""
    best: tuple[int, int, str] | None = None
    for i, layer in enumerate(LAYERS):
        for component, members in layer.items():
            for m in members:
                hit = module == m if m == "bostudio" else module == m or module.startswith(m + ".")
                if hit and (best is None or len(m) > best[0]):
                    best = (len(m), i, component)
    return None if best is None else (best[1], best[2])


def is_pure(module: str) -> bool:
    place = placement(module)
    return module in PURE_MODULES or (place is not None and place[1] in PURE_COMPONENTS)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (as a path that ends where it starts), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour: dict[str, int] = defaultdict(int)
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        colour[v] = GREY
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if colour[w] == GREY:
                return stack[stack.index(w):] + [w]
            if colour[w] == WHITE:
                found = visit(w)
                if found:
                    return found
        stack.pop()
        colour[v] = BLACK
        return None

    for v in sorted(edges):
        if colour[v] == WHITE:
            found = visit(v)
            if found:
                return found
    return None


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checker itself: relative forms, imports inside functions and import_module strings are found."""
    pkg = tmp_path / "bostudio" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "bostudio" / "__init__.py").write_text("")
    (tmp_path / "bostudio" / "other.py").write_text("")
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("import importlib\nfrom .. import other\n\ndef f():\n"
                              "    from bostudio.sub import b\n    importlib.import_module('bostudio.other')\n")
    (pkg / "b.py").write_text("from .a import x\n")
    files = module_files(tmp_path / "bostudio")
    found = {(i.module, i.target, i.line, i.in_function)
             for name, path in files.items() for i in _imports_of(name, path, set(files))}
    assert found == {("bostudio.sub", "bostudio.sub.a", 1, False), ("bostudio.sub.a", "importlib", 1, False),
                     ("bostudio.sub.a", "bostudio.other", 2, False), ("bostudio.sub.a", "bostudio.sub.b", 5, True),
                     ("bostudio.sub.a", "bostudio.other", 6, True), ("bostudio.sub.b", "bostudio.sub.a", 1, False)}
    edges = {"bostudio.sub.a": {"bostudio.sub.b"}, "bostudio.sub.b": {"bostudio.sub.a"}}
    assert find_cycle(edges) == ["bostudio.sub.a", "bostudio.sub.b", "bostudio.sub.a"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


def test_every_module_has_a_place_in_the_layers() -> None:
    unplaced = sorted(m for m in module_files() if placement(m) is None)
    assert not unplaced, f"add these modules to LAYERS in {__file__}: {unplaced}"
    every = [m for layer in LAYERS for members in layer.values() for m in members]
    assert len(every) == len(set(every)), "a module is named twice in LAYERS"


def all_cycles(edges: dict[str, set[str]], most: int = 20) -> list[list[str]]:
    """Cycles until none is left, each found then broken at its closing edge (so each shows once)."""
    edges = {k: set(v) for k, v in edges.items()}
    out = []
    while len(out) < most and (cycle := find_cycle(edges)) is not None:
        out.append(cycle)
        edges[cycle[-2]].discard(cycle[-1])
    return out


def test_no_import_cycles() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in import_graph():
        if imp.target.startswith("bostudio"):
            edges[imp.module].add(imp.target)
    cycles = all_cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_a_layer_above_its_own() -> None:
    files = module_files()
    problems = set()
    for imp in import_graph():
        if not imp.target.startswith("bostudio"):
            continue
        src, dst = placement(imp.module), placement(imp.target)
        assert src is not None and dst is not None, (imp.module, imp.target)
        if src[1] == dst[1] or dst[0] < src[0] or (imp.module, imp.target) in ALLOWED:
            continue
        where = "above" if dst[0] > src[0] else "beside (same layer, independent)"
        problems.add(f"{files[imp.module].relative_to(ROOT.parent)}:{imp.line}: {imp.module} ({src[1]}) imports "
                     f"{imp.target} ({dst[1]}), {where} its layer" + (" inside a function" if imp.in_function else ""))
    assert not problems, "imports against the layer order:\n" + "\n".join(sorted(problems))


def test_allowed_exceptions_are_still_needed() -> None:
    seen = {(i.module, i.target) for i in import_graph()}
    assert not set(ALLOWED) - seen, f"remove from ALLOWED, no longer imported: {sorted(set(ALLOWED) - seen)}"


def test_the_pure_core_imports_no_io_library_anywhere_in_its_code() -> None:
    """Statically, imports inside functions too: the planner, the pairing core, gguf, speculation, config..."""
    bad = [f"{i.module}:{i.line} imports {i.target}" for i in import_graph()
           if i.target in IO_LIBRARIES and is_pure(i.module)]
    assert not bad, "\n".join(bad)


def test_only_the_effects_runner_starts_stops_or_connects_to_children() -> None:
    """DESIGN.md: the supervisor decides purely and acts through effects. Within daemon/supervise, no module but
    effects.py creates a ServerProcess, opens a socket or a client of its own to a child."""
    child_io = ("subprocess", "socket", "bostudio.runtime.net", "bostudio.runtime.verify", "bostudio.runtime.passthrough")
    files = module_files()
    bad = [f"{i.module}:{i.line} imports {i.target}" for i in import_graph()
           if i.module.startswith("bostudio.daemon.supervise.") and i.module != "bostudio.daemon.supervise.effects"
           and i.target in child_io]
    for name, path in files.items():
        if not name.startswith("bostudio.daemon.supervise.") or name == "bostudio.daemon.supervise.effects":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if called in ("ServerProcess", "AsyncLlamaClient", "LlamaClient", "AsyncClient", "Popen"):
                    bad.append(f"{name}:{node.lineno} calls {called}")
    assert not bad, "\n".join(bad)


def test_only_the_tui_imports_textual() -> None:
    bad = [f"{i.module}:{i.line}" for i in import_graph()
           if i.target in ("textual", "textual_plotext", "plotext", "rich")
           and not (i.module == "bostudio.tui" or i.module.startswith("bostudio.tui."))]
    assert not bad, f"textual outside bostudio/tui: {bad}"


@pytest.mark.parametrize("module", ["bostudio.planner", "bostudio.planner.render", "bostudio.pairing",
                                    "bostudio.pairing.core", "bostudio.pairing.core.cost",
                                    "bostudio.pairing.core.select", "bostudio.gguf", "bostudio.gguf.describe",
                                    "bostudio.speculation", "bostudio.config", "bostudio.files", "bostudio.hardware",
                                    "bostudio.daemon.supervise.lifecycle"])
def test_the_pure_core_loads_no_io_library(module: str) -> None:
    """At run time, in a fresh interpreter: what importing the module really loads (its imports' imports too)."""
    code = (f"import sys, {module}\n"
            f"print(','.join(sorted(m for m in {IO_LIBRARIES!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "", f"{module} loads {out.stdout.strip()}"


def test_every_name_imported_from_bostudio_exists_and_comes_from_its_home() -> None:
    """Imports inside functions run late: one naming what moved away fails only when that code runs. And a
    function or class is imported from the module that defines it (or a package's public __init__), not
    through another module that happens to import it: no shims left behind by a move."""
    import importlib

    files = module_files()
    missing = []
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("bostudio") or source == "bostudio.__main__":
                continue
            module = importlib.import_module(source)
            for alias in node.names:
                where = f"{path.relative_to(ROOT.parent)}:{node.lineno}"
                if f"{source}.{alias.name}" in files:
                    continue
                if not hasattr(module, alias.name):
                    missing.append(f"{where}: {source} has no {alias.name}")
                    continue
                home = getattr(getattr(module, alias.name), "__module__", None)
                if (callable(getattr(module, alias.name)) and home and home.startswith("bostudio.") and home != source
                        and files[source].name != "__init__.py"):
                    missing.append(f"{where}: import {alias.name} from {home}, where it lives, not from {source}")
    assert not missing, "\n".join(missing)
