#!/usr/bin/env bash
# Quick start, the main job: set up what is missing, then serve the embedded default model
# (Qwen2.5-Coder-1.5B-Instruct Q4_K_M) with speculative decoding on 127.0.0.1:8080 (Ctrl-C stops it).
# Extra arguments go to `bostudio up`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec "$VENV/bin/bostudio" up "$@"
