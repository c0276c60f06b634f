#!/bin/bash
# Measures the request-level prefetch floors on a Mooncake trace, each in one
# run on this machine (side by side, so host noise hits both sides alike):
#
#   1. prefetch on vs off: one hybrid node (small staging window, footprint
#      many times the window) populated once, then read-only replays
#      alternating prefetch on / off; ratio of load bandwidth.
#   2. hit ratio vs the infinite-cache ceiling: a fresh hybrid node with
#      capacity above the footprint, replaying with stores.
#   3. hybrid vs DRAM-only at equal DRAM: the same replay against a DRAM node
#      of D bytes (the master evicts by recency) and a hybrid node whose
#      window + write buffer total D, once the footprint exceeds D.
#
# Usage: tools/bench/hymbench_floors.sh TRACE.jsonl [floor...]
#   floors: 1 2 3 (default: all). Results under $OUT (default
#   /tmp/hymbench-floors): JSON/CSV per run, summary.txt, and floor 1's
#   per-turn PNGs (prefetch on vs off, round 1) under plots/.
# Knobs (environment): BLOCK (256K), REQS1 (1000: requests for floor 1),
#   CONCURRENCY1 (1: replay workers of floor 1: one request at a time shows
#   the request-level pipeline; with several workers the plain reads of
#   different requests also overlap each other), TIME_SCALE (20: trace time
#   compression for floors 2 and 3), CONCURRENCY (4: workers of floors 2 and
#   3), DRAM (512M: floor 3's DRAM), CAPDIR (capacity files; default $OUT,
#   must be a real filesystem for O_DIRECT), HYMCACHE_BENCH_BIN (a folder
#   holding hymcache-master, hymcache-storage and hymbench, run instead of
#   building them with bazel -c opt: the measurements smoke test).
# Exits 1 if a replay stored and loaded nothing (a run that measured
# nothing), besides hymbench's own failures.
set -euo pipefail

TRACE=${1:?usage: $0 TRACE.jsonl [1 2 3]}
shift || true
FLOORS=${*:-1 2 3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/hymbench-floors}
BLOCK=${BLOCK:-256K}
REQS1=${REQS1:-1000}
TIME_SCALE=${TIME_SCALE:-20}
CONCURRENCY=${CONCURRENCY:-4}
CONCURRENCY1=${CONCURRENCY1:-1}
DRAM=${DRAM:-512M}
# Capacity files: floor 1's, and floors 2 and 3's (above the footprint of
# the Mooncake trace; a generated short trace needs far less).
CAPACITY1=${CAPACITY1:-16G}
CAPACITY=${CAPACITY:-24G}
CAPDIR=${CAPDIR:-$OUT}

mkdir -p "$OUT" "$CAPDIR"
cd "$ROOT"
# shellcheck source=tools/bench/cluster_lib.sh
source "$ROOT/tools/bench/cluster_lib.sh"
cluster_binaries "$OUT"

# replay NAME [flags]: runs hymbench, keeps its JSON and table; fails if
# the replay stored and loaded nothing.
replay() {
  local name=$1; shift
  "$BIN/hymbench" replay --master="$MASTER" --trace="$TRACE" \
    --block_bytes="$BLOCK" --progress_s=5 --json="$OUT/$name.json" \
    --csv="$OUT/$name.csv" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.progress"
  python3 -c "
import json, sys
o = json.load(open('$OUT/$name.json'))['overall']
if not o['stored'] and not o['loaded']:
    sys.exit('$name: the replay stored and loaded nothing (see $OUT/$name.progress)')"
}

SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

