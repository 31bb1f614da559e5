#!/usr/bin/env bash
# Quick start, the tests: set up what is missing, then run the whole test suite against the real
# llama-server and the real model. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
bash "$ROOT/scripts/setup_agents.sh"  # the coding agents the agent tests run (pinned, npm, .agents/)
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
