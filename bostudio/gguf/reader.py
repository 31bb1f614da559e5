"""A bounded, lazy GGUF header reader.

It reads the header, the key/value metadata and the tensor-info table, and nothing else. Big arrays (token
lists, merges, scores) are *located*, not parsed: the reader walks over them, records where they are and a
sha256 of their raw bytes, and only decodes arrays small enough to be hyperparameters. Every count, length and
offset is checked against what is left of the file before anything is read or allocated, and the only
exception that leaves this module is `GGUFFormatError`, naming the file and what is wrong.

The byte layout (ggml/src/gguf.cpp, gguf-py gguf_writer.py):
    magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
    n_kv x (string key, u32 type, value)         string = u64 length + UTF-8 bytes
                                                 array  = u32 element type + u64 count + elements
    n_tensors x (string name, u32 n_dims, n_dims x i64 ne, u32 ggml type, u64 offset)
    padding to general.alignment (default 32), then the tensor data.
The checks mirror gguf.cpp's, so a file this reader accepts is one llama.cpp can open.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Protocol

from bostudio.errors import GGUFFormatError
from bostudio.gguf.ggml_types import GGML_TYPES, tensor_nbytes

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # tensor names are shorter than this (gguf.cpp)

# Arrays up to this many elements are decoded (hyperparameters, per-layer values, tags); longer ones are
# only located. The largest per-layer array in a real model has a few hundred entries.
SMALL_ARRAY = 4096
# Limits a hostile header cannot talk us past, whatever the file size: no real key is this long, no real
# metadata string (chat templates included) this big, no real header this large.
MAX_KEY_BYTES = 64 * 1024
MAX_STRING_BYTES = 16 * 1024 * 1024
MAX_HEADER_BYTES = 512 * 1024 * 1024

_HINT = "the file is damaged, truncated or not a GGUF model; download it again"


class ValueType(IntEnum):
    """GGUF metadata value types (gguf-py constants.py GGUFValueType)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct codes and sizes of the fixed-size value types
_SCALAR_CODES = {
    ValueType.UINT8: "B", ValueType.INT8: "b", ValueType.UINT16: "H", ValueType.INT16: "h",
    ValueType.UINT32: "I", ValueType.INT32: "i", ValueType.FLOAT32: "f", ValueType.BOOL: "?",
    ValueType.UINT64: "Q", ValueType.INT64: "q", ValueType.FLOAT64: "d",
}
_SCALAR_SIZES = {t: struct.calcsize(c) for t, c in _SCALAR_CODES.items()}
INTEGER_TYPES = frozenset({ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16,
                           ValueType.UINT32, ValueType.INT32, ValueType.UINT64, ValueType.INT64})
FLOAT_TYPES = frozenset({ValueType.FLOAT32, ValueType.FLOAT64})


@dataclass(frozen=True, slots=True)
class ArrayRef:
    """An array value, located in its file: where its elements start, how many bytes they take, their sha256.

    `values` holds the decoded elements for arrays of at most SMALL_ARRAY elements, else None; call
    `read_strings()` on a local file to decode a big string array on demand.
    """

    elem_type: ValueType
    count: int
    offset: int  # absolute file offset of the first element
    nbytes: int
    sha256: str  # of the raw element bytes
    source: str = field(compare=False)  # file path (or URL) the array lives in
    byteorder: str = field(default="<", compare=False)
    values: tuple | None = field(default=None, compare=False, repr=False)

    def read_strings(self, start: int = 0, stop: int | None = None) -> list[str]:
        """Decode elements [start, stop) of a string array, reading its local file now."""
        if self.elem_type != ValueType.STRING:
            raise GGUFFormatError(f"{self.source}: array holds {self.elem_type.name}, not strings")
        stop = self.count if stop is None else min(stop, self.count)
        start = max(0, start)
        if self.values is not None:
            return list(self.values[start:stop])
        data = _read_local_span(self.source, self.offset, self.nbytes)
        u64 = struct.Struct(self.byteorder + "Q").unpack_from
        out: list[str] = []
        off = 0
        for i in range(stop):
            (n,) = u64(data, off)
            off += 8
            if i >= start:
                out.append(data[off:off + n].decode("utf-8", "replace"))
            off += n
        return out


