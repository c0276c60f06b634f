#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, starts a local HyMCache cluster on
# embedded defaults (one master, one storage node with a DRAM device; data
# and logs under ./hymcache-data), runs the demo workload against it, shows
# `hymctl status`, and stops the cluster. With --keep the cluster keeps
# running (stop it with: kill $(cat hymcache-data/*.pid)).
# HYMCACHE_DEVICE=hybrid runs the storage node on the software CXL hybrid
# device instead (a 2 GiB capacity file under ./hymcache-data behind a 64 MiB
# staging window and a 32 MiB write buffer).
set -euo pipefail
cd "$(dirname "$0")/.."

KEEP=0
[ "${1:-}" = "--keep" ] && KEEP=1
DATA=${HYMCACHE_DATA:-$PWD/hymcache-data}
DRAM=${HYMCACHE_DRAM_BYTES:-536870912}
DEVICE=${HYMCACHE_DEVICE:-dram}
DEVICE_FLAGS=(--dram_bytes="$DRAM")
if [ "$DEVICE" = "hybrid" ]; then
  DEVICE_FLAGS=(--device=hybrid --capacity_path="$DATA/capacity.dat"
                --capacity_bytes=2G --staging_bytes=64M --write_buffer_bytes=32M)
fi

bash tools/setup.sh
echo "quickstart: building (first build takes a few minutes on 2 cores)..."
bazel build -c opt //master:hymcache-master //storage_node:hymcache-storage \
  //tools/hymctl:hymctl //tools/demo:hymcache-demo 2>&1 | tail -n 2
BIN=$PWD/bazel-bin
mkdir -p "$DATA/logs"

pids=()
cleanup() {
  if [ $KEEP -eq 0 ]; then
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -f "$DATA"/*.pid
  fi
}
trap cleanup EXIT

# Waits for a daemon's ready line (the first line matching PATTERN) in its
# stdout file and prints it.
ready_line() {
  local file=$1 pid=$2 pattern=$3
  for _ in $(seq 1 300); do
    if grep -q -m 1 -- "$pattern" "$file" 2>/dev/null; then
      grep -m 1 -- "$pattern" "$file"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { echo "quickstart: daemon exited; see $DATA/logs" >&2; return 1; }
    sleep 0.1
  done
  echo "quickstart: daemon did not start; see $DATA/logs" >&2
  return 1
}

"$BIN/master/hymcache-master" --listen=127.0.0.1:0 --db_path="$DATA/master" \
  --metrics_listen=127.0.0.1:0 --log_dir="$DATA/logs" >"$DATA/master.out" 2>"$DATA/logs/master.stderr" &
pids+=($!); echo $! >"$DATA/master.pid"
line=$(ready_line "$DATA/master.out" "${pids[0]}" '^hymcache-master listening on ')
MASTER=${line##* }
echo "quickstart: $line"

"$BIN/storage_node/hymcache-storage" --master="$MASTER" --name=local-node-0 \
  --data_port=0 --control_port=0 --metrics_listen=127.0.0.1:0 \
  "${DEVICE_FLAGS[@]}" --log_dir="$DATA/logs" \
  >"$DATA/storage.out" 2>"$DATA/logs/storage.stderr" &
pids+=($!); echo $! >"$DATA/storage.pid"
line=$(ready_line "$DATA/storage.out" "${pids[1]}" '^hymcache-storage data=')
echo "quickstart: $line"

for _ in $(seq 1 100); do
  "$BIN/tools/hymctl/hymctl" --master="$MASTER" --json status 2>/dev/null | grep -q '"alive": true' && break
  sleep 0.1
done

echo
echo "quickstart: demo workload (4 conversations x 5 turns, 1 MiB blocks)"
"$BIN/tools/demo/hymcache-demo" --master="$MASTER"
echo
"$BIN/tools/hymctl/hymctl" --master="$MASTER" status
echo
if [ "$DEVICE" = "hybrid" ]; then
  "$BIN/tools/hymctl/hymctl" --master="$MASTER" stats
  echo
fi
if [ $KEEP -eq 1 ]; then
  echo "quickstart: cluster left running; master at $MASTER"
  echo "  try: $BIN/tools/hymctl/hymctl --master=$MASTER status"
  echo "  Prometheus targets (docs/operations.md, Metrics):" \
    "master $(sed -n 's/^hymcache-master metrics on //p' "$DATA/master.out")," \
    "storage $(grep -o 'metrics=[^ ]*' "$DATA/storage.out" | cut -d= -f2)"
else
  echo "quickstart: stopping the cluster (logs in $DATA/logs)"
fi
