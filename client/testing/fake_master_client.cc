#include "client/testing/fake_master_client.h"

#include <algorithm>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "common/wire.h"

namespace hymcache {

ObjectCapability FakeCapability(const ObjectLocation& l, uint8_t rights) {
  ObjectCapability c;
  c.rights = rights;
  // Far ahead of any FakeClock (the real master's are minutes ahead).
  c.expires_unix_ms = int64_t{4102444800000};  // 2100-01-01
  absl::little_endian::Store64(
      c.tag.data(), l.addr ^ (uint64_t{l.node_id} << 40) ^
                        (uint64_t{l.region_id} << 56) ^ l.length);
  absl::little_endian::Store64(c.tag.data() + 8, l.generation);
  return c;
}

// Chunks of `chunk` keys, each answered when taken.
class FakeMasterClient::Stream : public LookupStream {
 public:
  Stream(FakeMasterClient* master, absl::Span<const std::string> keys,
         size_t chunk)
      : master_(master), keys_(keys), chunk_(chunk) {}

  bool has_next() const override {
    return !stopped_ && next_ * chunk_ < keys_.size();
  }

  absl::StatusOr<const LookupBatch*> Next(bool block) override {
    MutexLock l(&master_->mu_);
    if (!block && next_ > 0 && master_->later_chunks_late_) return nullptr;
    const size_t chunk = next_++;
    ++master_->chunks_taken_;
    if (auto it = master_->lookup_failures_.find(chunk);
        it != master_->lookup_failures_.end()) {
      return it->second;
    }
    const size_t begin = chunk * chunk_;
    const size_t n = std::min(chunk_, keys_.size() - begin);
    batch_ = master_->LookupLocked(keys_.subspan(begin, n));
    return &batch_;
  }

  void CancelRest() override {
    if (has_next()) {
      MutexLock l(&master_->mu_);
      ++master_->streams_cancelled_early_;
    }
    stopped_ = true;
  }

