// KvManager's think-time hints: staging a conversation's blocks into the
// window while its user (or its agent's tool) is still thinking, so that the
// next turn's request finds them staged instead of refilling them from the
// capacity tier when it arrives.
//
// The rules (docs/prefetch.md, "Think-time hints"):
//   * A hint never takes window space a request needs. Hints are staged only
//     while no session has an object waiting to be issued (by default only
//     while no session is open at all: idle device time), only into space
//     sessions leave free, and together at most hint_share of the window.
//     A session about to issue an object unstages hints, the latest expected
//     first, until the object fits; those hints go back to the queue and
//     are staged again when the window is idle.
//   * Soonest expected first: the queue is ordered by due time.
//   * A session that prefetches a hinted object shares the hint's staged
//     copy (the device stages an object once for all its holders): a hit if
//     it was staged by then, late otherwise.
//   * A read of an object one hint holds ends that hint of the object (the
//     read holds it now). An object several hints hold (a system prompt
//     that conversations share) stays staged until the last of those hints
//     ends.
//   * A hint (one HintTurn call: a conversation's chain) ends when its turn
//     has come: a read of one of its last objects (kTailObjects; reading
//     its first ones tells nothing, as a new conversation reads a shared
//     system prompt too). hint_turn_grace later (a turn's load may take
//     several prefetch lists and reads), its objects no read claimed go,
//     counted unused (a block the engine computes again, a branch not
//     taken).
//   * A hint holds its object at most until its due time plus its hold; the
//     reaper then releases it (wasted if it had been staged).
//   * A staged hint holds an extent read pin, like a session's staged
//     object, so the space is not rewritten under it. The master keeps a
//     hinted chain recent (the client's hint looks it up for reading), so
//     eviction rarely picks it meanwhile.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "storage_node/dataplane/kv_manager.h"

