#include "tools/crashtest/crashtest_impl.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/thread.h"
#include "tools/crashtest/block_data.h"

namespace hymcache::crashtest {

// ---------------------------------------------------------------------------
// Workload

bool CrashTest::Impl::Stopping() {
  MutexLock l(&stop_mu_);
  return stop_;
}

bool CrashTest::Impl::SleepUnlessStopping(absl::Duration d) {
  MutexLock l(&stop_mu_);
  return !stop_mu_.AwaitWithDeadline(absl::Condition(&stop_), absl::Now() + d);
}

void CrashTest::Impl::AppendBlocks(Conversation& c, size_t count,
                                   std::mt19937_64& rng) {
  for (size_t k = 0; k < count; ++k) {
    const size_t index = c.keys.size();
    std::vector<int32_t> tokens(keys_.block_tokens());
    // The first blocks are a shared system prompt (same tokens, same keys
    // in every conversation opening with it); the rest are the
    // conversation's own.
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() & 0x7fffffff);
    const std::string parent = index == 0 ? std::string() : c.keys.back();
    std::string key = keys_.NextKey(parent, tokens);
    c.lengths.push_back(
        BlockLength(key, options_.min_block_bytes, options_.max_block_bytes));
    c.keys.push_back(std::move(key));
  }
}

void CrashTest::Impl::ConversationLoop(int slot) {
  std::mt19937_64 rng(options_.seed * 0x9e3779b97f4a7c15ULL + slot + 1);
  std::vector<uint8_t> scratch;
  while (!Stopping()) {
    Conversation c;
    const int turns =
        std::uniform_int_distribution<int>(1, options_.max_turns)(rng);
    const int prompt =
        std::uniform_int_distribution<int>(0, options_.system_prompts - 1)(rng);
    {
      // System prompt blocks: tokens from the prompt's own generator.
      std::mt19937_64 prompt_rng(options_.seed * 31 + prompt);
      AppendBlocks(c, options_.system_prompt_blocks, prompt_rng);
    }
    size_t chain = 0;
    {
      MutexLock l(&mu_);
      chain = chains_.size();
      chains_.emplace_back();
    }
    for (int t = 0; t < turns && !Stopping(); ++t) {
      AppendBlocks(
          c,
          std::uniform_int_distribution<int>(1, options_.max_new_blocks)(rng),
          rng);
      {
        MutexLock l(&mu_);
        chains_[chain] = c.keys;
      }
      RunTurn(c, scratch);
      if (options_.hints) {
        // Refused only when too many are pending: advice, not checked.
        (t + 1 < turns ? client_->HintNextTurn(c.keys)
                       : client_->HintConversationEnded(c.keys))
            .IgnoreError();
      }
      if (!SleepUnlessStopping(options_.think_time)) break;
    }
  }
}

void CrashTest::Impl::RunTurn(Conversation& c, std::vector<uint8_t>& scratch) {
  const size_t n = c.keys.size();
  // Every buffer holds the largest block, so that a wrong object of another
  // length is loaded (and caught) rather than refused.
  const size_t stride = options_.max_block_bytes;
  scratch.assign(n * stride, 0xA5);
  std::vector<MutableBuffer> bufs(n);
  for (size_t i = 0; i < n; ++i)
    bufs[i] = {scratch.data() + i * stride, stride};

  LoadOptions lo;
  lo.deadline = absl::Now() + options_.load_deadline;
  absl::StatusOr<LoadResult> r = client_->Load(c.keys, bufs, lo);
  NoteCall("Load", lo.deadline, absl::Now());
  size_t loaded = 0;
  if (r.ok()) {
    loaded = r->loaded;
    VerifyLoaded("Load", c.keys, c.lengths, 0, loaded, r->lengths,
                 scratch.data(), stride);
  }
  {
    MutexLock l(&mu_);
    ++report_.loads;
    if (!r.ok()) {
      ++report_.load_errors;
      CountOutcome("Load failed:", r.status());
    } else {
      report_.blocks_loaded += loaded;
      if (r->hit_prefix > loaded && absl::IsNotFound(r->stop_reason)) {
        ++report_.refused_reads;
      }
      if (loaded < n) {
        CountOutcome(r->hit_prefix > loaded ? "Load stopped at a hit:"
                                            : "Load stopped at a miss:",
                     r->stop_reason);
      }
    }
  }
  if (loaded == n) return;

  // Recompute the rest and store it, chained to the loaded prefix.
  std::vector<std::string> keys(c.keys.begin() + loaded, c.keys.end());
  std::vector<uint64_t> lengths(c.lengths.begin() + loaded, c.lengths.end());
  std::vector<std::vector<uint8_t>> data(keys.size());
  std::vector<ConstBuffer> in(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    data[i].resize(lengths[i]);
    FillBlock(keys[i], lengths[i], data[i].data());
    in[i] = {data[i].data(), data[i].size()};
  }
  StoreOptions so;
  if (loaded > 0) so.parent_key = c.keys[loaded - 1];
  so.deadline = absl::Now() + options_.store_timeout;
  const absl::Time started = absl::Now();
  const std::vector<uint64_t> kills_at_start = KillCounts();
  std::shared_ptr<StoreHandle> h = client_->Store(keys, in, so);
  // The handle must finish before `data` goes; a Store that outlives its
  // timeout by far is an overrun, and still waited for.
  absl::StatusOr<PutResult> res =
      h->Wait(started + options_.store_timeout + options_.max_overrun +
              absl::Seconds(30));
  if (!res.ok() && !h->Done()) res = h->Wait();
  NoteCall("Store", started + options_.store_timeout, absl::Now());
  RecordStore(keys, lengths, so.parent_key, res, kills_at_start, KillCounts(),
              started);
}

