#!/usr/bin/env bash
# Builds the guest's busybox initramfs for the cached Debian guest kernel:
# busybox, kmod, the kernel modules for Soft-RoCE (rdma_rxe), virtio-9p and
# CXL/NVDIMM/DAX, and the host's RDMA/CXL/NUMA tools with their libraries.
# Its /init mounts the host's / read-only over virtio-9p at /mnt/host and runs
# the guest script named on the kernel command line (see run.sh), so changes
# to tests/vmtest/guest/*.sh or to the tested binaries need no rebuild.
# Output: $CACHE/initramfs-$KVER.cpio.gz (about 10 MB). Rebuilt only when this
# script or the kernel changed (FORCE=1 rebuilds anyway).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${HYMCACHE_VMTEST_CACHE:-$HOME/.cache/hymcache-vmtest}
KVER=${KVER:-$(cat "$CACHE/kver" 2>/dev/null || true)}
KROOT=$CACHE/kernel/$KVER
[ -n "$KVER" ] && [ -d "$KROOT/lib/modules/$KVER" ] ||
  { echo "build-initramfs: no guest kernel in $CACHE (run tests/vmtest/setup.sh)" >&2; exit 1; }
OUT=$CACHE/initramfs-$KVER.cpio.gz
STAMP=$OUT.stamp
want=$( (cat "$0"; echo "$KVER") | sha256sum | cut -d' ' -f1)
if [ -z "${FORCE:-}" ] && [ -f "$OUT" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "build-initramfs: $OUT is up to date"
  exit 0
fi

R=$(mktemp -d "$CACHE/rootfs.XXXXXX")
trap 'rm -rf "$R"' EXIT
mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,root,lib,lib64,mnt/host}

# --- busybox applets
cp /bin/busybox "$R/bin/busybox"
for a in $("$R/bin/busybox" --list); do
  [ -e "$R/bin/$a" ] || ln -s busybox "$R/bin/$a"
done

# --- a file (and, for an ELF file, its shared libraries), same path as on the host
copy_with_libs() {
  local f=$1
  [ -e "$f" ] || { echo "build-initramfs: missing $f (skipped)" >&2; return 0; }
  mkdir -p "$R$(dirname "$f")"
  cp -L "$f" "$R$f"
  if file -L "$f" | grep -q ELF; then
    ldd "$f" 2>/dev/null | grep -o '/[^ ]*' | while read -r lib; do
      [ -e "$R$lib" ] && continue
      mkdir -p "$R$(dirname "$lib")"
      cp -L "$lib" "$R$lib"
    done
  fi
}
for b in /usr/bin/rdma /usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/cxl /usr/bin/ndctl \
         /usr/bin/daxctl /usr/bin/numactl /usr/bin/kmod /usr/sbin/ip /usr/bin/file; do
  copy_with_libs "$b"
done
# kmod's modprobe resolves dependencies and options better than busybox's.
for a in modprobe insmod lsmod rmmod depmod modinfo; do
  rm -f "$R/bin/$a" "$R/sbin/$a"
  ln -s /usr/bin/kmod "$R/sbin/$a"
done
rm -f "$R/bin/ip" && ln -s /usr/sbin/ip "$R/bin/ip"
# glibc dlopen()s libgcc_s for thread cancellation.
copy_with_libs /lib/x86_64-linux-gnu/libgcc_s.so.1
# libibverbs providers (ibv_devinfo in the initramfs needs librxe).
for p in /usr/lib/x86_64-linux-gnu/libibverbs/*.so; do copy_with_libs "$p"; done
mkdir -p "$R/etc/libibverbs.d" && cp /etc/libibverbs.d/*.driver "$R/etc/libibverbs.d/"
echo 'root:x:0:0:root:/root:/bin/sh' > "$R/etc/passwd"
echo 'root:x:0:' > "$R/etc/group"
printf '127.0.0.1 localhost\n' > "$R/etc/hosts"

# --- kernel modules, with their dependencies
MODS="virtio_pci 9pnet_virtio 9p crc32_generic crc32c_generic rdma_rxe ib_uverbs rdma_ucm dummy
cxl_acpi cxl_pci cxl_mem cxl_pmem cxl_port libnvdimm nd_pmem nd_btt dax_pmem device_dax kmem"
MD=$KROOT/lib/modules/$KVER
[ -f "$MD/modules.dep" ] || depmod -b "$KROOT" "$KVER"
for m in $MODS; do
  modprobe -C /dev/null -d "$KROOT" -S "$KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}'
done | sort -u | while read -r ko; do
  rel=${ko#"$KROOT"}
  mkdir -p "$R$(dirname "$rel")"
  cp "$ko" "$R$rel"
done
cp "$MD"/modules.order "$MD"/modules.builtin* "$R/lib/modules/$KVER/" 2>/dev/null || true
depmod -b "$R" "$KVER"

cat > "$R/init" <<'INIT'
#!/bin/sh
# HyMCache vmtest guest init. Kernel command line:
#   vmtest_guest=PATH  guest script (a host path, read over 9p) to run, then power off
#   vmtest_job=PATH    job script (a host path) passed to the guest script
# Without vmtest_guest: an interactive shell on the console.
export PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp; mount -t tmpfs tmpfs /run
ip link set lo up
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p" | tail -1; }
G=$(arg vmtest_guest); J=$(arg vmtest_job)
echo "VMTEST: init reached, uptime $(cut -d' ' -f1 /proc/uptime)s"
modprobe virtio_pci; modprobe 9pnet_virtio; modprobe 9p
H=/mnt/host
if mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 host $H; then
  # The host's / read-only, with the guest's own proc/sys/dev and fresh
  # tmpfs for /tmp, /run and /dev/shm (writes stay inside the guest).
  for d in proc sys dev dev/pts dev/shm; do mount --bind /$d $H/$d; done
  mount -t tmpfs tmpfs $H/tmp; mount -t tmpfs tmpfs $H/run
else
  echo "VMTEST: mounting the host's / over 9p failed"
fi
if [ -n "$G" ]; then
  rc=1
  if [ -f "$H$G" ]; then sh "$H$G" "$J"; rc=$?; else echo "VMTEST: no guest script $H$G"; fi
  echo "VMTEST-RESULT: rc=$rc uptime=$(cut -d' ' -f1 /proc/uptime)s"
  sync; poweroff -f
fi
exec setsid cttyhack sh
INIT
chmod +x "$R/init"
(cd "$R" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$want" > "$STAMP"
echo "build-initramfs: $OUT ($(du -h "$OUT" | cut -f1))"
