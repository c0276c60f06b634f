// drain --copy: moves a draining node's chains to the other nodes before it
// leaves; rebalance: moves chains off the fullest nodes, so that a node
// that joins takes a share of the hot chains (docs/operations.md, "drain /
// undrain" and "rebalance").
//
// The master lists the node's objects (ListObjects, with each one's parent
// and last read). The copy takes every object (kAll) or the hot ones (kHot:
// read within hot_within) together with the blocks before them on the node,
// so that every copied block stays reachable; the rest is let go (a miss
// once the node leaves). It copies chain by chain, hottest first, each chain
// head first in runs of linked blocks: reads a run's blocks where the master
// lists them (Client::Get), then stores them with
// StoreOptions::relocate_from_node, which places them on another node
// (after the run's parent, so a chain stays together) and moves each
// listing at commit if it did not change meanwhile. Readers are never
// without a copy: until the commit the master lists the old one, which the
// draining node keeps serving (it takes no new placements, so nothing
// overwrites it).
//
// A block that cannot be read (removed meanwhile, or its node refused it)
// ends its run: the blocks after it are not copied (nothing would reach
// them). Objects put on the node during the copy (the drain began after the
// listing) are not copied; run it again to take them. Copies of blocks
// (StoreOptions::replicas, master/replica_key.h) on the node are let go
// and not counted: their blocks are on other nodes.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "proto/master.grpc.pb.h"

namespace hymcache::hymctl {

struct DrainCopyOptions {
  // The node to copy off (it should be draining: else new puts land on it
  // meanwhile).
  uint32_t node_id = 0;
  // Every object, or the hot ones (and the blocks before them).
  enum class Which { kAll, kHot };
  Which which = Which::kAll;
  // kHot: read within this long before the copy starts. Default: 10 min.
  absl::Duration hot_within = absl::Minutes(10);
  // Most blocks read and stored per round trip. Default: 64.
  size_t batch_keys = 64;
  // The whole copy ends by then (what is not copied stays). Default: none.
  absl::Time deadline = absl::InfiniteFuture();
  // The copy ends once it has moved this many bytes (a rebalance's share).
  // Default: no limit.
  uint64_t max_bytes = std::numeric_limits<uint64_t>::max();
};

struct DrainCopyReport {
  uint64_t listed = 0;  // objects the node held when listed
  uint64_t chosen = 0;  // of them, to copy
  uint64_t copied = 0;  // moved to another node
  uint64_t copied_bytes = 0;
  uint64_t skipped = 0;  // not on the node any more, or unreadable
  uint64_t failed = 0;   // not moved: a write or commit failed
  uint64_t let_go = 0;   // listed, not chosen (kHot)
  bool deadline_passed = false;
  bool max_bytes_reached = false;
};

// Copies per the options. `progress` (may be empty) is called after each
// round trip with the report so far. Errors: the master cannot be listed
// (Unavailable, DeadlineExceeded, PermissionDenied without an admin
// token); failures of single blocks are counted instead.
absl::StatusOr<DrainCopyReport> CopyOffNode(
    hymcache::v1::MasterService::Stub* master, Client* client,
    const DrainCopyOptions& options,
    const std::function<void(const DrainCopyReport&)>& progress);

// rebalance: each alive, undrained node holding more than `slack` over the
// mean of those nodes' used bytes gives up its excess: CopyOffNode with
// max_bytes = its used bytes minus the mean, hottest chains first (`which`
// kHot: only those read within hot_within), to the other nodes (the
// master's load-aware placement puts them on the emptiest: the node that
// joined). Unlike a drain, the node keeps taking puts and its freed space
// is reused: a reader that looked a moved block up before its copy
// committed may find it gone (a miss: the engine recomputes; never
// another object's bytes).
struct RebalanceOptions {
  DrainCopyOptions::Which which = DrainCopyOptions::Which::kAll;
  absl::Duration hot_within = absl::Minutes(10);
  // A node more than this share over the mean gives up its excess.
  // Default: 0.1.
  double slack = 0.1;
  absl::Time deadline = absl::InfiniteFuture();
};
struct RebalanceStep {
  uint32_t node_id = 0;
  std::string name;
  uint64_t used_bytes = 0;  // before
  uint64_t mean_bytes = 0;  // the alive, undrained nodes' mean
  DrainCopyReport copy;
};
// Errors: as CopyOffNode, and the master's GetStats.
absl::StatusOr<std::vector<RebalanceStep>> Rebalance(
    hymcache::v1::MasterService::Stub* master, Client* client,
    const RebalanceOptions& options,
    const std::function<void(const DrainCopyReport&)>& progress);

// "copied C of N objects (B bytes); S skipped, F failed, L let go" (and
// ", deadline passed" or ", share moved"), and the same as JSON.
std::string DrainCopyText(const DrainCopyReport& report);
nlohmann::json DrainCopyJson(const DrainCopyReport& report);
// A line per node that gave up chains ("balanced: ..." for none), and
// {"moved": [{node_id, name, used_bytes, mean_bytes, copy}]}.
std::string RebalanceText(const std::vector<RebalanceStep>& steps);
nlohmann::json RebalanceJson(const std::vector<RebalanceStep>& steps);

}  // namespace hymcache::hymctl
