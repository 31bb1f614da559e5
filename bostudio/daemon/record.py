"""`bostudio daemon --record DIR`: every request body the daemon reads, saved in the order received, so that
`bostudio bench --workload DIR` can replay a real agent's session turn by turn.

One file per request, DIR/NNNNNN.json: {"seq", "time", "route", "headers" (credentials left out), "body"}.
The sequence number is taken on the event loop when the body has been read (the order requests arrived);
the file is written in a thread (no blocking I/O on the loop).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path

from bostudio.errors import ConfigError

SECRET_HEADERS = {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie", "set-cookie",
                  "anthropic-api-key", "openai-api-key", "x-goog-api-key"}
_NAME = re.compile(r"^(\d{6,})\.json$")


class Recorder:
    """Saves request bodies to `directory`, numbered after whatever it already holds."""

    def __init__(self, directory: Path) -> None:
        d = directory.expanduser()
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the recording directory {d}: {exc}", "pass a writable --record DIR") from exc
        if not os.access(d, os.W_OK):
            raise ConfigError(f"the recording directory {d} is not writable", "pass a writable --record DIR")
        self.dir = d
        found = [int(m.group(1)) for p in d.iterdir() if (m := _NAME.match(p.name))]
        self.seq = max(found, default=0)

    def entry(self, route: str, headers: dict[str, str], body: dict) -> tuple[Path, dict]:
        """The next file and what goes in it (call on the loop: it takes the sequence number)."""
        self.seq += 1
        kept = {k: v for k, v in headers.items() if k.lower() not in SECRET_HEADERS}
        return self.dir / f"{self.seq:06d}.json", {"seq": self.seq, "time": time.time(), "route": route,
                                                  "headers": kept, "body": body}

    @staticmethod
    def write(path: Path, data: dict) -> None:
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)

    async def save(self, route: str, headers: dict[str, str], body: dict) -> None:
        path, data = self.entry(route, headers, body)
        await asyncio.to_thread(self.write, path, data)


_active: Recorder | None = None


def start_recording(directory: Path | None) -> Recorder | None:
    """Turn recording on for this daemon process (None: off)."""
    global _active
    _active = Recorder(directory) if directory is not None else None
    return _active


def active() -> Recorder | None:
    return _active
