#!/bin/bash
# hymsim and hymbench side by side on eviction (issue 33: "hymsim and
# hymbench agree within 20%"): one trace, a store that holds a fraction of
# its footprint, and the prefill time the cached prefixes save
#   model     hymsim eviction's chain-rule store with the master's LRU walk
#             (tools/hymsim/hymsim/eviction.py), capacity in blocks;
#   measured  hymbench replay of the same trace against a real master and an
#             all-DRAM node of that capacity in bytes (the master evicts),
#             scored by the same prefill formula (hymsim --measured).
# The replay runs in trace order, one request at a time, each store waited
# for (--wait_stores) and no read leases (--read_lease_ms=0), so the store
# sees the sequence the model sees.
#
# Usage: tools/bench/eviction_agreement.sh [--trace=PATH] [--fraction=0.5]
#          [--block_bytes=64K] [--out=DIR] [--ended] [--cost]
#   --trace     a Mooncake JSONL trace (512 tokens per hash_id), e.g.
#               ../shared/traces/...; default: hymbench gen's synthetic chat
#               (CONVERSATIONS=48, TURNS=8: ~400 requests).
#   --fraction  the store's capacity as a fraction of the trace's footprint
#               (its distinct full blocks).
#   --ended     a second replay, on a fresh master and node, that sends
#               HintConversationEnded after each conversation's last request
#               (--hint_conversation_end: the master evicts ended chains
#               first), scored beside the first and against hymsim's "ended"
#               policy; one more last line: `eviction_ended:
#               measured_ended_vs_lru_saved=X.XX model_ended_vs_lru_saved=X.XX
#               measured_vs_model_saved=X.XX (ended, capacity F)`.
#   --cost      one more replay, on a fresh master (--eviction_policy=cost,
#               master/eviction_cost.h) and node, with the hints of
#               --ended when it is given too; scored beside the others and
#               against hymsim's "cost" policy; one more last line:
#               `eviction_cost: measured_cost_vs_lru_saved=X.XX
#               [measured_cost_vs_ended_saved=X.XX] model_cost_vs_lru_saved=X.XX
#               (cost, capacity F)`. COST_FLAGS (environment) adds master
#               flags to that run (e.g. --eviction_cost_pool=256).
#   REPLAY_FLAGS (environment) adds hymbench flags to every replay (e.g.
#   --hint_next_turn: think-time hints, from which the cost policy learns
#   each tenant's turn-return rate).
# Knobs (environment): HYMCACHE_BENCH_BIN as cluster_lib.sh.
# Its last line: `eviction_agreement: measured_vs_model_saved=X.XX
#   measured_vs_model_hits=X.XX (lru, capacity F)`.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TRACE=""
FRACTION=0.5
BLOCK=64K
OUT=/tmp/eviction-agreement
ENDED=0
COST=0
while [ $# -gt 0 ]; do
  case $1 in
    --trace=*) TRACE=${1#*=} ;;
    --fraction=*) FRACTION=${1#*=} ;;
    --block_bytes=*) BLOCK=${1#*=} ;;
    --out=*) OUT=${1#*=} ;;
    --ended) ENDED=1 ;;
    --cost) COST=1 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
CONVERSATIONS=${CONVERSATIONS:-48}
TURNS=${TURNS:-8}

rm -rf "$OUT"
mkdir -p "$OUT"
cd "$ROOT"
# shellcheck source=tools/bench/cluster_lib.sh
source "$ROOT/tools/bench/cluster_lib.sh"
cluster_binaries "$OUT"

if [ -z "$TRACE" ]; then
  TRACE="$OUT/trace.jsonl"
  "$BIN/hymbench" gen --conversations="$CONVERSATIONS" --turns="$TURNS" >"$TRACE"
fi
block_bytes=$(python3 -c "
s = '$BLOCK'.upper(); m = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
print(int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s))")
# The store's capacity: the fraction of the distinct full blocks
# (hymsim's footprint), in bytes.
capacity=$(cd tools/hymsim && python3 -c "
import sys
from hymsim import evict_replay, trace
reqs = trace.load_mooncake(sys.argv[1])
print(int(float(sys.argv[2]) * evict_replay.footprint(reqs, 512)) * int(sys.argv[3]))
" "$(realpath "$TRACE")" "$FRACTION" "$block_bytes")
echo "trace $TRACE, capacity $FRACTION of the footprint: $capacity bytes" \
  "in $BLOCK blocks" >&2

# One replay against a fresh master and node: $1 names its files, the rest
# are extra hymbench flags; MASTER_FLAGS (an array) extra master flags.
MASTER_FLAGS=()
# shellcheck disable=SC2206  # REPLAY_FLAGS: words on purpose
replay_flags=(${REPLAY_FLAGS:-})
replay() {
  local name=$1
  shift
  start_master "$OUT/master-$name" --read_lease_ms=0 "${MASTER_FLAGS[@]}"
  start_node "$OUT" "node-$name" --device=dram --dram_bytes="$capacity" --shm=false
  "$BIN/hymbench" replay --master="$MASTER" --trace="$TRACE" --block_tokens=512 \
    --block_bytes="$BLOCK" --concurrency=1 --time_scale=max --wait_stores \
    --progress_s=0 --json="$OUT/$name.json" "${replay_flags[@]}" "$@" \
    >"$OUT/$name.txt" 2>"$OUT/$name.log"
  stop_all
  tail -4 "$OUT/$name.txt" >&2
}
replay replay
measured_ended=()
if [ "$ENDED" = 1 ]; then
  replay replay-ended --hint_conversation_end
  measured_ended=(--measured_ended="$OUT/replay-ended.json")
fi
measured_cost=()
if [ "$COST" = 1 ]; then
  hints=()
  [ "$ENDED" = 1 ] && hints=(--hint_conversation_end)
  # shellcheck disable=SC2206  # COST_FLAGS: words on purpose
  MASTER_FLAGS=(--eviction_policy=cost ${COST_FLAGS:-})
  replay replay-cost "${hints[@]}"
  MASTER_FLAGS=()
  measured_cost=(--measured_cost="$OUT/replay-cost.json")
fi

cd tools/hymsim
python3 -m hymsim eviction --trace="$(realpath "$TRACE")" --block_tokens=512 \
  --trace_block_tokens=512 --capacity_fraction="$FRACTION" --policies=lru \
  --measured="$OUT/replay.json" "${measured_ended[@]}" "${measured_cost[@]}" \
  --json="$OUT/eviction.json"
