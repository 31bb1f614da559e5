"""Pairing: which speculator a target gets (draft model, MTP head, DFlash/DSpark/EAGLE3 drafter, n-gram).

The folder shows the split (DESIGN.md):

    core/  pure, no file-system walk, process or network access (tests/test_layering.py checks it):
        table.load_pairings() / parse_table() -> PairingTable   pairings.toml's schema, loader and errors
        compat.check_compatibility(target, draft) -> CompatReport   llama.cpp's draft-simple rules, explained
        cost                                                     what a candidate costs: memory, a draft step
        guardrails                                               known regressions per backend and build
        select.select(target, table, request, ...) -> Selection  the choice, every candidate and why
    edge/  one layer higher: reads local files, runs the engine's tools, reaches the hub
        pair.choose(target, request, engine) -> Selection        local files, compatibility, cost, profile
        probe                                                    both tokenizers on a probe corpus
        fetch.pair_model(path, engine) -> PairReport             `bostudio pair`: the choice, hub drafters
"""
