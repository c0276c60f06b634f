#!/usr/bin/env bash
# The short master-HA crash test (tools/crashtest --masters=2): a 1-member
# etcd, two masters with synchronous standby replication and a 1 s lease,
# a DRAM and a hybrid node under the multi-turn workload; 3 SIGKILLs of
# whichever master leads. Wrong bytes, lost acknowledged commits (blocks on
# nodes never killed), stale listings and fsck are checked strictly, and
# every kill's failover (kill -> first lookup, first put) must finish within
# 10 s: a generous bound for a loaded machine or a sanitizer build; the 2 s
# p99 floor is measured by the long form (docs/ha.md).
set -euo pipefail
exec "$TEST_SRCDIR/$TEST_WORKSPACE/tools/crashtest/crashtest" \
  --masters=2 --kills=3 --seed=30 --max_failover_ms=10000 \
  --daemon_log_dir="${TEST_UNDECLARED_OUTPUTS_DIR:-$TEST_TMPDIR}" "$@"
