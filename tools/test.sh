#!/usr/bin/env bash
# Runs the HyMCache test suite: installs dependencies, then runs every test
# under each configuration in HYMCACHE_TEST_CONFIGS (default: "default asan
# tsan"), and prints a closing line "N passed, N failed" counted from Bazel's
# per-test results. Exits non-zero if any test failed or did not build.
set -uo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh || exit 1

CONFIGS=${HYMCACHE_TEST_CONFIGS:-"default asan tsan"}
passed=0
failed=0
status=0
for cfg in $CONFIGS; do
  flags=(--config=ci)
  [ "$cfg" != "default" ] && flags+=(--config="$cfg")
  echo "=== bazel test ${flags[*]} //..."
  log=$(mktemp)
  bazel test "${flags[@]}" //... 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  p=$(grep -cE '^//[^ ]+ +PASSED' "$log")
  f=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE|FAILED TO BUILD)' "$log")
  echo "=== [$cfg] $p passed, $f failed (bazel exit $rc)"
  passed=$((passed + p))
  failed=$((failed + f))
  if [ "$rc" -ne 0 ]; then
    status=1
    # A build failure shows no per-test lines: count it as a failure.
    [ "$f" -eq 0 ] && failed=$((failed + 1))
  fi
  rm -f "$log"
done
echo "$passed passed, $failed failed"
exit $status
