"""describe(): everything the planner, the pairing rules and the catalog need to know about a GGUF model,
computed from its header alone (pure: no file, process or network access once the Header is read).

Per-layer values are tuples over *all* blocks (`n_block = n_layer + n_nextn`, the GGUF's block_count); the
trunk is the first `n_layer` of them, the NextN/MTP layers the last `n_nextn`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bostudio.errors import GGUFFormatError
from bostudio.gguf import arch as rules
from bostudio.gguf.ggml_types import FILE_TYPES, GGML_TYPES
from bostudio.gguf.reader import INTEGER_TYPES, Header, ValueType
from bostudio.gguf.split import read_header
from bostudio.gguf.tokenizer import TokenizerInfo, describe_tokenizer

_HINT = "the file is damaged or was written by a broken converter; download it again"
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS (src/llama-hparams.h)
_BLK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class RopeInfo:
    """RoPE settings the model was trained with."""

    freq_base: float
    freq_base_swa: float
    dimension_count: int
    scaling_type: str  # none | linear | yarn | longrope | ...
    scaling_factor: float
    original_ctx: int  # rope.scaling.original_context_length, 0 when absent


@dataclass(frozen=True)
class ModelInfo:
    """A GGUF model described from its header. Sizes are bytes; per-layer tuples cover all n_block blocks."""

    path: Path
    parts: tuple[Path, ...]
    architecture: str
    name: str | None
    size_label: str | None  # general.size_label, else derived from n_params ("270M")
    kind: str  # model | drafter | mmproj | adapter | vocab
    n_params: int
    file_type: int | None
    quant: str  # Q4_K_M, Q8_0, ... (from general.file_type, else the dominant tensor type)
    file_size: int
    tensor_bytes: int
    layer_bytes: tuple[int, ...]
    token_embd_bytes: int
    output_bytes: int  # 0 when the output projection is tied to token_embd
    other_bytes: int  # norms and everything outside blk.N / token_embd / output
    n_block: int
    n_layer: int  # trunk layers = block_count - nextn_predict_layers
    n_nextn: int
    n_embd: int
    n_ff: tuple[int, ...]
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_dim_k: int
    head_dim_v: int
    head_dim_k_swa: int
    head_dim_v_swa: int
    n_ctx_train: int
    n_vocab: int
    rope: RopeInfo
    sliding_window: int  # 0: no sliding-window attention
    swa_type: str  # none | standard | chunked | symmetric
    swa_layers: tuple[bool, ...]
    recurrent_layers: tuple[bool, ...]
    ssm_d_conv: int
    ssm_d_inner: int
    ssm_d_state: int
    ssm_n_group: int
    ssm_dt_rank: int
    shortconv_l_cache: int  # LFM2 short-convolution cache
    wkv_head_size: int  # RWKV
    token_shift_count: int  # RWKV
    kv_lora_rank: int | None  # MLA; None when absent or zero
    q_lora_rank: int | None
    key_length_mla: int | None
    value_length_mla: int | None
    n_expert: int
    n_expert_used: int
    n_expert_shared: int
    n_ff_exp: int
    leading_dense_blocks: int
    has_mtp: bool  # blk.<n_block-1>.nextn.eh_proj.weight exists: usable with --spec-type draft-mtp
    drafter: str | None  # None | dflash | dspark | eagle3 | mtp-sidecar
    drafter_block_size: int  # DFlash/DSpark trained block size (default 16), else 0
    drafter_target_layers: tuple[int, ...]  # EAGLE3/DFlash target layers
    drafter_target_hidden: int  # eagle3.target_hidden_size; DFlash: fc.weight width / target layers; else 0
    tokenizer: TokenizerInfo
    has_chat_template: bool
    chat_template_names: tuple[str, ...]  # named templates (tokenizer.chat_template.<name>)
    # Bytes of 2-D weights other than token_embd, per ggml type name ("Q4_K"): the planner needs them
    # because llama.cpp's CPU backend keeps a second, repacked copy of some types (CPU_REPACK).
    matmul_bytes_by_type: tuple[tuple[str, int], ...] = ()
    # Every tensor's place, for what the host holds when the CPU backend moves some weights into its own
    # buffer types (bostudio.planner.memory.amx_host_weights): (slot, part, start, end, type, ne0, ne1), slot =
    # the block index, TOKEN_EMBD_SLOT, n_block for output.* or n_block + 1 for the rest; start/end: the
    # tensor's data in its split part.
    tensor_places: tuple[tuple[int, int, int, int, str, int, int], ...] = field(default=(), repr=False)
    chat_template: str | None = field(default=None, repr=False)  # raw text: never render it; escape to show
    # Why llama.cpp cannot load this drafter as it is ('' when it can): e.g. a fork-only DFlash layout.
    drafter_format_problem: str = ""

    @property
    def is_mla(self) -> bool:
        return bool(self.key_length_mla and self.value_length_mla)

    @property
    def mtp_usable(self) -> bool:
        """NextN layers llama.cpp can run as an MTP draft (tensors present and the arch has an MTP graph)."""
        return self.has_mtp and self.architecture in rules.MTP_GRAPH_ARCHS

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def is_recurrent(self) -> bool:
        """Every trunk layer is recurrent (Mamba, RWKV): no KV cache at all."""
        trunk = self.recurrent_layers[:self.n_layer]
        return bool(trunk) and all(trunk) and self.architecture in rules.RECURRENT_ARCHS

    @property
    def is_hybrid(self) -> bool:
        return any(self.recurrent_layers) and not self.is_recurrent

    def to_json(self) -> dict:
        """A JSON-ready dict (the raw chat template and the token list reference left out)."""
        d = asdict(self)
        d["path"] = str(self.path)
        d["parts"] = [str(p) for p in self.parts]
        d.pop("chat_template")
        d["tokenizer"].pop("tokens", None)
        d.update(is_mla=self.is_mla, is_moe=self.is_moe, is_recurrent=self.is_recurrent,
                 is_hybrid=self.is_hybrid, mtp_usable=self.mtp_usable)
        return d


    @classmethod
    def from_json(cls, d: dict) -> "ModelInfo":
        """Rebuild a ModelInfo from to_json() output (as the catalog caches it: no raw template, no token list
        reference; describe() the file again for those)."""
        d = dict(d)
        for derived in ("is_mla", "is_moe", "is_recurrent", "is_hybrid", "mtp_usable"):
            d.pop(derived, None)
        d["path"] = Path(d["path"])
        d["parts"] = tuple(Path(p) for p in d["parts"])
        d["rope"] = RopeInfo(**d["rope"])
        d["tokenizer"] = TokenizerInfo(**d["tokenizer"])
        return cls(**{k: _tuples(v) for k, v in d.items()})  # type: ignore[arg-type]


def _tuples(v: object) -> object:
    """JSON's lists back into the tuples ModelInfo holds, nested ones too (tensor_places, matmul_bytes_by_type)."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def _fail(header: Header, what: str) -> GGUFFormatError:
    return GGUFFormatError(f"{header.path}: {what}", _HINT)


