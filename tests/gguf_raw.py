"""Hand-assembled GGUF bytes, for files no well-behaved writer would produce."""

from __future__ import annotations

import struct

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_CODES = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i", FLOAT32: "f", BOOL: "?",
          UINT64: "Q", INT64: "q", FLOAT64: "d"}


def s(text: str | bytes) -> bytes:
    """A GGUF string: u64 length + bytes."""
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def value(vtype: int, v: object) -> bytes:
    """Encode a value; arrays are given as (elem_type, [elements])."""
    if vtype == STRING:
        return s(v)  # type: ignore[arg-type]
    if vtype == ARRAY:
        etype, items = v  # type: ignore[misc]
        return struct.pack("<IQ", etype, len(items)) + b"".join(value(etype, i) for i in items)
    return struct.pack("<" + _CODES[vtype], v)


def kv(key: str, vtype: int, v: object) -> bytes:
    return s(key) + struct.pack("<I", vtype) + value(vtype, v)


def tensor_info(name: str, dims: tuple[int, ...], ggml_type: int = 0, offset: int = 0) -> bytes:
    return s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<q", d) for d in dims) + \
        struct.pack("<IQ", ggml_type, offset)


def gguf(kvs: list[bytes], tensors: list[bytes] = (), *, n_kv: int | None = None,  # type: ignore[assignment]
         n_tensors: int | None = None, data: bytes = b"", version: int = 3, magic: bytes = b"GGUF",
         alignment: int = 32) -> bytes:
    """Assemble a file: header, kvs, tensor infos, padding to `alignment`, then `data`."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    if tensors:
        body += b"\0" * (-len(body) % alignment)
    return body + data


ARCH = kv("general.architecture", STRING, "llama")


def minimal(extra: list[bytes] = (), n_elems: int = 8) -> bytes:  # type: ignore[assignment]
    """A valid llama-ish file with one F32 tensor of n_elems elements."""
    return gguf([ARCH, kv("llama.block_count", UINT32, 1), *extra],
                [tensor_info("blk.0.attn_norm.weight", (n_elems,))], data=b"\0" * (4 * n_elems))
