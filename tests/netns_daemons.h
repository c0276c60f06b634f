// What the tests on many hosts (network namespaces, tests/netns) share: the
// network, or a skip where namespaces cannot be made, and daemons started
// inside its hosts, each listening on its host's address.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/daemon.h"
#include "tests/etcd_cluster.h"
#include "tests/netns/virtual_network.h"

namespace hymcache::testing {

// The network of `hosts`; nullptr, after printing "NETNS SKIPPED: why",
// where this machine cannot make namespaces (not root, no iproute2): the
// test then returns and passes. Other errors are errors.
//
// With HYM_NETNS_LINK_LATENCY_US=N in the environment (Bazel:
// --test_env=HYM_NETNS_LINK_LATENCY_US=250), every host's link is shaped
// with N us of one-way latency (LinkShape; netem, or the NFQUEUE delayer
// where the kernel has no netem): between two hosts a packet waits 2N each
// way, so 250 gives the 1 ms round trips of issue 32's floors.
absl::StatusOr<std::unique_ptr<VirtualNetwork>> NetworkOrSkip(
    const std::vector<std::string>& hosts);

// A master (MasterArgs with `db_path`, port 0 on the host's address,
// --logtostderr, then `extra`) in host `host`, and the address it serves.
struct NetnsMaster {
  Daemon daemon;
  std::string address;
};
absl::StatusOr<NetnsMaster> StartMasterOn(
    VirtualNetwork& net, int host, const std::string& db_path,
    const std::vector<std::string>& extra = {});

// The masters of a cluster on many hosts: one master alone, or HA masters
// (docs/ha.md) electing their leader through a 3-member etcd cluster,
// with synchronous replication.
struct NetnsMastersOptions {
  // Master i runs in host master_hosts[i]. One: a master alone, no etcd.
  std::vector<int> master_hosts;
  // HA: etcd's members all run in this host...
  int etcd_host = -1;
  // ...or, true: member i runs in master i's host (a three-host install;
  // three masters), each master lists its own member first and moves
  // etcd's raft leadership off its host (--etcd_move_raft_leader).
  bool etcd_beside_masters = false;
  std::string dir;                 // master i's store: dir/master<i>
  std::string cluster = "netns";   // HA: --cluster
  std::vector<std::string> flags;  // every master's (HA adds its own)
};
struct NetnsMasters {
  std::unique_ptr<EtcdCluster> etcd;  // HA only
  std::vector<NetnsMaster> masters;
  std::vector<std::string> addresses;  // master i's
  // Every master's address, comma-separated (clients', nodes' --master).
  std::string address_list() const;
};
// Starts them; the calling thread must reach the hosts (enter one of the
// network's hosts first).
absl::StatusOr<NetnsMasters> StartMastersOn(VirtualNetwork& net,
                                            const NetnsMastersOptions& o);

// A storage node `name` (StorageArgs for `master`, --listen_host the host's
// address, --logtostderr, then `extra`) in host `host`.
absl::StatusOr<Daemon> StartStorageOn(
    VirtualNetwork& net, int host, const std::string& master,
    const std::string& name, const std::vector<std::string>& extra = {});

// Issue 32's cluster shape, host by host in this order: the masters m0..,
// etcd, the storage hosts s0.., the engine hosts e0.., then `extra`.
struct NetnsLayout {
  int masters = 3;
  int storage = 8;
  int engines = 4;
  std::vector<std::string> extra;

  int master_host(int i) const { return i; }
  int etcd_host() const { return masters; }
  int storage_host(int i) const { return masters + 1 + i; }
  int engine_host(int i) const { return masters + 1 + storage + i; }
  int extra_host(int i) const { return masters + 1 + storage + engines + i; }
  // The names for NetworkOrSkip.
  std::vector<std::string> HostNames() const;
};

// A layout's masters (StartMastersOn: HA with etcd on its host when there
// are several; `dir` and --cluster from `name`, then `master_flags`) and a
// storage node "s<i>" on each storage host (every master's address as its
// --master, then `storage_flags`).
struct NetnsCluster {
  NetnsMasters masters;
  std::vector<Daemon> nodes;
  std::string master;  // every master's address, for clients and hymctl
};
absl::StatusOr<NetnsCluster> StartClusterOn(
    VirtualNetwork& net, const NetnsLayout& layout, const std::string& name,
    const std::vector<std::string>& master_flags,
    const std::vector<std::string>& storage_flags = {"--insecure",
                                                     "--dram_bytes=64M"});

}  // namespace hymcache::testing
