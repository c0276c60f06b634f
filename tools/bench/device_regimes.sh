#!/usr/bin/env bash
# device_bench in both device regimes in one run: the capacity files' device
# at its own speed, then the same device throttled, and one table of both.
#
#   tools/bench/device_regimes.sh [--dir=DIR] [--throttle_read_bps=N]
#       [--throttle_write_bps=N] [--method=pace|cgroup] [--out=DIR]
#       [-- device_bench flags...]
#
#   --dir                where the capacity files go (a real filesystem with
#                        O_DIRECT; default /tmp). Its block device is the one
#                        throttled.
#   --throttle_read_bps  default 2000000000 (2 GB/s)
#   --throttle_write_bps default 1000000000
#   --method             pace (default): BlockIo's own pacer
#                        (device_bench --read_bps/--write_bps), exact and
#                        available anywhere; cgroup: the kernel's cgroup v1
#                        blkio throttle (needs root and /sys/fs/cgroup/blkio;
#                        it lets idle gaps between turns bank ~100 ms of
#                        credit, so short read phases exceed the rate)
#   --out                JSON and logs (default /tmp/device-regimes)
#
# HYMCACHE_BENCH_BIN=DIR (environment) runs DIR/device_bench instead of
# building it with bazel -c opt (the measurements smoke test).
#
# Takes about a minute on a 2-core machine.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=/tmp
RBPS=2000000000
WBPS=1000000000
OUT=/tmp/device-regimes
METHOD=pace
EXTRA=()
while [ $# -gt 0 ]; do
  case $1 in
    --dir=*) DIR=${1#*=} ;;
    --throttle_read_bps=*) RBPS=${1#*=} ;;
    --throttle_write_bps=*) WBPS=${1#*=} ;;
    --out=*) OUT=${1#*=} ;;
    --method=*) METHOD=${1#*=} ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT" "$DIR"
cd "$ROOT"
if [ -n "${HYMCACHE_BENCH_BIN:-}" ]; then
  # Binaries built already (tools/bench/measurements_smoke.sh, a Bazel test,
  # cannot run bazel): a folder holding device_bench.
  BIN="$HYMCACHE_BENCH_BIN/device_bench"
else
  bazel build -c opt //tools/bench:device_bench >/dev/null
  BIN="$OUT/device_bench"
  cp -f bazel-bin/tools/bench/device_bench "$BIN"
fi
PREFIX="$DIR/hymcache-device-regimes-$$"

echo "== fast: $DIR as it is" >&2
"$BIN" --capacity_file="$PREFIX" --json="$OUT/fast.json" "${EXTRA[@]}" \
  >"$OUT/fast.txt" 2>"$OUT/fast.log"

if [ "$METHOD" = pace ]; then
  echo "== throttled: paced to $RBPS B/s read, $WBPS B/s write" >&2
  "$BIN" --capacity_file="$PREFIX" --read_bps="$RBPS" --write_bps="$WBPS" \
    --json="$OUT/throttled.json" "${EXTRA[@]}" \
    >"$OUT/throttled.txt" 2>"$OUT/throttled.log"
elif [ "$METHOD" = cgroup ]; then
  CG_ROOT=/sys/fs/cgroup/blkio
  if [ ! -w "$CG_ROOT" ]; then
    echo "no writable cgroup v1 blkio at $CG_ROOT (need root)" >&2
    exit 2
  fi
  MAJMIN=$(findmnt -n -o MAJ:MIN --target "$DIR" | head -1 | tr -d ' ')
  CG="$CG_ROOT/hymcache-device-regimes.$$"
  mkdir "$CG"
  cleanup() {
    for t in $(cat "$CG/tasks" 2>/dev/null); do echo "$t" >"$CG_ROOT/tasks" 2>/dev/null || true; done
    rmdir "$CG" 2>/dev/null || true
  }
  trap cleanup EXIT
  echo "$MAJMIN $RBPS" >"$CG/blkio.throttle.read_bps_device"
  echo "$MAJMIN $WBPS" >"$CG/blkio.throttle.write_bps_device"
  echo "== throttled: $DIR ($MAJMIN) at $RBPS B/s read, $WBPS B/s write (cgroup)" >&2
  sh -c 'echo $$ > "$1/tasks"; shift; exec "$@"' sh "$CG" \
    "$BIN" --capacity_file="$PREFIX" --json="$OUT/throttled.json" "${EXTRA[@]}" \
    >"$OUT/throttled.txt" 2>"$OUT/throttled.log"
else
  echo "unknown --method=$METHOD (pace or cgroup)" >&2
  exit 2
fi

python3 - "$OUT/fast.json" "$OUT/throttled.json" <<'EOF'
import json, sys
runs = [("fast", json.load(open(sys.argv[1]))), ("throttled", json.load(open(sys.argv[2])))]
modes = ["staging", "staging_writer", "lru", "lru_writer", "lru_small"]
print("| regime | raw GB/s | " + " | ".join(modes) + " | staging/raw | staging/lru | writer refused |")
print("|---|---|" + "---|" * len(modes) + "---|---|---|")
for name, r in runs:
    m = r["modes"]
    raw = r["raw_gbps"]
    if not m and not raw:
        sys.exit("device_regimes: the %s run measured nothing" % name)
    cells = []
    for k in modes:
        cells.append("%.2f" % m[k]["read_gbps"] if k in m else "-")
    st = m.get("staging", {}).get("read_gbps", 0)
    lru = m.get("lru", {}).get("read_gbps", 0)
    sw = m.get("staging_writer")
    refused = ("%d of %d" % (sw["writer_refused"], sw["writer_refused"] + sw["writer_writes"])) if sw else "-"
    print("| %s | %.2f | %s | %.2fx | %s | %s |" % (
        name, raw, " | ".join(cells), st / raw if raw else 0,
        "%.2fx" % (st / lru) if lru else "-", refused))
EOF
echo "details: $OUT/{fast,throttled}.txt" >&2
