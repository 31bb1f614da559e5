#!/usr/bin/env bash
# Installs the coding agents the tests run (pinned, as `bostudio launch` names them) into .agents/ with npm:
# idempotent, nothing installed globally. Called by scripts/test.sh; needs node/npm and the npm registry.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="$ROOT/.agents"
PKGS=("@anthropic-ai/claude-code@2.1.332" "@openai/codex@0.171.0" "opencode-ai@1.18.33")
if ! command -v npm >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[setup] installing nodejs and npm with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "[setup] npm is missing: install Node.js (>= 18) to run the agent tests" >&2; exit 1
  fi
fi
want="$(printf '%s\n' "${PKGS[@]}")"
if [ "$(cat "$PREFIX/.pinned" 2>/dev/null)" != "$want" ] || [ ! -x "$PREFIX/node_modules/.bin/claude" ]; then
  echo "[setup] installing ${PKGS[*]} into $PREFIX" >&2
  mkdir -p "$PREFIX"
  npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "${PKGS[@]}" >&2
  echo "$want" > "$PREFIX/.pinned"
fi