def open_regular(path: str | os.PathLike[str]):
    """`path` opened for binary reading, refusing anything but a regular file (a FIFO, a device, a
    socket, a directory) *before* open(): opening a FIFO blocks until a writer comes, reading a device
    never ends. O_NONBLOCK closes the race with a swap after the check (it is a no-op for regular files).
    Raises OSError; GGUFFormatError for a non-regular file."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise GGUFFormatError(f"{path}: not a regular file ({_file_kind(st.st_mode)})",
                              "give the path of a .gguf file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GGUFFormatError(f"{path}: not a regular file", "give the path of a .gguf file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a plain file"


def _read_local_span(source: str, offset: int, nbytes: int) -> bytes:
    try:
        with open_regular(source) as f:
            f.seek(offset)
            data = f.read(nbytes)
    except OSError as exc:
        raise GGUFFormatError(f"{source}: cannot read array data: {exc.strerror or exc}",
                              "the array can only be read from a local file") from exc
    if len(data) != nbytes:
        raise GGUFFormatError(f"{source}: file changed or shrank since its header was read", _HINT)
    return data


@dataclass(frozen=True, slots=True)
class Field:
    """One metadata key/value pair. Arrays have type ARRAY and an ArrayRef value."""

    key: str
    type: ValueType
    value: object


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One entry of the tensor-info table. `shape` is in ggml order (ne0 first)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the start of the data section of its part
    n_elements: int
    n_bytes: int
    part: int = 0  # index of the split file holding the data

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]


@dataclass(frozen=True)
class Header:
    """The parsed header of a GGUF model (all split parts merged into one)."""

    path: Path  # the first (or only) part
    parts: tuple[Path, ...]
    part_sizes: tuple[int, ...]
    data_offsets: tuple[int, ...]  # per part: where the tensor data starts (= header bytes of that part)
    version: int
    byteorder: str  # "<" little endian, ">" big endian
    alignment: int
    fields: Mapping[str, Field]
    tensors: tuple[TensorInfo, ...]

    @property
    def file_size(self) -> int:
        return sum(self.part_sizes)

    def get(self, key: str, default: object = None) -> object:
        """The value of metadata key `key` (an ArrayRef for arrays), or `default`."""
        f = self.fields.get(key)
        return default if f is None else f.value

    def _wrong(self, f: Field, expected: str) -> GGUFFormatError:
        got = f.type.name if f.type != ValueType.ARRAY else f"ARRAY of {f.value.elem_type.name}"  # type: ignore[attr-defined]
        return GGUFFormatError(f"{self.path}: metadata key {f.key!r} has type {got}, expected {expected}", _HINT)

    def _typed(self, key: str, allowed: frozenset[ValueType], expected: str) -> Field | None:
        f = self.fields.get(key)
        if f is not None and f.type not in allowed:
            raise self._wrong(f, expected)
        return f

    def int_value(self, key: str) -> int | None:
        """An integer key's value (any integer type), None when absent; another type is a format error."""
        f = self._typed(key, INTEGER_TYPES, "an integer")
        return None if f is None else int(f.value)  # type: ignore[call-overload]

    def float_value(self, key: str) -> float | None:
        """A float key's value (integers accepted), None when absent."""
        f = self._typed(key, FLOAT_TYPES | INTEGER_TYPES, "a number")
        return None if f is None else float(f.value)  # type: ignore[arg-type]

    def bool_value(self, key: str) -> bool | None:
        """A BOOL key's value, None when absent."""
        f = self._typed(key, frozenset({ValueType.BOOL}), "BOOL")
        return None if f is None else bool(f.value)

    def str_value(self, key: str) -> str | None:
        """A STRING key's value, None when absent."""
        f = self._typed(key, frozenset({ValueType.STRING}), "STRING")
        return None if f is None else str(f.value)

    def array_value(self, key: str, elem_types: frozenset[ValueType] | None = None) -> ArrayRef | None:
        """An ARRAY key's ArrayRef (optionally of one of `elem_types`), None when absent."""
        f = self._typed(key, frozenset({ValueType.ARRAY}), "an array")
        if f is None:
            return None
        ref: ArrayRef = f.value  # type: ignore[assignment]
        if elem_types is not None and ref.elem_type not in elem_types:
            raise self._wrong(f, "an array of " + "/".join(sorted(t.name for t in elem_types)))
        return ref

    @property
    def architecture(self) -> str:
        value = self.get("general.architecture")
        if not isinstance(value, str) or not value:
            raise GGUFFormatError(f"{self.path}: general.architecture is missing or not a string", _HINT)
        return value


