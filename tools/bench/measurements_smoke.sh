#!/usr/bin/env bash
# A smoke run of every command in README.md's "## Measurements" section: each
# documented benchmark once, in a short form (tiny sizes, one trial, short
# durations), with the binaries of the current build configuration. A command
# fails its smoke if it exits non-zero or prints none of the rows it exists
# to print; the test fails if any smoke did. Numbers are not checked: this is
# about a documented command that rots (as transport_bench did when the
# storage node began to require capabilities, and printed no rows, exit 0).
#
#   bazel test //tools/bench:measurements_smoke   (tools/test.sh runs it in
#                                                  the default configuration)
#   bazel run //tools/bench:measurements_smoke -- get_bench_tcp transport_bench
#       only the named smokes (names as printed)
#
# Not run here, and why:
#   bash tests/vmtest/check.sh   tools/test.sh runs it already (a QEMU guest);
#   bazel run //tools/crashtest  the suite runs its short forms (20 kills;
#                                3 leader kills with --masters=2; the
#                                //tools/crashtest tests);
#   tools/bench/peers.sh         needs the peers installed outside the
#                                repository; tools/test.sh's engine block
#                                runs `peers.sh --short` (or says it skipped);
# hymbench_floors.sh wants a Mooncake trace; here it replays a small
# Mooncake-format trace that `hymbench gen` writes (no trace files from
# outside the repository).
set -uo pipefail

if [ -n "${TEST_SRCDIR:-}" ]; then
  R="$TEST_SRCDIR/${TEST_WORKSPACE:-hymcache}"
else
  R="$0.runfiles/hymcache"
fi
if [ ! -d "$R/tools/bench" ]; then
  echo "measurements_smoke: no runfiles at $R (run it with bazel test/run)" >&2
  exit 2
fi
T=${TEST_TMPDIR:-$(mktemp -d)}
mkdir -p "$T"
cd "$R" || exit 2
ONLY=" $* "
# Per command: a generous bound, for a loaded CI machine.
LIMIT=${SMOKE_TIMEOUT_S:-150}

passed=0
failed=0
failures=()

# smoke NAME [-p PATTERN]... -- COMMAND...: runs COMMAND; passes if it exits
# 0 and every PATTERN (an extended regular expression) matches a line of its
# output (stdout and stderr together).
smoke() {
  local name=$1
  shift
  local patterns=()
  while [ "$1" != "--" ]; do
    patterns+=("$2")
    shift 2
  done
  shift
  if [ "$ONLY" != "  " ] && [[ "$ONLY" != *" $name "* ]]; then return; fi
  local log="$T/$name.log" start=$SECONDS rc=0 why=""
  timeout -k 10 "$LIMIT" "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    why="exit status $rc"
    [ "$rc" -eq 124 ] && why="timed out after $LIMIT s"
  else
    for p in "${patterns[@]}"; do
      if ! grep -Eq -- "$p" "$log"; then
        why="no line matches /$p/"
        break
      fi
    done
  fi
  if [ -n "$why" ]; then
    echo "FAIL $name ($((SECONDS - start)) s): $why"
    echo "     command: $*"
    tail -n 25 "$log" | sed 's/^/     | /'
    failed=$((failed + 1))
    failures+=("$name")
  else
    echo "ok   $name ($((SECONDS - start)) s)"
    for p in "${patterns[@]}"; do
      grep -E -m1 -- "$p" "$log" | cut -c1-160 | sed 's/^/     | /'
    done
    passed=$((passed + 1))
  fi
}

B="$R/tools/bench"

# bazel run -c opt //master:metadata_index_benchmark
smoke metadata_index_benchmark \
  -p '^key_bytes=32 entries=20000 bytes_per_entry=' \
  -p ' signed32_us=[0-9.]+/[0-9.]+/[0-9.]+ prefetched32_us=[0-9.]+/' \
  -p '^mix threads=2 op=batch_lookup32_for_read count=[1-9]' -- \
  "$R/master/metadata_index_benchmark" --entries=20000 --key_sizes=32 \
  --mix_threads=2 --mix_objects=2000 --mix_seconds=0.3

# bazel run -c opt //tools/bench:lookup_bench
smoke lookup_bench -p '^\| 32 \| 1 \| plain \| [1-9]' \
  -p '^\| 32 \| 1 \| for_read \| [1-9]' -- \
  "$B/lookup_bench" --objects=2000 --batch_sizes=32 --threads=1 \
  --seconds=0.2 --trials=1