namespace hymcache::storage {
namespace {

// A read of one of a hint's last this many objects means its turn has come
// (the last one may be a partial block that the next turn computes again).
constexpr uint32_t kTailObjects = 2;

}  // namespace

uint64_t KvManager::HintBudget() const {
  return static_cast<uint64_t>(options_.hint_share *
                               static_cast<double>(options_.staging_capacity));
}

std::vector<absl::Status> KvManager::HintTurn(
    absl::Span<const ExtentKey> objects, absl::Duration expected_in,
    absl::Duration hold) {
  std::vector<absl::Status> out(objects.size());
  MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  if (hold <= absl::ZeroDuration()) {
    for (size_t i = 0; i < objects.size(); ++i) {
      auto it = turn_hints_.find(objects[i]);
      if (it == turn_hints_.end()) {
        out[i] = absl::NotFoundError("kv manager: object not hinted");
        continue;
      }
      ++counters_.turn_hints_cancelled;
      // The latest hint of the object is the ending conversation's.
      TurnHint* h = it->second.get();
      RemoveBatchLocked(h, h->batches.back().batch);
    }
    PumpHintsLocked();
    return out;
  }
  const absl::Duration cap = options_.max_hint_hold;
  expected_in = std::clamp(expected_in, absl::ZeroDuration(), cap);
  const absl::Time due = now + expected_in;
  const absl::Time expires = now + std::min(expected_in + hold, cap);
  const uint64_t budget = HintBudget();
  const uint64_t batch = next_hint_batch_++;
  absl::flat_hash_set<ExtentKey, KeyHash, KeyEq> held;
  for (size_t i = 0; i < objects.size(); ++i) {
    const ExtentKey& k = objects[i];
    ++counters_.turn_hints;
    // Nothing to stage ahead on a device without a window (DRAM: every read
    // is as fast as a staged one), or for an object larger than the budget.
    if (budget == 0 || k.length > budget) continue;
    auto it = turn_hints_.find(k);
    if (it != turn_hints_.end()) {
      TurnHint* h = it->second.get();
      HintOrder& set = h->staged ? hint_staged_ : hint_queue_;
      set.erase({h->due, h->seq, h});
      // Needed by the earliest of its hinters, held for the latest.
      h->due = std::min(h->due, due);
      h->expires = std::max(h->expires, expires);
      set.insert({h->due, h->seq, h});
      if (held.insert(k).second) {
        h->batches.push_back({batch, static_cast<uint32_t>(held.size() - 1)});
      }
      continue;
    }
    if (static_cast<int>(turn_hints_.size()) >= options_.max_hints) {
      --counters_.turn_hints;
      ++counters_.turn_hints_refused;
      out[i] = absl::ResourceExhaustedError(
          absl::StrCat("storage node: more than ", options_.max_hints,
                       " objects hinted for next turns"));
      continue;
    }
    auto h = std::make_unique<TurnHint>();
    h->key = k;
    h->due = due;
    h->expires = expires;
    h->seq = next_hint_seq_++;
    held.insert(k);
    h->batches.push_back({batch, static_cast<uint32_t>(held.size() - 1)});
    hint_queue_.insert({due, h->seq, h.get()});
    turn_hints_.emplace(k, std::move(h));
  }
  if (!held.empty()) {
    HintBatch& b = hint_batches_[batch];
    b.size = static_cast<uint32_t>(held.size());
    b.left = std::move(held);
  }
  PumpHintsLocked();
  return out;
}

void KvManager::EndHintsOfReads(absl::Span<const ExtentKey> objects) {
  MutexLock l(&mu_);
  if (turn_hints_.empty()) return;
  for (const ExtentKey& k : objects) ClaimHintLocked(k);
  PumpHintsLocked();
}

void KvManager::HintLoop() {
  MutexLock l(&mu_);
  while (!stopping_) {
    if (hints_loading_.empty()) {
      hint_cv_.Wait(&mu_);
      continue;
    }
    PumpHintsLocked();
    // Refills take a fraction of a millisecond to milliseconds: look again
    // soon (only while some are in flight).
    if (!hints_loading_.empty()) {
      hint_cv_.WaitWithDeadline(&mu_, absl::Now() + absl::Milliseconds(1));
    }
  }
}

void KvManager::ProbeHintsLocked() {
  for (size_t i = 0; i < hints_loading_.size();) {
    TurnHint* h = hints_loading_[i];
    absl::StatusOr<const uint8_t*> data =
        options_.device->PrefetchWait(h->handle, absl::InfinitePast());
    // A failed refill is not in flight any more either; a request's read
    // of the object reports the error.
    if (data.ok() ||
        data.status().code() != absl::StatusCode::kDeadlineExceeded) {
      h->ready = true;
      hints_loading_[i] = hints_loading_.back();
      hints_loading_.pop_back();
    } else {
      ++i;
    }
  }
}

void KvManager::PumpHintsLocked() {
  ProbeHintsLocked();
  // Requests waiting for the window come first; with hints_when_idle, any
  // open request does.
  if (session_queued_ > 0) return;
  if (options_.hints_when_idle && !sessions_.empty()) return;
  const uint64_t budget = HintBudget();
  while (!hint_queue_.empty() &&
         static_cast<int>(hints_loading_.size()) < options_.max_hint_refills) {
    TurnHint* h = std::get<2>(*hint_queue_.begin());
    const uint64_t len = h->key.length;
    if (hint_bytes_ + len > budget ||
        session_issued_bytes_ + hint_bytes_ + len > options_.staging_capacity) {
      return;
    }
    hint_queue_.erase(hint_queue_.begin());
    absl::StatusOr<ExtentTable::ReadPin> pin =
        options_.extents->PinRead(h->key);
    absl::StatusOr<PrefetchHandle> handle =
        pin.ok() ? options_.device->PrefetchObject(h->key.region_id,
                                                   h->key.addr, len)
                 : absl::StatusOr<PrefetchHandle>(pin.status());
    if (!handle.ok()) {
      // Evicted or rewritten since the hint: nothing to stage.
      VLOG(1) << "kv manager: dropping a think-time hint: " << handle.status();
      ++counters_.dropped_stale;
      turn_hints_.erase(ExtentKey(h->key));
      continue;
    }
    h->pin = std::move(*pin);
    h->handle = *handle;
    h->staged = true;
    h->ready = false;
    hints_loading_.push_back(h);
    hint_bytes_ += len;
    hint_staged_.insert({h->due, h->seq, h});
    ++counters_.turn_hints_staged;
    // Staged from the write buffer or at once (DRAM): not in flight.
    ProbeHintsLocked();
  }
  if (!hints_loading_.empty()) hint_cv_.Signal();
}

void KvManager::MakeRoomForSessionLocked(const ExtentKey& key) {
  if (options_.staging_capacity == 0 || hint_staged_.empty()) return;
  auto own = turn_hints_.find(key);
  if (own != turn_hints_.end() && own->second->staged) return;  // shared
  while (!hint_staged_.empty() &&
         session_issued_bytes_ + hint_bytes_ + key.length >
             options_.staging_capacity) {
    ++counters_.turn_hints_yielded;
    UnstageHintLocked(std::get<2>(*std::prev(hint_staged_.end())));
  }
}

void KvManager::ClaimHintLocked(const ExtentKey& key) {
  auto it = turn_hints_.find(key);
  if (it == turn_hints_.end()) return;
  TurnHint* h = it->second.get();
  ++(h->staged ? counters_.turn_hint_hits : counters_.turn_hint_late);
  h->claimed = true;
  // A read of one of a hint's last kTailObjects objects: that hint's turn
  // has come (a new conversation reading a shared system prompt reads only
  // the first objects of other conversations' hints).
  for (const TurnHint::Ref& ref : h->batches) {
    auto b = hint_batches_.find(ref.batch);
    if (b == hint_batches_.end() || ref.pos + kTailObjects < b->second.size) {
      continue;
    }
    batch_ends_.try_emplace(ref.batch,
                            clock_->Now() + options_.hint_turn_grace);
  }
  // Held by one hint only: the read holds the object now; its hint is done.
  if (h->batches.size() == 1) RemoveBatchLocked(h, h->batches.front().batch);
}

void KvManager::RemoveBatchLocked(TurnHint* h, uint64_t batch) {
  auto b = hint_batches_.find(batch);
  if (b != hint_batches_.end()) {
    b->second.left.erase(h->key);
    if (b->second.left.empty()) hint_batches_.erase(b);
  }
  h->batches.erase(std::find_if(
      h->batches.begin(), h->batches.end(),
      [batch](const TurnHint::Ref& r) { return r.batch == batch; }));
  if (h->batches.empty()) DropHintLocked(h);
}

void KvManager::EndBatchLocked(uint64_t batch) {
  batch_ends_.erase(batch);
  auto b = hint_batches_.find(batch);
  if (b == hint_batches_.end()) return;
  const std::vector<ExtentKey> left(b->second.left.begin(),
                                    b->second.left.end());
  for (const ExtentKey& k : left) {
    auto it = turn_hints_.find(k);
    if (it == turn_hints_.end()) continue;
    if (it->second->batches.size() == 1 && !it->second->claimed) {
      ++counters_.turn_hints_unused;
    }
    RemoveBatchLocked(it->second.get(), batch);
  }
  hint_batches_.erase(batch);
}

void KvManager::UnstageHintLocked(TurnHint* h) {
  hint_staged_.erase({h->due, h->seq, h});
  if (!h->ready) {
    hints_loading_.erase(
        std::find(hints_loading_.begin(), hints_loading_.end(), h));
  }
  h->ready = false;
  options_.device->PrefetchRelease(h->handle);
  h->pin.Release();
  h->handle = PrefetchHandle();
  h->staged = false;
  hint_bytes_ -= h->key.length;
  hint_queue_.insert({h->due, h->seq, h});
}

void KvManager::DropHintLocked(TurnHint* h) {
  for (const TurnHint::Ref& ref : h->batches) {
    auto b = hint_batches_.find(ref.batch);
    if (b == hint_batches_.end()) continue;
    b->second.left.erase(h->key);
    if (b->second.left.empty()) hint_batches_.erase(b);
  }
  if (h->staged) UnstageHintLocked(h);
  hint_queue_.erase({h->due, h->seq, h});
  // A copy: erasing destroys `h` and the key it holds.
  turn_hints_.erase(ExtentKey(h->key));
}

void KvManager::ExpireHintsLocked(absl::Time now) {
  std::vector<uint64_t> ended;
  for (const auto& [batch, when] : batch_ends_) {
    if (when <= now) ended.push_back(batch);
  }
  for (uint64_t batch : ended) EndBatchLocked(batch);
  std::vector<TurnHint*> expired;
  for (const auto& [key, h] : turn_hints_) {
    if (h->expires <= now) expired.push_back(h.get());
  }
  for (TurnHint* h : expired) {
    ++(h->staged ? counters_.turn_hints_wasted : counters_.turn_hints_expired);
    DropHintLocked(h);
  }
}

}  // namespace hymcache::storage
