#!/bin/bash
# deploy/systemd units as systemd reads them, without a running systemd:
# - systemd-analyze verify accepts them (ExecStart pointed at the built
#   binaries; the storage template as an instance);
# - systemd-analyze security --offline rates each at exposure <= 4.0;
# - they are Type=notify with a watchdog and do not restart on exit 2
#   (a configuration error);
# - every --flag in ExecStart and in the shipped flag files is one the
#   daemon defines, and each daemon reads its flag file (--flagfile) far
#   enough to reject a bad flag with exit 2.
# The same units run under a real systemd in tests/systemd (boot test).
set -euo pipefail
src="$TEST_SRCDIR/hymcache"
dir="$src/deploy/systemd"
command -v systemd-analyze >/dev/null || {
  echo "systemd-analyze missing: apt-get install systemd (tools/setup.sh --test)" >&2
  exit 1
}
declare -A bin=(
  [master]="$src/master/hymcache-master"
  [storage]="$src/storage_node/hymcache-storage"
)
declare -A unit=(
  [master]=hymcache-master.service
  [storage]=hymcache-storage@.service
)
declare -A instance=(
  [master]=hymcache-master.service
  [storage]=hymcache-storage@dram0.service
)
declare -A conf=(
  [master]=master.conf
  [storage]=storage-dram0.conf
)
for u in master storage; do
  file="$dir/${unit[$u]}"
  grep -qx 'Type=notify' "$file"
  grep -q '^WatchdogSec=[1-9]' "$file"
  grep -qx 'RestartPreventExitStatus=2' "$file"
  grep -q '^ExecStart=/usr/bin/hymcache-' "$file"
  test="$TEST_TMPDIR/${instance[$u]}"
  sed "s|/usr/bin/hymcache-$u|${bin[$u]}|" "$file" > "$test"
  # Quiet when it is happy; any message is a finding.
  out=$(cd "$TEST_TMPDIR" && systemd-analyze verify "$test" 2>&1) || {
    echo "$out" >&2
    exit 1
  }
  if [ -n "$out" ]; then
    echo "systemd-analyze verify ${instance[$u]}: $out" >&2
    exit 1
  fi
  sec=$(cd "$TEST_TMPDIR" && systemd-analyze security --offline=yes \
          --threshold=40 "$test" 2>&1) || {
    echo "$sec" >&2
    echo "${instance[$u]}: exposure above 4.0" >&2
    exit 1
  }
  level=$(grep -o 'Overall exposure level for [^:]*: [0-9.]*' <<<"$sec" |
            awk '{print $NF}')
  [ -n "$level" ]
  # The flags of ExecStart (through its continuation lines) and of the
  # shipped flag file.
  help=$("${bin[$u]}" --helpfull 2>&1 || true)
  flags=$( (sed -n '/^ExecStart=/,/[^\\]$/p' "$file";
            grep -v '^#' "$dir/${conf[$u]}") |
           grep -o -- '--[a-z_]*' | sort -u)
  [ -n "$flags" ]
  for f in $flags; do
    grep -q -- "^    -${f#--} (" <<<"$help" || {
      echo "${unit[$u]} or ${conf[$u]} passes $f, which ${bin[$u]} does not define" >&2
      exit 1
    }
  done
  # The commented-out alternatives in the flag file are real flags too.
  for f in $(grep '^#--' "$dir/${conf[$u]}" | grep -o -- '--[a-z_]*'); do
    grep -q -- "^    -${f#--} (" <<<"$help" || {
      echo "${conf[$u]} suggests $f, which ${bin[$u]} does not define" >&2
      exit 1
    }
  done
  # A flag file with a typo: exit 2, which the unit does not restart on.
  bad="$TEST_TMPDIR/bad-$u.conf"
  { cat "$dir/${conf[$u]}"; echo "--no_such_flag=1"; } > "$bad"
  set +e
  "${bin[$u]}" --flagfile="$bad" >/dev/null 2>&1
  rc=$?
  set -e
  [ "$rc" -eq 2 ] || {
    echo "${bin[$u]} --flagfile with a bad flag exited $rc, not 2" >&2
    exit 1
  }
  echo "${instance[$u]}: verified, exposure $level, flags: $(echo $flags)"
done
