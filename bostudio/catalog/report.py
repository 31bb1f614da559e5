"""Plain-text views of the catalog for `bostudio ls` and `bostudio show`. Every string that came from a file
or a file name goes through escape_untrusted."""

from __future__ import annotations

from bostudio.catalog.index import CatalogEntry
from bostudio.display import escape_untrusted, human_bytes
from bostudio.gguf import ModelInfo
from bostudio.gguf.template import template_for


def speculation_marks(info: ModelInfo) -> str:
    """What the model offers speculative decoding: its MTP head, or what kind of drafter it is."""
    if info.drafter:
        return f"drafter:{info.drafter}"
    return "mtp" if info.has_mtp else ""


def catalog_table(entries: list[CatalogEntry]) -> str:
    """One line per model: name, source, architecture, size label, quant, file size, context, speculation."""
    header = ("NAME", "SOURCE", "ARCH", "PARAMS", "QUANT", "SIZE", "CTX", "SPEC")
    rows = [header]
    for e in entries:
        name = escape_untrusted(e.name)
        if e.info is None:
            rows.append((name, e.source, "?", "", "", human_bytes(e.size), "",
                         f"unreadable: {escape_untrusted(e.error or '')}"))
            continue
        i = e.info
        rows.append((name, e.source, escape_untrusted(i.architecture), escape_untrusted(i.size_label or ""),
                     i.quant, human_bytes(e.size), f"{i.n_ctx_train:,}" if i.n_ctx_train else "",
                     speculation_marks(i) or ("" if i.kind == "model" else i.kind)))
    widths = [max(len(r[c]) for r in rows) for c in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows).rstrip()


def _layers(flags: tuple[bool, ...]) -> str:
    idx = [str(i) for i, f in enumerate(flags) if f]
    return f"{len(idx)}/{len(flags)}" + (f" ({', '.join(idx[:24])}{', ...' if len(idx) > 24 else ''})" if idx else "")


def model_details(info: ModelInfo, name: str | None = None) -> list[str]:
    """The `bostudio show` lines for one model."""
    e = escape_untrusted
    t = info.tokenizer
    lines = [
        f"name:          {e(name or info.name or info.path.name)}",
        f"path:          {e(str(info.path))}" + (f" (+{len(info.parts) - 1} more parts)" if len(info.parts) > 1 else ""),
        f"general.name:  {e(info.name or '')}",
        f"architecture:  {e(info.architecture)}  kind: {info.kind}",
        f"parameters:    {info.n_params:,} ({e(info.size_label or '?')})  quant: {info.quant}",
        f"file:          {human_bytes(info.file_size)}  weights: {human_bytes(info.tensor_bytes)} "
        f"(embeddings {human_bytes(info.token_embd_bytes)}, output {human_bytes(info.output_bytes)}, "
        f"layers {human_bytes(sum(info.layer_bytes))}, other {human_bytes(info.other_bytes)})",
        f"layers:        {info.n_layer}" + (f" + {info.n_nextn} NextN/MTP" if info.n_nextn else "")
        + f"  n_embd: {info.n_embd}",
        f"attention:     heads {_compact(info.n_head)}, kv heads {_compact(info.n_head_kv)}, "
        f"head dim k/v {info.head_dim_k}/{info.head_dim_v}",
        f"context:       {info.n_ctx_train:,} trained; rope base {info.rope.freq_base:g}, "
        f"scaling {e(info.rope.scaling_type)}" + (f" x{info.rope.scaling_factor:g}" if info.rope.scaling_factor else ""),
    ]
    if info.sliding_window:
        lines.append(f"sliding window: {info.sliding_window} ({info.swa_type}) on {_layers(info.swa_layers)} layers")
    if any(info.recurrent_layers):
        lines.append(f"recurrent:     {_layers(info.recurrent_layers)} layers; ssm conv {info.ssm_d_conv}, "
                     f"inner {info.ssm_d_inner}, state {info.ssm_d_state}, groups {info.ssm_n_group}, "
                     f"dt rank {info.ssm_dt_rank}" + (f", wkv head {info.wkv_head_size}" if info.wkv_head_size else ""))
    if info.is_mla:
        lines.append(f"MLA:           kv_lora_rank {info.kv_lora_rank}, k/v head {info.key_length_mla}/"
                     f"{info.value_length_mla}")
    if info.is_moe:
        lines.append(f"experts:       {info.n_expert} ({info.n_expert_used} used, {info.n_expert_shared} shared)")
    spec = speculation_marks(info)
    if spec:
        lines.append(f"speculation:   {spec}" + (f" (block size {info.drafter_block_size})"
                                                  if info.drafter_block_size else "")
                     + (f" target layers {list(info.drafter_target_layers)}" if info.drafter_target_layers else ""))
    lines += [
        f"tokenizer:     {e(t.model or '?')}/{e(t.pre or '-')}, {t.vocab_size:,} tokens, bos {t.bos_id} "
        f"eos {t.eos_id}, add_bos {t.add_bos}, add_eos {t.add_eos}",
        f"fingerprint:   {t.fingerprint or '-'}",
        "chat template: " + (("yes" + (f" (+ named: {', '.join(e(n) for n in info.chat_template_names)})"
                                        if info.chat_template_names else "")
                              + "; `--template` prints it (escaped, never rendered)")
                             if info.has_chat_template else "none"),
        "served with:   " + e(template_for(info).label),  # the template llama-server gets: the GGUF's or a fallback
    ]
    return lines


def _compact(values: tuple[int, ...]) -> str:
    return str(values[0]) if len(set(values)) <= 1 and values else str(list(values))
