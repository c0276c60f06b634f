// Private to StorageNode's files (storage_node.cc, storage_node_master.cc):
// the node's link to its masters and the region descriptor's wire form.

#ifndef HYMCACHE_STORAGE_NODE_STORAGE_NODE_INTERNAL_H_
#define HYMCACHE_STORAGE_NODE_STORAGE_NODE_INTERNAL_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grpc_reconnect.h"
#include "common/health_probe.h"
#include "common/mutex.h"
#include "common/status_reason.h"
#include "proto/master.grpc.pb.h"
#include "storage_node/device/memory_device.h"
#include "storage_node/storage_node.h"

namespace hymcache {
namespace storage::internal {

inline void ToProto(const storage::RegionDescriptor& r,
                    ::hymcache::v1::RegionInfo* out) {
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
// UNAVAILABLE, or not answered within the call's timeout, moves the node on: to
// the leader the refusal names (LeaderHintOf) when it is one of the list, else
// to the next master; the heartbeat loop then registers there. With etcd
// (`leader` set) a master the refusal or etcd names is connected even if not
// listed, and etcd's leader is preferred to the next of the list.
struct StorageNode::MasterLink {
  struct Peer {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<::hymcache::v1::MasterService::Stub> stub;
  };
  // Connects a master (ConnectMaster's channel arguments and security).
  std::function<absl::StatusOr<std::unique_ptr<Peer>>(const std::string&)>
      connect;
  // The leader's address as etcd names it ("" while none); empty without
  // etcd.
  std::function<std::string()> leader;
  // The etcd client and observer behind `leader` (destroyed after it is
  // last called: with the link).
  std::shared_ptr<void> etcd;
  // Keeps the listed masters' channels connecting after a call found no
  // master (under gRPC's "poll" strategy nothing else would, but its backup
  // poller seconds later, and the master would take this node for dead).
  // Masters learned from etcd or a hint are not in it (Kick ignores them).
  std::unique_ptr<ChannelReconnector> reconnector;

  Mutex mu;
  // Only ever grows (a Peer outlives the calls on it).
  std::vector<std::unique_ptr<Peer>> peers ABSL_GUARDED_BY(mu);
  size_t current ABSL_GUARDED_BY(mu) = 0;
  // The master that last went silent, and when (Silent).
  size_t silent ABSL_GUARDED_BY(mu) = SIZE_MAX;
  absl::Time silent_at ABSL_GUARDED_BY(mu) = absl::InfinitePast();

  // The master calls go to now; nullptr while none is known (no list, and
  // etcd names no leader).
  Peer* Current(size_t* index = nullptr) {
    MutexLock l(&mu);
    if (peers.empty()) {
      const std::string at = leader ? leader() : "";
      if (at.empty() || IndexOf(at) < 0) return nullptr;
      current = 0;
    }
    if (index != nullptr) *index = current;
    return peers[current].get();
  }
  ::hymcache::v1::MasterService::Stub* stub() {
    Peer* p = Current();
    return p == nullptr ? nullptr : p->stub.get();
  }
  std::string address() {
    Peer* p = Current();
    return p == nullptr ? "(no master known)" : p->address;
  }
  // Whether there is another master to move to after a refusal.
  bool several() {
    MutexLock l(&mu);
    return peers.size() > 1 || static_cast<bool>(leader);
  }
  // The current master serves read-only (it lost etcd): moves to another
  // master whose gRPC health says SERVING (one that leads), etcd's leader
  // first when etcd names one. Each is asked within `timeout`, without the
  // lock. True when it moved.
  bool MoveToServingLeader(absl::Duration timeout) {
    std::vector<std::pair<size_t, std::shared_ptr<grpc::Channel>>> others;
    {
      MutexLock l(&mu);
      if (peers.empty()) return false;
      const std::string named = leader ? leader() : "";
      const int first = named.empty() || named == peers[current]->address
                            ? -1
                            : IndexOf(named);
      if (first >= 0) others.emplace_back(first, peers[first]->channel);
      for (size_t i = 0; i < peers.size(); ++i) {
        if (i != current && static_cast<int>(i) != first) {
          others.emplace_back(i, peers[i]->channel);
        }
      }
    }
    for (const auto& [i, channel] : others) {
      absl::StatusOr<bool> serving = CheckHealth(channel, "", timeout);
      if (serving.ok() && *serving) {
        MutexLock l(&mu);
        current = i;
        return true;
      }
    }
    return false;
  }
  // The current master did not answer a call within its timeout (frozen,
  // or its host lost): moves on as after a refusal, and for a while
  // (kSilentMemory) follows no hint back to it. Right after a leader's
  // host is lost the standbys still name it until its lease runs out; a
  // node that went back would wait on it again.
  void Silent(const absl::Status& s, absl::Time now) {
    {
      MutexLock l(&mu);
      silent = current;
      silent_at = now;
    }
    Refused(s, now);
  }
  // The current master refused a call with `s` (UNAVAILABLE).
  void Refused(const absl::Status& s, absl::Time now = absl::Now()) {
    MutexLock l(&mu);
    if (peers.empty() || (peers.size() < 2 && !leader)) return;
    const size_t at = current;
    const bool recently_silent = now - silent_at < kSilentMemory;
    if (std::optional<LeaderHint> hint = LeaderHintOf(s);
        hint.has_value() && !hint->address.empty() &&
        hint->address != peers[at]->address) {
      int i = Find(hint->address);
      if (i < 0 && leader) i = IndexOf(hint->address);
      if (i >= 0 && recently_silent && static_cast<size_t>(i) == silent) {
        i = -1;  // the master that just went silent: not yet
      }
      if (i >= 0) {
        current = static_cast<size_t>(i);
        return;
      }
    }
    if (leader) {
      const std::string named = leader();
      if (!named.empty() && named != peers[at]->address) {
        if (const int i = IndexOf(named);
            i >= 0 && !(recently_silent && static_cast<size_t>(i) == silent)) {
          current = static_cast<size_t>(i);
          return;
        }
      }
    }
    size_t next = (at + 1) % peers.size();
    if (recently_silent && next == silent && peers.size() > 2) {
      next = (next + 1) % peers.size();
    }
    current = next;
  }

  // How long a master that went silent is passed over by hints.
  // A node finds the silence with a heartbeat (sent within an interval of
  // the loss, answered or not within 1 s), so a second covers the
  // standbys' stale hints (FailoverMasterClient::kSilentMemory), and a
  // live leader wrongly taken for silent gets the node back within about
  // interval + 2 s, inside the master's node_timeout.
  static constexpr absl::Duration kSilentMemory = absl::Seconds(1);

 private:
  int Find(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (size_t i = 0; i < peers.size(); ++i) {
      if (peers[i]->address == address) return static_cast<int>(i);
    }
    return -1;
  }
  // Index of `address`, connecting it if new; -1 if it cannot be.
  int IndexOf(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (const int i = Find(address); i >= 0) return i;
    auto peer = connect(address);
    if (!peer.ok()) return -1;
    peers.push_back(std::move(peer).value());
    return static_cast<int>(peers.size() - 1);
  }
};

}  // namespace hymcache

#endif  // HYMCACHE_STORAGE_NODE_STORAGE_NODE_INTERNAL_H_
