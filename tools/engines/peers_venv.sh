#!/usr/bin/env bash
# Creates (or reuses) the virtual environments of the peer engines whose
# storage backends hymcache implements (python/hymcache/sglang.py,
# python/hymcache/lmcache.py): one venv per engine, outside the repository,
# because each pins its own torch. Wheels are kept between runs
# (tools/engines/pip_lib.sh), and
# the hymcache package is installed into each (tools/install_python.sh).
# Prints the venv's python on its last line.
#
#   tools/engines/peers_venv.sh sglang|lmcache     create or reuse that venv
#   tools/engines/peers_venv.sh ENGINE --check     only say whether it is
#                                                  complete (exit 0/1)
#   tools/engines/peers_venv.sh ENGINE --no-hymcache   skip installing hymcache
#
# Venvs: $HYMCACHE_SGLANG_VENV (default ~/.cache/hymcache/sglang-venv) and
# $HYMCACHE_LMCACHE_VENV (default ~/.cache/hymcache/lmcache-venv), made from
# Debian's /usr/bin/python3 (3.11, the version the extension is built for).
#
# Why the engine is installed without its dependencies: both list CUDA-only
# kernel packages (sglang: flashinfer, sglang-kernel, deep-ep, flash-attn-4,
# tilelang, ...; lmcache: cupy-cuda13x, cufile-python, nixl) that either do
# not install here or pull gigabytes nothing on this CPU-only machine can
# run. The rest of each engine's requirements is installed from its own
# metadata, less those packages; torch comes from PyPI (the CUDA build, which
# runs on the CPU as well) at the version the engine pins.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tools/engines/pip_lib.sh
. tools/engines/pip_lib.sh

ENGINE=""
INSTALL_HYMCACHE=1
CHECK=0
for arg in "$@"; do
  case "$arg" in
    sglang|lmcache) ENGINE="$arg" ;;
    --check) CHECK=1 ;;
    --no-hymcache) INSTALL_HYMCACHE=0 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "peers_venv: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[ -n "$ENGINE" ] || { echo "peers_venv: say sglang or lmcache" >&2; exit 2; }

BASE_PYTHON=${HYMCACHE_BASE_PYTHON:-/usr/bin/python3}
case "$ENGINE" in
  sglang)
    VENV=${HYMCACHE_SGLANG_VENV:-$HOME/.cache/hymcache/sglang-venv}
    PKG=sglang; VERSION=${HYMCACHE_SGLANG_VERSION:-0.5.23}
    TORCH=${HYMCACHE_SGLANG_TORCH:-2.14.1}
    # CUDA/ROCm kernels, multimodal and speculative-decoding extras.
    SKIP='torch|torchaudio|torchcodec|flashinfer.*|flash-attn.*|sgl-.*|sglang-kernel|humming-kernels|quack-kernels|tilelang|nvidia-.*|nvshmem4py.*|cuda-python|apache-tvm-ffi|deepseek-recipe|tml-renderers|av|decord2|timm|torch_memory_saver|checkpoint-engine|kernels|smg-grpc-servicer|modelscope|py-spy'
    IMPORTS='import torch, sglang; from sglang.srt.mem_cache.hicache_storage import HiCacheStorage'
    ;;
  lmcache)
    VENV=${HYMCACHE_LMCACHE_VENV:-$HOME/.cache/hymcache/lmcache-venv}
    PKG=lmcache; VERSION=${HYMCACHE_LMCACHE_VERSION:-0.5.6}
    TORCH=${HYMCACHE_LMCACHE_TORCH:-2.14.1}
    SKIP='torch|cupy-cuda.*|cufile-python|cuda-python|nixl|nvtx|google-cloud-bigtable|google-api-core|awscrt|grpcio-observability'
    IMPORTS='import torch, lmcache; from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector'
    ;;
esac
# The stamp names what was installed: a new version or skip list reinstalls.
STAMP="$VENV/.hymcache-$PKG-$VERSION-torch-$TORCH-$(echo "$SKIP" | md5sum | cut -c1-8)"

if [ "$CHECK" = 1 ]; then
  [ -f "$STAMP" ] && "$VENV/bin/python" -c "$IMPORTS" 2>/dev/null
  exit $?
fi

log() { echo "peers_venv($ENGINE): $*" >&2; }
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV from $BASE_PYTHON"
  mkdir -p "$(dirname "$VENV")"
  "$BASE_PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
if [ ! -f "$STAMP" ]; then
  log "installing torch==$TORCH and $PKG==$VERSION (wheels kept in $HYMCACHE_WHEELHOUSE)"
  install_engine "$PY" "$PKG" "$VERSION" "$TORCH" "$SKIP" pytest
  "$PY" -c "$IMPORTS; print('peers_venv: torch', torch.__version__, '$PKG', '$VERSION')" >&2
  touch "$STAMP"
fi
if [ "$INSTALL_HYMCACHE" = 1 ]; then
  bash tools/install_python.sh --python="$PY" >&2
fi
echo "$PY"
