#!/usr/bin/env bash
# The Debian package under a real systemd: builds a Debian bookworm root
# with mmdebstrap (systemd as init, plus the hymcache, libhymcache1 and
# libhymcache-dev .debs, whose Depends: apt resolves from Debian's archive), boots it with systemd-nspawn -b
# (systemd is PID 1 in the container; private network: loopback only), and
# inside it, as an operator would:
#   - makes the identities (make-identities.sh from the package);
#   - systemctl enable --now hymcache-master, hymcache-storage@a and @b
#     (two DRAM instances on distinct ports), which must become active
#     (Type=notify: READY=1) and show two live nodes in `hymctl status`;
#   - runs the demo workload against them (every loaded byte verified);
#   - builds the C quick start with gcc and `pkg-config hymcache` from
#     libhymcache-dev and runs it against them;
#   - reloads the master (SIGHUP), checks a mistyped instance flag file
#     fails with exit 2 and is not restarted (RestartPreventExitStatus=2);
#   - stops everything: each unit's Result must be success and its main
#     process must have exited 0;
#   - then the three-host install's masters, two of them on this host:
#     etcd.service of Debian's etcd-server from the shipped etcd.default,
#     hymcache-master with master-ha.conf appended to master.conf and a
#     second master unit (a copy of the packaged one on its own port and
#     state directory), a storage instance listing both masters; one
#     master leads; the demo runs; then the leader's unit is SIGKILLed:
#     the other master must lead with a higher epoch, the node must be
#     alive again, the demo must run again (every loaded byte verified),
#     (the killed unit is stopped, not restarted: the host is gone); the
#     host's master is started again and stands by; SIGKILLed as a
#     standby, systemd restarts it (Restart=on-failure) and the leader
#     stays; everything then stops cleanly.
#
#   tests/systemd/boot_test.sh [--deb=PATH]
#
# Without --deb it builds them with tools/package.sh --fast (--deb names
# the hymcache .deb; the SDK's are taken from beside it). Needs root,
# systemd-container, mmdebstrap and Debian's archive (tools/setup.sh
# --test). Prints "SYSTEMD BOOT PASS" or "SYSTEMD BOOT FAIL: why" (exit 1);
# "SYSTEMD BOOT SKIPPED: why" (exit 3) when this machine cannot boot a
# container at all (no privileges for namespaces), which a trivial boot
# shows before the real one. Takes about a minute.
set -uo pipefail
cd "$(dirname "$0")/../.."

DEB=""
for a in "$@"; do
  case "$a" in
    --deb=*) DEB=${a#--deb=} ;;
    *) echo "boot_test: unknown argument $a" >&2; exit 2 ;;
  esac
done
fail() { echo "SYSTEMD BOOT FAIL: $*"; exit 1; }
for tool in mmdebstrap systemd-nspawn; do
  command -v "$tool" >/dev/null || fail "$tool missing (tools/setup.sh --test)"
done
[ "$(id -u)" = 0 ] || fail "needs root (mmdebstrap and systemd-nspawn)"
if [ -z "$DEB" ]; then
  DEB=$(bash tools/package.sh --fast --out="${TMPDIR:-/tmp}/hymcache-deb" | tail -n 1) ||
    fail "tools/package.sh failed"
fi
DEB=$(readlink -f "$DEB")
[ -f "$DEB" ] || fail "no package at $DEB"

work=$(mktemp -d /var/tmp/hymcache-systemd.XXXXXX)
trap 'rm -rf "$work"' EXIT
root="$work/root"
result="$work/result"
mkdir -p "$result"

echo "boot_test: building a bookworm root with systemd and $(basename "$DEB")"
# The SDK packages built beside it.
version=$(dpkg-deb -f "$DEB" Version)
arch=$(dpkg-deb -f "$DEB" Architecture)
debs=("$DEB")
for pkg in libhymcache1 libhymcache-dev; do
  f="$(dirname "$DEB")/${pkg}_${version}_${arch}.deb"
  [ -f "$f" ] || fail "no $f beside $DEB (tools/package.sh builds it)"
  debs+=("$f")
