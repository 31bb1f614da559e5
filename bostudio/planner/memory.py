"""The memory model: what llama.cpp allocates for a model, as pure functions of its header.

Every formula cites the llama.cpp code it mirrors (paths relative to the pinned tree). Inputs are a
ModelInfo (bostudio.gguf.describe) and a ContextSettings (the launch flags that change memory);
outputs are bytes. Nothing here reads a file, starts a process or touches the network.

What is exact (same arithmetic as llama.cpp): KV cache cells and bytes for every cache type, SWA
windows, unified/per-slot streams, MLA K-only caches, recurrent states including the per-draft-slot
copies, the output buffer, weight bytes per layer. What is an estimate: the compute buffer (ggml's
allocator measures a worst-case graph; we model its peak stage), and per-backend platform overhead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the planner needs only attributes; no import of the reader at run time
    from bostudio.gguf.describe import ModelInfo

MIB = 1024 * 1024
GIB = 1024 * MIB


# ---------------------------------------------------------------- cache types

@dataclass(frozen=True)
class CacheType:
    """A ggml type a KV cache can use: `block_size` elements take `type_size` bytes."""

    name: str
    block_size: int
    type_size: int

    def row_bytes(self, n: int) -> int:
        """ggml_row_size: bytes for a row of n elements (n is a multiple of the block size)."""
        return self.type_size * n // self.block_size


# The types -ctk/-ctv accept (common/arg.cpp kv_cache_types), sizes from ggml's type traits.
CACHE_TYPES: dict[str, CacheType] = {t.name: t for t in (
    CacheType("f32", 1, 4), CacheType("f16", 1, 2), CacheType("bf16", 1, 2),
    CacheType("q8_0", 32, 34), CacheType("q4_0", 32, 18), CacheType("q4_1", 32, 20),
    CacheType("iq4_nl", 32, 18), CacheType("q5_0", 32, 22), CacheType("q5_1", 32, 24),
)}


def cache_type(name: str) -> CacheType:
    try:
        return CACHE_TYPES[name]
    except KeyError:
        from bostudio.errors import ConfigError

        raise ConfigError(f"unknown KV cache type {name!r}",
                          f"one of {', '.join(CACHE_TYPES)}") from None


# ---------------------------------------------------------------- settings

def pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class ContextSettings:
    """The launch flags that change memory, with llama-server's defaults.

    n_parallel 4 + kv_unified is what `-np` auto gives (tools/server/server.cpp); flash attention
    `auto` resolves to on for the CPU, CUDA, Metal and Vulkan backends.
    """

    n_ctx: int
    n_parallel: int = 4
    kv_unified: bool = True
    n_batch: int = 2048
    n_ubatch: int = 512
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = True
    swa_full: bool = False
    n_rs_seq: int = 0          # extra recurrent rows per sequence (--spec-draft-n-max for MTP/EAGLE3/DFlash)
    n_outputs_max: int = 0     # 0: n_parallel (no speculation); the server raises it when drafting

    @property
    def outputs_max(self) -> int:
        return self.n_outputs_max or self.n_parallel


@dataclass(frozen=True)
class ContextShape:
    """How llama_context sizes itself (src/llama-context.cpp:285-307)."""

    n_ctx: int       # total cells over all streams, padded to 256
    n_ctx_seq: int   # cells per stream
    n_stream: int    # 1 when unified, else one per sequence
    n_seq: int


def context_shape(s: ContextSettings) -> ContextShape:
    n_seq = max(1, s.n_parallel)
    n_ctx = pad(max(1, s.n_ctx), 256)
    if s.kv_unified or n_seq == 1:
        return ContextShape(n_ctx, n_ctx, 1, n_seq)
    n_ctx_seq = pad(n_ctx // n_seq, 256)
    return ContextShape(n_ctx_seq * n_seq, n_ctx_seq, n_seq, n_seq)


# ---------------------------------------------------------------- KV cache

def _is_mla(m: "ModelInfo") -> bool:
    # hparams.is_mla(): both MLA lengths read and non-zero (src/llama-hparams.cpp:298-303)
    return bool(m.key_length_mla) and bool(m.value_length_mla)


def attention_layers(m: "ModelInfo", include_nextn: bool = False) -> list[int]:
    """Layers that own KV cells: trunk layers with KV heads that are not recurrent
    (llama-model.cpp create_memory, filter_attn). NextN layers get their own MTP context."""
    last = m.n_block if include_nextn else m.n_layer
    return [il for il in range(last)
            if m.n_head_kv[il] > 0 and not (il < len(m.recurrent_layers) and m.recurrent_layers[il])]


def is_swa_layer(m: "ModelInfo", il: int) -> bool:
    return bool(m.sliding_window) and il < len(m.swa_layers) and m.swa_layers[il]


@dataclass(frozen=True)
class KvCacheBytes:
    """One context's attention cache. cells_* are totals over all streams."""

    k: int
    v: int
    cells_full: int
    cells_swa: int
    n_layers: int
    bytes_per_token_full: int  # K+V bytes one more token of context costs (full-attention layers)

    @property
    def total(self) -> int:
        return self.k + self.v