# bazel run -c opt //tools/bench:lookup_bench -- --batch_sizes=32
#     --threads=1,8 --modes=for_read --transports=unary,stream_async,sdk
#     --redis --client_poll_strategy=poll
# tools/setup.sh --test installs redis-server (Debian's); without it this
# smoke fails, as the documented command would.
redis=(--redis)
smoke lookup_bench_transports -p '^\| 32 \| 8 \| for_read stream_async' \
  -p '^\| 32 \| 8 \| for_read sdk' -p '^\| 32 \| 8 \| Redis MGET' -- \
  "$B/lookup_bench" --batch_sizes=32 --threads=1,8 --modes=for_read \
  --transports=unary,stream_async,sdk "${redis[@]}" \
  --client_poll_strategy=poll --objects=2000 --seconds=0.2 --trials=1

# bazel run -c opt //tools/bench:get_bench
smoke get_bench_tcp -p '^best: raw loopback socket +[0-9.]+ GB/s, hymcache GET \(tcp\) +[0-9.]+ GB/s +\([0-9.]+x\)$' -- \
  "$B/get_bench" --block_kib=256 --blocks=4 --rounds=2 --trials=1

# bazel run -c opt //tools/bench:c_api_bench
smoke c_api_bench -p '^tcp +[0-9.]+ \(' -p '^shm +[0-9.]+ \(' -- \
  "$B/c_api_bench" --blocks=4 --block_kib=16 --calls=20

# bazel run -c opt //tools/bench:get_bench -- --transport=shm
smoke get_bench_shm -p '^best: memcpy +[0-9.]+ GB/s, hymcache GET \(shm\) +[0-9.]+ GB/s +\([0-9.]+x\)$' -- \
  "$B/get_bench" --transport=shm --block_kib=256 --blocks=4 --rounds=2 --trials=1

# bazel run -c opt //tools/bench:get_bench -- --busy_core --processes=separate
smoke get_bench_busy_separate \
  -p 'processes=separate busy_core=unpinned' \
  -p '^best: raw loopback socket +[0-9.]+ GB/s, hymcache GET \(tcp\) +[0-9.]+ GB/s +\([0-9.]+x\)$' -- \
  "$B/get_bench" --busy_core --processes=separate --block_kib=256 --blocks=4 \
  --rounds=2 --trials=1

# bazel run -c opt //tools/bench:transport_bench (its 16 MiB and 256 KiB rows)
smoke transport_bench \
  -p '^ +16384 KiB x  1 \| raw socket +[0-9.]+ +tcp +[0-9.]+ +\([0-9.]+x\) \| memcpy +[0-9.]+ +shm +[0-9.]+ +\([0-9.]+x\)$' \
  -p '^ +256 KiB x  2 \| raw socket' -- \
  bash -c '"$1" --block_kib=16384 --batch=1 --seconds=0.05 --trials=1 &&
           "$1" --block_kib=256 --batch=2 --seconds=0.05 --trials=1' _ \
  "$B/transport_bench"

# bazel run -c opt //tools/bench:python_load_bench
smoke python_load_bench -p '^\| 16 x 16384 KiB \| [0-9.]+ \| [0-9.]+ \|' \
  -p '^\| 32 x 256 KiB \| [0-9.]+ \| [0-9.]+ \|' -- \
  "$B/python_load_bench" --trials=1 --iterations=1

# bazel run -c opt //python/kvengine:kv_engine -- --local
smoke kv_engine -p 'TTFT per turn' -p '^ +all +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ ' -- \
  "$R/python/kvengine/kv_engine" --local --local_dram_bytes=67108864 \
  --conversations=2 --turns=2 --num_layers=2 --head_dim=16 --block_tokens=16 \
  --system_prompt_tokens=64 --user_tokens=32 --output_tokens=16 \
  --prefill_tokens_per_s=1000000 --wait_stores

# bazel run -c opt //tools/bench:device_bench
DEVICE_SMALL=(--conversations=2 --turns=2 --block_mib=1 --window_mib=4
              --write_buffer_mib=2 --footprint_x=2 --raw_gib=0.03
              --raw_passes=1 --queue_depth=8)
smoke device_bench -p '^\| raw \(' -p '^\| staging \| [0-9.]+ \|' \
  -p '^\| lru_small \(' -- \
  "$B/device_bench" --capacity_file="$T/device-bench" "${DEVICE_SMALL[@]}"

# bazel run -c opt //tools/bench:reconcile_bench
smoke reconcile_bench -p '^anti-entropy round: [0-9.]+ s' \
  -p '^master restart: loaded in [0-9.]+ s' -- \
  "$B/reconcile_bench" --objects=2000 --dir="$T/reconcile"

# bazel run -c opt //master:replication_benchmark (docs/ha.md)
smoke replication_benchmark -p '^rep=0 mode=async puts_per_s=[1-9]' \
  -p '^ratio async/off=[0-9.]+ sync/off=[0-9.]+' -- \
  "$R/master/replication_benchmark" --seconds=0.3 --threads=1 --reps=1 \
  --dir="$T/replication"

