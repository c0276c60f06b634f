#!/usr/bin/env bash
# The short crash test (tools/crashtest): 20 SIGKILLs of random daemons of a
# master, a DRAM node and a hybrid node under the multi-turn workload. The
# daemons' logs land in the test's undeclared outputs.
set -euo pipefail
exec "$TEST_SRCDIR/$TEST_WORKSPACE/tools/crashtest/crashtest" \
  --kills=20 --seed=20 \
  --daemon_log_dir="${TEST_UNDECLARED_OUTPUTS_DIR:-$TEST_TMPDIR}" "$@"