def swa_cells(m: "ModelInfo", s: ContextSettings) -> int:
    """Cells per stream for sliding-window layers (src/llama-kv-cache-iswa.cpp:68-80)."""
    shape = context_shape(s)
    if s.swa_full:
        return shape.n_ctx_seq
    window = m.sliding_window * (shape.n_seq if s.kv_unified else 1) + s.n_ubatch
    return pad(min(shape.n_ctx_seq, window), 256)


def kv_cache_bytes(m: "ModelInfo", s: ContextSettings, layers: list[int] | None = None) -> KvCacheBytes:
    """Bytes of the KV cache (src/llama-kv-cache.cpp:200-251): per layer, cells x row bytes of
    n_head_kv x head length, K and V with their own cache types. MLA caches K only (the latent +
    rope part); SWA layers hold only their window (plus a ubatch); without flash attention, V rows
    are padded to the widest layer."""
    layers = attention_layers(m) if layers is None else layers
    shape = context_shape(s)
    tk, tv = cache_type(s.cache_type_k), cache_type(s.cache_type_v)
    mla = _is_mla(m)
    cells_swa_stream = swa_cells(m, s) if any(is_swa_layer(m, il) for il in layers) else 0
    widths_v = [m.n_head_kv[il] * (m.head_dim_v_swa if is_swa_layer(m, il) else m.head_dim_v) for il in layers]
    v_pad = max(widths_v, default=0) if not s.flash_attn else 0
    k_total = v_total = per_token = 0
    for il in layers:
        swa = is_swa_layer(m, il)
        cells = cells_swa_stream * shape.n_stream if swa else shape.n_ctx
        n_k = m.n_head_kv[il] * (m.head_dim_k_swa if swa else m.head_dim_k)
        n_v = 0 if mla else max(m.n_head_kv[il] * (m.head_dim_v_swa if swa else m.head_dim_v), v_pad)
        k_total += cells * tk.row_bytes(n_k)
        v_total += cells * tv.row_bytes(n_v) if n_v else 0
        if not swa:
            per_token += tk.row_bytes(n_k) + (tv.row_bytes(n_v) if n_v else 0)
    return KvCacheBytes(k_total, v_total, shape.n_ctx if layers else 0,
                        cells_swa_stream * shape.n_stream, len(layers), per_token)


# ---------------------------------------------------------------- recurrent state

def recurrent_row_floats(m: "ModelInfo") -> tuple[int, int]:
    """(n_embd_r, n_embd_s): conv and ssm state widths per layer (src/llama-hparams.cpp:208-258)."""
    if m.wkv_head_size:  # RWKV
        return m.token_shift_count * m.n_embd, m.n_embd * m.wkv_head_size
    if m.shortconv_l_cache:  # LFM2
        return m.n_embd * (m.shortconv_l_cache - 1), m.ssm_d_state * m.ssm_d_inner
    conv = (m.ssm_d_conv - 1 if m.ssm_d_conv > 0 else 0) * (m.ssm_d_inner + 2 * m.ssm_n_group * m.ssm_d_state)
    return conv, m.ssm_d_state * m.ssm_d_inner


