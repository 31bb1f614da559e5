"""Prompt reuse across reloads: before the daemon stops a child it saves each slot that holds a
prompt (llama-server's `POST /slots/N?action=save` into `--slot-save-path`); the next load of the
same model restores them before it reports ready, so an agent's long prefix is paid once.

A saved state belongs to one identity: the model file (path, size, mtime), the engine commit, the
context size, the cache types and the slot layout. Its files are named by a hash of that identity
and a sidecar JSON records it in full, so a state saved for anything else is never loaded. The
store is kept under a disk cap, least recently used (saved or restored) evicted first.

The store owns its directory: it must belong to this user and be writable by no one else, and only
files it wrote (a 32-hex-digit name, a regular file of this user, a sidecar of the right shape) are
read; anything else in it is ignored and reported (`usage()["ignored"]`), never trusted."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bostudio.errors import BostudioError
from bostudio.files import owner_problem, write_atomic
from bostudio.runtime.client import AsyncLlamaClient, ChildError

log = logging.getLogger("bostudio.daemon")
MIN_SAVE_TOKENS = 64  # a shorter prompt is cheaper to recompute than to save and load
SLOT_TIMEOUT = httpx.Timeout(120.0, connect=2.0)
MAX_SIDECAR_BYTES = 1 << 20  # ours are ~0.5 kB; a bigger "sidecar" is not ours
_SIDECAR = re.compile(r"^[0-9a-f]{32}\.json$")


class StoreError(BostudioError):
    """The prompt store's directory cannot be trusted (another owner, writable by others, not a dir)."""


@dataclass(frozen=True)
class StateKey:
    """What a saved slot state is valid for."""

    model_path: str
    model_size: int
    model_mtime_ns: int
    engine_commit: str
    ctx: int
    cache_type_k: str
    cache_type_v: str
    slots: str  # llama-server's slot layout ("auto": 4 slots, unified KV)
    swa_full: bool
    flash_attn: bool = True  # without it the V cache is stored transposed, and a saved state will not load

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:32]


def state_key(model: Path, engine_commit: str, ctx: int, cache_type: str = "f16", slots: str = "auto",
              swa_full: bool = True, flash_attn: bool = True) -> StateKey:
    st = model.stat()
    return StateKey(str(model.resolve()), st.st_size, st.st_mtime_ns, engine_commit, ctx, cache_type, cache_type,
                    slots, swa_full, flash_attn)


@dataclass(frozen=True)
class SavedEntry:
    digest: str
    model: str
    ctx: int
    slots: int
    tokens: int
    bytes: int
    used: float  # wall time of the last save or restore


