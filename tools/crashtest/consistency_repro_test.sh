#!/usr/bin/env bash
# Both consistency_repro cases must not reproduce (exit 0): a Put
# acknowledged by a restarted node is never purged by its registration, and
# storing a key again elsewhere never removes the blocks after it.
set -uo pipefail
bin="$TEST_SRCDIR/$TEST_WORKSPACE/tools/crashtest/consistency_repro"
status=0
for c in lost_commit orphaned_subtree; do
  echo "=== $c"
  "$bin" --case="$c" --work_dir="${TEST_UNDECLARED_OUTPUTS_DIR:-$TEST_TMPDIR}/$c"
  rc=$?
  echo "=== $c: exit $rc"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
