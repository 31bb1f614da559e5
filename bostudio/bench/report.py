"""The bench's outputs: the terminal table and the PNG chart (matplotlib, imported only for --plot)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bostudio.bench.measure import Projection, Row
from bostudio.errors import ConfigError


def _f(v: float | None, fmt: str, none: str = "-") -> str:
    return none if v is None else format(v, fmt)


def table(rows: Sequence[Row], projection: Projection) -> str:
    head = (f"{'workload':<10} {'ctx':>6} {'config':<24} {'tok/s':>7} {'min-max':>13} {'speed-up':>8} "
            f"{'paired min-max':>15} {'accept':>7} {'acc.len':>7} {'prompt t/s':>10} {'acc/drafted':>13}")
    lines = [head, "-" * len(head)]
    last = None
    for r in rows:
        if last is not None and (r.workload, r.ctx) != last:
            lines.append("")
        last = (r.workload, r.ctx)
        spread = f"{r.tok_s_min:.1f}-{r.tok_s_max:.1f}"
        paired = f"{_f(r.speedup_min, '.2f')}-{_f(r.speedup_max, '.2f')}" if r.speedup is not None else "-"
        lines.append(f"{r.workload:<10} {_f(r.ctx, 'd'):>6} {r.config[:24]:<24} {r.tok_s_total:7.1f} {spread:>13} "
                     f"{_f(r.speedup, '.2f') + ('x' if r.speedup is not None else ''):>8} {paired:>15} "
                     f"{_f(r.acceptance and 100 * r.acceptance, '.0f') + ('%' if r.acceptance is not None else ''):>7} "
                     f"{_f(r.accept_len, '.2f'):>7} {_f(r.prompt_tok_s, '.0f'):>10} "
                     f"{(f'{r.accepted}/{r.drafted}' if r.drafted else '-'):>13}")
    if projection.seconds_saved:
        lines.append("")
        lines.append(f"projection (decode only: prompt processing, tools and network not included) for an agent "
                     f"task of {projection.turns} turns x {projection.tokens_per_turn} output tokens:")
        for cfg, s in sorted(projection.seconds_saved.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {cfg:<24} {'saves' if s >= 0 else 'costs'} {abs(s):7.1f} s")
    return "\n".join(lines)


def plot(rows: Sequence[Row], out: Path, title: str) -> Path:
    """tok/s against context (one line per configuration) and a bar chart of tok/s per workload."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib, which is not installed",
                          "pip install 'bostudio[plot]' (or pip install matplotlib)") from exc
    if out.suffix.lower() != ".png":
        raise ConfigError(f"--plot writes a PNG, and {out.name} does not end in .png", "e.g. --plot bench.png")
    sweep = [r for r in rows if r.ctx is not None]
    workload_rows = [r for r in rows if r.ctx is None]
    workloads = list(dict.fromkeys(r.workload for r in workload_rows))
    panels = (1 if sweep else 0) + len(workloads)
    if panels == 0:
        raise ConfigError("nothing to plot", "run at least one workload or a --ctx sweep")
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2), squeeze=False)
    ax_iter = iter(axes[0])
    if sweep:
        ax = next(ax_iter)
        for cfg in dict.fromkeys(r.config for r in sweep):
            pts = sorted((r.ctx, r.tok_s_total) for r in sweep if r.config == cfg)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=cfg)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("decode tok/s (tokens over time)")
        ax.set_title("tok/s against context")
        ax.legend(fontsize=7)
    for w in workloads:
        ax = next(ax_iter)
        wr = [r for r in workload_rows if r.workload == w]
        xs = range(len(wr))
        ax.bar(xs, [r.tok_s_median for r in wr],
               yerr=[[r.tok_s_median - r.tok_s_min for r in wr], [r.tok_s_max - r.tok_s_median for r in wr]],
               capsize=3)
        ax.set_xticks(list(xs), [r.config for r in wr], rotation=35, ha="right", fontsize=7)
        ax.set_ylabel("decode tok/s (median, min-max)")
        ax.set_title(f"workload: {w}")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return out
