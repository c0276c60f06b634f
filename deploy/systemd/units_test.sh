#!/bin/bash
# deploy/systemd units: systemd-analyze verify accepts them (with ExecStart
# pointed at the built binaries), they are Type=notify with a watchdog, and
# each --flag in ExecStart is one the daemon defines.
set -euo pipefail
src="$TEST_SRCDIR/hymcache"
command -v systemd-analyze >/dev/null || {
  echo "systemd-analyze missing: apt-get install systemd (tools/setup.sh --test)" >&2
  exit 1
}
declare -A bin=(
  [master]="$src/master/hymcache-master"
  [storage]="$src/storage_node/hymcache-storage"
)
for u in master storage; do
  unit="$src/deploy/systemd/hymcache-$u.service"
  grep -qx 'Type=notify' "$unit"
  grep -q '^WatchdogSec=[1-9]' "$unit"
  test="$TEST_TMPDIR/hymcache-$u.service"
  sed "s|/usr/local/bin/hymcache-$u|${bin[$u]}|" "$unit" > "$test"
  # Quiet when it is happy; any message is a finding.
  out=$(cd "$TEST_TMPDIR" && systemd-analyze verify "$test" 2>&1) || {
    echo "$out" >&2
    exit 1
  }
  if [ -n "$out" ]; then
    echo "systemd-analyze verify hymcache-$u.service: $out" >&2
    exit 1
  fi
  # The flags of ExecStart (through its continuation lines).
  help=$("${bin[$u]}" --helpfull 2>&1 || true)
  flags=$(sed -n '/^ExecStart=/,/[^\\]$/p' "$unit" | grep -o -- '--[a-z_]*' || true)
  [ -n "$flags" ]
  for f in $flags; do
    grep -q -- "^    -${f#--} (" <<<"$help" || {
      echo "hymcache-$u.service passes $f, which ${bin[$u]} does not define" >&2
      exit 1
    }
  done
  echo "hymcache-$u.service: verified, flags: $(echo $flags)"
done
