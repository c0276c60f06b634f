# Sourced by guest/main.sh: turns the QEMU CXL type-3 device into a CPU-less
# NUMA node and exports HYMCACHE_CXL_NODE. QEMU 7.2 only has persistent CXL
# memory, so: cxl create-region (pmem) -> ndctl create-namespace (devdax)
# -> daxctl reconfigure-device --mode=system-ram (kmem hot-plugs it).
for m in cxl_acpi cxl_pci cxl_port cxl_mem cxl_pmem nd_pmem dax_pmem device_dax kmem; do
  modprobe $m || echo "VMTEST: modprobe $m failed"
done
# Wait until the memdev's nvdimm is bound before creating the region.
i=0
while [ $i -lt 60 ] && ! [ -e /sys/bus/nd/devices/nmem0/driver ]; do sleep 0.5; i=$((i + 1)); done
DEC=$(cxl list -D -d root 2>/dev/null | sed -n 's/.*"decoder":"\(decoder0\.[0-9]*\)".*/\1/p' | head -1)
cxl create-region -m -t pmem -d "${DEC:-decoder0.0}" -w 1 -g 256 mem0 >/dev/null ||
  { echo "VMTEST: cxl create-region failed"; cxl list -vvv; exit 1; }
REG=$(ndctl list -R 2>/dev/null | sed -n 's/.*"dev":"\(region[0-9]*\)".*/\1/p' | head -1)
ndctl create-namespace -m devdax -r "${REG:-region0}" -a 2M >/dev/null ||
  { echo "VMTEST: ndctl create-namespace failed"; ndctl list -RNDu; exit 1; }
DAX=$(daxctl list 2>/dev/null | sed -n 's/.*"chardev":"\(dax[0-9.]*\)".*/\1/p' | head -1)
daxctl reconfigure-device --mode=system-ram "${DAX:-dax0.0}" >/dev/null ||
  { echo "VMTEST: daxctl reconfigure-device failed"; daxctl list -u; exit 1; }
N=$(ls -d /sys/devices/system/node/node* | sed 's/.*node//' | sort -n | tail -1)
if [ "$N" = 0 ] || [ -n "$(cat /sys/devices/system/node/node$N/cpulist)" ]; then
  echo "VMTEST: no CPU-less NUMA node after the CXL setup"; numactl -H; exit 1
fi
echo "VMTEST: CXL memory is NUMA node $N: $(sed -n 's/.*MemTotal: *//p' /sys/devices/system/node/node$N/meminfo)"
export HYMCACHE_CXL_NODE=$N