# bazel run -c opt //tools/bench:ha_bench (docs/ha.md; Debian's etcd)
smoke ha_bench -p '^async +puts/s +[1-9][0-9.]* \([0-9.]+x\) +lookups/s +[1-9]' -- \
  "$B/ha_bench" --modes=off,async --threads=1 --seconds=0.3 --reps=1 \
  --settle_s=3 --dir="$T/ha"
# ... -- --modes=off,async,sync --threads=4 --put_depth=128 --leader_cpu=0
smoke ha_bench_depth -p '^sync +puts/s +[1-9][0-9.]* \([0-9.]+x\)' \
  -p '^sync +puts [0-9.]+x +lookups [0-9.]+x$' -- \
  "$B/ha_bench" --modes=off,sync --threads=1 --put_depth=8 --seconds=0.3 \
  --reps=1 --settle_s=3 --dir="$T/ha-depth"
# ... -- --modes=off,async,sync,confirm --put_depth=128 --lookup_depth=16
# --leader_cpu=0: the client confirms its commits with the standby (every
# put confirmed); the lookups start once the masters are idle
smoke ha_bench_confirm -p '^confirm +puts/s +[1-9][0-9.]* \([0-9.]+x\) +lookups/s +[1-9]' \
  -p '^rep=0 mode=confirm .* settled_ms=[0-9]+ client_cpu_us_per_lookup=[1-9]' \
  -p '^rep=0 mode=confirm .* confirm_commits=[1-9][0-9]* waits_sent=[1-9][0-9]* .*not_confirmed=0' -- \
  "$B/ha_bench" --modes=off,confirm --threads=1 --put_depth=8 --lookup_depth=4 \
  --seconds=0.3 --reps=1 --settle_s=3 --dir="$T/ha-confirm"

# ... -- --modes=off,async,confirm,redis --threads=1 --lookup_stream
# --client_poll_strategy=poll: HA lookups against Redis MGET-32 (Debian's
# redis-server, as lookup_bench_transports)
smoke ha_bench_redis -p '^rep=0 mode=redis .*lookups_per_s=[1-9]' \
  -p '^threads=1 .* batch=32 packed=1 ' \
  -p '^async +lookups [0-9.]+x redis \(per rep [0-9.]+x\)$' -- \
  "$B/ha_bench" --modes=off,async,redis --threads=1 --put_depth=8 \
  --lookup_stream --client_poll_strategy=poll --redis_keys=2000 \
  --seconds=0.3 --reps=1 --settle_s=3 --dir="$T/ha-redis"

# bazel run -c opt //tools/bench:ha_bench -- --failover_objects=N and
# --restart_objects=N (docs/ha.md)
smoke ha_bench_failover -p '^failover: rep=0 preload_index=1 serving_after_ms=[0-9]' \
  -p '^failover: objects=1000 .*ratio [0-9.]+\)$' -- \
  "$B/ha_bench" --failover_objects=1000 --reps=1 --dir="$T/ha-failover"
smoke ha_bench_restart -p '^restart_all: rep=0 preload_index=0 serving_after_ms=[0-9]' \
  -p '^restart_all: objects=1000 .*ratio [0-9.]+\)$' -- \
  "$B/ha_bench" --restart_objects=1000 --reps=1 --dir="$T/ha-restart"

# bazel run -c opt //tools/bench:put_bench (docs/ha.md, node-confirmed commits)
smoke put_bench -p '^receipts +[1-9][0-9]* ' -p '^ratio receipts/none: [0-9.]+' -- \
  "$B/put_bench" --blocks=2 --block_kib=4 --puts=20 --trials=1

# Documented outside README.md's Measurements (docs/security.md,
# docs/hybrid_device.md, docs/performance.md), smoked all the same.
# bazel run -c opt //tools/bench:tls_bench
smoke tls_bench -p '^plaintext [0-9.]+ GB/s, TLS [0-9.]+ GB/s' -- \
  "$B/tls_bench" --blocks=4 --block_bytes=1048576 --trials=1
# bazel run -c opt //common:crc32c_bench
smoke crc32c_bench -p '^ +table +256 KiB buffer: +[0-9.]+ GB/s' -- \
  "$R/common/crc32c_bench"
# bazel run -c opt //storage_node/device:integrity_bench -- --dir=/tmp --gib=2
smoke integrity_bench -p '^reads +4 readers: [0-9.]+ GB/s unchecked' -- \
  "$R/storage_node/device/integrity_bench" --dir="$T" --gib=0.05 --records=2
# master_load_benchmark --dir=DIR --write --snapshot (docs/performance.md)
smoke master_load_benchmark -p '^load_seconds=[0-9.]+ .*objects=20000' -- \
  "$R/master/master_load_benchmark" --dir="$T/load" --entries=20000 \
  --write --snapshot --reps=1

