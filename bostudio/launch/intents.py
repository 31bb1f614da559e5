"""What each launcher asks of the one launch decision, stated once: `up` (a foreground server), a daemon
child, a bench run. Each says only what its user asked for and how its launcher differs; what the model
itself needs (its kind, template and flags) is gathered from its header (bostudio.launch.gather). The CLI's
option parsing (`plan`, `pair`) builds a LaunchIntent itself, from its options."""

from __future__ import annotations

from bostudio.launch.decide import N_SLOTS, LaunchIntent


def serve_intent(*, ctx: int | None = None, cache_type: str = "f16", spec: str = "auto",
                 flash_attn: str = "auto") -> LaunchIntent:
    """`bostudio up`: one server in the foreground with N_SLOTS slots and no prompt store."""
    return LaunchIntent(ctx=ctx, cache_type=cache_type, spec=spec, flash_attn=flash_attn, n_parallel=N_SLOTS)


def child_intent(spec: str, ctx: int | None, cache_type: str = "f16", *, prompt_reuse: bool = False,
                 children: int = 1, draft_len: tuple[int, str] | None = None) -> LaunchIntent:
    """A daemon child: its model config's spec, ctx and cache type; with the daemon's prompt store, a host
    prompt cache and full SWA caches; its CPU threads split between the `children` resident beside it; the
    draft length the acceptance check settled on (`draft_len`: (n, why)), when it settled on one."""
    return LaunchIntent(ctx=ctx, cache_type=cache_type, spec=spec, prompt_reuse=prompt_reuse, children=children,
                        draft_len=draft_len)


def bench_intent(ctx: int) -> LaunchIntent:
    """Every bench server's baseline: `ctx` tokens, one slot (requests run one at a time), speculation off
    in the plan (each side runs its own speculator on that memory plan: Decision.launch_spec); the settings
    under test (-fa, -t/-tb) are asked through Decision.varied."""
    return LaunchIntent(ctx=ctx, spec="off", n_parallel=1)
