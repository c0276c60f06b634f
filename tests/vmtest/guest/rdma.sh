# Sourced by guest/main.sh: Soft-RoCE device rxe0, for host-built binaries.
# rxe on `lo` gives GID index 1 = ::ffff:127.0.0.1 (RoCE v2). If the kernel
# refuses `lo`, rxe goes on a dummy netdev with a guest-only link-local
# address. The guest has no NIC: no packet leaves it.
modprobe crc32_generic
modprobe rdma_rxe || { echo "VMTEST: modprobe rdma_rxe failed"; exit 1; }
modprobe rdma_ucm
if rdma link add rxe0 type rxe netdev lo; then
  echo "VMTEST: rxe0 on lo"
else
  echo "VMTEST: rxe on lo refused; using dummy0"
  ip link add dummy0 type dummy
  ip addr add 169.254.77.1/32 dev dummy0
  ip link set dummy0 up
  rdma link add rxe0 type rxe netdev dummy0 || { echo "VMTEST: rdma link add failed"; exit 1; }
fi
i=0
while [ $i -lt 50 ] && ! ibv_devinfo -d rxe0 2>/dev/null | grep -q PORT_ACTIVE; do
  sleep 0.1; i=$((i + 1))
done
ibv_devinfo -v -d rxe0 | grep -E 'state:|active_mtu|max_mr_size|max_qp_wr|max_qp_rd_atom|GID\[' | sed 's/^[[:space:]]*/  /'
export HYMCACHE_RDMA_DEVICE=rxe0
