"""The one launch decision: gather the inputs once (edge) -> decide (pure) -> Plan + the one argv.

`up`, every daemon child (local or over RPC workers), `plan`, `pair`, the daemon's plans route (the TUI's
plan view) and `bench` all go through here, so what is shown is what runs, and what the daemon evicts by
(the plan's total) is what it runs.
"""

from bostudio.launch.decide import N_SLOTS, Decision, LaunchInputs, LaunchIntent, Layout, decide, view
from bostudio.launch.gather import gather, gather_and_decide
from bostudio.launch.intents import bench_intent, child_intent, serve_intent

__all__ = ["N_SLOTS", "Decision", "LaunchInputs", "LaunchIntent", "Layout", "decide", "view", "gather",
           "gather_and_decide", "bench_intent", "child_intent", "serve_intent"]
