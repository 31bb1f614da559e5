"""The memory planner: pure functions from a model header, devices and intent to a Plan.

No file, process or network access here (a test proves it by importing this package in a fresh
interpreter and looking at sys.modules).

    plan(model, devices, intent, speculator, draft) -> Plan   both options, the choice and why; the one
        launch decision (bostudio.launch.decide) calls it and launches plan.chosen.speculator with the
        plan's flags (bostudio.engine.argv.plan_args)

The speculator is bostudio.speculation.Speculator (what llama-server runs); a draft speculator is
planned from its draft model's header (`draft=describe(path)`).
"""

from bostudio.planner.fit import (MTP_SPEC, NGRAM_SPEC, NO_SPEC, Intent, Plan, PlanOption, Use,
                                  default_fallback, fit_option, largest_ctx, memory_uses, plan,
                                  spec_label, what_would_fit)
from bostudio.planner.memory import (CACHE_TYPES, CacheType, ContextSettings, KvCacheBytes,
                                     compute_buffer_bytes, kv_cache_bytes, output_buffer_bytes,
                                     recurrent_state_bytes, weight_split)
from bostudio.planner.reported import ReportedMemory, parse_reported_memory

__all__ = ["MTP_SPEC", "NGRAM_SPEC", "NO_SPEC", "Intent", "Plan", "PlanOption", "Use", "default_fallback",
           "fit_option", "largest_ctx", "memory_uses", "plan", "spec_label", "what_would_fit", "CACHE_TYPES", "CacheType", "ContextSettings",
           "KvCacheBytes", "compute_buffer_bytes", "kv_cache_bytes", "output_buffer_bytes",
           "recurrent_state_bytes", "weight_split", "ReportedMemory", "parse_reported_memory"]
