#!/usr/bin/env bash
# The staging window through the storage node, as deployed: one master and one
# hybrid node (separate processes, loopback), a synthetic multi-turn workload
# whose footprint is many times the staging window, read back with request-
# level prefetch by hymbench over TCP and over shared memory, side by side
# with the limits in the same run:
#
#   raw device  device_bench --modes=raw on the capacity file's filesystem;
#   plane       get_bench's baseline: a raw loopback socket (tcp) or memcpy
#               (shm) moving the same block size.
#
# Floor (issue: the read path at device speed): aggregate load bandwidth
# >= 0.8 x min(raw device, plane limit).
#
#   tools/bench/node_staging_bench.sh [--dir=DIR] [--out=DIR]
#
# Knobs (environment): BLOCK (1M), WINDOW (128M: --staging_bytes),
# CONVERSATIONS (8), TURNS (8), USER_TOKENS (8192 per turn: 16 blocks of 512
# tokens), CONCURRENCY (4 replay workers), ROUNDS (2 alternating rounds),
# RAW_GIB (2: the span device_bench reads for the raw device's limit),
# CAPACITY (8G: the node's --capacity_bytes, preallocated in --dir, so the
# filesystem there needs that much free).
# Footprint with the defaults: ~1.1 GB (8.5x the window). Takes a few minutes.
# HYMCACHE_BENCH_BIN=DIR runs the binaries in DIR (hymcache-master,
# hymcache-storage, hymbench, device_bench, get_bench) instead of building
# them with bazel -c opt (the measurements smoke test). Exits 1 if a replay
# loaded nothing or the populate stored nothing.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=/tmp
OUT=/tmp/node-staging-bench
for a in "$@"; do
  case $a in
    --dir=*) DIR=${a#*=} ;;
    --out=*) OUT=${a#*=} ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done
BLOCK=${BLOCK:-1M}
WINDOW=${WINDOW:-128M}
CONVERSATIONS=${CONVERSATIONS:-8}
TURNS=${TURNS:-8}
USER_TOKENS=${USER_TOKENS:-8192}
CONCURRENCY=${CONCURRENCY:-4}
ROUNDS=${ROUNDS:-2}
RAW_GIB=${RAW_GIB:-2}
CAPACITY=${CAPACITY:-8G}

mkdir -p "$OUT" "$DIR"
cd "$ROOT"
if [ -n "${HYMCACHE_BENCH_BIN:-}" ]; then
  BIN=$HYMCACHE_BENCH_BIN  # built already (the measurements smoke test)
else
  bazel build -c opt //master:hymcache-master //storage_node:hymcache-storage \
    //tools/hymbench:hymbench //tools/bench:device_bench //tools/bench:get_bench \
    >/dev/null
  BIN="$OUT/bin"
  mkdir -p "$BIN"
  cp -f bazel-bin/master/hymcache-master bazel-bin/storage_node/hymcache-storage \
    bazel-bin/tools/hymbench/hymbench bazel-bin/tools/bench/device_bench \
    bazel-bin/tools/bench/get_bench "$BIN/"
fi
# shellcheck source=tools/bench/cluster_lib.sh
source "$ROOT/tools/bench/cluster_lib.sh"

block_bytes=$(python3 -c "
import re
m=re.fullmatch(r'(\d+)([KMG]?)','$BLOCK'); print(int(m[1])*{'':1,'K':1<<10,'M':1<<20,'G':1<<30}[m[2]])")
CAP="$DIR/hymcache-node-staging-$$.cap"
SYNTH=(--synthetic --conversations="$CONVERSATIONS" --turns="$TURNS"
       --user_tokens="$USER_TOKENS" --output_tokens=0 --block_bytes="$BLOCK")

replay() {
  local name=$1; shift
  "$BIN/hymbench" replay --master="$MASTER" "${SYNTH[@]}" --progress_s=0 \
    --json="$OUT/$name.json" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.log"
}
# Aggregate load GB/s of a replay: loaded bytes / its wall time. Fails (and
# with it the script) if the replay loaded nothing.
agg() {
  python3 -c "
import json, sys
r = json.load(open('$1'))
if not r['overall']['loaded_bytes'] or not r['wall_seconds']:
    sys.exit('$1: the replay loaded nothing')
print('%.3f' % (r['overall']['loaded_bytes']/r['wall_seconds']/1e9))"
}

echo "== cluster: one hybrid node, window $WINDOW, blocks $BLOCK" >&2
start_master "$OUT/master"
start_node "$OUT" node --device=hybrid --capacity_path="$CAP" \
  --capacity_bytes="$CAPACITY" --staging_bytes="$WINDOW" --write_buffer_bytes=256M
replay populate --wait_stores --concurrency=1
footprint=$(python3 -c "import json; r=json.load(open('$OUT/populate.json')); print(r['overall']['stored']*$block_bytes)")
echo "populated $footprint bytes" >&2
if [ "$footprint" -eq 0 ]; then
  echo "the populate replay stored nothing" >&2
  exit 1
fi

declare -A sum
for t in tcp shm; do sum[$t]=0; done
for round in $(seq "$ROUNDS"); do
  for t in tcp shm; do
    replay "read-$t-$round" --store=false --prefetch=true \
      --concurrency="$CONCURRENCY" --transport="$t"
    g=$(agg "$OUT/read-$t-$round.json")
    echo "round $round $t: $g GB/s (hit $(overall "$OUT/read-$t-$round.json" prefix_hit_ratio))" >&2
    sum[$t]=$(python3 -c "print(${sum[$t]} + $g)")
  done
done
stop_all
rm -rf "$CAP" "$CAP.meta"

echo "== limits" >&2
"$BIN/device_bench" --modes=raw --capacity_file="$DIR/hymcache-node-staging-raw-$$" \
  --block_mib=$((block_bytes >> 20 > 0 ? block_bytes >> 20 : 1)) --raw_gib="$RAW_GIB" \
  --json="$OUT/raw.json" >"$OUT/raw.txt" 2>"$OUT/raw.log"
raw=$(python3 -c "import json; print(json.load(open('$OUT/raw.json'))['raw_gbps'])")
plane() {  # plane TRANSPORT: the baseline's best GB/s in get_bench's output
  "$BIN/get_bench" --transport="$1" --block_kib=$((block_bytes >> 10)) \
    --blocks=32 --rounds=8 >"$OUT/plane-$1.txt" 2>"$OUT/plane-$1.log"
  sed -n 's/^best: [^0-9]* \([0-9.]*\) GB\/s.*/\1/p' "$OUT/plane-$1.txt"
}
tcp_limit=$(plane tcp)
shm_limit=$(plane shm)

python3 - "$footprint" "$WINDOW" "$raw" "$tcp_limit" "$shm_limit" "${sum[tcp]}" "${sum[shm]}" "$ROUNDS" <<'EOF'
import sys
fp, window, raw, tcp_l, shm_l, tcp_s, shm_s, rounds = sys.argv[1:]
raw, tcp_l, shm_l = float(raw), float(tcp_l), float(shm_l)
got = {"tcp": float(tcp_s) / int(rounds), "shm": float(shm_s) / int(rounds)}
lim = {"tcp": tcp_l, "shm": shm_l}
print("footprint %.2f GB, window %s" % (int(fp) / 1e9, window))
print("| plane | load GB/s (node, prefetch) | raw device GB/s | plane limit GB/s | min | ratio | floor 0.8x |")
print("|---|---|---|---|---|---|---|")
for t in ("tcp", "shm"):
    m = min(raw, lim[t])
    r = got[t] / m if m > 0 else 0
    print("| %s | %.2f | %.2f | %.2f | %.2f | %.2fx | %s |" % (
        t, got[t], raw, lim[t], m, r, "met" if r >= 0.8 else "NOT met"))
EOF
echo "details in $OUT" >&2
