#!/usr/bin/env bash
# Boots the Debian guest kernel under QEMU (TCG: no KVM needed), with this
# host's / exported read-only over virtio-9p, sets up the requested devices
# and runs one host-built binary inside the guest (chroot into the host's /,
# so Bazel outputs run unchanged). Prints one PASS/FAIL line and exits with
# the binary's exit status.
#
#   tests/vmtest/run.sh [-e NAME=VALUE]... MODE BINARY [ARGS...]
#   tests/vmtest/run.sh shell            # interactive guest shell (Ctrl-A x quits)
#
# MODE:
#   rdma      Soft-RoCE device rxe0 on `lo` (GID index 1 = ::ffff:127.0.0.1;
#             falls back to a dummy netdev). Sets HYMCACHE_RDMA_DEVICE=rxe0.
#   cxl       a QEMU CXL type-3 memory device turned into a CPU-less NUMA node
#             (pmem region -> devdax -> system-ram). Sets HYMCACHE_CXL_NODE=N.
#   rdma+cxl  both.
# The binary also gets: every HYMCACHE_* variable of the caller's environment
# (except HYMCACHE_VMTEST_*), each -e NAME=VALUE, TEST_TMPDIR (a guest tmpfs
# directory), RUNFILES_DIR/TEST_SRCDIR when BINARY.runfiles exists (and then
# runs in BINARY.runfiles/hymcache, like `bazel test`; else in the current
# directory). The guest's /tmp, /run and /dev/shm are guest-only tmpfs; the
# rest of the host's / is read-only.
#
# Environment: VM_TIMEOUT (seconds, default 600), VM_MEM (default 2G),
# VM_SMP (default 2), CXL_SIZE (default 512M), LOG (console log file, default
# in the run directory), KVER, HYMCACHE_VMTEST_CACHE (default
# ~/.cache/hymcache-vmtest; tests/vmtest/setup.sh fills it).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${HYMCACHE_VMTEST_CACHE:-$HOME/.cache/hymcache-vmtest}

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
extra_env=()
while [ $# -gt 0 ]; do
  case "$1" in
    -e) [ $# -ge 2 ] && [[ "$2" == *=* ]] || usage; extra_env+=("$2"); shift 2 ;;
    -h|--help) usage ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || usage
MODE=$1; shift
case "$MODE" in
  rdma|cxl|rdma+cxl|cxl+rdma|shell) ;;
  *) echo "run.sh: unknown mode '$MODE'" >&2; usage ;;
