"""Find every llama-server bostudio can use, probe what each one can do, and choose one.

Probing runs the binary with `--version` (stderr), `--list-devices` (stdout) and `--help`
(the `--spec-type` values it knows). Capabilities come from the binary, not from its version.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bostudio import paths
from bostudio.engine.amx import AMX_PROBE_CACHE, cached_amx_problem, cpu_reports_amx
from bostudio.engine.build import RPC_SERVER, built_engines, is_current_default
from bostudio.errors import EngineError
from bostudio.hardware.device import EngineDevice

PROBE_TIMEOUT_S = 20.0
# llama.cpp's switch for which Vulkan devices it uses (indices as vulkaninfo lists them); without it,
# only real GPUs: a software device (lavapipe) is listed only when named here.
VK_VISIBLE = "GGML_VK_VISIBLE_DEVICES"
VK_NO_GRAPH_OPTIMIZE = "GGML_VK_DISABLE_GRAPH_OPTIMIZE"

_VERSION = re.compile(r"^version: (\S+) \(build (\d+), commit ([0-9a-f]+|unknown)\)", re.M)
_BUILT = re.compile(r"^built with (.+) for (.+)$", re.M)
_DEVICE = re.compile(r"^\s+(\S+): (.*) \((\d+) MiB, (\d+) MiB free\)\s*$", re.M)
# Device-name prefixes identify backends (reference 3.2).
_DEVICE_BACKEND = (("CUDA", "cuda"), ("ROCm", "hip"), ("MUSA", "musa"), ("Vulkan", "vulkan"),
                   ("SYCL", "sycl"), ("MTL", "metal"), ("RPC", "rpc"))
_LIB_BACKEND = re.compile(r"^(?:lib)?ggml-([a-z0-9]+)")
KNOWN_SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
                    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


@dataclass(frozen=True)
class Engine:
    path: Path
    source: str  # "env" | "built" | "built-other" (a variant or older flags) | "path" | "explicit"
    version: str = "unknown"
    build: int = 0
    commit: str = "unknown"
    compiler: str = ""
    target: str = ""
    backends: tuple[str, ...] = ()
    devices: tuple[EngineDevice, ...] = ()
    spec_types: tuple[str, ...] = ()
    flags: frozenset[str] = field(default_factory=frozenset)  # every option --help lists
    problem: str | None = None  # why it cannot be used, if it cannot
    # Its CPU backend has ggml's AMX buffer type (a -march=native build on a CPU with AMX-INT8): host weights
    # are then repacked into it, which changes what the host holds (bostudio.planner.memory.amx_host_weights).
    amx: bool = False

    @property
    def usable(self) -> bool:
        return self.problem is None

    def supports(self, flag: str) -> bool:
        return flag in self.flags

    def server_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment llama-server runs in: `base` (the process's own by default), plus what this engine's
        devices need. On a software device (lavapipe, Mesa 22.3 in Debian 12) ggml-vulkan's graph optimisation
        (node reordering for concurrency, which only a real GPU gains from) crashed lavapipe in a queue
        submission on every batch of about 9 to 32 tokens: a chat request's first prompt. Measured: SIGSEGV
        with it, none from 1 to 64 tokens and over chat without it. A value the user set is kept."""
        env = dict(os.environ if base is None else base)
        if any(d.software for d in self.devices):
            env.setdefault(VK_NO_GRAPH_OPTIMIZE, "1")
        return env

    def gpu_mib(self) -> int:
        """Memory of the real GPUs it sees: a software device (lavapipe) is the host's RAM again."""
        return sum(d.total_mib for d in self.devices if not d.software)

    @property
    def idle_backends(self) -> tuple[str, ...]:
        """GPU backends built in that list no device here (a Vulkan build on a machine without a GPU)."""
        seen = {d.backend for d in self.devices}
        return tuple(b for b in self.backends if b not in ("cpu", "rpc") and b not in seen)

    def notes(self) -> tuple[str, ...]:
        """What a user should know about this engine's devices (shown by `bostudio devices`)."""
        out = []
        if "vulkan" in self.idle_backends and not os.environ.get(VK_VISIBLE):
            out.append(f"{self.path.name} has the Vulkan backend but lists no Vulkan device: llama.cpp skips "
                       f"software devices (Mesa's lavapipe) unless {VK_VISIBLE} names them "
                       f"(e.g. {VK_VISIBLE}=0; see docs/vulkan.md)")
        out += [f"{d.name} ({d.description}) is a software device: the CPU behind the Vulkan API, "
                "planned on host RAM" for d in self.devices if d.software]
        return tuple(out)

    def tool(self, name: str) -> Path | None:
        """A sibling binary from the same build (llama-quantize, llama-fit-params...)."""
        cand = self.path.parent / name
        return cand if cand.exists() else None

    @property
    def rpc_server(self) -> Path | None:
        """The build's ggml-rpc-server (serves this machine's devices to another llama-server)."""
        return self.tool(RPC_SERVER)

    @property
    def has_rpc(self) -> bool:
        """Can use RPC workers (`--rpc`): built with GGML_RPC=ON."""
        return "--rpc" in self.flags and "rpc" in self.backends

    def require_rpc(self) -> None:
        if not self.has_rpc:
            raise EngineError(f"{self.path} was built without the RPC backend, so it cannot use RPC workers",
                              "build the engine with `bostudio engine build` (it adds GGML_RPC=ON), "
                              "or pass an --engine built with -DGGML_RPC=ON")

    def to_json(self) -> dict:
        data = asdict(self)
        data["path"] = str(self.path)
        data["flags"] = sorted(self.flags)
        data["rpc"] = self.has_rpc
        data["rpc_server"] = str(self.rpc_server) if self.rpc_server else None
        return data


