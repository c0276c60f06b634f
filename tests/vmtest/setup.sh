#!/usr/bin/env bash
# One-time host setup for the QEMU test kit (Debian 12, as root or with sudo):
#   1. host packages: QEMU, busybox, kmod, and the RDMA / CXL user tools that
#      go into the guest's initramfs;
#   2. the Debian guest kernel (linux-image-<ABI>-amd64), fetched with
#      `apt-get download` and unpacked into the cache directory;
#   3. the initramfs (build-initramfs.sh).
# Everything large lives in the cache directory, never in the repository:
#   ${HYMCACHE_VMTEST_CACHE:-$HOME/.cache/hymcache-vmtest}
# Idempotent: a second run only rebuilds the initramfs when its inputs changed.
# Environment: KVER=6.1.0-57-amd64 pins the guest kernel (default: the ABI that
# Debian's linux-image-amd64 currently depends on, or the one already cached).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${HYMCACHE_VMTEST_CACHE:-$HOME/.cache/hymcache-vmtest}
mkdir -p "$CACHE"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

PACKAGES=(qemu-system-x86 busybox-static kmod cpio file iproute2
  rdma-core ibverbs-utils ibverbs-providers ndctl daxctl numactl)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
updated=0
if [ ${#missing[@]} -gt 0 ]; then
  echo "vmtest setup: installing ${missing[*]}"
  $SUDO apt-get update -q && updated=1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# --- guest kernel
if [ -z "${KVER:-}" ]; then
  KVER=$(apt-cache depends linux-image-amd64 2>/dev/null |
         sed -n 's/.*Depends: linux-image-\(.*\)/\1/p' | head -1)
  if [ -z "$KVER" ]; then
    # No package lists yet, or no network: reuse a cached kernel if there is one.
    KVER=$(ls "$CACHE/kernel" 2>/dev/null | sort -V | tail -1 || true)
  fi
fi
[ -n "$KVER" ] || { echo "vmtest setup: cannot tell the guest kernel version (apt-get update?)" >&2; exit 1; }
KDIR=$CACHE/kernel/$KVER
if [ ! -f "$KDIR/boot/vmlinuz-$KVER" ]; then
  echo "vmtest setup: fetching linux-image-$KVER"
  mkdir -p "$CACHE/debs"
  if ! (cd "$CACHE/debs" && apt-get download "linux-image-$KVER"); then
    [ $updated -eq 1 ] || $SUDO apt-get update -q
    (cd "$CACHE/debs" && apt-get download "linux-image-$KVER")
  fi
  rm -rf "$KDIR.tmp" && mkdir -p "$KDIR.tmp"
  dpkg -x "$(ls "$CACHE"/debs/linux-image-"${KVER}"_*.deb | head -1)" "$KDIR.tmp"
  depmod -b "$KDIR.tmp" "$KVER"
  rm -rf "$KDIR" && mv "$KDIR.tmp" "$KDIR"
  rm -f "$CACHE"/debs/linux-image-"${KVER}"_*.deb
fi
echo "$KVER" > "$CACHE/kver"
echo "vmtest setup: guest kernel $KVER in $KDIR"

KVER=$KVER bash "$HERE/build-initramfs.sh"
