// Think-time hints of ClientImpl (Client::HintNextTurn,
// HintConversationEnded; docs/prefetch.md): a conversation's chain, looked
// up and sent to the nodes holding it, in the background.
#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "common/status_macros.h"

namespace hymcache {
namespace {

uint32_t Millis(absl::Duration d) {
  const int64_t ms = absl::ToInt64Milliseconds(d);
  return static_cast<uint32_t>(
      std::clamp<int64_t>(ms, 0, std::numeric_limits<uint32_t>::max()));
}

}  // namespace

absl::Status ClientImpl::HintNextTurn(absl::Span<const std::string> keys,
                                      const TurnHintOptions& options) {
  if (options.hold <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("HintNextTurn: hold must be > 0");
  }
  if (options.expected_in < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("HintNextTurn: expected_in must be >= 0");
  }
  // At least 1 ms of hold on the wire: 0 means "ended".
  return QueueTurnHint(keys, options.expected_in,
                       std::max(options.hold, absl::Milliseconds(1)));
}

absl::Status ClientImpl::HintConversationEnded(
    absl::Span<const std::string> keys) {
  return QueueTurnHint(keys, absl::ZeroDuration(), absl::ZeroDuration());
}

absl::Status ClientImpl::QueueTurnHint(absl::Span<const std::string> keys,
                                       absl::Duration expected_in,
                                       absl::Duration hold) {
  RETURN_IF_ERROR(CheckKeys(keys));
  {
    MutexLock l(&mu_);
    if (hints_pending_ >= options_.max_pending_hints) {
      return absl::ResourceExhaustedError(
          absl::StrCat("think-time hint dropped: ", hints_pending_,
                       " hints already pending (max_pending_hints)"));
    }
    ++hints_pending_;
  }
  wire::HintTimes times{Millis(expected_in), Millis(hold)};
  if (hold > absl::ZeroDuration() && times.hold_ms == 0) times.hold_ms = 1;
  const bool queued = bg_executor_->TrySubmit(
      [this, keys = std::vector<std::string>(keys.begin(), keys.end()), times] {
        SendTurnHint(keys, times);
        MutexLock l(&mu_);
        --hints_pending_;
      });
  if (!queued) {
    MutexLock l(&mu_);
    --hints_pending_;
    return absl::ResourceExhaustedError(
        "think-time hint dropped: the client's background queue is full");
  }
  return absl::OkStatus();
}

void ClientImpl::SendTurnHint(const std::vector<std::string>& keys,
                              const wire::HintTimes& times) {
  // Hints are advice: every failure below only means nothing is staged.
  const absl::Time deadline = clock_->Now() + kReleaseTimeout;
  const bool next_turn = times.hold_ms > 0;
  const absl::Span<const std::string> all(keys);
  // Each key's location, where the master found it.
  std::vector<std::optional<ObjectLocation>> found(keys.size());
  if (next_turn) {
    // Looked up for reading, head first, up to the first miss: the master
    // then counts the chain as just used (recent, leased), which keeps
    // eviction away from it.
    for (size_t begin = 0; begin < keys.size();
         begin += options_.max_keys_per_rpc) {
      const size_t n =
          std::min<size_t>(keys.size() - begin, options_.max_keys_per_rpc);
      absl::StatusOr<LookupBatch> batch = master_->Lookup(
          all.subspan(begin, n), LookupIntent::kNextTurn, deadline);
      if (!batch.ok()) break;
      for (const PeerInfo& node : batch->nodes) Remember(node);
      size_t i = 0;
      for (; i < n && batch->found[i]; ++i)
        found[begin + i] = batch->locations[i];
      if (i < n) break;  // the chain's stored prefix ends here
    }
  } else {
    // Ended: the master moves the chain's unshared tail to the front of its
    // node's eviction order. A chain longer than one request goes in runs,
    // tail first, each with the head of the run after it (what
    // MetadataIndex::DemoteChain walks up from).
    const size_t run = std::max<size_t>(1, options_.max_keys_per_rpc - 1);
    for (size_t r = (keys.size() + run - 1) / run; r-- > 0;) {
      const size_t begin = r * run;
      const size_t n = std::min(run, keys.size() - begin);
      const size_t with =
          std::min<size_t>(keys.size() - begin, options_.max_keys_per_rpc);
      absl::StatusOr<LookupBatch> batch = master_->Lookup(
          all.subspan(begin, with), LookupIntent::kEnded, deadline);
      if (!batch.ok()) break;
      for (const PeerInfo& node : batch->nodes) Remember(node);
      for (size_t i = 0; i < n; ++i) {
        if (batch->found[i]) found[begin + i] = batch->locations[i];
      }
    }
  }
  // The stored prefix of the chain, node by node in read order.
  std::vector<std::pair<uint32_t, std::vector<RemoteRef>>> per_node;
  for (size_t i = 0; i < keys.size() && found[i].has_value(); ++i) {
    const ObjectLocation& loc = *found[i];
    auto it =
        std::find_if(per_node.begin(), per_node.end(),
                     [&](const auto& p) { return p.first == loc.node_id; });
    if (it == per_node.end()) {
      per_node.emplace_back(loc.node_id, std::vector<RemoteRef>());
      it = std::prev(per_node.end());
    }
    it->second.push_back(ToRemoteRef(loc));
  }
  for (const auto& [node, refs] : per_node) {
    absl::StatusOr<PeerInfo> peer = Peer(node);
    if (!peer.ok() || unresponsive_.Skip(node)) continue;
    transport_->HintTurn(*peer, refs, times, deadline);
  }
}

}  // namespace hymcache
