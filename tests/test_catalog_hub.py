"""`bostudio pull` and the remote header read, run against a fake hub on 127.0.0.1 (nothing leaves the machine)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Iterator

import pytest

from bostudio.catalog import hub as hubmod
from bostudio.catalog.hub import pull
from bostudio.catalog.hubfiles import RemoteFile, select_files
from bostudio.catalog.remote import describe_remote, read_remote_sources
from bostudio.cli import main
from bostudio.errors import ModelError
from bostudio.gguf import describe, describe_header, parse_header
from bostudio.gguf.synth import tiny_llama, write_model
from benchmarks.hubserver import COMMIT, FakeHub, HubServer, use_hub

REPO = "org/Tiny-GGUF"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A fake hub serving a repo with two quants of one model and a 3-part split of another."""
    fake = FakeHub()
    (tmp_path / "src").mkdir()
    fake.add_file(REPO, "Tiny-Q8_0.gguf", tiny_llama(tmp_path / "src" / "Tiny-Q8_0.gguf"))
    fake.add_file(REPO, "Tiny-Q4_K_M.gguf", tiny_llama(tmp_path / "src" / "q4.gguf", n_layer=1))
    tiny_llama(tmp_path / "src" / "split.gguf", n_layer=3, split_max_tensors=12)
    for i in (1, 2, 3):
        fake.add_file(REPO, f"Q6_K/Tiny-Q6_K-0000{i}-of-00003.gguf",
                      tmp_path / "src" / f"split-0000{i}-of-00003.gguf")
    fake.add_file(REPO, "mmproj-Tiny-F16.gguf", b"not a model")
    fake.add_file(REPO, "README.md", b"# tiny")
    with HubServer(fake) as served:
        use_hub(served, tmp_path, monkeypatch)
        yield served
    assert all(not r.path.startswith("http") for r in fake.requests)


def _file_gets(hub: FakeHub) -> list[str]:
    return [r.path for r in hub.requests if "/resolve/" in r.path]


