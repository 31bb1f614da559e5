"""Supervision of the daemon's llama-server children. It imports nothing of the HTTP edge (daemon/http).

    lifecycle  one child's lifecycle as a pure transition (life, event) -> (life, effects); eviction and
               idle choice across children (pure)
    effects    the effects runner: the only code here that starts and stops processes, waits on them and
               saves their slots
    supervisor the instances by model name: load on demand, stop, restart, the background loops
    instance   what the daemon keeps per model: its config (survives restarts) and its running instance
    launching  a child's launch decision, gathered as for `bostudio up`
    policy     LRU eviction, idle TTL, speculation's break-even verdicts (pure)
    admission  requests in a child's KV pool, and those queued for room
    slots      saved slot states (prompt reuse): the store and the save/restore calls
    prefill    the prompts a child is processing now, from its /slots
    stats      timings and /metrics -> per-instance live stats (pure parsing)
    events     the event bus behind /bostudio/events (SSE)
"""
