"""`bostudio pull`: fetch a GGUF model from the Hugging Face hub into the hub cache, with huggingface-hub.

The files land where huggingface-hub itself puts them (models--ORG--NAME/blobs + snapshots/REV symlinks),
so every tool that reads the hub cache sees them. What hf_hub_download does not give us, we add around its
building blocks (HfApi for metadata, build_hf_headers, http_get with its progress bar and retries):
  - resuming across runs: bytes go to blobs/<sha256>.incomplete, which a later pull continues;
  - a sha256 check against the hub's LFS metadata before a blob gets its final name;
  - a disk-space check for all parts before the first byte is fetched.
A failed or interrupted pull never leaves a file under a final name.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import quote

from bostudio import paths
from bostudio.catalog.digest import sha256_file
from bostudio.catalog.hubfiles import RemoteFile, parse_ref, select_files
from bostudio.errors import ModelError
from bostudio.files import write_atomic

METADATA_TIMEOUT = 30.0
_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
DISK_MARGIN = 64 * 1024 * 1024


def hub_endpoint() -> str:
    """The hub to talk to: HF_ENDPOINT (read now, not at import), else huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


@dataclass(frozen=True)
class RepoListing:
    repo: str
    commit: str
    files: list[RemoteFile]


def list_repo(repo: str, revision: str = "main") -> RepoListing:
    """The repo's files with sizes and sha256 (one metadata request)."""
    import httpx2  # huggingface-hub's HTTP client
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = HfApi(endpoint=hub_endpoint()).model_info(repo, revision=revision, files_metadata=True,
                                                         timeout=METADATA_TIMEOUT)
    except RepositoryNotFoundError as exc:
        raise ModelError(f"hub repo {repo} not found (or private)",
                         "check the name; for a private or gated repo run `hf auth login`") from exc
    except RevisionNotFoundError as exc:
        raise ModelError(f"{repo} has no revision {revision!r}", "use --revision main") from exc
    except HfHubHTTPError as exc:
        raise ModelError(f"hub request for {repo} failed: {exc}", "retry later; check HF_ENDPOINT") from exc
    except (httpx2.TransportError, OSError) as exc:  # connection refused, DNS, timeouts
        raise ModelError(f"cannot reach the hub at {hub_endpoint()}: {exc}", "check your network") from exc
    files = [RemoteFile(s.rfilename, int(s.size or (s.lfs.size if s.lfs else 0)), s.lfs.sha256 if s.lfs else None)
             for s in info.siblings or []]
    return RepoListing(repo, str(info.sha), files)


def file_url(repo: str, commit: str, path: str) -> str:
    """The hub's resolve URL of a file (hf_hub_url's format, but with the endpoint read now)."""
    return f"{hub_endpoint()}/{repo}/resolve/{quote(commit, safe='')}/{quote(path)}"


def _storage(repo: str, cache: Path) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def _complete(pointer: Path, f: RemoteFile) -> bool:
    return pointer.is_file() and pointer.stat().st_size == f.size


