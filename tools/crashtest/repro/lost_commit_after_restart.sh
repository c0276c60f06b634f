#!/usr/bin/env bash
# Repro (issue 10): a Put acknowledged by a DRAM node that was restarted on
# its ports and has not re-registered yet is purged when the node registers
# moments later: the key is gone although nothing crashed after the commit.
# Run from a checkout after: bazel build //master:hymcache-master \
#   //storage_node:hymcache-storage //tools/hymctl
set -u
B=${B:-bazel-bin}
D=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$D"' EXIT
ready() { for _ in $(seq 100); do [ -s "$1" ] && return; sleep 0.1; done; echo "no ready line in $1"; exit 2; }

$B/master/hymcache-master --db_path="$D/m" --listen=127.0.0.1:0 >"$D/m.out" 2>"$D/m.log" &
MPID=$!; ready "$D/m.out"; M=$(sed 's/.* on //' "$D/m.out")
$B/storage_node/hymcache-storage --master="$M" --name=n --data_port=0 --control_port=0 \
  --rdma=off --shared_huge_pages=false --dram_bytes=64M >"$D/n.out" 2>"$D/n.log" &
NPID=$!; ready "$D/n.out"
DATA=$(sed 's/.*data=[^:]*:\([0-9]*\).*/\1/' "$D/n.out"); CTL=$(sed 's/.*control=[^:]*:\([0-9]*\).*/\1/' "$D/n.out")
sleep 1

# The node and the master crash; the node's service manager restarts it on
# its ports at once; the master comes back 5 s later (the node retries its
# registration every 2 s by then).
kill -9 $NPID $MPID; wait $NPID $MPID 2>/dev/null
$B/storage_node/hymcache-storage --master="$M" --name=n --data_port=$DATA --control_port=$CTL \
  --rdma=off --shared_huge_pages=false --dram_bytes=64M >"$D/n2.out" 2>>"$D/n.log" &
ready "$D/n2.out"; sleep 5
$B/master/hymcache-master --db_path="$D/m" --listen="$M" >"$D/m2.out" 2>>"$D/m.log" &
ready "$D/m2.out"

head -c 100000 /dev/urandom >"$D/block"
echo "put: $($B/tools/hymctl/hymctl --master="$M" put k "$D/block" 2>&1)"
sleep 3
echo "get: $($B/tools/hymctl/hymctl --master="$M" get k "$D/out" 2>&1)"
grep -h "does not retain\|new incarnation" "$D/n.log" "$D/m.log" | cut -c1-160
