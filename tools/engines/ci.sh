#!/usr/bin/env bash
# CI's engine step (tools/test.sh runs it; not under asan/tsan): installs or
# reuses the engines' venv (wheels from our wheelhouse, tools/engines/pip_lib.sh;
# PyPI for what is missing), runs
# the connector's tests against vLLM's installed classes and real daemons
# (python/tests/vllm_connector_test.py), the KV-event publisher's against
# vLLM's event types (python/tests/kv_events_test.py) and the engine-cache
# reporter's against vLLM's publisher (python/tests/engine_blocks_test.py),
# then the short form of the end to
# end run with the real engine (tools/engines/vllm_e2e.sh --short). Its last
# line is "engines: N passed, N failed". When vLLM cannot be installed at all
# it says so in one line, "engines: SKIPPED: ...", and exits 3.
set -uo pipefail
cd "$(dirname "$0")/../.."

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! PY=$(timeout 900 bash tools/engines/venv.sh 2>"$log" | tail -n 1) ||
   [ ! -x "$PY" ]; then
  why=$(grep -m 1 -E 'ERROR|Error|error' "$log" || tail -n 1 "$log")
  echo "engines: SKIPPED: vLLM could not be installed here (tools/engines/venv.sh): $why"
  exit 3
fi
passed=0
failed=0
bazel build -c opt //master:hymcache-master //storage_node:hymcache-storage \
  //tools/hymctl:hymctl 2>&1 | tail -n 1
BIN=$(bazel info -c opt bazel-bin 2>/dev/null)

echo "=== engines: hymcache.vllm against vLLM's classes, KV events in vLLM's format"
HYMCACHE_BIN="$BIN" timeout 300 "$PY" -m pytest -q -p no:cacheprovider \
  python/tests/vllm_connector_test.py python/tests/kv_events_test.py \
  python/tests/engine_blocks_test.py 2>&1 | tee "$log"
p=$(grep -oE '[0-9]+ passed' "$log" | tail -n 1 | cut -d' ' -f1)
f=$(grep -oE '[0-9]+ (failed|error)' "$log" | awk '{s += $1} END {print s + 0}')
passed=$((passed + ${p:-0}))
failed=$((failed + f))
[ -z "$p" ] && [ "$f" -eq 0 ] && failed=$((failed + 1))

echo "=== engines: vLLM end to end, short form"
start=$(date +%s)
if timeout 480 bash tools/engines/vllm_e2e.sh --short; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
fi
echo "engines: short form took $(( $(date +%s) - start )) s"
echo "engines: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