done
copy_in=()
in_tmp=()
for f in "${debs[@]}"; do
  copy_in+=(--customize-hook="copy-in $f /tmp")
  in_tmp+=("/tmp/$(basename "$f")")
done
if ! mmdebstrap --variant=minbase \
       --include=systemd,systemd-sysv,dbus,procps,gcc,libc6-dev,pkg-config,etcd-server \
       "${copy_in[@]}" \
       --customize-hook="chroot \"\$1\" apt-get install --yes ${in_tmp[*]}" \
       --customize-hook="rm -f \"\$1\"/tmp/*.deb" \
       bookworm "$root" > "$work/mmdebstrap.log" 2>&1; then
  grep -v '^I: \|^Get:' "$work/mmdebstrap.log" | tail -n 30
  fail "mmdebstrap could not build the root (or apt could not satisfy the package's Depends)"
fi

boot() {  # boot ROOT; the container's /result is $result
  timeout 300 systemd-nspawn --quiet --register=no --keep-unit \
    --private-network --directory="$root" --bind="$result":/result \
    --boot > "$work/console.log" 2>&1
}
unit_dir="$root/etc/systemd/system"
install -d "$unit_dir/multi-user.target.wants"

# A trivial boot first: can this machine run systemd in a container at all?
cat > "$unit_dir/probe.service" <<'EOF'
[Unit]
Description=boot probe
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo booted > /result/probe; systemctl poweroff'
[Install]
WantedBy=multi-user.target
EOF
ln -s ../probe.service "$unit_dir/multi-user.target.wants/probe.service"
boot
if [ ! -f "$result/probe" ]; then
  tail -n 20 "$work/console.log"
  echo "SYSTEMD BOOT SKIPPED: systemd-nspawn cannot boot a container here"
  exit 3
fi
rm -f "$unit_dir/multi-user.target.wants/probe.service" "$unit_dir/probe.service"

# Two DRAM instances from the shipped example, on loopback ports.
conf="$root/etc/hymcache"
for i in a b; do
  case $i in a) data=50061 control=50062 metrics=9452 ;;
             b) data=50071 control=50072 metrics=9453 ;; esac
  sed -e 's|^--master=.*|--master=127.0.0.1:50051|' \
      -e 's|^--dram_bytes=.*|--dram_bytes=64M|' \
      -e 's|^--numa_node=.*|--numa_node=-1|' \
      -e "s|^--data_port=.*|--data_port=$data|" \
      -e "s|^--control_port=.*|--control_port=$control|" \
      -e "s|^--metrics_listen=.*|--metrics_listen=127.0.0.1:$metrics|" \
      "$conf/storage-dram0.conf" > "$conf/storage-$i.conf"
done
cp "$conf/storage-a.conf" "$conf/storage-bad.conf"
echo "--dram_bytse=64M" >> "$conf/storage-bad.conf"  # the typo

install -m 0755 /dev/stdin "$root/usr/local/sbin/hymcache-boot-test" <<'EOF'
#!/bin/bash
# Runs inside the container under systemd (hymcache-boot-test.service).
exec > /result/log 2>&1
set -x
done_with() {
  echo "$1" > /result/status
  journalctl --no-pager -o short-monotonic -u 'hymcache-*' > /result/journal
  systemctl poweroff
  exit 0
}
fail() { echo "FAIL: $*"; done_with "FAIL: $*"; }
master=127.0.0.1:50051
admin=(--master=$master --token_file=/etc/hymcache/admin.token)

/usr/share/hymcache/make-identities.sh || fail "make-identities.sh"
getent passwd hymcache || fail "the package did not create the hymcache user"
systemctl enable --now hymcache-master || fail "hymcache-master did not start"
systemctl enable --now hymcache-storage@a hymcache-storage@b ||
  fail "the storage instances did not start"