def _run(path: Path, arg: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    proc = subprocess.run([str(path), arg], capture_output=True, text=True, errors="replace",
                          timeout=PROBE_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout, proc.stderr


def parse_version(text: str) -> dict:
    out: dict = {}
    m = _VERSION.search(text)
    if m:
        out.update(version=m.group(1), build=int(m.group(2)), commit=m.group(3))
    m = _BUILT.search(text)
    if m:
        out.update(compiler=m.group(1).strip(), target=m.group(2).strip())
    return out


def parse_devices(text: str) -> tuple[EngineDevice, ...]:
    devices = []
    for name, desc, total, free in _DEVICE.findall(text):
        backend = next((b for prefix, b in _DEVICE_BACKEND if name.startswith(prefix)), "unknown")
        devices.append(EngineDevice(name, desc.strip(), int(total), int(free), backend))
    return tuple(devices)


def parse_help(text: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """(spec types, option names) from `llama-server --help`. An option line starts with its
    comma-separated names ("-a,    --alias STRING   ..."); removed options do not count."""
    flags: set[str] = set()
    spec: list[str] = []
    for line in text.splitlines():
        if not line.startswith("-") or "the argument has been removed" in line:
            continue
        tokens = line.split()
        names: list[str] = []
        for tok in tokens:
            if not tok.startswith("-"):
                break
            names.append(tok.rstrip(","))
            if not tok.endswith(","):
                break
        flags.update(names)
        if names and names[-1] == "--spec-type" and len(tokens) > len(names):
            listed = tokens[len(names)].split(",")  # "none,draft-simple,...,ngram-cache"
            spec = [t for t in KNOWN_SPEC_TYPES if t in listed] + [t for t in listed if t not in KNOWN_SPEC_TYPES]
    return tuple(spec), frozenset(flags)


def _lib_backends(bin_dir: Path) -> set[str]:
    found = set()
    for lib in bin_dir.glob("*ggml-*"):
        m = _LIB_BACKEND.match(lib.name)
        if m and m.group(1) not in ("base",):
            found.add(m.group(1))
    return found


# ggml-cpu/amx/amx.cpp names its buffer type "AMX", and is compiled only with __AMX_INT8__ and __AVX512VNNI__.
_AMX_NAME = b"\x00AMX\x00"


def has_amx(bin_dir: Path) -> bool:
    """Whether the engine's CPU backend (libggml-cpu*, or a statically linked llama-server) carries the AMX
    buffer type: the name of that type is in the binary only when it was compiled in."""
    for lib in [*bin_dir.glob("libggml-cpu*"), bin_dir / "llama-server"]:
        if lib.is_file() and not lib.is_symlink():
            try:
                if _AMX_NAME in lib.read_bytes():
                    return True
            except OSError:
                continue
    return False


def probe_engine(path: Path, source: str) -> Engine:
    """Probe a llama-server binary. A binary that cannot run is returned with `problem` set."""
    path = Path(path)
    if not path.exists():
        return Engine(path, source, problem="file does not exist")
    if not os.access(path, os.X_OK):
        return Engine(path, source, problem="not executable")
    try:
        rc, out, err = _run(path, "--version")
        info = parse_version(out + "\n" + err)
        if rc != 0 or "version" not in info:
            return Engine(path, source, problem=f"`--version` failed: {(err or out).strip()[-200:]}")
        _, dev_out, _ = _run(path, "--list-devices")
        devices = parse_devices(dev_out)
        _, help_out, help_err = _run(path, "--help")
        spec_types, flags = parse_help(help_out + "\n" + help_err)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Engine(path, source, problem=f"probe failed: {exc}")
    backends = {"cpu"} | _lib_backends(path.parent) | {d.backend for d in devices}
    problem = None
    if "--spec-type" not in flags:
        problem = "this llama-server has no --spec-type (too old for bostudio's speculative settings)"
    # the AMX buffer type is used only where the CPU has AMX (ggml_amx_init): elsewhere the libraries are not read
    amx = cpu_reports_amx() and has_amx(path.parent)
    if amx and source.startswith("built") and (why := cached_amx_problem(paths.engines_dir() / AMX_PROBE_CACHE)):
        # built here with AMX kernels that die here (bostudio.engine.amx): its first decode would be a SIGILL
        problem = f"its AMX kernels would crash on this machine ({why}); run `bostudio engine build`, " \
                  "which leaves them out"
    return Engine(path=path, source=source, backends=tuple(sorted(backends)), devices=devices,
                  spec_types=spec_types, flags=flags, problem=problem, amx=amx, **info)


def candidate_paths() -> list[tuple[Path, str]]:
    """Every llama-server we know of, most explicit first, without duplicates."""
    cands: list[tuple[Path, str]] = []
    env = os.environ.get("LLAMA_SERVER")
    if env:
        cands.append((Path(env).expanduser(), "env"))
    for eng in built_engines():
        # A variant (portable) or a build from older base flags is used only when nothing better is there.
        cands.append((eng.server, "built" if is_current_default(eng) else "built-other"))
    on_path = shutil.which("llama-server")
    if on_path:
        cands.append((Path(on_path), "path"))
    seen: set[Path] = set()
    unique = []
    for p, src in cands:
        key = p.resolve() if p.exists() else p
        if key not in seen:
            seen.add(key)
            unique.append((p, src))
    return unique


def discover_engines() -> list[Engine]:
    return [probe_engine(p, src) for p, src in candidate_paths()]


_SOURCE_RANK = {"env": 3, "built": 2, "built-other": 1, "path": 0}


def choose_engine(engines: list[Engine]) -> Engine:
    """The best usable engine for this machine's devices: one that sees GPUs beats CPU-only, more
    device memory beats less; on a tie the one the user named (LLAMA_SERVER) beats our default build beats
    our other builds (the portable variant, older flags) beats PATH, and one with the RPC backend beats
    one without. A software device (lavapipe) counts as no GPU: a Vulkan build that sees only lavapipe
    is used where it is named (--engine, LLAMA_SERVER), never chosen over the CPU build."""
    usable = [e for e in engines if e.usable]
    if not usable:
        why = "; ".join(f"{e.path}: {e.problem}" for e in engines) or "none found"
        raise EngineError(f"no usable llama-server ({why})",
                          "run `bostudio engine build`, or set LLAMA_SERVER to a recent llama-server")
    # on a tie, a build with the RPC backend (it can also use workers) beats one without, and one without
    # GPU backends that see nothing here (a Vulkan build with no GPU, or only lavapipe) beats one with them
    return max(usable, key=lambda e: (e.gpu_mib() > 0, e.gpu_mib(), _SOURCE_RANK.get(e.source, 0), e.has_rpc,
                                      not e.idle_backends and not any(d.software for d in e.devices)))


def find_engine(explicit: str | None = None) -> Engine:
    """The engine to launch: `explicit` if given (must be usable), else the best one found."""
    if explicit:
        eng = probe_engine(Path(explicit).expanduser(), "explicit")
        if not eng.usable:
            raise EngineError(f"{explicit} cannot be used: {eng.problem}",
                              "pass a recent llama-server with --engine, or omit --engine")
        return eng
    return choose_engine(discover_engines())
