#!/usr/bin/env bash
# Runs the HyMCache test suite: installs dependencies, then runs every test
# under each configuration in HYMCACHE_TEST_CONFIGS (default: "default asan
# tsan"), then the RDMA and CXL tests inside a QEMU guest (tests/vmtest;
# HYMCACHE_VMTEST=0 skips them), and prints a closing line "N passed, N
# failed" counted from Bazel's per-test results and the guest runs. Exits
# non-zero if any test failed or did not build.
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
# The RDMA and CXL code paths on real (software) devices: a QEMU guest with
# Soft-RoCE and a CXL memory NUMA node runs host-built tests (tests/vmtest).
# HYMCACHE_VMTEST=0 skips it. A guest that never reports a result (boot
# trouble, a kernel oops) is retried once; a failing test is not.
if [ "${HYMCACHE_VMTEST:-1}" = "1" ]; then
  echo "=== vmtest: Soft-RoCE and a CXL NUMA node in a QEMU guest"
  if bash tests/vmtest/setup.sh &&
     bazel build -c opt //common:rdma_loopback_test //tests:direct_cluster_test; then
    bb=$(bazel info -c opt bazel-bin 2>/dev/null)
    for t in "rdma common/rdma_loopback_test" "rdma+cxl tests/direct_cluster_test"; do
      mode=${t%% *}
      bin=${t#* }
      rc=1
      for attempt in 1 2; do
        out=$(HYMCACHE_REQUIRE_RDMA=1 VM_TIMEOUT=900 bash tests/vmtest/run.sh \
                "$mode" "$bb/$bin" 2>&1)
        rc=$?
        echo "$out" | grep -E "^VMTEST (PASS|FAIL)|FAILED|with expansion" || true
        echo "$out" | grep -q "VMTEST-RESULT" && break
        echo "=== vmtest: the guest reported no result; retrying once"
      done
      if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
      else
        echo "$out" | tail -n 80
        failed=$((failed + 1))
        status=1
      fi
    done
  else
    echo "=== vmtest: setup or build failed"
    failed=$((failed + 1))
    status=1
  fi
fi

echo "$passed passed, $failed failed"
exit $status