void CrashTest::Impl::RecordStore(const std::vector<std::string>& keys,
                                  const std::vector<uint64_t>& lengths,
                                  const std::string& parent,
                                  const absl::StatusOr<PutResult>& result,
                                  const std::vector<uint64_t>& kills_at_start,
                                  const std::vector<uint64_t>& kills_at_end,
                                  absl::Time began) {
  const absl::Time returned = absl::Now();
  MutexLock l(&mu_);
  ++report_.stores;
  uint64_t total = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    KeyRecord& rec = ledger_[keys[i]];
    rec.length = lengths[i];
    rec.parent = i == 0 ? parent : keys[i - 1];
    total += RoundUp(lengths[i]);
  }
  auto charge_all = [&] { Charge(-1, total, kills_at_start, kills_at_end); };
  if (!result.ok()) {
    report_.store_failed += keys.size();
    CountOutcome("Store call failed:", result.status());
    // Unavailable: the master was unreachable or died mid-call (its pending
    // puts died with it); InvalidArgument, FailedPrecondition (the parent is
    // not stored) and ResourceExhausted allocate nothing. Anything else (a
    // deadline) may have left an allocation on some node until the put expires.
    const absl::StatusCode code = result.status().code();
    if (code != absl::StatusCode::kUnavailable &&
        code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kFailedPrecondition &&
        code != absl::StatusCode::kResourceExhausted) {
      charge_all();
    }
    return;
  }
  const PutResult& r = *result;
  int node = -1;
  if (r.node_id != 0) {
    auto it = index_of_node_.find(r.node_id);
    if (it != index_of_node_.end()) node = it->second;
  }
  uint64_t placed = 0;
  bool unknown_placement = false;
  for (size_t i = 0; i < keys.size(); ++i) {
    switch (r.outcomes[i]) {
      case PutOutcome::kStored: {
        ++report_.blocks_stored;
        placed += RoundUp(lengths[i]);
        KeyRecord& rec = ledger_[keys[i]];
        rec.committed = true;
        rec.node = node;
        rec.kills_at_store = kills_at_start;
        rec.store_began = began;
        rec.store_returned = returned;
        break;
      }
      case PutOutcome::kAlreadyStored:
      case PutOutcome::kInProgress:
        break;
      case PutOutcome::kFailed:
        if (absl::IsResourceExhausted(r.errors[i])) {
          ++report_.store_refused;
        } else {
          ++report_.store_failed;
        }
        CountOutcome("Store key failed:", r.errors[i]);
        // Allocated on the put's node and freed again, or not allocated.
        if (node >= 0) {
          placed += RoundUp(lengths[i]);
        } else if (!absl::IsResourceExhausted(r.errors[i]) &&
                   !absl::IsUnavailable(r.errors[i])) {
          unknown_placement = true;
        }
        break;
    }
  }
  if (node >= 0) Charge(node, placed, kills_at_start, kills_at_end);
  if (r.node_id != 0 && node < 0) charge_all();  // a node we do not know
  if (unknown_placement) charge_all();
}

void CrashTest::Impl::Charge(int i, uint64_t bytes,
                             const std::vector<uint64_t>& from,
                             const std::vector<uint64_t>& to) {
  for (size_t k = 1; k < placed_.size(); ++k) {
    if (i >= 0 && static_cast<size_t>(i) != k) continue;
    placed_[k].total += bytes;
    // The allocation was made in one of the epochs the Store spanned.
    for (uint64_t e = from[k]; e <= to[k]; ++e) placed_[k].by_epoch[e] += bytes;
  }
}

uint64_t CrashTest::Impl::Bound(const Placement& p, bool keeps_objects,
                                uint64_t epoch) {
  if (keeps_objects) return p.total;
  auto it = p.by_epoch.find(epoch);
  return it == p.by_epoch.end() ? 0 : it->second;
}

void CrashTest::Impl::MonitorLoop() {
  while (SleepUnlessStopping(absl::Milliseconds(250))) {
    absl::StatusOr<ClusterStatus> st = PollClusterStatus();
    if (!st.ok()) continue;
    MutexLock l(&mu_);
    // A smaller count is a new master: its predecessor's last count stays.
    if (st->evicted_objects < evicted_last_) evicted_base_ += evicted_last_;
    evicted_last_ = st->evicted_objects;
  }
}

}  // namespace hymcache::crashtest
