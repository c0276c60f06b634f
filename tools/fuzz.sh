#!/usr/bin/env bash
# Runs every libFuzzer target of HyMCache (cc_binary targets named *_fuzz,
# built with --config=fuzz: clang-14, libFuzzer, ASan + UBSan) for a fixed
# time each, starting from its seed corpus (PKG/fuzz_corpus/NAME), and
# prints per target: executions, executions/s, coverage (libFuzzer's cov:
# edges, ft: features), corpus size and the outcome. A crash, sanitizer
# report, leak, timeout (a hang) or out-of-memory fails the target; its input
# is saved under --artifacts and the command to replay it is printed.
#
#   tools/fuzz.sh                    # 25 s per target (tools/test.sh: 20 s)
#   tools/fuzz.sh --seconds=600      # the long run (docs/security.md)
#   tools/fuzz.sh --targets=//master:master_service_fuzz --seconds=60
#   tools/fuzz.sh --merge            # then add inputs that cover new code to
#                                    # the in-tree seed corpus (minimised)
#
# The in-tree corpus is never modified without --merge: each run works on a
# copy. Closing line: "fuzz: N passed, N failed". Exit status 1 if a target
# failed or did not build.
set -uo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=25
TARGETS=""
MERGE=0
PARALLEL=$(nproc 2>/dev/null || echo 2)
[ "$PARALLEL" -gt 2 ] && PARALLEL=2
ARTIFACTS=${TMPDIR:-/tmp}/hymcache-fuzz-artifacts
TIMEOUT=10      # seconds one input may take before it counts as a hang
RSS_LIMIT=3072  # MiB
for arg in "$@"; do
  case "$arg" in
    --seconds=*) SECONDS_PER_TARGET=${arg#*=} ;;
    --targets=*) TARGETS=${arg#*=} ;;
    --merge) MERGE=1 ;;
    --parallel=*) PARALLEL=${arg#*=} ;;
    --artifacts=*) ARTIFACTS=${arg#*=} ;;
    --timeout=*) TIMEOUT=${arg#*=} ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

bash tools/setup.sh >/dev/null || exit 1

if [ -z "$TARGETS" ]; then
  TARGETS=$(bazel query 'attr(name, "_fuzz$", kind("cc_binary", //...))' 2>/dev/null | sort)
fi
if [ -z "$TARGETS" ]; then
  echo "fuzz: no fuzz targets found"
  echo "fuzz: 0 passed, 1 failed"
  exit 1
fi
ntargets=$(echo $TARGETS | wc -w)
echo "=== fuzz: building $ntargets targets with --config=fuzz (clang-14, libFuzzer, ASan+UBSan)"
# shellcheck disable=SC2086
if ! bazel build --config=fuzz $TARGETS; then
  echo "fuzz: 0 passed, $ntargets failed (build)"
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$ARTIFACTS"
bins="$work/bin"
mkdir -p "$bins"

# Copies the binaries: a later bazel build (another config) reuses the
# output paths.
for t in $TARGETS; do
  pkg=${t#//}; pkg=${pkg%%:*}; name=${t##*:}
  cp "bazel-bin/$pkg/$name" "$bins/$name"
done

run_one() {
  local t=$1 pkg name seeds corpus log
  pkg=${t#//}; pkg=${pkg%%:*}; name=${t##*:}
  seeds="$pkg/fuzz_corpus/$name"
  corpus="$work/corpus-$name"
  log="$work/$name.log"
  mkdir -p "$corpus"
  [ -d "$seeds" ] && cp -r "$seeds/." "$corpus/"
  "$bins/$name" "$corpus" \
      -max_total_time="$SECONDS_PER_TARGET" -timeout="$TIMEOUT" \
      -rss_limit_mb="$RSS_LIMIT" -print_final_stats=1 \
      -artifact_prefix="$ARTIFACTS/$name-" >"$log" 2>&1
  echo $? >"$work/$name.rc"
}

running=0
for t in $TARGETS; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$PARALLEL" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

passed=0
failed=0
printf '%-44s %12s %9s %7s %8s %7s  %s\n' target runs exec/s cov ft corpus result
for t in $TARGETS; do
  pkg=${t#//}; pkg=${pkg%%:*}; name=${t##*:}
  log="$work/$name.log"
  rc=$(cat "$work/$name.rc" 2>/dev/null || echo 1)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: ' | tail -1)
  cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
  ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
  corp=$(echo "$last" | sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p')
  if [ "$rc" -eq 0 ]; then
    result=ok
    passed=$((passed + 1))
  else
    result="FAILED (exit $rc)"
    failed=$((failed + 1))
  fi
  printf '%-44s %12s %9s %7s %8s %7s  %s\n' "$t" "${runs:-?}" "${eps:-?}" \
      "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
  if [ "$rc" -ne 0 ]; then
    echo "--- $t: last lines of libFuzzer's output"
    tail -60 "$log"
    art=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    if [ -n "$art" ]; then
      echo "--- $t: input saved as $art; replay it with"
      echo "    bazel build --config=fuzz $t && bazel-bin/$pkg/$name $art"
      echo "    bazel run --config=asan $t -- $art    # gcc + ASan, replay only"
    fi
  fi
  if [ "$MERGE" = 1 ] && [ "$rc" -eq 0 ]; then
    mkdir -p "$pkg/fuzz_corpus/$name"
    "$bins/$name" -merge=1 "$pkg/fuzz_corpus/$name" "$work/corpus-$name" \
        >"$work/$name.merge.log" 2>&1 ||
      echo "--- $t: merge failed (see libFuzzer's -merge)"
    echo "    merged: $(ls "$pkg/fuzz_corpus/$name" | wc -l) inputs in $pkg/fuzz_corpus/$name"
  fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