for u in hymcache-master hymcache-storage@a hymcache-storage@b; do
  [ "$(systemctl is-active $u)" = active ] || fail "$u is not active"
done
alive=0
for t in $(seq 1 60); do
  alive=$(hymctl "${admin[@]}" --json status | grep -c '"alive": true')
  [ "$alive" -eq 2 ] && break
  sleep 0.5
done
[ "$alive" -eq 2 ] || fail "hymctl status shows $alive live nodes, not 2"
hymctl "${admin[@]}" status
hymcache-demo --master=$master --token_file=/etc/hymcache/engine.token \
  --conversations=2 --turns=3 || fail "the demo workload failed"

# The C SDK from libhymcache-dev, as an engine developer builds with it.
gcc -std=c11 -Wall -Wextra -Werror \
  /usr/share/doc/libhymcache-dev/examples/example.c \
  $(pkg-config --cflags --libs hymcache) -o /tmp/example ||
  fail "the C quick start does not build with pkg-config hymcache"
/tmp/example $master /etc/hymcache/engine.token || fail "the C quick start failed"

# The master says it reloaded (sd_notify STATUS=) and is still the same
# process.
pid=$(systemctl show -P MainPID hymcache-master)
systemctl reload hymcache-master || fail "reload"
for _ in $(seq 1 100); do
  systemctl show -P StatusText hymcache-master | grep -q "identities reloaded" && break
  sleep 0.1
done
systemctl show -P StatusText hymcache-master | grep -q "identities reloaded" ||
  fail "the master did not report the reload: $(systemctl show -P StatusText hymcache-master)"
[ "$(systemctl is-active hymcache-master)" = active ] &&
  [ "$(systemctl show -P MainPID hymcache-master)" = "$pid" ] ||
  fail "the master died on reload"

# A restartable exit would leave the unit in activating/auto-restart; exit 2
# (RestartPreventExitStatus=2) leaves it failed for good.
systemctl start hymcache-storage@bad && fail "a mistyped flag file started"
for _ in $(seq 1 100); do
  [ "$(systemctl show -P ActiveState hymcache-storage@bad)" = failed ] && break
  sleep 0.1
done
[ "$(systemctl show -P ActiveState hymcache-storage@bad)" = failed ] ||
  fail "the mistyped instance is $(systemctl show -P ActiveState,SubState hymcache-storage@bad), not failed"
[ "$(systemctl show -P NRestarts hymcache-storage@bad)" = 0 ] ||
  fail "the mistyped instance was restarted"
[ "$(systemctl show -P ExecMainStatus hymcache-storage@bad)" = 2 ] ||
  fail "the mistyped instance exited $(systemctl show -P ExecMainStatus hymcache-storage@bad), not 2"

systemctl stop hymcache-storage@a hymcache-storage@b hymcache-master
for u in hymcache-master hymcache-storage@a hymcache-storage@b; do
  r=$(systemctl show -P Result $u)
  s=$(systemctl show -P ExecMainStatus $u)
  [ "$r" = success ] && [ "$s" = 0 ] || fail "$u stopped with Result=$r status=$s"
done
systemd-analyze security hymcache-master hymcache-storage@a | tail -n 5

# --- Masters against etcd, as in docs/operations.md "A three-host install":
# two of the three masters on this host (their own ports and state
# directories), etcd from the example with one member (loopback only).
ex=/usr/share/doc/hymcache/examples
[ -f $ex/master-ha.conf ] && [ -f $ex/etcd.default ] ||
  fail "the package has no $ex/master-ha.conf and etcd.default"
sed -e 's|10\.0\.0\.1|127.0.0.1|g' \
    -e 's|^ETCD_LISTEN_CLIENT_URLS=.*|ETCD_LISTEN_CLIENT_URLS=http://127.0.0.1:2379|' \
    -e 's|^ETCD_INITIAL_CLUSTER=.*|ETCD_INITIAL_CLUSTER=hym1=http://127.0.0.1:2380|' \
    $ex/etcd.default > /etc/default/etcd