def recurrent_layer_count(m: "ModelInfo") -> int:
    return sum(1 for il in range(m.n_layer) if il < len(m.recurrent_layers) and m.recurrent_layers[il])


def recurrent_state_bytes(m: "ModelInfo", s: ContextSettings) -> int:
    """F32 conv + ssm states per recurrent layer, rows = max(1, n_seq) x (1 + n_rs_seq): speculation
    with MTP/EAGLE3/DFlash keeps a copy per draft position (src/llama-memory-recurrent.cpp:101-103).
    Independent of the context size."""
    n = recurrent_layer_count(m)
    if not n:
        return 0
    r, st = recurrent_row_floats(m)
    rows = max(1, s.n_parallel) * (1 + max(0, s.n_rs_seq))
    return n * rows * (r + st) * 4


# ---------------------------------------------------------------- output and compute buffers

def output_buffer_bytes(m: "ModelInfo", s: ContextSettings) -> int:
    """Host buffer for logits as reserved at load: n_vocab floats per sequence
    (src/llama-context.cpp output_reserve(n_seq_max))."""
    return m.n_vocab * max(1, s.n_parallel) * 4


def output_growth_bytes(m: "ModelInfo", s: ContextSettings) -> int:
    """What the logits buffer grows by at the first drafted batch: output_reserve() reallocates it
    for n_outputs_max rows (n_parallel x (1 + draft length) when speculating). Not in the load log."""
    return m.n_vocab * max(0, s.outputs_max - max(1, s.n_parallel)) * 4


def _ffn_floats(m: "ModelInfo", il: int) -> int:
    """Activations alive during one layer's FFN, per row: gate, up, their product and the
    down-projection input, plus the residual stream."""
    if m.n_expert and il >= m.leading_dense_blocks:
        n_ff_exp = m.n_ff_exp or (m.n_ff[il] if il < len(m.n_ff) else 0)
        return 4 * (m.n_expert_used + m.n_expert_shared) * n_ff_exp + m.n_embd + m.n_expert
    n_ff = m.n_ff[il] if il < len(m.n_ff) else 0
    return 4 * n_ff + m.n_embd


def _attn_floats(m: "ModelInfo", il: int) -> int:
    """Q, K, V and the attention output alive at once, per row, plus the residual stream."""
    n_head = m.n_head[il] if il < len(m.n_head) else 0
    if _is_mla(m):
        lat = m.head_dim_k  # kv_lora_rank + rope dims: the absorbed query and the cached key
        return 2 * m.n_embd + n_head * lat + 2 * lat + n_head * (m.kv_lora_rank or lat)
    n_kv = m.n_head_kv[il] if il < len(m.n_head_kv) else 0
    return 2 * m.n_embd + n_head * m.head_dim_k + n_kv * (m.head_dim_k + m.head_dim_v) + n_head * m.head_dim_v


# Archs whose recurrent layers are Gated DeltaNet (chunked, no ssm_scan state copies).
GATED_DELTA_NET_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe"})


def _recurrent(m: "ModelInfo", il: int) -> bool:
    return il < len(m.recurrent_layers) and bool(m.recurrent_layers[il])


def _recurrent_floats(m: "ModelInfo") -> int:
    """One recurrent layer, per row: the input projection and three copies of the conv channels
    (transposed input, conv state concat, conv output). Fitted to llama.cpp's mamba2 and
    Gated-DeltaNet graphs on CPU within ~7%."""
    conv_dim = m.ssm_d_inner + 2 * m.ssm_n_group * m.ssm_d_state
    proj = conv_dim + m.ssm_d_inner + 2 * max(1, m.ssm_dt_rank)
    return proj + 3 * conv_dim


