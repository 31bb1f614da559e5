"""Plan before download: read a hub model's GGUF header with HTTP range requests.

Only the header is fetched (metadata, token arrays, tensor infos: a few MB even for a 262k vocabulary), in
growing ranges as the reader asks for them; tensor data is never requested. The result is the same ModelInfo
describe() gives for the local file, so `plan` and `show` work on `REPO:QUANT` before it is on disk.
"""

from __future__ import annotations

from bostudio.catalog.hub import file_url, list_repo
from bostudio.catalog.hubfiles import RemoteFile, parse_ref, select_files
from bostudio.errors import GGUFFormatError, ModelError
from bostudio.gguf import ModelInfo, describe_header, merge_parts, parse_header

RANGE_TIMEOUT = 30.0


class HttpRangeSource:
    """A ByteSource over a remote file: each read is one `Range: bytes=a-b` GET (redirects followed)."""

    first_read = 64 * 1024  # the reader grows its reads by doubling from here

    def __init__(self, url: str, size: int, name: str) -> None:
        self.url = url
        self.size = size
        self.name = name
        self.fetched = 0  # bytes received, for the "header only" promise
        self.requests = 0

    def read(self, offset: int, n: int) -> bytes:
        import httpx2
        from huggingface_hub import get_session
        from huggingface_hub.utils import build_hf_headers

        headers = {**build_hf_headers(), "Range": f"bytes={offset}-{offset + n - 1}",
                   "Accept-Encoding": "identity"}
        try:
            r = get_session().get(self.url, headers=headers, follow_redirects=True, timeout=RANGE_TIMEOUT)
        except httpx2.HTTPError as exc:
            raise ModelError(f"{self.name}: range request failed: {exc}", "check your network, retry") from exc
        self.requests += 1
        if r.status_code != 206:
            raise ModelError(f"{self.name}: the server answered {r.status_code} to a range request",
                             "this host does not serve byte ranges; download the model with `bostudio pull`")
        data = r.content
        self.fetched += len(data)
        if len(data) != n:
            raise GGUFFormatError(f"{self.name}: asked for {n:,} bytes at {offset:,}, got {len(data):,}",
                                  "the remote file changed or is shorter than the hub says")
        return data


def read_remote_sources(ref: str, revision: str = "main") -> tuple[list[RemoteFile], list[HttpRangeSource]]:
    """The selected files of `ref` and a range source for each (nothing fetched yet)."""
    repo, _ = parse_ref(ref)
    listing = list_repo(repo, revision)
    files = select_files(ref, listing.files)
    sources = [HttpRangeSource(file_url(repo, listing.commit, f.path), f.size, f"{repo}:{f.path}") for f in files]
    return files, sources


def describe_remote(ref: str, revision: str = "main") -> ModelInfo:
    """Describe the hub model `ref` (REPO[:QUANT|:FILE]) from its header alone, all split parts included."""
    _, sources = read_remote_sources(ref, revision)
    return describe_header(merge_parts([parse_header(s) for s in sources]))
