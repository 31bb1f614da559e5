"""Files bostudio writes whole: written atomically, so a reader (another command, a restarted daemon, a
crash) sees the old file or the new one, never half of one. Files that hold prompts or secrets are
written owner-only into a directory only their owner may write (write_private)."""

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


def owner_problem(st: os.stat_result) -> str | None:
    """Why a file or directory with this stat is not this user's alone to write, or None."""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_dir(directory: Path) -> Path:
    """`directory`, created owner-only (0700) when missing, for files that hold prompts or secrets.
    Raises ConfigError when it is no directory, or another user owns it or may write to it (they could
    swap or read what bostudio writes there)."""
    from bostudio.errors import ConfigError

    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.stat(directory)
    except OSError as exc:
        raise ConfigError(f"cannot create the directory {directory}: {exc.strerror or exc}",
                          "pass a directory of your own") from exc
    problem = "is not a directory" if not stat.S_ISDIR(st.st_mode) else owner_problem(st)
    if problem:
        raise ConfigError(f"the directory {directory} {problem}", "use a directory of your own (mode 0700)")
    return directory


def write_private(path: Path, text: str) -> None:
    """write_atomic() for a file holding prompts or secrets (a token, an agent config with the token):
    owner-only (0600) whatever mode an existing file had, in a private_dir(). The temporary file is
    created exclusively (O_EXCL: a link planted at its name is never followed) and renamed over `path`
    (a link at `path` is replaced, not followed)."""
    private_dir(path.parent)
    write_atomic(path, text, mode=0o600)