def _uint(header: Header, key: str, default: int = 0) -> int:
    v = header.int_value(key)
    if v is None:
        return default
    if v < 0:
        raise _fail(header, f"{key} is negative ({v})")
    return v


def _per_layer(header: Header, key: str, n_block: int, default: int) -> tuple[int, ...]:
    """A key that is a scalar (same for every layer) or an array of exactly n_block integers."""
    f = header.fields.get(key)
    if f is None:
        return (default,) * n_block
    if f.type != ValueType.ARRAY:
        return (_uint(header, key),) * n_block
    ref = header.array_value(key, INTEGER_TYPES)
    assert ref is not None
    if ref.count != n_block or ref.values is None:
        raise _fail(header, f"{key} has {ref.count} entries, expected one per layer ({n_block})")
    if any(v < 0 for v in ref.values):
        raise _fail(header, f"{key} has a negative entry")
    return tuple(int(v) for v in ref.values)


def _bool_layers(header: Header, key: str, n_block: int) -> tuple[bool, ...] | None:
    """A per-layer bool array (shorter ones are padded with False, as llama.cpp's get_arr does)."""
    f = header.fields.get(key)
    if f is None or f.type != ValueType.ARRAY:
        return None
    ref = header.array_value(key, frozenset({ValueType.BOOL}) | INTEGER_TYPES)
    assert ref is not None
    if ref.count > n_block or ref.values is None:
        raise _fail(header, f"{key} has {ref.count} entries for {n_block} layers")
    return tuple(bool(v) for v in ref.values) + (False,) * (n_block - ref.count)