systemctl restart etcd || fail "etcd.service did not start from etcd.default"
ha_conf() {  # PORT METRICS_PORT: master.conf + master-ha.conf for this host
  cat /etc/hymcache/master.conf $ex/master-ha.conf |
    sed -e "s|^--listen=.*|--listen=127.0.0.1:$1|" \
        -e 's|^--etcd=.*|--etcd=127.0.0.1:2379|' \
        -e "s|^--advertise_address=.*|--advertise_address=127.0.0.1:$1|" \
        -e "s|^--metrics_listen=.*|--metrics_listen=127.0.0.1:$2|" \
        -e 's|^--cluster=.*|--cluster=boot|'
}
ha_conf 50052 9454 > /etc/hymcache/master-b.conf
ha_conf 50051 9451 > /tmp/master-a.conf
cp /tmp/master-a.conf /etc/hymcache/master.conf
grep -q '^--etcd=127.0.0.1:2379$' /etc/hymcache/master.conf || fail "ha_conf"
sed -e 's|--flagfile=/etc/hymcache/master.conf|--flagfile=/etc/hymcache/master-b.conf|' \
    -e 's|--db_path=%S/hymcache/master$|--db_path=%S/hymcache/master-b|' \
    /usr/lib/systemd/system/hymcache-master.service \
    > /etc/systemd/system/hymcache-master-b.service
grep -q 'master-b$' /etc/systemd/system/hymcache-master-b.service || fail "unit copy"
sed -e 's|^--master=.*|--master=127.0.0.1:50051,127.0.0.1:50052|' \
    -e 's|^--data_port=.*|--data_port=50081|' \
    -e 's|^--control_port=.*|--control_port=50082|' \
    -e 's|^--metrics_listen=.*|--metrics_listen=127.0.0.1:9455|' \
    /etc/hymcache/storage-a.conf > /etc/hymcache/storage-c.conf
systemctl daemon-reload
both=127.0.0.1:50051,127.0.0.1:50052
hadmin=(--master=$both --token_file=/etc/hymcache/admin.token)
leader() {  # "ADDRESS EPOCH" of the master hymctl finds leading, or nothing
  hymctl "${hadmin[@]}" status 2>/dev/null |
    sed -n 's/^master \(.*\) leads, epoch \([0-9]*\)$/\1 \2/p'
}
alive_nodes() {
  hymctl "${hadmin[@]}" --json status 2>/dev/null | grep -c '"alive": true'
}
systemctl start hymcache-master hymcache-master-b ||
  fail "the HA masters did not start (READY=1)"
l=""
for _ in $(seq 1 150); do l=$(leader); [ -n "$l" ] && break; sleep 0.2; done
[ -n "$l" ] || fail "no master leads: $(hymctl "${hadmin[@]}" status 2>&1 | tail -n 3)"
read -r laddr lepoch <<<"$l"
echo "HA: $laddr leads, epoch $lepoch"
systemctl start hymcache-storage@c || fail "hymcache-storage@c did not start"
n=0
for _ in $(seq 1 150); do n=$(alive_nodes); [ "$n" -eq 1 ] && break; sleep 0.2; done
[ "$n" -eq 1 ] || fail "HA: $n live nodes, not 1"
hymcache-demo --master=$both --token_file=/etc/hymcache/engine.token \
  --conversations=2 --turns=3 || fail "the demo failed against the HA masters"
case $laddr in
  *:50051) lunit=hymcache-master ;;
  *:50052) lunit=hymcache-master-b ;;
  *) fail "the leader $laddr is neither master" ;;
esac
# The leader's host is lost: SIGKILL, no resignation, and nothing restarts
# it (stop cancels the pending auto-restart; a restarted master could win
# the election itself, which is not a host loss).
t0=$(date +%s%N)
systemctl kill --signal=SIGKILL "$lunit" || fail "systemctl kill $lunit"
systemctl stop "$lunit"
l2=""
for _ in $(seq 1 300); do
  l2=$(leader)
  [ -n "$l2" ] && [ "${l2% *}" != "$laddr" ] && break
  l2=""; sleep 0.1
