#!/bin/bash
# Think-time hints, side by side in one run (issue 33's floors): the same
# synthetic multi-turn chat, replayed at its real pace (users think
# --gap_ms between turns), against
#   dram       an all-DRAM node of the hybrid node's capacity (it holds the
#              whole footprint: every load is a DRAM read);
#   hybrid     a hybrid node (small staging window and write buffer over a
#              capacity file), no hints: each turn refills its prefix from
#              the capacity tier when it arrives;
#   hints      the same hybrid node setup, hymbench --hint_next_turn (each
#              turn, once stored, hints its blocks for the next one);
#   busyhints  (only when CONFIGS names it) hints with
#              --prefetch_hints_when_idle=false: refills may start beside
#              requests that are loading (the node's rule before Dec 6 2026);
#   waste      the same, every hint wrong: each names the blocks of the same
#              workload in another namespace (stored first, never read):
#              what wasted staging costs the requests in flight.
# Every configuration first stores that other namespace's blocks (a quick
# replay), so that the nodes hold the same data.
# Reports the load part of TTFT (Client::Load wall time) of turns >= 2,
# p50 and p99, and hints/dram ratios; the node's hint counters; and the
# load bandwidth of requests with hints on vs off (the cost of wasted
# staging to requests in flight).
#
# Usage: tools/bench/think_time_bench.sh [--capdir=DIR] [--read_bps=N]
#          [--write_bps=N] [--throttle] [--out=DIR] [--reps=N]
#   --capdir     where the hybrid node's capacity file goes (a real
#                filesystem with O_DIRECT; default /tmp). For the fast
#                regime, a zram device: see docs/performance.md.
#   --read_bps / --write_bps  pace the node's capacity tier (BlockIo's own
#                pacer: --io_max_read_bytes_per_s), e.g. an NVMe drive's
#                8.7 GB/s read on zram. Default: unpaced.
#   --throttle   run the hybrid nodes in a cgroup v1 blkio group that limits
#                --capdir's block device to --read_bps / --write_bps
#                instead (the kernel's throttle; needs root and
#                /sys/fs/cgroup/blkio).
#   --reps       alternating rounds of the three configurations (default 2).
# Knobs (environment): CONVERSATIONS (16), TURNS (6), GAP_MS (3000), BLOCK
#   (1M), STAGING (512M: hints may hold half, the chains of the
#   conversations in think time), WRITE_BUFFER (32M), CAPACITY (2G),
#   CONFIGS ("dram hybrid hints waste"), HYMCACHE_BENCH_BIN
#   (a folder holding hymcache-master, hymcache-storage and hymbench, run
#   instead of building them with bazel -c opt).
# Its last line: `think_time: hints_vs_dram_p50=X.XX hints_vs_dram_p99=X.XX
#   nohints_vs_dram_p50=X.XX nohints_vs_dram_p99=X.XX hints_bw_vs_nohints=X.XX
#   wasted_bw_vs_nohints=X.XX pooled_hints_vs_dram_p50=X.XX
#   pooled_hints_vs_dram_p99=X.XX` (medians over the reps, then the ratios of
#   every rep's loads pooled; nan where CONFIGS left out a configuration the
#   ratio needs). Before it, the loads' p50,
#   p90 and p99 per configuration over all reps pooled. Takes about
#   (4 x reps x TURNS x GAP_MS) + setup.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CAPDIR=/tmp
OUT=/tmp/think-time-bench
READ_BPS=0
WRITE_BPS=0
THROTTLE=0
REPS=2
while [ $# -gt 0 ]; do
  case $1 in
    --capdir=*) CAPDIR=${1#*=} ;;
    --out=*) OUT=${1#*=} ;;
    --read_bps=*) READ_BPS=${1#*=} ;;
    --write_bps=*) WRITE_BPS=${1#*=} ;;
    --throttle) THROTTLE=1 ;;
    --reps=*) REPS=${1#*=} ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
CONVERSATIONS=${CONVERSATIONS:-16}
TURNS=${TURNS:-6}
GAP_MS=${GAP_MS:-3000}
BLOCK=${BLOCK:-1M}
STAGING=${STAGING:-512M}
WRITE_BUFFER=${WRITE_BUFFER:-32M}
CAPACITY=${CAPACITY:-2G}

mkdir -p "$OUT" "$CAPDIR"
cd "$ROOT"
# shellcheck source=tools/bench/cluster_lib.sh
source "$ROOT/tools/bench/cluster_lib.sh"
cluster_binaries "$OUT"

PACE=()
CG=""
if [ "$THROTTLE" = 1 ]; then
  root=/sys/fs/cgroup/blkio
  [ -w "$root" ] || { echo "--throttle: $root is not writable (need root, cgroup v1)" >&2; exit 2; }
  majmin=$(findmnt -n -o MAJ:MIN --target "$CAPDIR" | head -1 | tr -d ' ')
  CG="$root/hymcache-think-time.$$"
  mkdir "$CG"
  [ "$READ_BPS" != 0 ] && echo "$majmin $READ_BPS" >"$CG/blkio.throttle.read_bps_device"
  [ "$WRITE_BPS" != 0 ] && echo "$majmin $WRITE_BPS" >"$CG/blkio.throttle.write_bps_device"
  trap 'cleanup; rmdir "$CG" 2>/dev/null || true' EXIT
fi
[ "$THROTTLE" = 0 ] && [ "$READ_BPS" != 0 ] && PACE+=(--io_max_read_bytes_per_s="$READ_BPS")
[ "$THROTTLE" = 0 ] && [ "$WRITE_BPS" != 0 ] && PACE+=(--io_max_write_bytes_per_s="$WRITE_BPS")

# run CONFIG REP: one replay against a fresh master and node.
run() {
  local config=$1 rep=$2 dir="$OUT/$1-$2"
  rm -rf "$dir"
  start_master "$dir/master"
  local hint=()
  if [ "$config" = dram ]; then
    start_node "$dir" node --device=dram --dram_bytes="$CAPACITY" \
      --metrics_listen=127.0.0.1:0
  else
    local node=(--device=hybrid --capacity_path="$CAPDIR/think-time-$$.cap"
                --capacity_bytes="$CAPACITY" --staging_bytes="$STAGING"
                --write_buffer_bytes="$WRITE_BUFFER" --metrics_listen=127.0.0.1:0
                "${PACE[@]}")
    [ "$config" = busyhints ] && node+=(--prefetch_hints_when_idle=false)
    if [ "$THROTTLE" = 1 ]; then
      # The node joins the throttled group first (its threads inherit it).
      local real_bin=$BIN
      mkdir -p "$dir/tbin"
      cat >"$dir/tbin/hymcache-storage" <<EOF
#!/bin/bash
echo \$\$ > "$CG/tasks"
exec "$real_bin/hymcache-storage" "\$@"
EOF
      chmod +x "$dir/tbin/hymcache-storage"
      BIN="$dir/tbin" start_node "$dir" node "${node[@]}"
    else
      start_node "$dir" node "${node[@]}"
    fi
    [ "$config" = hints ] && hint=(--hint_next_turn)
    [ "$config" = busyhints ] && hint=(--hint_next_turn)
    [ "$config" = waste ] && hint=(--hint_next_turn --hint_namespace=decoy)
  fi
  "$BIN/hymbench" replay --master="$MASTER" --synthetic \
    --conversations="$CONVERSATIONS" --turns="$TURNS" --concurrency=1 \
    --block_bytes="$BLOCK" --namespace=decoy --wait_stores --progress_s=0 \
    >"$dir/decoy.txt" 2>"$dir/decoy.log"
  "$BIN/hymbench" replay --master="$MASTER" --synthetic \
    --conversations="$CONVERSATIONS" --turns="$TURNS" --turn_gap_ms="$GAP_MS" \
    --time_scale=1 --concurrency="$CONVERSATIONS" --block_bytes="$BLOCK" \
    --progress_s=0 --json="$dir/replay.json" "${hint[@]}" >"$dir/replay.txt" 2>"$dir/replay.log"
  # The node's counters after the run (hints staged, hits, wasted).
  curl -s "http://$(grep -m1 -o 'metrics=[^ ]*' "$dir/node.stdout" | cut -d= -f2)/metrics" \
    >"$dir/metrics.txt" 2>/dev/null || true
  stop_all
  # Under --throttle the node is a grandchild (throttle.sh's): stop it too.
  pkill -f -- "--capacity_path=$CAPDIR/think-time-$$.cap" 2>/dev/null || true
  for _ in $(seq 100); do
    pgrep -f -- "--capacity_path=$CAPDIR/think-time-$$.cap" >/dev/null || break
    sleep 0.1
  done
  rm -rf "$CAPDIR/think-time-$$.cap"*  # the file, .meta and .node_key
}

for rep in $(seq 1 "$REPS"); do
  for config in ${CONFIGS:-dram hybrid hints waste}; do
    echo "== rep $rep: $config" >&2
    run "$config" "$rep"
  done
done

python3 - "$OUT" "$REPS" ${CONFIGS:-dram hybrid hints waste} <<'EOF'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
run = sys.argv[3:]

def pct(v, p):
    v = sorted(v)
    if not v:
        return float('nan')
    k = (len(v) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)

def stats(path):
    j = json.load(open(path))
    recs = [r for r in j['requests'] if r['turn'] >= 1 and r['loaded'] > 0]
    loads = [r['load_ms'] for r in recs]
    byts = sum(r['loaded_bytes'] for r in recs)
    secs = sum(r['load_ms'] for r in recs) / 1e3
    errors = sum(1 for r in j['requests'] if r.get('load_error'))
    return dict(p50=pct(loads, 0.5), p99=pct(loads, 0.99), n=len(recs), loads=loads,
                gbps=byts / secs / 1e9 if secs else 0, errors=errors,
                hit=j['overall']['prefix_hit_ratio'])

def metric(path, name):
    try:
        for line in open(path):
            if line.startswith(name + ' ') or line.startswith(name + '{'):
                return float(line.split()[-1])
    except OSError:
        pass
    return float('nan')

rows, ratios = [], {k: [] for k in ('h50', 'h99', 'n50', 'n99', 'bw', 'waste')}
# The configurations run (CONFIGS), in the table's order; a ratio needs both
# of its configurations (else "nan").
configs = [c for c in ('dram', 'hybrid', 'hints', 'busyhints', 'waste') if c in run]
pooled = {c: [] for c in configs}
nan = float('nan')

def ratio(s, a, b, key):
    if a not in s or b not in s or not s[b][key]:
        return nan
    return s[a][key] / s[b][key]

print('| rep | config | turns>=2 loads | p50 load ms | p99 load ms | load GB/s | hit ratio | hints staged / hits / late / wasted |')
print('|---|---|---|---|---|---|---|---|')
for rep in range(1, reps + 1):
    s = {c: stats('%s/%s-%d/replay.json' % (out, c, rep)) for c in configs}
    for c in configs:
        pooled[c] += s[c]['loads']
        m = '%s/%s-%d/metrics.txt' % (out, c, rep)
        h = '/'.join('%g' % metric(m, 'hymcache_storage_prefetch_turn_' + n) for n in
                     ('hints_staged_total', 'hint_hits_total', 'hint_late_total', 'hints_wasted_total'))
        print('| %d | %s | %d | %.2f | %.2f | %.2f | %.3f | %s |' % (
            rep, c, s[c]['n'], s[c]['p50'], s[c]['p99'], s[c]['gbps'], s[c]['hit'], h))
    ratios['h50'].append(ratio(s, 'hints', 'dram', 'p50'))
    ratios['h99'].append(ratio(s, 'hints', 'dram', 'p99'))
    ratios['n50'].append(ratio(s, 'hybrid', 'dram', 'p50'))
    ratios['n99'].append(ratio(s, 'hybrid', 'dram', 'p99'))
    ratios['bw'].append(ratio(s, 'hints', 'hybrid', 'gbps'))
    ratios['waste'].append(ratio(s, 'waste', 'hybrid', 'gbps'))
med = {k: statistics.median(v) for k, v in ratios.items()}
# The loads of every rep together: a p99 of reps x 80 loads moves less with
# one slow load than each rep's own.
line = []
for c in configs:
    line.append('%s p50 %.2f p90 %.2f p99 %.2f ms' % (
        c, pct(pooled[c], 0.5), pct(pooled[c], 0.9), pct(pooled[c], 0.99)))
print('pooled over %d reps: %s' % (reps, '; '.join(line)))

def pooled_ratio(a, b, p):
    if a not in pooled or b not in pooled or not pooled[b]:
        return nan
    return pct(pooled[a], p) / pct(pooled[b], p)

print('think_time: hints_vs_dram_p50=%.2f hints_vs_dram_p99=%.2f nohints_vs_dram_p50=%.2f '
      'nohints_vs_dram_p99=%.2f hints_bw_vs_nohints=%.2f wasted_bw_vs_nohints=%.2f '
      'pooled_hints_vs_dram_p50=%.2f pooled_hints_vs_dram_p99=%.2f' % (
          med['h50'], med['h99'], med['n50'], med['n99'], med['bw'], med['waste'],
          pooled_ratio('hints', 'dram', 0.5), pooled_ratio('hints', 'dram', 0.99)))
EOF
