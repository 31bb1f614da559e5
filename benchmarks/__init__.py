"""Programs that measure bostudio: each is `python -m benchmarks.NAME --help`. They import bostudio and never
tests/; tests/test_benchmarks_smoke.py runs each one on a tiny model. Their figures are in BENCHMARKS.md."""