def _free_bytes(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def check_disk_space(storage: Path, files: list[RemoteFile]) -> None:
    """Refuse before downloading when the parts still to fetch do not fit (with a margin)."""
    need = 0
    for f in files:
        blob = storage / "blobs" / (f.sha256 or "")
        if blob.is_file():
            continue
        partial = blob.with_name(blob.name + ".incomplete")
        need += f.size - (partial.stat().st_size if partial.is_file() else 0)
    free = _free_bytes(storage)
    if need + DISK_MARGIN > free:
        raise ModelError(f"not enough disk space: the download needs {need:,} bytes, {free:,} are free "
                         f"under {storage}", "free some space, or set HF_HUB_CACHE to a bigger disk")


def _link(blob: Path, pointer: Path) -> None:
    pointer.parent.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(f".{pointer.name}.link")
    tmp.unlink(missing_ok=True)
    try:
        tmp.symlink_to(os.path.relpath(blob, pointer.parent))
    except OSError:
        shutil.copyfile(blob, tmp)  # no symlinks on this filesystem: a full copy, as huggingface-hub does
    os.replace(tmp, pointer)


def _download(repo: str, commit: str, f: RemoteFile, storage: Path, log: Callable[[str], None]) -> Path:
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    assert f.sha256  # checked by the caller
    pointer = storage / "snapshots" / commit / f.path
    if _complete(pointer, f):
        log(f"{f.path}: already here")
        return pointer
    blob = storage / "blobs" / f.sha256
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = storage.parent / ".locks" / storage.name / f"{f.sha256}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):
        if not (blob.is_file() and blob.stat().st_size == f.size):
            partial = blob.with_name(blob.name + ".incomplete")
            have = partial.stat().st_size if partial.is_file() else 0
            if have > f.size:
                partial.unlink()
                have = 0
            if have:
                log(f"{f.path}: resuming at {have:,} of {f.size:,} bytes")
            try:
                with open(partial, "r+b" if have else "wb") as out:
                    out.seek(have)
                    http_get(file_url(repo, commit, f.path), out, resume_size=have, expected_size=f.size,
                             headers=build_hf_headers(), displayed_filename=f.path.rsplit("/", 1)[-1])
            except (HfHubHTTPError, httpx2.HTTPError, OSError) as exc:
                done = partial.stat().st_size if partial.is_file() else 0
                raise ModelError(f"{f.path}: download stopped at {done:,} of {f.size:,} bytes: "
                                 f"{str(exc).splitlines()[0]}",
                                 "run the same `bostudio pull` again: it resumes where it stopped") from exc
            got = sha256_file(partial)
            if got != f.sha256:
                partial.unlink()
                raise ModelError(f"{f.path}: sha256 {got} does not match the hub's {f.sha256}; the download "
                                 f"was discarded", "run the pull again; if it keeps failing the upload is broken")
            os.replace(partial, blob)
        _link(blob, pointer)
    return pointer


def _check_names(repo: str, commit: str, files: list[RemoteFile]) -> None:
    """Names from the hub become paths on disk: accept only safe ones."""
    if not _HEX40.fullmatch(commit):
        raise ModelError(f"{repo}: the hub answered with an odd commit id {commit!r}", "check HF_ENDPOINT")
    for f in files:
        if not f.sha256 or not _HEX64.fullmatch(f.sha256):
            raise ModelError(f"{repo}/{f.path}: the hub gives no sha256 for it (not an LFS file)",
                             "bostudio only pulls files it can verify")
        parts = f.path.split("/")
        if f.path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ModelError(f"{repo}: refusing the unsafe file name {f.path!r}", "check HF_ENDPOINT")


def pull(ref: str, revision: str = "main", log: Callable[[str], None] = print) -> Path:
    """Download the model `ref` (REPO[:QUANT|:FILE]) into the hub cache; return its (first) local path."""
    repo, _ = parse_ref(ref)
    listing = list_repo(repo, revision)
    files = select_files(ref, listing.files)
    _check_names(repo, listing.commit, files)
    storage = _storage(repo, paths.hf_cache_dir())
    check_disk_space(storage, files)
    local = [_download(repo, listing.commit, f, storage, log) for f in files]
    if revision != listing.commit:
        write_atomic(storage / "refs" / revision, listing.commit, mode=0o644)  # as huggingface-hub leaves it
    return local[0]


def cached_path(ref: str) -> Path | None:
    """The local copy of `ref` (REPO[:QUANT|:FILE]) in the hub cache, all split parts complete, or None.
    Looks at disk only (no network): the snapshot `refs/main` points to first, then any other."""
    repo, _ = parse_ref(ref)
    storage = _storage(repo, paths.hf_cache_dir())
    snapshots = storage / "snapshots"
    if not snapshots.is_dir():
        return None
    main = storage / "refs" / "main"
    head = main.read_text().strip() if main.is_file() else ""
    for snap in sorted(snapshots.iterdir(), key=lambda p: p.name != head):
        listing = [RemoteFile(str(f.relative_to(snap)), f.stat().st_size, None)
                   for f in snap.rglob("*.gguf") if f.is_file()]  # is_file follows the blob symlink
        try:
            files = select_files(ref, listing)
        except ModelError:
            continue
        return snap / files[0].path
    return None