# The scripts build with bazel -c opt unless HYMCACHE_BENCH_BIN names a
# folder of binaries (a test cannot run bazel): one with links to ours.
BIN="$T/bin"
mkdir -p "$BIN"
for b in master/hymcache-master storage_node/hymcache-storage \
    tools/hymbench/hymbench tools/bench/device_bench tools/bench/get_bench; do
  ln -sf "$R/$b" "$BIN/"
done

# tools/bench/device_regimes.sh [--dir=DIR]
smoke device_regimes -p '^\| fast \| [0-9.]+ \|' -p '^\| throttled \| [0-9.]+ \|' -- \
  env HYMCACHE_BENCH_BIN="$BIN" bash "$B/device_regimes.sh" --dir="$T/regimes" \
  --out="$T/regimes-out" -- "${DEVICE_SMALL[@]}" --modes=raw,staging,lru

# tools/bench/node_staging_bench.sh [--dir=DIR]
smoke node_staging_bench -p '^\| tcp \| [0-9.]+ \|' -p '^\| shm \| [0-9.]+ \|' -- \
  env HYMCACHE_BENCH_BIN="$BIN" BLOCK=64K WINDOW=1M CONVERSATIONS=2 TURNS=2 \
  USER_TOKENS=1024 CONCURRENCY=1 ROUNDS=1 RAW_GIB=0.03 CAPACITY=256M \
  bash "$B/node_staging_bench.sh" --dir="$T/staging" --out="$T/staging-out"

# tools/bench/hymbench_floors.sh TRACE.jsonl, on a generated trace.
"$R/tools/hymbench/hymbench" gen --out="$T/trace.jsonl" --conversations=3 \
  --turns=3 --system_prompt_tokens=600 --user_tokens=700 --output_tokens=200 \
  >"$T/gen.log" 2>&1 || echo "hymbench gen failed: $(cat "$T/gen.log")"
smoke hymbench_floors -p '^prefetch on/off load bandwidth: [0-9.]+x' \
  -p '^hit ratio [0-9.]+, ceiling [0-9.]+' -p '^hit ratio: DRAM-only [0-9.]+, hybrid [0-9.]+' -- \
  env HYMCACHE_BENCH_BIN="$BIN" OUT="$T/floors" BLOCK=64K REQS1=9 \
  TIME_SCALE=max CONCURRENCY=2 DRAM=8M CAPACITY1=1G CAPACITY=1G \
  bash "$B/hymbench_floors.sh" "$T/trace.jsonl"

# tools/bench/think_time_bench.sh: two conversations of two turns, one rep.
smoke think_time_bench -p '^think_time: hints_vs_dram_p50=[0-9.]+ .*wasted_bw_vs_nohints=[0-9.na]+ pooled_hints_vs_dram_p50=[0-9.na]+ pooled_hints_vs_dram_p99=[0-9.na]+$' -- \
  env HYMCACHE_BENCH_BIN="$BIN" CONVERSATIONS=2 TURNS=2 GAP_MS=300 BLOCK=64K \
  STAGING=16M WRITE_BUFFER=8M CAPACITY=256M \
  bash "$B/think_time_bench.sh" --capdir="$T/think-time" --out="$T/think-time-out" --reps=1

# netns_bench: one small size, few calls (root and network namespaces; in
# Bazel's sandbox it says SKIPPED, which passes).
smoke netns_bench -p '^netns: (SKIPPED|get256k_vs_raw=[0-9.]+ lookup8_vs_raw=[0-9.]+)' -- \
  "$R/tools/bench/netns_bench" --block_kib=256 --blocks=4 --rounds=2 \
  --lookup_keys=8 --lookups=50 --trials=1 --minloglevel=1 \
  --master_binary="$BIN/hymcache-master" --storage_binary="$BIN/hymcache-storage"

# tools/bench/eviction_agreement.sh: a small generated chat.
smoke eviction_agreement -p '^eviction_agreement: measured_vs_model_saved=[0-9.]+ measured_vs_model_hits=[0-9.]+ ' \
  -p '^eviction_ended: measured_ended_vs_lru_saved=[0-9.]+ model_ended_vs_lru_saved=[0-9.]+ measured_vs_model_saved=[0-9.]+ ' \
  -p '^eviction_cost: measured_cost_vs_lru_saved=[0-9.]+ measured_cost_vs_ended_saved=[0-9.]+ model_cost_vs_lru_saved=[0-9.]+ ' -- \
  env HYMCACHE_BENCH_BIN="$BIN" CONVERSATIONS=8 TURNS=4 \
  bash "$B/eviction_agreement.sh" --ended --cost --out="$T/eviction-agreement"

echo "measurements smoke: $passed passed, $failed failed${failures[*]:+ (${failures[*]})}"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