def _opt_positive(header: Header, key: str) -> int | None:
    v = _uint(header, key)
    return v or None


def _sizes(header: Header, n_block: int) -> tuple[tuple[int, ...], int, int, int, int, int]:
    """(layer_bytes, token_embd, output, other, total bytes, n_params) from the tensor table."""
    layers = [0] * n_block
    embd = output = other = total = params = 0
    for t in header.tensors:
        total += t.n_bytes
        params += t.n_elements
        m = _BLK.match(t.name)
        if m:
            il = int(m.group(1))
            if il >= n_block:
                raise _fail(header, f"tensor {t.name!r} belongs to layer {il}, but block_count is {n_block}")
            layers[il] += t.n_bytes
        elif t.name.startswith("token_embd."):
            embd += t.n_bytes
        elif t.name.startswith("output."):
            output += t.n_bytes
        else:
            other += t.n_bytes
    return tuple(layers), embd, output, other, total, params


TOKEN_EMBD_SLOT = -1


def _tensor_places(header: Header, n_block: int) -> tuple[tuple[int, int, int, int, str, int, int], ...]:
    out = []
    for t in header.tensors:
        m = _BLK.match(t.name)
        slot = (int(m.group(1)) if m else TOKEN_EMBD_SLOT if t.name.startswith("token_embd.")
                else n_block if t.name.startswith("output.") else n_block + 1)
        ne1 = t.shape[1] if len(t.shape) == 2 else 0  # a 2-D weight: a matmul's; 0 for the rest
        out.append((slot, t.part, t.offset, t.offset + t.n_bytes, t.type_name, t.shape[0] if t.shape else 0, ne1))
    return tuple(out)


def _matmul_bytes_by_type(header: Header) -> tuple[tuple[str, int], ...]:
    by_type: dict[str, int] = {}
    for t in header.tensors:
        if len(t.shape) >= 2 and not t.name.startswith("token_embd."):
            by_type[t.type_name] = by_type.get(t.type_name, 0) + t.n_bytes
    return tuple(sorted(by_type.items()))


def _quant(header: Header, file_type: int | None) -> str:
    if file_type is not None and file_type in FILE_TYPES:
        return FILE_TYPES[file_type]
    # No (known) file type: name the type holding most bytes among 2-D weights.
    by_type: dict[int, int] = {}
    for t in header.tensors:
        if len(t.shape) >= 2:
            by_type[t.ggml_type] = by_type.get(t.ggml_type, 0) + t.n_bytes
    if not by_type:
        return "unknown"
    return GGML_TYPES[max(by_type, key=lambda k: by_type[k])][0]


