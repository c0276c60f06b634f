#!/usr/bin/env bash
# Builds the RDMA and CXL tests, boots the QEMU guest for each (tests/vmtest)
# and prints a pass/fail summary; exits non-zero if any failed.
#   rdma      common/rdma_loopback_test: the verbs layer on Soft-RoCE
#             (memory windows included)
#   rdma      storage_node/dataplane/rdma_plane_test: what a client's queue pair can
#             reach of a node's memory (one object per grant) in each mode
#   rdma+cxl  tests/direct_cluster_test: master + storage nodes + clients over
#             RDMA (DRAM and hybrid devices, killed node), TCP, and shared
#             memory with the DRAM node on the CXL NUMA node
# A guest that reports no result (boot trouble, a kernel oops) is retried
# once; a failing test is not. Last line: "vmtest: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."

if ! bash tests/vmtest/setup.sh ||
   ! bazel build -c opt //common:rdma_loopback_test //storage_node/dataplane:rdma_plane_test \
       //tests:direct_cluster_test; then
  echo "vmtest: setup or build failed"
  echo "vmtest: 0 passed, 1 failed"
  exit 1
fi
bb=$(bazel info -c opt bazel-bin 2>/dev/null)
passed=0
failed=0
for t in "rdma common/rdma_loopback_test" "rdma storage_node/dataplane/rdma_plane_test" \
         "rdma+cxl tests/direct_cluster_test"; do
  mode=${t%% *}
  bin=${t#* }
  rc=1
  out=""
  for attempt in 1 2; do
    # 4 GiB: the guest's /tmp (tmpfs) holds the tests' capacity files and
    # databases, and 2 GiB ran short (virtio failed "out of resources").
    out=$(HYMCACHE_REQUIRE_RDMA=1 VM_TIMEOUT=${VM_TIMEOUT:-900} VM_MEM=${VM_MEM:-4G} \
          bash tests/vmtest/run.sh "$mode" "$bb/$bin" 2>&1)
    rc=$?
    echo "$out" | grep -q "VMTEST-RESULT" && break
    echo "vmtest: the guest reported no result for $bin; retrying once"
  done
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
  else
    echo "$out" | tail -n 80
    failed=$((failed + 1))
  fi
  echo "$out" | grep -E "^VMTEST (PASS|FAIL)" || echo "VMTEST FAIL: $mode $bin: no result"
done
echo "vmtest: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
