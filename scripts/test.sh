#!/usr/bin/env bash
# Quick start, the tests: set up what is missing, then run the whole test suite against the real
# llama-server and the real model. Extra arguments go to pytest.
set -euo pipefail
# The Vulkan tier (tests/test_vulkan.py, on Mesa's software device): setup installs its Debian packages (as
# root; skipped with the reason otherwise) and builds the Vulkan engine once, cached. By default its smoke
# check runs (discovery, the plan against llama.cpp's buffers, one answer from the device);
# BOSTUDIO_TEST_VULKAN=1 runs the whole tier, =0 none of it (docs/vulkan.md).
export BOSTUDIO_TEST_VULKAN="${BOSTUDIO_TEST_VULKAN:-smoke}"
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
bash "$ROOT/scripts/setup_agents.sh"  # the coding agents the agent tests run (pinned, npm, .agents/)
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
