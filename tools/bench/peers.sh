#!/usr/bin/env bash
# HyMCache side by side with Mooncake Store and Redis on this machine, in one
# run (tools/bench/peers.py does the work and says what each row measures).
# Installs or reuses the peers outside the repository: Mooncake from the
# peers' folder that tools/engines/vllm_peers.sh makes
# (mooncake-transfer-engine-non-cuda: mooncake_master and mooncake.store),
# redis-py with hiredis into ~/.cache/hymcache/bench-peers (wheels from our wheelhouse,
# tools/engines/pip_lib.sh), Debian's redis-server (tools/setup.sh --test);
# builds the daemons and the hymcache package (-c opt) into --work.
#
#   tools/bench/peers.sh            the full run; its last line is
#     peers: get16m_vs_mooncake=X.XX put16m_vs_mooncake=X.XX lookup32_vs_mooncake=X.XX get1m_vs_redis=X.XX multiturn_hit_vs_mooncake=X.XX
#   tools/bench/peers.sh --short    CI's smoke form (about a minute): one
#                                   size, one client, a tiny replay; its last
#                                   line is "peers-smoke: hymcache=ok ...".
#                                   Installs the peers as the full run does
#                                   (about 15 s from the wheelhouse); where
#                                   one cannot be installed (no engines
#                                   venv, no registry) it says so in one
#                                   line, "peers: SKIPPED: ...", and exits 0.
#   other arguments go to peers.py (--work=DIR keeps the logs; --help).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tools/engines/pip_lib.sh
. tools/engines/pip_lib.sh

SHORT=0
for arg in "$@"; do
  [ "$arg" = --short ] && SHORT=1
done
# The logs, binaries and package go to --work=DIR (or $HYMCACHE_PEERS_WORK),
# kept; without either, to a temporary folder removed at the end.
WORK=${HYMCACHE_PEERS_WORK:-}
case " $* " in *" --work="*) WORK=$(printf '%s\n' "$@" | sed -n 's/^--work=//p' | tail -n 1) ;; esac
if [ -z "$WORK" ]; then
  WORK=$(mktemp -d /tmp/hymcache-peers.XXXXXX)
  trap 'rm -rf "$WORK"' EXIT
fi
BENCH_PEERS=${HYMCACHE_BENCH_PEERS:-$HOME/.cache/hymcache/bench-peers}
REDISPY=${HYMCACHE_REDISPY_VERSION:-8.1.0}
HIREDIS=${HYMCACHE_HIREDIS_VERSION:-3.5.0}
# redis-py, what it imports on Python 3.11.2 (Debian 12), and hiredis, the
# C reply parser redis-py uses when present (redis[hiredis], its recommended
# install: its pure-Python parser reads a 16 MiB reply at ~0.05 GB/s).
REDIS_PKGS="redis==$REDISPY async-timeout==5.0.1 hiredis==$HIREDIS"
REDIS_STAMP="$BENCH_PEERS/.redis-$(echo "$REDIS_PKGS" | md5sum | cut -c1-8)"
VENV=${HYMCACHE_ENGINE_VENV:-$HOME/.cache/hymcache/engines-venv}

skip() {
  echo "peers: SKIPPED: $*"
  exit 0
}
if ! command -v redis-server >/dev/null; then
  [ "$SHORT" = 1 ] && skip "no redis-server (tools/setup.sh --test installs it)"
  echo "peers: no redis-server (tools/setup.sh --test installs it)" >&2
  exit 1
fi
# The short form installs too (CI's smoke would otherwise skip on every
# machine where nobody ran the full form), but a failed install is a
# SKIPPED line there, not a failure.
if [ "$SHORT" = 1 ] && [ ! -x "$VENV/bin/python" ]; then
  skip "no engines venv at $VENV (tools/engines/venv.sh makes it)"
fi
if ! PEERS=$(bash tools/engines/vllm_peers.sh | tail -n 1); then
  [ "$SHORT" = 1 ] &&
    skip "Mooncake could not be installed (tools/engines/vllm_peers.sh failed)"
  exit 1
fi
if [ ! -f "$REDIS_STAMP" ]; then
  rm -rf "$BENCH_PEERS"
  mkdir -p "$BENCH_PEERS" "$HYMCACHE_WHEELHOUSE"
  # shellcheck disable=SC2086
  if ! { "$VENV/bin/python" -m pip --disable-pip-version-check -q download --no-deps \
           --find-links "$HYMCACHE_WHEELHOUSE" -d "$HYMCACHE_WHEELHOUSE" $REDIS_PKGS &&
         "$VENV/bin/python" -m pip --disable-pip-version-check -q install --no-deps \
           --no-index --find-links "$HYMCACHE_WHEELHOUSE" --target "$BENCH_PEERS" \
           $REDIS_PKGS; } >&2; then
    [ "$SHORT" = 1 ] && skip "redis-py could not be installed (pip failed)"
    exit 1
  fi
  touch "$REDIS_STAMP"
fi
PY="$VENV/bin/python"

mkdir -p "$WORK"
bazel build -c opt //master:hymcache-master //storage_node:hymcache-storage \
  2>&1 | tail -n 1 >&2
BIN="$WORK/bin"
mkdir -p "$BIN"
cp -f "$(bazel info -c opt bazel-bin 2>/dev/null)"/{master/hymcache-master,storage_node/hymcache-storage} "$BIN/"
bash tools/install_python.sh --python="$PY" --target="$WORK/py" >&2
VERSION=$(git describe --always --dirty 2>/dev/null || echo unknown)

export PYTHONPATH="$WORK/py:$BENCH_PEERS:$PEERS"
timeout "${HYMCACHE_PEERS_TIMEOUT:-3600}" "$PY" tools/bench/peers.py \
  --bin="$BIN" --peers="$PEERS" --redis_server="$(command -v redis-server)" \
  --work="$WORK" --hymcache_version="$VERSION" "$@"