class SlotStore:
    """The directory llama-server saves slots into, and its index of sidecars."""

    def __init__(self, root: Path, cap_bytes: int) -> None:
        self.root = root
        self.cap = cap_bytes
        self._reported: set[tuple[str, str]] = set()

    def ensure(self) -> Path:
        """The store's directory, created 0700 if missing. Raises StoreError when it is not ours."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        problem = self.dir_problem()
        if problem:
            raise StoreError(f"the prompt store {self.root} {problem}",
                             "use a directory of your own (--prompt-store-dir), or --no-prompt-reuse")
        return self.root

    def dir_problem(self) -> str | None:
        """Why the directory cannot be trusted, or None (also None when it does not exist yet)."""
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"cannot be read: {exc.strerror or exc}"
        return "is not a directory" if not stat.S_ISDIR(st.st_mode) else _not_yours(st)

    def _meta(self, digest: str) -> Path:
        return self.root / f"{digest}.json"

    @staticmethod
    def filename(digest: str, slot: int) -> str:
        return f"{digest}.slot{slot}"  # llama-server accepts a plain file name only (fs_validate_filename)

    def _owned_file(self, path: Path) -> str | None:
        """Why `path` is not a file this store wrote, or None. lstat: no symlink, FIFO or device is followed."""
        try:
            st = os.lstat(path)
        except OSError as exc:
            return f"cannot be read: {exc.strerror or exc}"
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file"
        if _not_yours(st):
            return _not_yours(st)
        if path.suffix == ".json" and st.st_size > MAX_SIDECAR_BYTES:
            return f"is {st.st_size} bytes, larger than any sidecar the store writes"
        return None

    def _ignore(self, name: str, why: str) -> None:
        if (name, why) not in self._reported:
            self._reported.add((name, why))
            log.warning("prompt store: ignoring %s (%s): the store did not write it", name, why)

    def read_meta(self, digest: str) -> dict | None:
        """The sidecar of `digest` if it is one the store wrote (name, owner, mode, shape), else None."""
        path = self._meta(digest)
        if not _SIDECAR.match(path.name):
            return None
        why = self._owned_file(path)
        if why is None:
            try:
                data = json.loads(path.read_bytes())
            except (OSError, ValueError, RecursionError) as exc:
                data, why = None, f"not a sidecar: {type(exc).__name__}"
            if data is not None:
                why = _sidecar_problem(data)
        if why is not None:
            if path.exists() or path.is_symlink():
                self._ignore(path.name, why)
            return None
        return data

    def ignored(self) -> list[dict]:
        """Files in the store it did not write (reported, never read as states)."""
        out = []
        if not self.root.is_dir():
            return out
        try:
            names = sorted(os.listdir(self.root))
        except OSError:
            return out
        digests = {n[:-5] for n in names if _SIDECAR.match(n) and self.read_meta(n[:-5]) is not None}
        for n in names:
            if n.split(".", 1)[0] in digests or n.endswith(".tmp") or n.endswith(".part"):
                continue
            why = self._owned_file(self.root / n) if _SIDECAR.match(n) else "not a name the store writes"
            out.append({"file": n, "reason": why or "not a sidecar the store wrote"})
        return out

    def entries(self) -> list[SavedEntry]:
        out = []
        for meta in self.root.glob("*.json") if self.root.is_dir() else []:
            data = self.read_meta(meta.stem)
            if not data:
                continue
            slots = data["slots"]
            out.append(SavedEntry(meta.stem, str(data["key"].get("model_path", "?")),
                                  _int(data["key"].get("ctx")), len(slots),
                                  sum(_int(s.get("tokens")) for s in slots.values()),
                                  self.entry_bytes(meta.stem), _float(data.get("used"))))
        return sorted(out, key=lambda e: e.used)

    def entry_bytes(self, digest: str) -> int:
        total = 0
        for f in self.root.glob(f"{digest}.*"):
            try:
                total += f.lstat().st_size
            except OSError:
                pass
        return total

    def for_key(self, key: StateKey) -> dict[int, int]:
        """slot -> tokens of the states saved for exactly `key` (the sidecar must match in full)."""
        data = self.read_meta(key.digest)
        if not data or data.get("key") != asdict(key):
            return {}
        out = {}
        for slot, info in data["slots"].items():
            if not str(slot).isdigit():
                continue
            if self._owned_file(self.root / self.filename(key.digest, int(slot))) is None:
                out[int(slot)] = _int(info.get("tokens"))
        return out

    def record(self, key: StateKey, saved: dict[int, dict]) -> None:
        """Write the sidecar for the slots just saved (merged with earlier ones) and enforce the cap."""
        data = self.read_meta(key.digest) or {}
        if data.get("key") != asdict(key):
            data = {"key": asdict(key), "slots": {}}
        for slot, info in saved.items():
            data["slots"][str(slot)] = info
        self.touch(key, data)
        self.enforce_cap(keep=key.digest)

    def touch(self, key: StateKey, data: dict | None = None) -> None:
        data = data or self.read_meta(key.digest)
        if data is None:
            return
        data["used"] = time.time()
        write_atomic(self._meta(key.digest), json.dumps(data), mode=0o600)  # it names the saved prompts

    def drop_slot(self, key: StateKey, slot: int) -> None:
        (self.root / self.filename(key.digest, slot)).unlink(missing_ok=True)

    def remove(self, digest: str) -> None:
        for f in self.root.glob(f"{digest}.*"):
            f.unlink(missing_ok=True)

    def enforce_cap(self, keep: str | None = None) -> list[str]:
        """Evict whole entries, least recently used first, until the store fits its cap; the entry
        just written goes last (and only if it alone is larger than the cap)."""
        entries = self.entries()
        total = sum(e.bytes for e in entries)
        evicted = []
        for e in sorted(entries, key=lambda e: (e.digest == keep, e.used)):
            if total <= self.cap:
                break
            self.remove(e.digest)
            total -= e.bytes
            evicted.append(e.digest)
            log.info("prompt store: evicted %s (%d bytes) to stay under %d bytes", e.digest, e.bytes, self.cap)
        return evicted

    def usage(self) -> dict:
        """What the store holds, and what it found there but did not write (never raises)."""
        try:
            entries = self.entries()
            ignored = self.ignored()
        except OSError as exc:
            return {"dir": str(self.root), "bytes": 0, "cap_bytes": self.cap, "entries": [], "ignored": [],
                    "error": f"cannot read the store: {exc.strerror or exc}"}
        out = {"dir": str(self.root), "bytes": sum(e.bytes for e in entries), "cap_bytes": self.cap,
               "entries": [asdict(e) for e in entries], "ignored": ignored}
        problem = self.dir_problem()
        if problem:
            out["error"] = f"the directory {problem}"
        return out


_not_yours = owner_problem  # why a file or dir is not this user's alone (the check private dirs take too)


def _sidecar_problem(data: object) -> str | None:
    """Why parsed JSON is not a sidecar this store wrote, or None."""
    if not isinstance(data, dict) or not isinstance(data.get("key"), dict) or not isinstance(data.get("slots"), dict):
        return "not a sidecar: no key and slots objects"
    if not all(isinstance(v, dict) for v in data["slots"].values()):
        return "not a sidecar: a slot entry is not an object"
    return None


def _int(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _float(v: object) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


async def save_slots(http: AsyncLlamaClient, store: SlotStore, key: StateKey) -> dict[int, dict]:
    """Save every slot of a running child that holds at least MIN_SAVE_TOKENS tokens; returns
    slot -> {tokens, bytes, ms}. Never raises for the child's errors: a failed save costs only time."""
    saved: dict[int, dict] = {}
    try:
        r = await http.get("/slots", timeout=SLOT_TIMEOUT)
        slots = r.json() if r.status_code == 200 else []
    except (ChildError, ValueError):
        return saved
    store.ensure()
    for s in slots if isinstance(slots, list) else []:
        sid = s.get("id")
        if not isinstance(sid, int) or s.get("is_processing"):
            continue
        name = store.filename(key.digest, sid)
        tmp = f"{name}.part"
        try:
            r = await http.post(f"/slots/{sid}", params={"action": "save"}, json={"filename": tmp},
                                timeout=SLOT_TIMEOUT)
            res = r.json() if r.status_code == 200 else {}
        except (ChildError, ValueError):
            res = {}
        n = int(res.get("n_saved", res.get("n_tokens", 0)) or 0)
        part = store.root / tmp
        if n >= MIN_SAVE_TOKENS and part.is_file():
            part.replace(store.root / name)  # a half-written state never carries the real name
            saved[sid] = {"tokens": n, "bytes": int(res.get("n_written", res.get("n_bytes", 0)) or 0),
                          "ms": (res.get("timings") or {}).get("save_ms", res.get("t_ms"))}
        else:
            part.unlink(missing_ok=True)
    if saved:
        store.record(key, saved)
    return saved


async def restore_slots(http: AsyncLlamaClient, store: SlotStore, key: StateKey) -> dict[int, int]:
    """Restore the states saved for exactly `key` into their slots; returns slot -> tokens."""
    restored: dict[int, int] = {}
    for sid, tokens in sorted(store.for_key(key).items()):
        try:
            r = await http.post(f"/slots/{sid}", params={"action": "restore"},
                                json={"filename": store.filename(key.digest, sid)}, timeout=SLOT_TIMEOUT)
        except ChildError as exc:
            log.warning("restoring slot %d failed: %r", sid, exc)
            continue
        if r.status_code == 200:
            try:
                res = r.json()
                restored[sid] = int(res.get("n_restored", res.get("n_tokens", tokens)) or tokens)
            except ValueError:
                restored[sid] = tokens
        else:
            log.warning("restoring slot %d refused (%d): %s; dropping the state", sid, r.status_code, r.text[:300])
            store.drop_slot(key, sid)
    if restored:
        store.touch(key)
    return restored
