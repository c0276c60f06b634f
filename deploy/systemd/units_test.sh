#!/bin/bash
# deploy/systemd units as systemd reads them, without a running systemd:
# - systemd-analyze verify accepts them (ExecStart pointed at the built
#   binaries; the storage template as an instance);
# - systemd-analyze security --offline rates each at exposure <= 4.0;
# - they are Type=notify with a watchdog and do not restart on exit 2
#   (a configuration error);
# - every --flag in ExecStart and in the shipped flag files is one the
#   daemon defines, and each daemon reads its flag file (--flagfile) far
#   enough to reject a bad flag with exit 2;
# - the HA additions (master-ha.conf appended to master.conf) are flags the
#   master defines and parse as one flag file; etcd.default sets only
#   variables etcd 3.4 reads (ETCD_<FLAG> for a flag of etcd --help).
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

# Three masters through etcd: master.conf + master-ha.conf as one flag file.
# Every flag defined; a typo in it exits 2 like any flag file.
help=$("${bin[master]}" --helpfull 2>&1 || true)
ha_flags=$(grep -v '^#' "$dir/master-ha.conf" | grep -o -- '--[a-z_]*' | sort -u)
for f in --etcd --cluster --advertise_address --lease_ttl_s --replication \
         --replication_token_file; do
  grep -qx -- "$f" <<<"$ha_flags" || {
    echo "master-ha.conf does not set $f" >&2; exit 1
  }
  grep -q -- "^    -${f#--} (" <<<"$help" || {
    echo "master-ha.conf passes $f, which the master does not define" >&2; exit 1
  }
done
for f in $(grep '^#--' "$dir/master.conf" "$dir/storage-dram0.conf" |
           grep -o -- '--[a-z_]*' | sort -u); do
  grep -q -- "^    -${f#--} (" <<<"$help$("${bin[storage]}" --helpfull 2>&1 || true)" || {
    echo "master.conf or storage-dram0.conf suggests $f, which no daemon defines" >&2
    exit 1
  }
done
ha="$TEST_TMPDIR/master-ha-bad.conf"
{ cat "$dir/master.conf" "$dir/master-ha.conf"; echo "--lease_ttl_z=5"; } > "$ha"
set +e
"${bin[master]}" --flagfile="$ha" >/dev/null 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || {
  echo "master.conf + master-ha.conf with a bad flag exited $rc, not 2" >&2; exit 1
}
# etcd.default: each ETCD_X is etcd's --x (etcd --help), and names a
# three-member initial cluster including this member.
if command -v etcd >/dev/null; then
  ehelp=$(etcd --help 2>&1 || true)
  vars=$(grep -o '^ETCD_[A-Z_]*' "$dir/etcd.default")
  [ -n "$vars" ]
  for v in $vars; do
    flag=$(tr 'A-Z_' 'a-z-' <<<"${v#ETCD_}")
    grep -q -- "^  --$flag " <<<"$ehelp" || {
      echo "etcd.default sets $v, but etcd has no --$flag" >&2; exit 1
    }
  done
  name=$(sed -n 's/^ETCD_NAME=//p' "$dir/etcd.default")
  cluster=$(sed -n 's/^ETCD_INITIAL_CLUSTER=//p' "$dir/etcd.default")
  [ "$(tr ',' '\n' <<<"$cluster" | grep -c '=http://')" -eq 3 ] &&
    grep -q "\(^\|,\)$name=" <<<"$cluster" || {
    echo "etcd.default: ETCD_INITIAL_CLUSTER is not three members with $name" >&2
    exit 1
  }
  echo "etcd.default: $(echo $vars | wc -w) variables, all etcd flags"
else
  echo "etcd missing: apt-get install etcd-server (tools/setup.sh --test)" >&2
  exit 1
fi
echo "master-ha.conf: verified"