class ByteSource(Protocol):
    """Random access to the bytes of one file: a local file, or a remote one read with range requests."""

    name: str
    size: int

    def read(self, offset: int, n: int) -> bytes:
        """Return bytes [offset, offset+n); the caller keeps offset+n <= size."""
        ...


class LocalFile:
    """A ByteSource over an open local file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.name = str(path)
        try:
            self._f = open_regular(path)
            self.size = os.fstat(self._f.fileno()).st_size
        except OSError as exc:
            raise GGUFFormatError(f"{path}: cannot open: {exc.strerror or exc}",
                                  "check that the path exists and is readable") from exc

    def read(self, offset: int, n: int) -> bytes:
        try:
            self._f.seek(offset)
            return self._f.read(n)
        except OSError as exc:
            raise GGUFFormatError(f"{self.name}: read failed: {exc.strerror or exc}", _HINT) from exc

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "LocalFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BytesSource:
    """A ByteSource over bytes already in memory (a test fixture, a fetched header)."""

    def __init__(self, data: bytes, name: str = "<memory>") -> None:
        self.name = name
        self.size = len(data)
        self._data = data

    def read(self, offset: int, n: int) -> bytes:
        return self._data[offset:offset + n]


class _Cursor:
    """The header bytes read so far, grown on demand from the source, and a position in them."""

    FIRST_READ = 256 * 1024

    def __init__(self, source: ByteSource) -> None:
        self.src = source
        # A remote source asks for smaller first reads: each byte it fetches is a byte downloaded.
        self.first_read = getattr(source, "first_read", self.FIRST_READ)
        self.size = source.size
        self.buf = bytearray()
        self.pos = 0

    def fail(self, what: str) -> GGUFFormatError:
        return GGUFFormatError(f"{self.src.name}: {what}", _HINT)

    def need(self, end: int, what: str) -> None:
        """Make sure bytes [0, end) are in the buffer, or fail naming `what` could not be read."""
        have = len(self.buf)
        if end <= have:
            return
        if end > self.size:
            raise self.fail(f"{what} runs past the end of the file "
                            f"(needs byte {end:,}, file has {self.size:,})")
        if end > MAX_HEADER_BYTES:
            raise self.fail(f"{what} would make the header larger than {MAX_HEADER_BYTES:,} bytes")
        want = min(self.size, MAX_HEADER_BYTES, max(end, have * 2, self.first_read))
        chunk = self.src.read(have, want - have)
        if len(chunk) != want - have:
            raise self.fail(f"short read at byte {have:,} (file changed while reading?)")
        self.buf += chunk


def _parse_one(source: ByteSource) -> Header:
    """Parse the header of one file (one split part) from `source`."""
    cur = _Cursor(source)
    buf = cur.buf
    name = source.name

    cur.need(24, "the GGUF header")
    if bytes(buf[0:4]) != MAGIC:
        raise cur.fail("not a GGUF file (it does not start with the GGUF magic)")  # no file bytes echoed
    (version,) = struct.unpack_from("<I", buf, 4)
    bo = "<"
    if version & 0xFFFF == 0 and version != 0:
        (swapped,) = struct.unpack_from(">I", buf, 4)
        if swapped in (2, 3):
            bo, version = ">", swapped
    if version == 1:
        raise GGUFFormatError(f"{name}: GGUF version 1 is no longer supported by llama.cpp",
                              "convert the model again with a current llama.cpp")
    if version not in (2, 3):
        raise cur.fail(f"unsupported GGUF version {version}")
    u32 = struct.Struct(bo + "I").unpack_from
    u64 = struct.Struct(bo + "Q").unpack_from
    i64 = struct.Struct(bo + "q").unpack_from
    n_tensors, n_kv = struct.unpack_from(bo + "QQ", buf, 8)
    cur.pos = 24
    # The smallest possible KV pair is 13 bytes (u64 key length, 1-byte key, u32 type, 1-byte value) and the
    # smallest tensor info 25 (u64 name length, 1-byte name, u32 n_dims, u32 type, u64 offset).
    if n_kv * 13 > source.size - 24:
        raise cur.fail(f"metadata count {n_kv:,} cannot fit in a {source.size:,}-byte file")
    if n_tensors * 25 > source.size - 24:
        raise cur.fail(f"tensor count {n_tensors:,} cannot fit in a {source.size:,}-byte file")

    def read_string(what: str, limit: int) -> str:
        pos = cur.pos
        cur.need(pos + 8, what)
        (n,) = u64(buf, pos)
        if n > limit:
            raise cur.fail(f"{what} is {n:,} bytes long (limit {limit:,})")
        cur.need(pos + 8 + n, what)
        cur.pos = pos + 8 + n
        return buf[pos + 8:pos + 8 + n].decode("utf-8", "replace")

    def read_u32(what: str) -> int:
        cur.need(cur.pos + 4, what)
        (v,) = u32(buf, cur.pos)
        cur.pos += 4
        return v

    def read_array(key: str) -> ArrayRef:
        what = f"array {key!r}"
        cur.need(cur.pos + 12, what)
        (etype,) = u32(buf, cur.pos)
        (count,) = u64(buf, cur.pos + 4)
        cur.pos += 12
        if etype == ValueType.ARRAY or etype > max(ValueType):
            raise cur.fail(f"array {key!r} has invalid element type {etype}")
        etype = ValueType(etype)
        start = cur.pos
        remaining = source.size - start
        if etype == ValueType.STRING:
            if count * 8 > remaining:
                raise cur.fail(f"array {key!r} claims {count:,} strings, more than the file can hold")
            values = _walk_strings(cur, key, count, keep=count <= SMALL_ARRAY, u64=u64)
        else:
            esize = _SCALAR_SIZES[etype]
            if count * esize > remaining:
                raise cur.fail(f"array {key!r} claims {count:,} elements, more than the file can hold")
            cur.need(start + count * esize, what)
            cur.pos = start + count * esize
            values = None
            if count <= SMALL_ARRAY:
                values = struct.unpack_from(f"{bo}{count}{_SCALAR_CODES[etype]}", buf, start)
        end = cur.pos
        digest = hashlib.sha256(buf[start:end]).hexdigest()
        return ArrayRef(etype, count, start, end - start, digest, name, bo,
                        tuple(values) if values is not None else None)

    fields: dict[str, Field] = {}
    for i in range(n_kv):
        key = read_string(f"metadata key #{i}", MAX_KEY_BYTES)
        if not key:
            raise cur.fail(f"metadata key #{i} is empty")
        if key in fields:
            raise cur.fail(f"duplicate metadata key {key!r}")
        vtype = read_u32(f"the type of {key!r}")
        if vtype == ValueType.STRING:
            value: object = read_string(f"the value of {key!r}", MAX_STRING_BYTES)
        elif vtype == ValueType.ARRAY:
            value = read_array(key)
        elif vtype in _SCALAR_CODES:
            vtype = ValueType(vtype)
            size = _SCALAR_SIZES[vtype]
            cur.need(cur.pos + size, f"the value of {key!r}")
            (value,) = struct.unpack_from(bo + _SCALAR_CODES[vtype], buf, cur.pos)
            cur.pos += size
        else:
            raise cur.fail(f"metadata key {key!r} has invalid type {vtype}")
        fields[key] = Field(key, ValueType(vtype), value)

    alignment = DEFAULT_ALIGNMENT
    af = fields.get("general.alignment")
    if af is not None:
        if af.type != ValueType.UINT32:
            raise cur.fail(f"general.alignment has type {af.type.name}, expected UINT32")
        alignment = int(af.value)  # type: ignore[call-overload]
        if alignment == 0 or alignment & (alignment - 1):
            raise cur.fail(f"general.alignment {alignment} is not a power of 2")

    tensors: list[TensorInfo] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        tname = read_string(f"tensor name #{i}", GGML_MAX_NAME - 1)
        if tname in seen:
            raise cur.fail(f"duplicate tensor name {tname!r}")
        seen.add(tname)
        n_dims = read_u32(f"the shape of tensor {tname!r}")
        if n_dims > GGML_MAX_DIMS:
            raise cur.fail(f"tensor {tname!r} has {n_dims} dimensions (at most {GGML_MAX_DIMS})")
        cur.need(cur.pos + 8 * n_dims + 12, f"tensor info {tname!r}")
        shape = tuple(i64(buf, cur.pos + 8 * d)[0] for d in range(n_dims))
        cur.pos += 8 * n_dims
        if any(d < 0 for d in shape):
            raise cur.fail(f"tensor {tname!r} has a negative dimension {shape}")
        n_elements = 1
        for d in shape:
            n_elements *= d
        if n_elements >= 2**63:
            raise cur.fail(f"tensor {tname!r} shape {shape} overflows")
        (gtype,) = u32(buf, cur.pos)
        (offset,) = u64(buf, cur.pos + 4)
        cur.pos += 12
        if gtype not in GGML_TYPES:
            raise cur.fail(f"tensor {tname!r} has unknown ggml type {gtype}")
        block = GGML_TYPES[gtype][1]
        if shape and shape[0] % block:
            raise cur.fail(f"tensor {tname!r} has rows of {shape[0]} elements, not a multiple of "
                           f"the {GGML_TYPES[gtype][0]} block size {block}")
        tensors.append(TensorInfo(tname, shape, gtype, offset, n_elements,
                                  tensor_nbytes(gtype, n_elements)))

    data_offset = cur.pos if not tensors else -(-cur.pos // alignment) * alignment
    # Tensor data must be laid out back to back in order, each padded to the alignment (gguf.cpp); that
    # also rules out misaligned and overlapping tensors. Every byte must lie inside the file.
    expected = 0
    for t in tensors:
        if t.offset != expected:
            raise cur.fail(f"tensor {t.name!r} has data offset {t.offset:,}, expected {expected:,} "
                           f"(misaligned or overlapping tensor data)")
        if data_offset + t.offset + t.n_bytes > source.size:
            raise cur.fail(f"the data of tensor {t.name!r} runs past the end of the file "
                           f"(needs byte {data_offset + t.offset + t.n_bytes:,}, file has {source.size:,})")
        expected += -(-t.n_bytes // alignment) * alignment

    path = Path(name)
    return Header(path=path, parts=(path,), part_sizes=(source.size,), data_offsets=(data_offset,),
                  version=version, byteorder=bo, alignment=alignment,
                  fields=MappingProxyType(fields), tensors=tuple(tensors))


def _walk_strings(cur: _Cursor, key: str, count: int, *, keep: bool, u64) -> tuple[str, ...] | None:  # type: ignore[no-untyped-def]
    """Step over `count` length-prefixed strings at cur.pos; decode them only when `keep`.

    This loop is the whole cost of reading a big vocabulary, so the common case does one comparison per
    string: the buffer is only grown (and a string's length only checked) when a read would leave it.
    """
    buf = cur.buf
    off = cur.pos
    what = f"array {key!r}"
    if keep:
        out = []
        for _ in range(count):
            cur.need(off + 8, what)
            (n,) = u64(buf, off)
            if n > MAX_STRING_BYTES:
                raise cur.fail(f"a string in {what} is {n:,} bytes long (limit {MAX_STRING_BYTES:,})")
            cur.need(off + 8 + n, what)
            out.append(buf[off + 8:off + 8 + n].decode("utf-8", "replace"))
            off += 8 + n
        cur.pos = off
        return tuple(out)
    limit = len(buf) - 8  # a length prefix at off <= limit lies inside the buffer
    n = 0
    for _ in range(count):
        if off > limit:
            if n > MAX_STRING_BYTES:
                raise cur.fail(f"a string in {what} is {n:,} bytes long (limit {MAX_STRING_BYTES:,})")
            cur.need(off + 8, what)
            limit = len(buf) - 8
        (n,) = u64(buf, off)
        off += 8 + n
    if n > MAX_STRING_BYTES:
        raise cur.fail(f"a string in {what} is {n:,} bytes long (limit {MAX_STRING_BYTES:,})")
    cur.need(off, what)  # the last string's bytes
    cur.pos = off
    return None


def parse_header(source: ByteSource) -> Header:
    """Parse one GGUF file's header from any ByteSource (a local file, a remote one). No split merging."""
    try:
        return _parse_one(source)
    except GGUFFormatError:
        raise
    except (struct.error, ValueError, OverflowError, MemoryError, IndexError) as exc:
        # Belt and braces: every read above is bounds-checked first, so this is a bug, but the user
        # still gets a typed error naming the file rather than a traceback.
        raise GGUFFormatError(f"{source.name}: malformed GGUF header ({type(exc).__name__}: {exc})",
                              _HINT) from exc
