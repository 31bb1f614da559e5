"""The memory planner: pure functions from a model header, devices and intent to a Plan.

No file, process or network access here (a test proves it by importing this package in a fresh
interpreter and looking at sys.modules).

    plan(model, devices, intent, speculator) -> Plan      both options, the choice and why
    plan_for_launch(model, devices, ...) -> Plan          the launcher's entry; plan.llama_args()
"""

from bostudio.planner.fit import (NO_SPEC, Intent, Plan, PlanOption, Speculator, Use, fit_option,
                                  largest_ctx, memory_uses, plan, plan_for_launch)
from bostudio.planner.memory import (CACHE_TYPES, CacheType, ContextSettings, KvCacheBytes,
                                     compute_buffer_bytes, kv_cache_bytes, output_buffer_bytes,
                                     recurrent_state_bytes, weight_split)
from bostudio.planner.reported import ReportedMemory, parse_reported_memory

__all__ = ["NO_SPEC", "Intent", "Plan", "PlanOption", "Speculator", "Use", "fit_option", "largest_ctx",
           "memory_uses", "plan", "plan_for_launch", "CACHE_TYPES", "CacheType", "ContextSettings",
           "KvCacheBytes", "compute_buffer_bytes", "kv_cache_bytes", "output_buffer_bytes",
           "recurrent_state_bytes", "weight_split", "ReportedMemory", "parse_reported_memory"]
