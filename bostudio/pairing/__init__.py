"""Pairing: which speculator a target gets (draft model, MTP head, DFlash/DSpark/EAGLE3 drafter, n-gram).

    load_pairings() -> PairingTable                 the user's pairings.toml, then the shipped one
    check_compatibility(target, draft) -> CompatReport   llama.cpp's draft-simple rules, explained
    select(target, table, request, ...) -> Selection     pure: the choice, every candidate and why
    pair.choose(target, request, engine) -> Selection     the edge: local files, compatibility, cost, profile
    fetch.pair_model(path, engine) -> PairReport         `bostudio pair`: the choice, hub drafters, the probe

`table`, `compat`, `select`, `cost` and `guardrails` are pure (no process or network access): the core. `pair`,
`probe` and `fetch` are the edge, one layer higher (they read files, run tools, and reach the hub).
"""

from bostudio.pairing.compat import CompatReport, Mismatch, check_compatibility
from bostudio.pairing.select import Considered, DraftFile, Selection, select
from bostudio.pairing.table import Candidate, Entry, Match, PairingTable, PairingTableError, load_pairings, parse_table

__all__ = ["Candidate", "CompatReport", "Considered", "DraftFile", "Entry", "Match", "Mismatch", "PairingTable",
           "PairingTableError", "Selection", "check_compatibility", "load_pairings", "parse_table", "select"]