def compute_buffer_bytes(m: "ModelInfo", s: ContextSettings, layers: list[int] | None = None,
                         with_output: bool = True) -> int:
    """Estimate of the worst-case graph buffer (src/llama-context.cpp sched_reserve): a ubatch of
    n_t = min(n_ctx, n_ubatch) tokens. Exact parts: the KQ masks (f16 with flash attention, f32
    without, one per full/SWA cache, n_kv x n_t) and without flash attention the KQ scores of one
    layer (n_kv x n_t x n_head f32), with MLA also a transposed copy of the latent V rows. Modelled part:
    the largest per-layer stage of activations; the last layer runs its FFN on the output rows only
    (get_rows(inp_out_ids))."""
    layers = list(range(m.n_layer)) if layers is None else layers
    if not layers:
        return 0
    shape = context_shape(s)
    n_t = min(shape.n_ctx, s.n_ubatch)
    n_out = min(n_t, s.outputs_max)
    attn = [il for il in layers if m.n_head_kv[il] > 0 and not _recurrent(m, il)]
    masks = _mask_bytes(m, s, attn)
    kq = 0
    if not s.flash_attn and attn:
        n_head = max(m.n_head[il] for il in attn)
        kq = shape.n_ctx_seq * n_t * n_head * 4
        if _is_mla(m):  # V is a view of the latent K rows, not stored transposed: the graph copies it
            # transposed (llama-graph.cpp build_attn_mha, v_cont), n_kv x kv_lora_rank in the K cache's type
            kq += cache_type(s.cache_type_k).row_bytes(shape.n_ctx_seq * (m.kv_lora_rank or m.head_dim_v))
    # Inputs such as the masks are freed after their last reader (ggml-alloc), so they count only
    # for stages up to the last attention layer.
    last_attn = max((layers.index(il) for il in attn), default=-1)
    peak = 0
    for k, il in enumerate(layers):
        rows_ffn = n_out if k == len(layers) - 1 else n_t
        if _recurrent(m, il):
            layer = n_t * _recurrent_floats(m) * 4
            if m.architecture not in GATED_DELTA_NET_ARCHS:
                # ssm_scan also holds the gathered input states: about one state row per sequence
                layer += shape.n_seq * 4 * recurrent_row_floats(m)[1]
        else:
            layer = n_t * _attn_floats(m, il) * 4 + kq
        stage = max(layer, rows_ffn * _ffn_floats(m, il) * 4)
        peak = max(peak, stage + (masks if k <= last_attn else 0))
    if not with_output:  # a device of a split that does not hold the output layer
        return peak
    # The output projection runs after the last attention op has released the masks.
    return max(peak, logits_buffer_bytes(m, s))


def _mask_bytes(m: "ModelInfo", s: ContextSettings, attn: list[int]) -> int:
    """The KQ masks of a ubatch: f16 with flash attention, f32 without, one per full/SWA cache, n_kv x n_t."""
    shape = context_shape(s)
    n_t = min(shape.n_ctx, s.n_ubatch)
    elem = 2 if s.flash_attn else 4
    masks = 0
    if any(not is_swa_layer(m, il) for il in attn):
        masks += shape.n_ctx_seq * n_t * elem
    if any(is_swa_layer(m, il) for il in attn):
        masks += swa_cells(m, s) * n_t * elem
    return masks


def host_inputs_bytes(m: "ModelInfo", s: ContextSettings) -> int:
    """The host's compute buffer when the layers run on a GPU: the graph's inputs live in the backend's
    pinned host memory (Vulkan_Host, CUDA_Host): the input embeddings of a ubatch, staged twice, and the
    KQ masks (measured on lavapipe: 5.01 MiB for a 4096-token f16 mask of 512 rows and a small model)."""
    attn = [il for il in range(m.n_layer) if m.n_head_kv[il] > 0 and not _recurrent(m, il)]
    return min(s.n_ubatch, s.n_ctx) * m.n_embd * 4 * 2 + _mask_bytes(m, s, attn)


def logits_buffer_bytes(m: "ModelInfo", s: ContextSettings) -> int:
    """The output projection's stage: the output rows' hidden states and their logits (f32)."""
    n_t = min(context_shape(s).n_ctx, s.n_ubatch)
    return min(n_t, s.outputs_max) * (m.n_vocab + m.n_embd) * 4


