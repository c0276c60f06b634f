// Private to StorageNode's files (storage_node.cc, storage_node_master.cc):
// the node's link to its masters and the region descriptor's wire form.

#ifndef HYMCACHE_STORAGE_NODE_STORAGE_NODE_INTERNAL_H_
#define HYMCACHE_STORAGE_NODE_STORAGE_NODE_INTERNAL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/grpc_reconnect.h"
#include "common/status_reason.h"
#include "proto/master.grpc.pb.h"
#include "storage_node/device/memory_device.h"
#include "storage_node/storage_node.h"

namespace hymcache {
namespace storage::internal {

inline void ToProto(const storage::RegionDescriptor& r, ::hymcache::v1::RegionInfo* out) {
  out->set_region_id(r.region_id);
  out->set_capacity_bytes(r.capacity_bytes);
  out->set_alignment(r.alignment);
  out->set_numa_node(r.numa_node);
  out->set_device_kind(r.device_kind);
  out->set_persistent(r.persistent);
}

}  // namespace storage::internal

// The node's connections to the masters (a channel and stub each), and the
// one calls go to. With several masters (docs/ha.md) a call refused with
// UNAVAILABLE moves the node on: to the leader the refusal names
// (LeaderHintOf) when it is one of the list, else to the next master; the
// heartbeat loop then registers there.
struct StorageNode::MasterLink {
  struct Peer {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<::hymcache::v1::MasterService::Stub> stub;
  };
  std::vector<Peer> peers;  // constant after ConnectMaster
  std::atomic<size_t> current{0};
  // Keeps the channels connecting after a call found no master (under
  // gRPC's "poll" strategy nothing else would, but its backup poller
  // seconds later, and the master would take this node for dead).
  std::unique_ptr<ChannelReconnector> reconnector;

  ::hymcache::v1::MasterService::Stub* stub() { return peers[current.load()].stub.get(); }
  const std::string& address() { return peers[current.load()].address; }
  // The current master refused a call with `s` (UNAVAILABLE).
  void Refused(const absl::Status& s) {
    if (peers.size() < 2) return;
    const size_t at = current.load();
    if (std::optional<LeaderHint> hint = LeaderHintOf(s)) {
      for (size_t i = 0; i < peers.size(); ++i) {
        if (i != at && peers[i].address == hint->address) {
          current = i;
          return;
        }
      }
    }
    current = (at + 1) % peers.size();
  }
};

}  // namespace hymcache

#endif  // HYMCACHE_STORAGE_NODE_STORAGE_NODE_INTERNAL_H_
