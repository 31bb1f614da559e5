"""Small synthetic GGUFs for the planner's accuracy tests.

Two sources, both the real tools: `test-llama-archs -o DIR` (llama.cpp's own random small models,
one per architecture) and gguf-py's GGUFWriter, used here to derive variants of those files:
a NextN/MTP layer appended to a glm4moe model, and a shallower copy of a model to act as its
draft (same vocab, so draft-simple accepts the pair).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def write_arch_models(tool: Path, out: Path, archs: list[str]) -> dict[str, Path]:
    """Run `test-llama-archs -a '^(a|b)$' -o out`; map file stem ("llama-dense", "qwen3moe-moe")
    -> file. The tool writes a dense and/or a MoE variant per architecture."""
    out.mkdir(parents=True, exist_ok=True)
    pattern = "^(" + "|".join(archs) + ")$"
    subprocess.run([str(tool), "-a", pattern, "-o", str(out)], check=True, capture_output=True, timeout=120)
    found = {f.stem: f for f in out.glob("*.gguf")}
    missing = {a for a in archs if not any(stem.rsplit("-", 1)[0] == a for stem in found)}
    if missing:
        raise RuntimeError(f"test-llama-archs wrote no model for {sorted(missing)}")
    return found


def _copy_fields(reader: GGUFReader, writer: GGUFWriter, overrides: dict[str, tuple[object, GGUFValueType]]) -> None:
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key in overrides:
            value, vtype = overrides[key]
            sub = GGUFValueType.INT32 if vtype == GGUFValueType.ARRAY else None
            writer.add_key_value(key, value, vtype, sub_type=sub)
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            if not len(field.data):
                continue  # GGUFWriter refuses empty arrays; the loader treats them as absent anyway
            sub = field.types[-1] if len(field.types) > 1 else GGUFValueType.INT32
            writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
        else:
            writer.add_key_value(key, field.contents(), vtype)
    for key, (value, vtype) in overrides.items():
        if key not in reader.fields:
            writer.add_key_value(key, value, vtype)


def _add_tensor(writer: GGUFWriter, name: str, data: np.ndarray, ttype: object) -> None:
    writer.add_tensor(name, np.asarray(data), raw_dtype=ttype)  # type: ignore[arg-type]


def _finish(writer: GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def with_nextn_layer(src: Path, dst: Path) -> Path:
    """Append one NextN/MTP block to a glm4moe/deepseek2-style model: a copy of its last block plus
    the nextn.* tensors, block_count + 1 and nextn_predict_layers = 1 (llama-arch.cpp:586-593)."""
    r = GGUFReader(str(src))
    arch = str(r.fields["general.architecture"].contents())
    n_block = int(r.fields[f"{arch}.block_count"].contents())
    n_embd = int(r.fields[f"{arch}.embedding_length"].contents())
    w = GGUFWriter(str(dst), arch)
    overrides: dict[str, tuple[object, GGUFValueType]] = {
        f"{arch}.block_count": (n_block + 1, GGUFValueType.UINT32),
        f"{arch}.nextn_predict_layers": (1, GGUFValueType.UINT32)}
    rope = f"{arch}.rope.dimension_sections"
    if rope in r.fields and not any(r.fields[rope].contents()):
        # GLM's MTP graph always uses multi-section RoPE, which asserts on all-zero sections
        n_rot = int(r.fields[f"{arch}.rope.dimension_count"].contents())
        overrides[rope] = ([n_rot // 2, 0, 0, 0], GGUFValueType.ARRAY)
    _copy_fields(r, w, overrides)
    last = f"blk.{n_block - 1}."
    for t in r.tensors:
        _add_tensor(w, t.name, t.data, t.tensor_type)
    for t in r.tensors:
        if t.name.startswith(last):
            _add_tensor(w, f"blk.{n_block}." + t.name[len(last):], t.data, t.tensor_type)
    rng = np.random.default_rng(0)
    nextn = f"blk.{n_block}.nextn."
    w.add_tensor(nextn + "eh_proj.weight", rng.normal(0, 0.02, (n_embd, 2 * n_embd)).astype(np.float32))
    for norm in ("enorm", "hnorm", "shared_head_norm"):
        w.add_tensor(nextn + norm + ".weight", np.ones(n_embd, dtype=np.float32))
    _finish(w)
    return dst


def with_fewer_layers(src: Path, dst: Path, n_block: int) -> Path:
    """A shallower copy (the first n_block blocks): a draft with the target's exact vocab."""
    r = GGUFReader(str(src))
    arch = str(r.fields["general.architecture"].contents())
    w = GGUFWriter(str(dst), arch)
    _copy_fields(r, w, {f"{arch}.block_count": (n_block, GGUFValueType.UINT32)})
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_block:
            continue
        _add_tensor(w, t.name, t.data, t.tensor_type)
    _finish(w)
    return dst


def with_fim_tokens(src: Path, dst: Path, pre: int, suf: int, mid: int) -> Path:
    """A copy of a real model whose header names three of its tokens as the fill-in-the-middle
    prefix/suffix/middle tokens (tokenizer.ggml.fim_*_token_id): llama-server then serves /infill."""
    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), str(r.fields["general.architecture"].contents()))
    _copy_fields(r, w, {})
    for name, tok in (("pre", pre), ("suf", suf), ("mid", mid)):
        w.add_uint32(f"tokenizer.ggml.fim_{name}_token_id", tok)
    for t in r.tensors:
        _add_tensor(w, t.name, t.data, t.tensor_type)
    _finish(w)
    return dst