# ---------------------------------------------------------------- weights

@dataclass(frozen=True)
class WeightSplit:
    """Where the weights go for a given -ngl (src/llama-model.cpp:1589-1600): the last `ngl` of
    n_block + 1 layers go to the GPU, the output layer counting as the +1. Token embeddings stay on
    the host; a tied output is duplicated onto the GPU."""

    gpu: int
    cpu: int
    gpu_layers: int      # repeating layers on the GPU
    output_on_gpu: bool

    @property
    def total(self) -> int:
        return self.gpu + self.cpu


def max_gpu_layers(m: "ModelInfo", include_nextn: bool = True) -> int:
    """The -ngl value that offloads everything (layers + output)."""
    return (m.n_block if include_nextn else m.n_layer) + 1


def weight_split(m: "ModelInfo", n_gpu_layers: int, load_nextn: bool = False,
                 output_on_host: bool = False) -> WeightSplit:
    """Weight bytes on the GPU(s) and on the host. NextN layers are loaded only for draft-mtp
    (`mparams.load_mtp`, common/common.cpp:1625); otherwise their tensors are skipped.
    `output_on_host`: the output projection is pinned to the host (`-ot`, see OUTPUT_ON_HOST_OT): the
    output layer's slot on the device keeps only the output norm, and a tied output shares the
    host's mapped embedding."""
    n_all = m.n_block
    ngl = max(0, min(n_gpu_layers, n_all + 1))
    start = n_all + 1 - ngl
    gpu = cpu = 0
    on_gpu_layers = 0
    for il, size in enumerate(m.layer_bytes):
        if il >= m.n_layer and not load_nextn:
            continue
        if il >= start:
            gpu += size
            on_gpu_layers += 1
        else:
            cpu += size
    output_on_gpu = ngl >= 1 and not output_on_host
    out = m.output_bytes or m.token_embd_bytes  # tied: the embedding is duplicated as the output
    cpu += m.token_embd_bytes
    if ngl >= 1:
        gpu += m.other_bytes  # the output norm goes with the output layer's slot
    else:
        cpu += m.other_bytes
    if output_on_gpu:
        gpu += out
    elif m.output_bytes:
        cpu += m.output_bytes
    return WeightSplit(gpu, cpu, on_gpu_layers, output_on_gpu)


def host_weight_bytes(m: "ModelInfo", load_nextn: bool = False) -> int:
    """All weights in host memory (CPU-only run): each tensor once; a tied output is not duplicated."""
    nextn = sum(m.layer_bytes[m.n_layer:]) if load_nextn else 0
    return sum(m.layer_bytes[:m.n_layer]) + nextn + m.token_embd_bytes + m.output_bytes + m.other_bytes


# Memory a backend takes before any model buffer: driver context, kernels, library workspaces.
# Typical figures, not measured here (no GPU on the build machine): a plan keeps them as a margin.
PLATFORM_OVERHEAD = {"cuda": 400 * MIB, "hip": 512 * MIB, "musa": 400 * MIB, "sycl": 512 * MIB,
                     "vulkan": 256 * MIB, "metal": 64 * MIB, "cpu": 0, "unknown": 256 * MIB,
                     # an RPC device's backend overhead is paid in the worker's own rpc-server process
                     "rpc": 0}


def platform_overhead(backend: str) -> int:
    return PLATFORM_OVERHEAD.get(backend, PLATFORM_OVERHEAD["unknown"])


# ggml-cpu/repack.cpp: on AVX2 hosts the CPU backend keeps an interleaved copy of these weight
# types in a CPU_REPACK buffer, next to the mapped file (ARM/NEON repacks a different set).
CPU_REPACK_TYPES = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})


