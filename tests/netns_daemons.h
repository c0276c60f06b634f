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

}  // namespace hymcache::testing
