"""Prompt reuse across reloads: before the daemon stops a child it saves each slot that holds a
prompt (llama-server's `POST /slots/N?action=save` into `--slot-save-path`); the next load of the
same model restores them before it reports ready, so an agent's long prefix is paid once.

A saved state belongs to one identity: the model file (path, size, mtime), the engine commit, the
context size, the cache types and the slot layout. Its files are named by a hash of that identity
and a sidecar JSON records it in full, so a state saved for anything else is never loaded. The
store is kept under a disk cap, least recently used (saved or restored) evicted first."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bostudio.files import write_atomic

log = logging.getLogger("bostudio.daemon")
MIN_SAVE_TOKENS = 64  # a shorter prompt is cheaper to recompute than to save and load
SLOT_TIMEOUT = httpx.Timeout(120.0, connect=2.0)


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

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:32]


def state_key(model: Path, engine_commit: str, ctx: int, cache_type: str = "f16", slots: str = "auto",
              swa_full: bool = True) -> StateKey:
    st = model.stat()
    return StateKey(str(model.resolve()), st.st_size, st.st_mtime_ns, engine_commit, ctx, cache_type, cache_type,
                    slots, swa_full)


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

    def ensure(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.root

    def _meta(self, digest: str) -> Path:
        return self.root / f"{digest}.json"

    @staticmethod
    def filename(digest: str, slot: int) -> str:
        return f"{digest}.slot{slot}"  # llama-server accepts a plain file name only (fs_validate_filename)

    def read_meta(self, digest: str) -> dict | None:
        try:
            return json.loads(self._meta(digest).read_text())
        except (OSError, ValueError):
            return None

    def entries(self) -> list[SavedEntry]:
        out = []
        for meta in self.root.glob("*.json") if self.root.is_dir() else []:
            data = self.read_meta(meta.stem)
            if not data:
                continue
            slots = data.get("slots", {})
            out.append(SavedEntry(meta.stem, data.get("key", {}).get("model_path", "?"),
                                  int(data.get("key", {}).get("ctx", 0)), len(slots),
                                  sum(int(s.get("tokens", 0)) for s in slots.values()),
                                  self.entry_bytes(meta.stem), float(data.get("used", 0))))
        return sorted(out, key=lambda e: e.used)

    def entry_bytes(self, digest: str) -> int:
        total = 0
        for f in self.root.glob(f"{digest}.*"):
            try:
                total += f.stat().st_size
            except OSError:
                pass
        return total

    def for_key(self, key: StateKey) -> dict[int, int]:
        """slot -> tokens of the states saved for exactly `key` (the sidecar must match in full)."""
        data = self.read_meta(key.digest)
        if not data or data.get("key") != asdict(key):
            return {}
        out = {}
        for slot, info in data.get("slots", {}).items():
            if (self.root / self.filename(key.digest, int(slot))).is_file():
                out[int(slot)] = int(info.get("tokens", 0))
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
        write_atomic(self._meta(key.digest), json.dumps(data))

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
        entries = self.entries()
        return {"dir": str(self.root), "bytes": sum(e.bytes for e in entries), "cap_bytes": self.cap,
                "entries": [asdict(e) for e in entries]}


async def save_slots(http: httpx.AsyncClient, store: SlotStore, key: StateKey) -> dict[int, dict]:
    """Save every slot of a running child that holds at least MIN_SAVE_TOKENS tokens; returns
    slot -> {tokens, bytes, ms}. Never raises for the child's errors: a failed save costs only time."""
    saved: dict[int, dict] = {}
    try:
        r = await http.get("/slots", timeout=SLOT_TIMEOUT)
        slots = r.json() if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
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
        except (httpx.HTTPError, ValueError):
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


async def restore_slots(http: httpx.AsyncClient, store: SlotStore, key: StateKey) -> dict[int, int]:
    """Restore the states saved for exactly `key` into their slots; returns slot -> tokens."""
    restored: dict[int, int] = {}
    for sid, tokens in sorted(store.for_key(key).items()):
        try:
            r = await http.post(f"/slots/{sid}", params={"action": "restore"},
                                json={"filename": store.filename(key.digest, sid)}, timeout=SLOT_TIMEOUT)
        except httpx.HTTPError as exc:
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
