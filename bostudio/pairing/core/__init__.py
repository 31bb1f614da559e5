"""The pairing core, pure: pairings.toml's schema, compatibility, candidate costs, guardrails and select().
No process, network or UI library here, at any depth (tests/test_layering.py)."""
