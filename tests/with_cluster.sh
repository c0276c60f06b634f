#!/bin/bash
# Runs PROGRAM MASTER_ADDRESS [ARGS...] against a real hymcache-master and
# one hymcache-storage node started on loopback (port 0) for the run. For
# test programs that are not C++ (the C API's tests).
#   with_cluster.sh PROGRAM [ARGS...]
set -euo pipefail
program=$1
shift
BIN=$(mktemp -d "${TEST_TMPDIR:-/tmp}/bin.XXXXXX")
ln -s "$PWD/master/hymcache-master" "$BIN/hymcache-master"
ln -s "$PWD/storage_node/hymcache-storage" "$BIN/hymcache-storage"
# shellcheck source=../tools/bench/cluster_lib.sh
source tools/bench/cluster_lib.sh
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/cluster.XXXXXX")
start_master "$dir/master"
start_node "$dir" node1 --dram_bytes=64M
status=0
"$program" "$MASTER" "$@" || status=$?
if [ "$status" -ne 0 ]; then
  echo "---- master stderr (tail)" >&2
  tail -20 "$dir/master/stderr" >&2 || true
  echo "---- node stderr (tail)" >&2
  tail -20 "$dir/node1.stderr" >&2 || true
fi
exit "$status"