def test_pull_quant_tag_downloads_verified_file_into_hub_cache(hub: FakeHub, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", f"{REPO}:Q8_0"]) == 0
    out = capsys.readouterr()
    local = Path(out.out.strip())
    assert local == tmp_path / "hf" / "models--org--Tiny-GGUF" / "snapshots" / COMMIT / "Tiny-Q8_0.gguf"
    data = hub.repos[REPO]["Tiny-Q8_0.gguf"]
    assert local.read_bytes() == data
    assert local.resolve().name == hashlib.sha256(data).hexdigest()  # huggingface-hub's cache layout
    assert _file_gets(hub) == [f"/{REPO}/resolve/{COMMIT}/Tiny-Q8_0.gguf"]
    # a second pull finds it and fetches nothing
    assert main(["pull", f"{REPO}:q8_0"]) == 0
    assert len(_file_gets(hub)) == 1 and "already here" in capsys.readouterr().err
    # and the catalog lists it under the hub name
    assert main(["ls", "--json"]) == 0
    assert [e["name"] for e in json.loads(capsys.readouterr().out)] == [f"{REPO}:Q8_0"]


def test_pull_split_model_fetches_every_part(hub: FakeHub) -> None:
    first = pull(f"{REPO}:Q6_K", log=lambda m: None)
    assert first.name == "Tiny-Q6_K-00001-of-00003.gguf"
    assert sorted(p.name for p in first.parent.iterdir()) == [f"Tiny-Q6_K-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert describe(first).n_block == 3


def test_pull_without_tag_takes_q4_k_m(hub: FakeHub) -> None:
    assert pull(REPO, log=lambda m: None).name == "Tiny-Q4_K_M.gguf"


def test_interrupted_pull_leaves_no_final_file_and_resumes(hub: FakeHub, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    # http_get writes in DOWNLOAD_CHUNK_SIZE chunks (10 MB); small chunks let a small file be cut midway.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    data = hub.repos[REPO]["Tiny-Q8_0.gguf"]
    hub.cut_after["Tiny-Q8_0.gguf"] = 100_000
    with pytest.raises(ModelError, match="download stopped at") as err:
        pull(f"{REPO}:Q8_0", log=lambda m: None)
    assert "resumes" in err.value.hint
    storage = tmp_path / "hf" / "models--org--Tiny-GGUF"
    blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
    assert not blob.exists() and not (storage / "snapshots" / COMMIT / "Tiny-Q8_0.gguf").exists()
    partial = blob.with_name(blob.name + ".incomplete")
    have = partial.stat().st_size
    assert 0 < have <= 100_000 and partial.read_bytes() == data[:have]

    hub.failing.clear()
    logs: list[str] = []
    local = pull(f"{REPO}:Q8_0", log=logs.append)
    assert local.read_bytes() == data and not partial.exists()
    assert hub.requests[-1].range == f"bytes={have}-" and hub.requests[-1].sent == len(data) - have
    assert f"resuming at {have:,}" in logs[0]


def test_sha256_mismatch_discards_the_download(hub: FakeHub, tmp_path: Path) -> None:
    hub.corrupt.add("Tiny-Q8_0.gguf")
    with pytest.raises(ModelError, match="does not match the hub's"):
        pull(f"{REPO}:Q8_0", log=lambda m: None)
    storage = tmp_path / "hf" / "models--org--Tiny-GGUF"
    assert list((storage / "blobs").iterdir()) == []
    assert not (storage / "snapshots").exists()


def test_disk_space_is_checked_before_downloading(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hubmod.shutil, "disk_usage", lambda p: type("U", (), {"free": 1000})())
    with pytest.raises(ModelError, match="not enough disk space"):
        pull(f"{REPO}:Q8_0", log=lambda m: None)
    assert _file_gets(hub) == []


def test_unknown_repo_and_quant_are_clear_errors(hub: FakeHub) -> None:
    with pytest.raises(ModelError, match="hub repo org/None not found"):
        pull("org/None:Q4_K_M", log=lambda m: None)
    with pytest.raises(ModelError, match="no Q2_K file") as err:
        pull(f"{REPO}:Q2_K", log=lambda m: None)
    assert "Q4_K_M, Q6_K, Q8_0" in err.value.hint


def test_remote_header_read_fetches_only_the_header(hub: FakeHub, tmp_path: Path) -> None:
    # A model whose tensor data (4 MiB) dwarfs its header: the reader must not touch the data.
    big = write_model(tmp_path / "src" / "Wide-F32.gguf", "llama",
                      {".block_count": 1, ".embedding_length": 1024, ".context_length": 512},
                      {"blk.0.attn_norm.weight": (1024,), "blk.0.ffn_up.weight": (1024, 1024)})
    hub.add_file(REPO, "Wide-F32.gguf", big)
    files, sources = read_remote_sources(f"{REPO}:Wide-F32.gguf")
    header = parse_header(sources[0])
    info = describe_header(header)
    header_bytes = header.data_offsets[0]
    assert sources[0].fetched == hub.bytes_sent("Wide-F32.gguf")
    assert sources[0].fetched <= max(2 * header_bytes, sources[0].first_read)
    assert sources[0].fetched < files[0].size // 8
    local = describe(big)
    assert info.tensor_bytes == local.tensor_bytes == 4 * (1024 + 1024 * 1024)
    assert dataclasses.replace(info, path=local.path, parts=local.parts,
                               tokenizer=dataclasses.replace(info.tokenizer, tokens=local.tokenizer.tokens)) == local


def test_remote_split_model_and_cli_show(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    info = describe_remote(f"{REPO}:Q6_K")
    assert (info.n_block, len(info.parts)) == (3, 3)
    assert _file_gets(hub) and all(r.range for r in hub.requests if "/resolve/" in r.path)
    assert main(["show", f"{REPO}:Q8_0", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["name"] == f"{REPO}:Q8_0" and shown["architecture"] == "llama" and shown["n_block"] == 2


def _listing(*names: str) -> list[RemoteFile]:
    return [RemoteFile(n, 1, "0" * 64) for n in names]


@pytest.mark.parametrize("ref, names, expected", [
    ("o/r:Q4_K_M", ["a-Q4_K_M.gguf", "a-Q8_0.gguf"], ["a-Q4_K_M.gguf"]),
    ("o/r:q8_0", ["a-Q4_K_M.gguf", "a-Q8_0.gguf"], ["a-Q8_0.gguf"]),
    ("o/r", ["a-Q8_0.gguf", "a-Q4_K_M.gguf"], ["a-Q4_K_M.gguf"]),
    ("o/r", ["only-F16.gguf", "mmproj-F16.gguf"], ["only-F16.gguf"]),
    ("o/r:Q4_K", ["a-Q4_K_M.gguf", "a-Q4_K.gguf"], ["a-Q4_K.gguf"]),
    ("o/r:Q4_K_M", ["Q4_K_M/a-Q4_K_M-00002-of-00002.gguf", "Q4_K_M/a-Q4_K_M-00001-of-00002.gguf"],
     ["Q4_K_M/a-Q4_K_M-00001-of-00002.gguf", "Q4_K_M/a-Q4_K_M-00002-of-00002.gguf"]),
    ("o/r:a-Q4_K_M-00002-of-00002.gguf", ["a-Q4_K_M-00001-of-00002.gguf", "a-Q4_K_M-00002-of-00002.gguf"],
     ["a-Q4_K_M-00001-of-00002.gguf", "a-Q4_K_M-00002-of-00002.gguf"]),
    ("o/r:exact.gguf", ["exact.gguf", "other-Q4_K_M.gguf"], ["exact.gguf"]),
])
def test_select_files(ref: str, names: list[str], expected: list[str]) -> None:
    assert [f.path for f in select_files(ref, _listing(*names))] == expected


@pytest.mark.parametrize("ref, names, message", [
    ("o/r:Q4_K_M", ["a-Q4_K_M.gguf", "b-Q4_K_M.gguf"], "ambiguous: a-Q4_K_M.gguf, b-Q4_K_M.gguf"),
    ("o/r", ["a-Q8_0.gguf", "b-Q6_K.gguf"], "no Q4_K_M file"),
    ("o/r:Q4_K_M", ["a-Q4_K_M-00001-of-00003.gguf", "a-Q4_K_M-00003-of-00003.gguf"],
     "lacks split part(s) a-Q4_K_M-00002-of-00003.gguf"),
    ("o/r", ["README.md"], "no GGUF model files"),
    ("not a repo", ["a.gguf"], "not a hub repo reference"),
    ("o/r:missing.gguf", ["a.gguf"], "no file(s) named 'missing.gguf'"),
])
def test_select_files_errors(ref: str, names: list[str], message: str) -> None:
    with pytest.raises(ModelError) as err:
        select_files(ref, _listing(*names))
    assert message in err.value.message


def test_pull_shows_a_progress_bar_on_a_terminal(hub: FakeHub) -> None:
    """huggingface-hub draws its bar when stderr is a terminal (not in logs): run pull on a pseudo-terminal."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # tqdm sizes bars to it
    proc = subprocess.Popen([sys.executable, "-m", "bostudio", "pull", f"{REPO}:Q4_K_M"],
                            stdout=subprocess.PIPE, stderr=slave, cwd=Path(__file__).resolve().parent.parent)
    os.close(slave)
    err = b""
    while True:  # read while it runs: a closed pty may drop what nobody read
        if select.select([master], [], [], 60)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            err += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, err
    text = err.decode(errors="replace")
    assert "Tiny-Q4_K_M.gguf" in text and "100%" in text
    assert out.decode().strip().endswith("Tiny-Q4_K_M.gguf")