for f in $FLOORS; do
  case $f in
  1)
    note "== floor 1: prefetch on vs off (first $REQS1 requests, $BLOCK blocks, 64M window, $CONCURRENCY1 worker(s))"
    start_master "$OUT/f1/master"
    start_node "$OUT/f1" node --device=hybrid --capacity_path="$CAPDIR/f1.cap" \
      --capacity_bytes="$CAPACITY1" --staging_bytes=64M --write_buffer_bytes=256M
    replay f1-populate --max_requests="$REQS1" --wait_stores
    on=() off=()
    for round in 1 2; do
      replay "f1-on-$round" --max_requests="$REQS1" --store=false --prefetch=true \
        --concurrency="$CONCURRENCY1"
      replay "f1-off-$round" --max_requests="$REQS1" --store=false --prefetch=false \
        --concurrency="$CONCURRENCY1"
      on+=("$(overall "$OUT/f1-on-$round.json" load_gbps)")
      off+=("$(overall "$OUT/f1-off-$round.json" load_gbps)")
      note "round $round: prefetch on ${on[-1]} GB/s, off ${off[-1]} GB/s," \
        "hit ratio $(overall "$OUT/f1-on-$round.json" prefix_hit_ratio)"
    done
    note "$(python3 -c "on=[${on[0]},${on[1]}]; off=[${off[0]},${off[1]}]; \
print('prefetch on/off load bandwidth: %.2fx (on %.2f GB/s, off %.2f GB/s; floor 1.3x)' \
% (sum(on)/sum(off), sum(on)/2, sum(off)/2))")"
    "$BIN/hymbench" plot --json="$OUT/f1-on-1.json,$OUT/f1-off-1.json" \
      --plot="$OUT/plots" 2>"$OUT/plots.log" && note "plots of round 1 in $OUT/plots"
    stop_all
    rm -f "$CAPDIR/f1.cap"
    ;;
  2)
    note "== floor 2: hit ratio vs ceiling, capacity above the footprint ($BLOCK blocks)"
    start_master "$OUT/f2/master"
    start_node "$OUT/f2" node --device=hybrid --capacity_path="$CAPDIR/f2.cap" \
      --capacity_bytes="$CAPACITY" --staging_bytes=256M --write_buffer_bytes=512M
    replay f2 --time_scale="$TIME_SCALE" --concurrency="$CONCURRENCY"
    hr=$(overall "$OUT/f2.json" prefix_hit_ratio)
    ceil=$(overall "$OUT/f2.json" ceiling_hit_ratio)
    note "hit ratio $hr, ceiling $ceil: $(python3 -c "print('%.2f%% below the ceiling (floor: within 2%%)' % (100*($ceil-$hr)/$ceil))")"
    stop_all
    rm -f "$CAPDIR/f2.cap"
    ;;
  3)
    note "== floor 3: hybrid vs DRAM-only at $DRAM of DRAM ($BLOCK blocks)"
    # Short read lease: the replay compresses time, so a lease of seconds
    # would cover most of the footprint and block eviction on the DRAM node.
    start_master "$OUT/f3/master-dram" --read_lease_ms=200
    start_node "$OUT/f3" dram --device=dram --dram_bytes="$DRAM"
    replay f3-dram --time_scale="$TIME_SCALE" --concurrency="$CONCURRENCY"
    stop_all
    half=$(python3 -c "
import re
m=re.fullmatch(r'(\d+)([KMG]?)','$DRAM'); n=int(m[1])*{'':1,'K':1<<10,'M':1<<20,'G':1<<30}[m[2]]
print(n//2)")
    start_master "$OUT/f3/master-hybrid" --read_lease_ms=200
    start_node "$OUT/f3" hybrid --device=hybrid --capacity_path="$CAPDIR/f3.cap" \
      --capacity_bytes="$CAPACITY" --staging_bytes="$half" --write_buffer_bytes="$half"
    replay f3-hybrid --time_scale="$TIME_SCALE" --concurrency="$CONCURRENCY"
    d=$(overall "$OUT/f3-dram.json" prefix_hit_ratio)
    h=$(overall "$OUT/f3-hybrid.json" prefix_hit_ratio)
    note "hit ratio: DRAM-only $d, hybrid $h, ceiling $(overall "$OUT/f3-hybrid.json" ceiling_hit_ratio):" \
      "$(python3 -c "print('%.2fx (floor 2x)' % ($h/$d if $d > 0 else float('inf')))")"
    stop_all
    rm -f "$CAPDIR/f3.cap"
    ;;
  *) echo "unknown floor $f" >&2; exit 2 ;;
  esac
done
echo "results in $OUT"