# ggml-cpu/amx: a CPU backend built with AMX-INT8 (-march=native on Sapphire Rapids and later) keeps the 2-D
# weights of these types that a matmul reads in its AMX buffer type, repacked (mmq.cpp get_row_size), when
# out features % 32 == 0 and in features % the alignment below == 0 (amx.cpp supports_op). Its buffer type
# comes before CPU_REPACK's (ggml-cpu.cpp ggml_backend_cpu_get_extra_buffer_types).
AMX_ALIGN = {"Q4_0": 32, "Q4_1": 32, "Q8_0": 32, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "IQ4_XS": 256, "F16": 16}
_AMX_BLOCK = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34), "Q4_K": (256, 144), "Q5_K": (256, 176),
              "Q6_K": (256, 210), "IQ4_XS": (256, 136)}
# Per block, what the packed layout adds: Q8_0's int32 compensation, the K-quants' unpacked scales.
_AMX_EXTRA = {"Q8_0": 4, "Q4_K": 4, "Q5_K": 4, "IQ4_XS": 2}


def amx_bytes(type_name: str, ne0: int, ne1: int) -> int:
    """Bytes of one 2-D weight (ne0 in features, ne1 out features) in the AMX buffer; 0 when it stays out."""
    align = AMX_ALIGN.get(type_name)
    if align is None or ne1 <= 0 or ne1 % 32 or ne0 % align:
        return 0
    if type_name == "F16":
        return ne0 * ne1 * 2
    block, size = _AMX_BLOCK[type_name]
    kb = ne0 // block
    return ne1 * kb * (size + _AMX_EXTRA.get(type_name, 0))


def amx_host_weights(m: "ModelInfo", n_gpu_layers: int, load_nextn: bool = False,
                     output_on_host: bool = False) -> tuple[int, int, int]:
    """(mapped, amx, repack) host bytes of a model's weights when the engine's CPU backend has the AMX buffer
    type, from the tensor table: every host weight a matmul reads that AMX takes is copied into the AMX buffer;
    the file stays mapped from the first to the last byte of the host tensors left to it, per split part
    (llama-model.cpp maps one range per file); the other CPU_REPACK types are copied as without AMX. A tied
    output on the host is a matmul weight of its own (the embedding's duplicate), so AMX holds a copy of it
    while the embedding stays mapped for its row lookups. Measured on this engine: Gemma 3 270M on the CPU,
    AMX 213.9 MiB + mapped 235.2 MiB; the Qwen2.5-Coder 0.5B, 225.5 + 325.0 MiB (its output projection leads
    the file, so the mapped range starts after it)."""
    n_all = m.n_block
    ngl = max(0, min(n_gpu_layers, n_all + 1))
    start = n_all + 1 - ngl
    out_host = ngl == 0 or output_on_host
    ranges: dict[int, list[int]] = {}
    amx = repack = 0
    for slot, part, lo, hi, type_name, ne0, ne1 in m.tensor_places:
        if 0 <= slot < n_all:
            if (slot >= m.n_layer and not load_nextn) or slot >= start:
                continue
        elif slot == n_all:
            if not out_host:
                continue
        elif slot > n_all and ngl >= 1:  # norms and the rest: with the output layer's slot
            continue
        moved = amx_bytes(type_name, ne0, ne1) if slot != -1 else 0
        if moved:
            amx += moved
            continue
        if slot != -1 and ne1 and type_name in CPU_REPACK_TYPES and ne1 % 8 == 0:
            repack += hi - lo
        r = ranges.setdefault(part, [lo, hi])
        r[0], r[1] = min(r[0], lo), max(r[1], hi)
    if out_host and not m.output_bytes:  # tied: the output projection is the embedding's duplicate
        embd = next((p for p in m.tensor_places if p[0] == -1 and p[6]), None)
        if embd is not None:
            amx += amx_bytes(embd[4], embd[5], embd[6])
    return sum(hi - lo for lo, hi in ranges.values()), amx, repack


def cpu_repack_bytes(m: "ModelInfo", host_fraction: float = 1.0) -> int:
    """Extra host bytes for repacked weights, for the share of matmul weights left on the CPU."""
    total = sum(b for t, b in m.matmul_bytes_by_type if t in CPU_REPACK_TYPES)
    return int(total * host_fraction)
