#!/usr/bin/env bash
# Quick start, the main job: set up what is missing, then serve the embedded default model with
# speculative decoding on 127.0.0.1:8080 (Ctrl-C stops it). Extra arguments go to `bostudio up`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec "$VENV/bin/bostudio" up "$@"