def size_label_for(n_params: int) -> str:
    """A human size label like general.size_label: 270M, 8B, 1.5B."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n_params >= scale:
            v = n_params / scale
            return f"{v:.0f}{unit}" if v >= 10 or v == int(v) else f"{v:.1f}{unit}"
    return str(n_params)


def _swa(header: Header, a: str, n_layer: int, n_block: int,
         recurrent: tuple[bool, ...]) -> tuple[int, str, tuple[bool, ...]]:
    none = (0, "none", (False,) * n_block)
    window_key = f"{a}.attention.sliding_window"
    window = header.int_value(window_key)
    pattern_key = f"{a}.attention.sliding_window_pattern"
    if a == "lfm2":
        if window and window > 0:
            return window, "standard", tuple(not r for r in recurrent)
        return none
    rule = rules.SWA_RULES.get(a)
    if a == "exaone4" and n_layer == 64:
        rule = rules.EXAONE4_SWA
    if rule is None:
        # Architectures that write their SWA layers as an explicit array (gemma4, mimo2, step35, ...).
        layers = _bool_layers(header, pattern_key, n_block)
        if window and window > 0 and layers is not None:
            return window, "standard", tuple(s and il < n_layer for il, s in enumerate(layers))
        return none
    if rule.needs_window and not (window and window > 0):
        return none
    if a == "llama4" and window == 0:
        return none
    window = window if window else rule.default_window
    layers = _bool_layers(header, pattern_key, n_block)
    if layers is None:
        pattern = header.int_value(pattern_key)
        layers = rules.swa_pattern(n_layer, n_block, rule.pattern if pattern is None else pattern,
                                   rule.dense_first)
    return window, rule.kind, layers


def _recurrent(header: Header, a: str, n_layer: int, n_block: int, n_head_kv: tuple[int, ...],
               n_ff: tuple[int, ...]) -> tuple[bool, ...]:
    if a in rules.RECURRENT_ARCHS or a in rules.ALL_RECURRENT_HYBRIDS:
        return (True,) * n_block
    if a in rules.INTERVAL_HYBRIDS:
        layers = _bool_layers(header, f"{a}.attention.recurrent_layers", n_block)
        if layers is not None:
            return layers
        interval = _uint(header, f"{a}.full_attention_interval", rules.INTERVAL_HYBRIDS[a])
        if interval == 0:
            raise _fail(header, f"{a}.full_attention_interval is 0")
        return tuple(il < n_layer and (il + 1) % interval != 0 for il in range(n_block))
    if a in rules.KV_ZERO_HYBRIDS:
        return tuple(il < n_layer and n_head_kv[il] == 0 for il in range(n_block))
    if a in rules.KV_ZERO_ALL_BLOCKS:
        return tuple(kv == 0 for kv in n_head_kv)
    if a in rules.KV_AND_FF_ZERO_HYBRIDS:
        return tuple(il < n_layer and n_head_kv[il] == 0 and n_ff[il] == 0 for il in range(n_block))
    return (False,) * n_block


# DFlash drafters converted for llama.cpp forks (beellama.cpp, lucebox): another architecture name and nested
# keys (`dflash-draft.dflash.target_layer_ids`); upstream llama.cpp does not know the architecture
# (llama.cpp #25116, Anbeeld/beellama.cpp #4).
FORK_DFLASH_ARCHS = ("dflash-draft",)


def _drafter(header: Header, a: str, n_block: int, has_mtp: bool) -> str | None:
    names = {t.name for t in header.tensors}
    if a == "dflash" or a in FORK_DFLASH_ARCHS:
        return "dspark" if "markov_w1.weight" in names else "dflash"
    if a == "eagle3":
        return "eagle3"
    if a == "gemma4-assistant":
        return "mtp-sidecar"
    # An MTP sidecar (convert_hf_to_gguf.py --mtp) has NextN layers but no trunk (no blk.0.attn_norm).
    if has_mtp and "blk.0.attn_norm.weight" not in names and n_block > 1:
        return "mtp-sidecar"
    return None


def _drafter_format_problem(header: Header, a: str) -> str:
    """Why llama-server would refuse this DFlash/DSpark drafter at load ('' when the layout is upstream's)."""
    if a in FORK_DFLASH_ARCHS:
        nested = sorted((k for k in header.fields if k.startswith(f"{a}.dflash.")),
                        key=lambda k: ("target_layer" not in k, k))  # the key llama.cpp misses first
        return (f"it is in a fork-only DFlash layout: general.architecture = {a!r} (llama.cpp knows 'dflash')"
                + (f" with nested keys such as {nested[0]}" if nested else ""))
    if a == "dflash":
        nested = sorted(k for k in header.fields if k.startswith("dflash.dflash."))
        if nested:
            return f"it has nested DFlash keys ({nested[0]}) that llama.cpp does not read"
        if header.fields.get("dflash.target_layers") is None:
            return "it lacks dflash.target_layers (llama.cpp: \"DFlash model requires 'target_layers'\")"
    return ""


def _dflash_target_hidden(header: Header, n_target_layers: int) -> int:
    """The target hidden size a DFlash drafter was built for: its fc.weight reads the concatenated hidden
    states of the target layers, so its input width is n_target_layers x the target's n_embd."""
    fc = next((t for t in header.tensors if t.name == "fc.weight"), None)
    if fc is None or not fc.shape or not n_target_layers or fc.shape[0] % n_target_layers:
        return 0
    return fc.shape[0] // n_target_layers


def _kind(header: Header, a: str, drafter: str | None) -> str:
    general_type = header.str_value("general.type")
    if general_type == "adapter":
        return "adapter"
    if a == "clip" or general_type == "mmproj":
        return "mmproj"
    if not header.tensors:
        return "vocab"
    return "drafter" if drafter else "model"


def describe_header(header: Header) -> ModelInfo:
    """Describe a model from its Header (pure)."""
    a = header.architecture
    k = f"{a}."
    n_block = _uint(header, k + "block_count")
    if n_block > MAX_LAYERS:
        raise _fail(header, f"{k}block_count is {n_block:,}; llama.cpp allows at most {MAX_LAYERS}")
    n_nextn = _uint(header, k + "nextn_predict_layers")
    if n_nextn > n_block:
        raise _fail(header, f"{k}nextn_predict_layers ({n_nextn}) exceeds block_count ({n_block})")
    n_layer = n_block - n_nextn
    n_embd = _uint(header, k + "embedding_length")
    n_head = _per_layer(header, k + "attention.head_count", n_block, 0)
    n_head_kv = _per_layer(header, k + "attention.head_count_kv", n_block, 0)
    if header.fields.get(k + "attention.head_count_kv") is None:
        n_head_kv = n_head
    n_ff = _per_layer(header, k + "feed_forward_length", n_block, 0)
    head0 = n_head[0] if n_head else 0
    head_k = _uint(header, k + "attention.key_length", n_embd // head0 if head0 else 0)
    head_v = _uint(header, k + "attention.value_length", n_embd // head0 if head0 else 0)
    recurrent = _recurrent(header, a, n_layer, n_block, n_head_kv, n_ff)
    window, swa_type, swa_layers = _swa(header, a, n_layer, n_block, recurrent)

    layer_bytes, embd, output, other, total, params = _sizes(header, n_block)
    names = {t.name for t in header.tensors}
    has_mtp = n_block > 0 and f"blk.{n_block - 1}.nextn.eh_proj.weight" in names
    drafter = _drafter(header, a, n_block, has_mtp)
    target_layers = header.array_value(f"{a}.target_layers", INTEGER_TYPES)
    if target_layers is not None and target_layers.values is None:
        raise _fail(header, f"{a}.target_layers has {target_layers.count:,} entries")
    layers = tuple(int(v) for v in target_layers.values or ()) if target_layers else ()

    freq_base = header.float_value(k + "rope.freq_base")
    freq_base = 10000.0 if freq_base is None else freq_base
    scale_linear = header.float_value(k + "rope.scale_linear")
    scaling_type = header.str_value(k + "rope.scaling.type") or ("linear" if scale_linear else "none")
    factor = header.float_value(k + "rope.scaling.factor")
    rope = RopeInfo(
        freq_base=freq_base,
        freq_base_swa=header.float_value(k + "rope.freq_base_swa") or freq_base,
        dimension_count=_uint(header, k + "rope.dimension_count", head_k),
        scaling_type=scaling_type,
        scaling_factor=factor if factor is not None else (scale_linear or 0.0),
        original_ctx=_uint(header, k + "rope.scaling.original_context_length"),
    )
    file_type = header.int_value("general.file_type")
    tokenizer = describe_tokenizer(header, header.int_value(k + "vocab_size"))
    template = header.str_value("tokenizer.chat_template")
    template_names = tuple(sorted(key[len("tokenizer.chat_template."):] for key in header.fields
                                  if key.startswith("tokenizer.chat_template.")))
    return ModelInfo(
        path=header.path, parts=header.parts, architecture=a,
        name=header.str_value("general.name"),
        size_label=header.str_value("general.size_label") or (size_label_for(params) if params else None),
        kind=_kind(header, a, drafter),
        n_params=params, file_type=file_type, quant=_quant(header, file_type),
        file_size=header.file_size, tensor_bytes=total, layer_bytes=layer_bytes,
        token_embd_bytes=embd, output_bytes=output, other_bytes=other,
        matmul_bytes_by_type=_matmul_bytes_by_type(header), tensor_places=_tensor_places(header, n_block),
        n_block=n_block, n_layer=n_layer, n_nextn=n_nextn, n_embd=n_embd, n_ff=n_ff,
        n_head=n_head, n_head_kv=n_head_kv, head_dim_k=head_k, head_dim_v=head_v,
        head_dim_k_swa=_uint(header, k + "attention.key_length_swa", head_k),
        head_dim_v_swa=_uint(header, k + "attention.value_length_swa", head_v),
        n_ctx_train=_uint(header, k + "context_length"),
        n_vocab=_uint(header, k + "vocab_size", tokenizer.vocab_size),
        rope=rope, sliding_window=window, swa_type=swa_type, swa_layers=swa_layers,
        recurrent_layers=recurrent,
        ssm_d_conv=_uint(header, k + "ssm.conv_kernel"), ssm_d_inner=_uint(header, k + "ssm.inner_size"),
        ssm_d_state=_uint(header, k + "ssm.state_size"), ssm_n_group=_uint(header, k + "ssm.group_count"),
        ssm_dt_rank=_uint(header, k + "ssm.time_step_rank"),
        shortconv_l_cache=_uint(header, k + "shortconv.l_cache"),
        wkv_head_size=_uint(header, k + "wkv.head_size"),
        token_shift_count=_uint(header, k + "token_shift_count", 2 if a in rules.RWKV_ARCHS else 0),
        kv_lora_rank=_opt_positive(header, k + "attention.kv_lora_rank"),
        q_lora_rank=_opt_positive(header, k + "attention.q_lora_rank"),
        key_length_mla=_opt_positive(header, k + "attention.key_length_mla"),
        value_length_mla=_opt_positive(header, k + "attention.value_length_mla"),
        n_expert=_uint(header, k + "expert_count"), n_expert_used=_uint(header, k + "expert_used_count"),
        n_expert_shared=_uint(header, k + "expert_shared_count"),
        n_ff_exp=max(_per_layer(header, k + "expert_feed_forward_length", n_block, 0), default=0),
        leading_dense_blocks=_uint(header, k + "leading_dense_block_count"),
        has_mtp=has_mtp, drafter=drafter,
        drafter_block_size=(_uint(header, "dflash.block_size", 16) if a == "dflash" else 16)
        if drafter in ("dflash", "dspark") else 0,
        drafter_target_layers=layers,
        drafter_target_hidden=(_uint(header, "eagle3.target_hidden_size") if a == "eagle3" else
                               _dflash_target_hidden(header, len(layers)) if a == "dflash" else 0),
        drafter_format_problem=_drafter_format_problem(header, a) if drafter in ("dflash", "dspark") else "",
        tokenizer=tokenizer,
        has_chat_template=bool(template) or bool(template_names),
        chat_template_names=template_names,
        chat_template=template,
    )


def describe(source: str | Path | Header) -> ModelInfo:
    """Describe the GGUF model at a path (any split part) or from an already-read Header."""
    header = source if isinstance(source, Header) else read_header(source)
    return describe_header(header)