esac
BIN=""
if [ "$MODE" != shell ]; then
  [ $# -ge 1 ] || usage
  BIN=$(realpath -e "$1" 2>/dev/null) || { echo "run.sh: no such file: $1" >&2; exit 2; }
  [ -x "$BIN" ] || { echo "run.sh: not executable: $BIN" >&2; exit 2; }
  case "$BIN" in
    /tmp/*|/run/*|/dev/shm/*|/proc/*|/sys/*)
      echo "run.sh: $BIN is not visible in the guest (its /tmp, /run, /dev/shm are its own)" >&2
      exit 2 ;;
  esac
  shift
fi

KVER=${KVER:-$(cat "$CACHE/kver" 2>/dev/null || true)}
KERNEL=$CACHE/kernel/$KVER/boot/vmlinuz-$KVER
if [ -z "$KVER" ] || [ ! -f "$KERNEL" ] || ! command -v qemu-system-x86_64 >/dev/null; then
  echo "run.sh: no guest kernel or QEMU; run tests/vmtest/setup.sh first" >&2
  exit 2
fi
KVER=$KVER bash "$HERE/build-initramfs.sh" >/dev/null || exit 2
INITRD=$CACHE/initramfs-$KVER.cpio.gz

mkdir -p "$CACHE/runs"
RUN=$(mktemp -d "$CACHE/runs/$(date +%Y%m%d-%H%M%S).XXXX")
for p in "$HERE" "$RUN"; do
  case "$p" in *[[:space:]]*) echo "run.sh: paths with spaces are not supported: $p" >&2; exit 2 ;; esac
done
LOG=${LOG:-$RUN/console.log}

# Single-quote a word for /bin/sh.
q() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }

# The guest scripts run from a copy in the run directory: the kit itself may
# sit where the guest cannot see it (a CI clone under the host's /tmp).
mkdir -p "$RUN/kit"
cp -r "$HERE/guest" "$RUN/kit/"
KIT=$RUN/kit

# job.env: read by the guest script (busybox sh) before the chroot.
{
  echo "VMTEST_MODES=$(q "${MODE/cxl+rdma/rdma+cxl}")"
  echo "VMTEST_KIT=$(q "$KIT")"
  echo "VMTEST_RUN=$(q "$RUN")"
  echo "VMTEST_BIN=$(q "$BIN")"
} > "$RUN/job.env"
# job.sh: run by the host's /bin/sh inside the chroot.
{
  echo '#!/bin/sh'
  echo 'export HOME=/root TEST_TMPDIR=/tmp/vmtest-tmp'
  echo 'mkdir -p "$TEST_TMPDIR"'
  while IFS='=' read -r name value; do
    case "$name" in HYMCACHE_VMTEST_*) continue ;; esac
    echo "export $name=$(q "$value")"
  done < <(env | grep -E '^HYMCACHE_[A-Za-z0-9_]*=' || true)
  for kv in "${extra_env[@]+"${extra_env[@]}"}"; do
    echo "export ${kv%%=*}=$(q "${kv#*=}")"
  done
  if [ -n "$BIN" ] && [ -d "$BIN.runfiles" ]; then
    echo "export RUNFILES_DIR=$(q "$BIN.runfiles") TEST_SRCDIR=$(q "$BIN.runfiles") TEST_WORKSPACE=hymcache"
    echo "cd $(q "$BIN.runfiles/hymcache") 2>/dev/null || cd $(q "$BIN.runfiles")"
  else
    echo "cd $(q "$PWD") 2>/dev/null || cd /"
  fi
  printf 'exec %s' "$(q "$BIN")"
  for a in "$@"; do printf ' %s' "$(q "$a")"; done
  echo
} > "$RUN/job.sh"

APPEND="console=ttyS0 panic=-1 oops=panic quiet loglevel=${LOGLEVEL:-4}"
if [ "$MODE" != shell ]; then
  APPEND+=" vmtest_guest=$KIT/guest/main.sh vmtest_job=$RUN/job.env"
fi
QEMU=(qemu-system-x86_64 -accel tcg -smp "${VM_SMP:-2}" -nographic -no-reboot -nic none
  -virtfs "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap"
  -kernel "$KERNEL" -initrd "$INITRD")
case "$MODE" in
  *cxl*)
    # CXL type-3 device with persistent memory (QEMU 7.2 has no volatile CXL
    # memory) and a label storage area, behind a CXL host bridge with two
    # root ports (with only one, the region reads back zeros).
    truncate -s "${CXL_SIZE:-512M}" "$RUN/cxl-mem0.raw"
    truncate -s 256M "$RUN/cxl-lsa0.raw"
    QEMU+=(-machine q35,cxl=on -m "${VM_MEM:-2G},maxmem=8G,slots=8"
      -object "memory-backend-ram,id=m0,size=${VM_MEM:-2G}"
      -numa "node,nodeid=0,cpus=0-$((${VM_SMP:-2} - 1)),memdev=m0"
      -object "memory-backend-file,id=cxl-mem0,share=on,mem-path=$RUN/cxl-mem0.raw,size=${CXL_SIZE:-512M}"
      -object "memory-backend-file,id=cxl-lsa0,share=on,mem-path=$RUN/cxl-lsa0.raw,size=256M"
      -device pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1
      -device cxl-rp,port=0,bus=cxl.1,id=root_port13,chassis=0,slot=2
      -device cxl-type3,bus=root_port13,memdev=cxl-mem0,lsa=cxl-lsa0,id=cxl-pmem0
      -device cxl-rp,port=1,bus=cxl.1,id=root_port14,chassis=0,slot=3
      -M cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G)
    ;;
  *)
    QEMU+=(-m "${VM_MEM:-2G}")
    ;;
esac

if [ "$MODE" = shell ]; then
  exec "${QEMU[@]}" -append "$APPEND"
fi

echo "VMTEST: $MODE $BIN $* (log $LOG, timeout ${VM_TIMEOUT:-600}s)"
start=$(date +%s.%N)
timeout "${VM_TIMEOUT:-600}" "${QEMU[@]}" -append "$APPEND" < /dev/null 2>&1 | tee "$LOG"
qrc=${PIPESTATUS[0]}
wall=$(echo "$(date +%s.%N) $start" | awk '{printf "%.1f", $1-$2}')
rm -f "$RUN/cxl-mem0.raw" "$RUN/cxl-lsa0.raw"
line=$(tr -d '\r' < "$LOG" | grep -a '^VMTEST-RESULT: rc=' | tail -1)
name="$MODE $(basename "${BIN:-?}")"
if [ -z "$line" ]; then
  why="no result from the guest"
  [ "$qrc" -eq 124 ] && why="timed out after ${VM_TIMEOUT:-600}s"
  grep -aqE 'Kernel panic|Oops' "$LOG" && why="$why; guest kernel panic/oops (see log)"
  echo "VMTEST FAIL: $name: $why (qemu rc=$qrc, wall ${wall}s, log $LOG)"
  exit 1
fi
rc=$(echo "$line" | sed -n 's/^VMTEST-RESULT: rc=\([0-9]*\).*/\1/p')
up=$(echo "$line" | sed -n 's/.*uptime=\([0-9.]*\)s.*/\1/p')
if [ "$rc" = 0 ]; then
  echo "VMTEST PASS: $name (guest uptime ${up}s, wall ${wall}s, log $LOG)"
else
  echo "VMTEST FAIL: $name: exit status $rc (guest uptime ${up}s, wall ${wall}s, log $LOG)"
fi
# Keep the last 20 runs.
ls -1d "$CACHE"/runs/*/ 2>/dev/null | head -n -20 | xargs -r rm -rf
exit "${rc:-1}"
