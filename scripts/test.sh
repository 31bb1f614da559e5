#!/usr/bin/env bash
# Quick start, the tests: set up what is missing, then run the whole test suite against the real
# llama-server and the real model. Extra arguments go to pytest.
set -euo pipefail
# The Vulkan tier (tests/test_vulkan.py, on Mesa's software device) runs with BOSTUDIO_TEST_VULKAN=1: setup
# installs its packages and builds the Vulkan engine once, cached. Not yet by default: its cold build took
# 27.5 min on a loaded 2-core machine (18 min of CPU), which would put .ci/run past an hour.
export BOSTUDIO_TEST_VULKAN="${BOSTUDIO_TEST_VULKAN:-0}"
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
bash "$ROOT/scripts/setup_agents.sh"  # the coding agents the agent tests run (pinned, npm, .agents/)
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
