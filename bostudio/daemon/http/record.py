"""`bostudio daemon --record DIR`: every request body the daemon reads, saved in the order received, so that
`bostudio bench --workload DIR` can replay a real agent's session turn by turn.

One file per request, DIR/NNNNNN.json (0600, in a directory of the user's own: created 0700, refused when
another user owns it or may write to it): {"seq", "time", "route", "headers" (credentials left out), "body"}.
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
from bostudio.files import private_dir, write_private

SECRET_HEADERS = {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie", "set-cookie",
                  "anthropic-api-key", "openai-api-key", "x-goog-api-key"}
_NAME = re.compile(r"^(\d{6,})\.json$")


class Recorder:
    """Saves request bodies to `directory`, numbered after whatever it already holds."""

    def __init__(self, directory: Path) -> None:
        # Recordings hold every prompt: a directory of the user's own (created 0700), files 0600.
        d = private_dir(directory.expanduser())
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
        # Owner-only, through an exclusively created temporary file: a link planted at a predictable
        # temporary name cannot redirect the write.
        write_private(path, json.dumps(data, ensure_ascii=False))

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
