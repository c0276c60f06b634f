// What the KV-event tests share (kv_events_test on one host,
// kv_events_netns_test on many): a subscriber that follows WatchEvents and
// resumes where it left off, a workload of chains with removals, the
// checks that every store and removal arrived exactly once in commit order,
// and a router that keeps key -> node from the events alone, compared with
// PrefixQuery.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "proto/master.grpc.pb.h"

namespace hymcache::testing {

// Where a subscriber is in the stream.
struct EventPosition {
  uint64_t stream = 0;
  uint64_t after = 0;
};

// Reads events after *at until the one numbered `until`, `max` events or
// `wait`, then drops the stream (a subscriber going away); appends them to
// *out and the missed ranges to *missed; moves *at. Errors: the stream's,
// when it ended otherwise (not at its deadline).
absl::Status FollowEvents(
    v1::MasterService::Stub& stub, EventPosition* at, uint64_t until,
    size_t max, std::vector<v1::KvEvent>* out,
    std::vector<std::pair<uint64_t, uint64_t>>* missed = nullptr,
    absl::Duration wait = absl::Seconds(30));

// The sequence number of the master's latest event.
absl::StatusOr<uint64_t> LatestEvent(v1::MasterService::Stub& stub);

// The keys of chain `chain`: PREFIX "ch" CHAIN "-" BLOCK.
std::vector<std::string> EventChainKeys(const std::string& prefix, int chain,
                                        int blocks);

// Stores chains 0..chains-1 of `blocks` blocks (EventChainKeys) in turns
// of 3 blocks, each after the previous turn's last; then removes the middle
// block (blocks / 2) of every third chain, its tail going with it. Returns
// each chain's keys.
absl::StatusOr<std::vector<std::vector<std::string>>> StoreChainsRemoveSome(
    Client& client, const std::string& prefix, int chains, int blocks);

// That `events` are the numbers 1..latest in order and, for `chains` as
// StoreChainsRemoveSome left them: every block stored once with the block
// before it as its parent, and every removed block (the middle one and the
// tail of every third chain) removed once, after its store; nothing else
// stored or removed. FailedPrecondition says what is wrong.
absl::Status CheckChainEvents(
    const std::vector<v1::KvEvent>& events, uint64_t latest,
    const std::vector<std::vector<std::string>>& chains);

// A router's view from the events alone: key -> node of the blocks stored
// and not removed since.
std::map<std::string, uint32_t> RouterView(
    const std::vector<v1::KvEvent>& events);

// Whether the router's answer for the chain `keys` (its hit prefix and, per
// node, the node's longest prefix and blocks) is PrefixQuery's.
absl::StatusOr<bool> RouterAgrees(v1::MasterService::Stub& stub,
                                  const std::map<std::string, uint32_t>& where,
                                  const std::vector<std::string>& keys);

}  // namespace hymcache::testing