 private:
  FakeMasterClient* const master_;
  const absl::Span<const std::string> keys_;
  const size_t chunk_;
  size_t next_ = 0;
  bool stopped_ = false;
  LookupBatch batch_;
};

void FakeMasterClient::AddNode(const PeerInfo& node) {
  MutexLock l(&mu_);
  if (nodes_.empty()) default_node_ = node.node_id;
  nodes_.push_back(node);
}

void FakeMasterClient::SetDefaultNode(uint32_t node_id) {
  MutexLock l(&mu_);
  default_node_ = node_id;
}

void FakeMasterClient::FailLookupChunk(size_t chunk, absl::Status s) {
  MutexLock l(&mu_);
  lookup_failures_[chunk] = std::move(s);
}

void FakeMasterClient::SetLaterChunksLate(bool late) {
  MutexLock l(&mu_);
  later_chunks_late_ = late;
}

void FakeMasterClient::FailPutStart(absl::Status s, size_t from_call) {
  MutexLock l(&mu_);
  put_start_error_ = std::move(s);
  put_start_fail_from_ = put_starts_.size() + from_call;
}

void FakeMasterClient::FailPutCommit(absl::Status s) {
  MutexLock l(&mu_);
  put_commit_error_ = std::move(s);
}

void FakeMasterClient::MarkInProgress(const std::string& key) {
  MutexLock l(&mu_);
  in_progress_.insert(key);
}

void FakeMasterClient::BlockPutStart() {
  MutexLock l(&mu_);
  put_start_blocked_ = true;
}

void FakeMasterClient::UnblockPutStart() {
  MutexLock l(&mu_);
  put_start_blocked_ = false;
  cv_.SignalAll();
}

std::optional<ObjectLocation> FakeMasterClient::Find(
    const std::string& key) const {
  MutexLock l(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

std::vector<PutStartArgs> FakeMasterClient::put_starts() const {
  MutexLock l(&mu_);
  return put_starts_;
}

std::vector<FakeMasterClient::Commit> FakeMasterClient::commits() const {
  MutexLock l(&mu_);
  return commits_;
}

std::vector<uint64_t> FakeMasterClient::aborts() const {
  MutexLock l(&mu_);
  return aborts_;
}

std::vector<std::pair<std::string, ObjectLocation>>
FakeMasterClient::reported_missing() const {
  MutexLock l(&mu_);
  return reported_;
}

size_t FakeMasterClient::lookup_chunks_taken() const {
  MutexLock l(&mu_);
  return chunks_taken_;
}

std::vector<size_t> FakeMasterClient::stream_chunk_keys() const {
  MutexLock l(&mu_);
  return stream_chunk_keys_;
}

std::vector<std::vector<std::string>> FakeMasterClient::ended_chains() const {
  MutexLock l(&mu_);
  return ended_chains_;
}

size_t FakeMasterClient::streams_cancelled_early() const {
  MutexLock l(&mu_);
  return streams_cancelled_early_;
}

LookupBatch FakeMasterClient::LookupLocked(
    absl::Span<const std::string> keys) const {
  LookupBatch out;
  out.found.resize(keys.size());
  out.locations.resize(keys.size());
  std::set<uint32_t> nodes;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = index_.find(keys[i]);
    if (it == index_.end()) continue;
    out.found[i] = true;
    out.locations[i] = it->second;
    out.locations[i].capability = FakeCapability(it->second, wire::kCapRead);
    nodes.insert(it->second.node_id);
  }
  for (const PeerInfo& n : nodes_) {
    if (nodes.count(n.node_id) > 0) out.nodes.push_back(n);
  }
  return out;
}

absl::StatusOr<LookupBatch> FakeMasterClient::Lookup(
    absl::Span<const std::string> keys, LookupIntent intent,
    absl::Time deadline) {
  MutexLock l(&mu_);
  if (intent == LookupIntent::kEnded) {
    ended_chains_.emplace_back(keys.begin(), keys.end());
  }
  return LookupLocked(keys);
}

std::unique_ptr<LookupStream> FakeMasterClient::StartLookups(
    absl::Span<const std::string> keys, size_t chunk_keys,
    absl::Time deadline) {
  MutexLock l(&mu_);
  stream_chunk_keys_.push_back(chunk_keys);
  return std::make_unique<Stream>(this, keys, chunk_keys);
}

absl::StatusOr<PutStartReply> FakeMasterClient::PutStart(
    const PutStartArgs& args, absl::Time deadline) {
  MutexLock l(&mu_);
  while (put_start_blocked_) cv_.Wait(&mu_);
  const size_t call = put_starts_.size();
  put_starts_.push_back(args);
  if (!put_start_error_.ok() && call >= put_start_fail_from_) {
    return put_start_error_;
  }
  if (nodes_.empty()) return absl::ResourceExhaustedError("no storage node");
  uint32_t node = default_node_;
  if (args.preferred_node_id != 0) {
    node = args.preferred_node_id;
  } else if (auto it = index_.find(args.parent_key); it != index_.end()) {
    node = it->second.node_id;
  }
  auto peer = std::find_if(nodes_.begin(), nodes_.end(),
                           [&](const PeerInfo& p) { return p.node_id == node; });
  if (peer == nodes_.end()) return absl::InternalError("unknown node");

  PutStartReply out;
  out.node = *peer;
  PendingPut pending;
  for (size_t i = 0; i < args.keys.size(); ++i) {
    PutSlot slot;
    pending.keys.push_back(args.keys[i]);
    pending.locations.emplace_back();
    if (index_.contains(args.keys[i])) {
      slot.state = PutSlotState::kExists;
    } else if (in_progress_.count(args.keys[i]) > 0) {
      slot.state = PutSlotState::kInProgress;
    } else {
      slot.state = PutSlotState::kAllocated;
      ObjectLocation& loc = slot.location;
      loc.node_id = node;
      loc.region_id = 1;
      loc.addr = next_addr_[node];
      loc.length = args.lengths[i];
      loc.generation = next_generation_++;
      next_addr_[node] += args.lengths[i];
      loc.capability = FakeCapability(loc, wire::kCapWrite);
      pending.locations.back() = loc;
      in_progress_.insert(args.keys[i]);
    }
    out.slots.push_back(slot);
  }
  const bool any = std::any_of(
      pending.locations.begin(), pending.locations.end(),
      [](const std::optional<ObjectLocation>& l) { return l.has_value(); });
  if (any) {
    out.put_id = next_put_id_++;
    pending_[out.put_id] = std::move(pending);
  }
  return out;
}

absl::Status FakeMasterClient::PutCommit(
    uint64_t put_id, absl::Span<const uint32_t> failed_indexes,
    absl::Span<const wire::Receipt> receipts, absl::Time deadline) {
  MutexLock l(&mu_);
  commits_.push_back(
      {put_id, std::vector<uint32_t>(failed_indexes.begin(),
                                     failed_indexes.end())});
  if (!put_commit_error_.ok()) return put_commit_error_;
  auto it = pending_.find(put_id);
  if (it == pending_.end()) return absl::NotFoundError("no such put");
  const PendingPut& p = it->second;
  for (size_t i = 0; i < p.keys.size(); ++i) {
    if (!p.locations[i].has_value()) continue;
    in_progress_.erase(p.keys[i]);
    if (std::find(failed_indexes.begin(), failed_indexes.end(), i) !=
        failed_indexes.end()) {
      continue;
    }
    ObjectLocation loc = *p.locations[i];
    loc.capability = ObjectCapability{};
    index_[p.keys[i]] = loc;
  }
  pending_.erase(it);
  return absl::OkStatus();
}

void FakeMasterClient::PutAbortInBackground(uint64_t put_id) {
  if (put_id == 0) return;
  MutexLock l(&mu_);
  if (auto it = pending_.find(put_id); it != pending_.end()) {
    for (const std::string& k : it->second.keys) in_progress_.erase(k);
    pending_.erase(it);
  }
  aborts_.push_back(put_id);
  cv_.SignalAll();
}

absl::Status FakeMasterClient::ReportMissing(
    absl::Span<const std::string> keys,
    absl::Span<const ObjectLocation> locations, absl::Time deadline) {
  MutexLock l(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    reported_.emplace_back(keys[i], locations[i]);
    auto it = index_.find(keys[i]);
    if (it != index_.end() && it->second.node_id == locations[i].node_id &&
        it->second.addr == locations[i].addr &&
        it->second.generation == locations[i].generation) {
      index_.erase(it);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<bool>> FakeMasterClient::Remove(
    absl::Span<const std::string> keys, absl::Time deadline) {
  MutexLock l(&mu_);
  std::vector<bool> out;
  for (const std::string& k : keys) out.push_back(index_.erase(k) > 0);
  return out;
}

absl::StatusOr<PrefixAnswer> FakeMasterClient::PrefixQuery(
    absl::Span<const std::string> keys, absl::Time deadline) {
  MutexLock l(&mu_);
  PrefixAnswer out;
  std::map<uint32_t, PrefixAnswer::Node> nodes;
  std::optional<uint32_t> alone;  // the node holding every key so far
  for (const std::string& k : keys) {
    auto it = index_.find(k);
    if (it == index_.end()) break;
    const uint32_t id = it->second.node_id;
    PrefixAnswer::Node& n = nodes[id];
    n.node_id = id;
    ++n.blocks;
    if (out.hit_prefix_length == 0) alone = id;
    if (alone == id) n.longest_prefix = out.hit_prefix_length + 1;
    if (alone != id) alone.reset();
    ++out.hit_prefix_length;
  }
  for (auto& [id, n] : nodes) out.nodes.push_back(n);
  for (const auto& [engine, held] : engines_) {
    uint32_t n = 0;
    while (n < keys.size() && held.count(keys[n]) > 0) ++n;
    if (n > 0) out.engines.push_back({engine, n});
  }
  std::stable_sort(
      out.engines.begin(), out.engines.end(),
      [](const PrefixAnswer::Engine& a, const PrefixAnswer::Engine& b) {
        return a.longest_prefix > b.longest_prefix;
      });
  return out;
}

absl::StatusOr<EngineBlocksReply> FakeMasterClient::ReportEngineBlocks(
    const EngineBlocksReport& report, absl::Time deadline) {
  MutexLock l(&mu_);
  std::set<std::string>& held = engines_[report.engine_id];
  if (report.cleared) held.clear();
  for (const std::string& k : report.removed) held.erase(k);
  held.insert(report.stored.begin(), report.stored.end());
  return EngineBlocksReply{held.size(), absl::Seconds(60)};
}

absl::StatusOr<ClusterStatus> FakeMasterClient::GetClusterStatus(
    absl::Time deadline) {
  MutexLock l(&mu_);
  ClusterStatus out;
  for (const PeerInfo& p : nodes_) {
    NodeStatus n;
    n.node_id = p.node_id;
    n.data_address = p.data_address;
    n.alive = true;
    out.nodes.push_back(n);
  }
  out.object_count = index_.size();
  return out;
}

}  // namespace hymcache
