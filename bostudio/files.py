"""Files bostudio writes whole: written atomically, so a reader (another command, a restarted daemon, a
crash) sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write `text` (UTF-8) to `path`: a temporary file in the same folder, fsync, then rename over `path`.
    The file gets `mode`; by default the mode the file had (a user's own table keeps theirs), and for a new
    file, readable by its owner only (state, profiles, units). The folder is created when missing."""
    if mode is None:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except OSError:
            mode = 0o600
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