done
[ -n "$l2" ] || fail "HA: no other master leads after $lunit was killed"
read -r naddr nepoch <<<"$l2"
t1=$(date +%s%N)
[ "$nepoch" -gt "$lepoch" ] || fail "HA: the new leader's epoch $nepoch is not above $lepoch"
for _ in $(seq 1 300); do n=$(alive_nodes); [ "$n" -eq 1 ] && break; sleep 0.1; done
[ "$n" -eq 1 ] || fail "HA: the node did not come back to the new leader ($n alive)"
t2=$(date +%s%N)
echo "HA failover: $naddr leads, epoch $nepoch, $(( (t1 - t0) / 1000000 )) ms after the SIGKILL; node alive at $(( (t2 - t0) / 1000000 )) ms"
hymcache-demo --master=$both --token_file=/etc/hymcache/engine.token \
  --conversations=2 --turns=3 || fail "the demo failed after the leader was killed"
# The host comes back: its master stands by.
systemctl start "$lunit" || fail "HA: $lunit did not start again"
systemctl show -P StatusText $lunit | grep -q "standing by" ||
  fail "HA: the returning $lunit is not standing by: $(systemctl show -P StatusText $lunit)"
# A standby's process dies: systemd restarts it (Restart=on-failure) and it
# stands by again; the leader does not change.
r0=$(systemctl show -P NRestarts $lunit)
pid0=$(systemctl show -P MainPID $lunit)
systemctl kill --signal=SIGKILL "$lunit" || fail "systemctl kill $lunit (standby)"
for _ in $(seq 1 150); do
  [ "$(systemctl show -P NRestarts $lunit)" -gt "$r0" ] &&
    [ "$(systemctl is-active $lunit)" = active ] &&
    [ "$(systemctl show -P MainPID $lunit)" != "$pid0" ] && break
  sleep 0.2
done
[ "$(systemctl show -P NRestarts $lunit)" -gt "$r0" ] &&
  [ "$(systemctl is-active $lunit)" = active ] ||
  fail "HA: $lunit was not restarted ($(systemctl show -P ActiveState,SubState,NRestarts $lunit))"
systemctl show -P StatusText $lunit | grep -q "standing by" ||
  fail "HA: the restarted $lunit is not standing by: $(systemctl show -P StatusText $lunit)"
l3=$(leader)
[ "$l3" = "$l2" ] || fail "HA: the standby's restart changed the leader ($l3, was $l2)"
echo "HA: $lunit back, SIGKILLed as a standby, restarted by systemd, standing by; $naddr still leads"
systemctl stop hymcache-storage@c hymcache-master hymcache-master-b
for u in hymcache-master hymcache-master-b hymcache-storage@c; do
  r=$(systemctl show -P Result $u)
  s=$(systemctl show -P ExecMainStatus $u)
  [ "$r" = success ] && [ "$s" = 0 ] || fail "$u stopped with Result=$r status=$s"
done
done_with PASS
EOF
cat > "$unit_dir/hymcache-boot-test.service" <<'EOF'
[Unit]
Description=HyMCache package test under systemd
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/hymcache-boot-test
[Install]
WantedBy=multi-user.target
EOF
ln -s ../hymcache-boot-test.service \
  "$unit_dir/multi-user.target.wants/hymcache-boot-test.service"

echo "boot_test: booting systemd in the container"
boot
status=$(cat "$result/status" 2>/dev/null || echo "no result (boot or test hung)")
if [ "$status" != PASS ]; then
  echo "--- test log"; tail -n 40 "$result/log" 2>/dev/null
  echo "--- journal of the hymcache units"; tail -n 60 "$result/journal" 2>/dev/null
  echo "--- console"; tail -n 20 "$work/console.log"
  fail "$status"
fi
grep -E "Overall exposure|alive|verified|^HA" "$result/log" | head -n 30
echo "SYSTEMD BOOT PASS"
