#include "tools/hymbench/replay.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <deque>
#include <optional>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/mutex.h"
#include "common/status_reason.h"
#include "common/thread.h"
#include "glog/logging.h"
#include "tools/hymbench/block_data.h"

namespace hymcache::hymbench {
namespace {

// How long past its own timeout a store may take before hymbench gives up
// waiting for it at the end of the run.
constexpr absl::Duration kStoreGrace = absl::Seconds(30);

// How often a store refused for a full client queue is retried.
constexpr absl::Duration kStoreRetryInterval = absl::Milliseconds(1);

// One worker's KV pool: `slots` blocks of block_bytes in one anonymous
// mapping, every page touched at creation (outside the timed region), as a
// serving engine preallocates its KV cache. Slots are handed out per block
// and come back when no Load or Store uses them. Not thread-safe: one
// worker owns it.
class KvPool {
 public:
  // ResourceExhausted if the mapping fails.
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(uint64_t slots,
                                                        uint64_t block_bytes) {
    const uint64_t bytes = slots * block_bytes;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot map a KV pool of ", bytes, " bytes: ", std::strerror(errno)));
    }
    std::memset(p, 0, bytes);  // fault every page in now, untimed
    auto pool = std::unique_ptr<KvPool>(new KvPool(static_cast<uint8_t*>(p), bytes, block_bytes));
    pool->free_.reserve(slots);
    for (uint64_t i = slots; i-- > 0;) pool->free_.push_back(static_cast<uint32_t>(i));
    return pool;
  }
  ~KvPool() {
    if (!leak_) munmap(base_, bytes_);
  }
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  size_t free_slots() const { return free_.size(); }
  uint8_t* slot(uint32_t i) const { return base_ + uint64_t{i} * block_bytes_; }
  // REQUIRES: free_slots() >= n.
  std::vector<uint32_t> Take(size_t n) {
    std::vector<uint32_t> out(free_.end() - n, free_.end());
    free_.resize(free_.size() - n);
    return out;
  }
  void Give(absl::Span<const uint32_t> slots) {
    free_.insert(free_.end(), slots.begin(), slots.end());
  }
  // Keeps the mapping at destruction (a store that never finished may
  // still read it).
  void LeakForever() { leak_ = true; }

 private:
  KvPool(uint8_t* base, uint64_t bytes, uint64_t block_bytes)
      : base_(base), bytes_(bytes), block_bytes_(block_bytes) {}
  uint8_t* const base_;
  const uint64_t bytes_;
  const uint64_t block_bytes_;
  std::vector<uint32_t> free_;
  bool leak_ = false;
};

// A Store in flight, owned by the worker that issued it.
struct PendingStore {
  size_t request = 0;
  std::shared_ptr<StoreHandle> handle;
  // The hash ids of the stored blocks, in the order of the keys.
  std::vector<uint64_t> ids;
  // The pool slots the stored blocks point into.
  std::vector<uint32_t> slots;
  uint64_t bytes = 0;
  // Send the request's think-time hint once the store is done.
  bool hint = false;
};

// The loss reason of a failed block or call.
LossReason LossReasonOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kResourceExhausted:
      switch (hymcache::ReasonOf(s)) {
        case StatusReason::kStoreQueueFull:
          return LossReason::kRefusedStoreQueue;
        case StatusReason::kNodeRefusedWrite:
          return LossReason::kRefusedWriteBuffer;
        default:
          return LossReason::kRefusedNoRoom;
      }
    case absl::StatusCode::kDeadlineExceeded:
      return LossReason::kDeadline;
    case absl::StatusCode::kNotFound:
      return LossReason::kNotFound;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kOk:
      return LossReason::kOther;
    default:
      return LossReason::kNodeError;
  }
}

bool StoreQueueFull(const absl::StatusOr<PutResult>& r) {
  return !r.ok() && LossReasonOf(r.status()) == LossReason::kRefusedStoreQueue;
}

// What had become of a block when a request came: not yet handed to a
// store (absent), its store running, stored, or lost to a reason.
struct BlockFate {
  enum State : uint8_t { kPending, kStored, kLost } state = kPending;
  LossReason reason = LossReason::kOther;
};

class Replayer {
 public:
  Replayer(Client* client, absl::Span<const Request> requests,
           const ReplayOptions& options, std::ostream* progress)
      : client_(client),
        requests_(requests),
        options_(options),
        progress_(progress),
        codec_(options.key_namespace, options.block_bytes),
        hint_codec_(options.hint_namespace.empty() ? options.key_namespace
                                                   : options.hint_namespace,
                    options.block_bytes) {}

  // REQUIRES: `pools` holds one pool per worker, each holding the largest
  // request.
  ReplayResult Run(std::vector<std::unique_ptr<KvPool>> pools) {
    const std::vector<size_t> ceiling = CeilingHits(requests_);
    last_turn_.assign(requests_.size(), false);
    {
      absl::flat_hash_map<int64_t, size_t> last;  // conversation -> request
      for (size_t i = 0; i < requests_.size(); ++i) {
        const Request& q = requests_[i];
        if (q.conversation < 0) continue;
        auto [it, added] = last.try_emplace(q.conversation, i);
        if (!added && q.turn >= requests_[it->second].turn) it->second = i;
      }
      for (const auto& [conversation, i] : last) last_turn_[i] = true;
    }
    result_.records.resize(requests_.size());
    for (size_t i = 0; i < requests_.size(); ++i) {
      RequestRecord& r = result_.records[i];
      const Request& q = requests_[i];
      r.index = i;
      r.conversation = q.conversation;
      r.turn = q.turn;
      r.timestamp_ms = q.timestamp_ms;
      r.blocks = q.hash_ids.size();
      r.ceiling_hits = ceiling[i];
    }
    first_timestamp_ms_ = 0;
    if (!requests_.empty()) {
      first_timestamp_ms_ = requests_[0].timestamp_ms;
      for (const Request& q : requests_) {
        first_timestamp_ms_ = std::min(first_timestamp_ms_, q.timestamp_ms);
      }
    }
    result_.pool_bytes = pools.empty() ? 0 : pools[0]->bytes();
    result_.pools_allocated = pools.size();
    // Registered once, as an engine registers its KV pool at start-up.
    std::vector<bool> registered(pools.size(), false);
    if (options_.register_pool) {
      for (size_t w = 0; w < pools.size(); ++w) {
        absl::Status s = client_->RegisterMemory(pools[w]->base(), pools[w]->bytes());
        registered[w] = s.ok();
        if (s.ok()) {
          ++result_.pools_registered;
        } else if (result_.pool_registration_error.ok()) {
          LOG(WARNING) << "hymbench: cannot register the KV pool (" << s
                       << "); transfers go through the transport's bounce buffers";
          result_.pool_registration_error = s;
        }
      }
    }

    start_ = absl::Now();
    Thread progress_thread;
    if (progress_ != nullptr && options_.progress_interval > absl::ZeroDuration()) {
      progress_thread = Thread("hymbench-prog", [this] { ProgressLoop(); });
    }
    // One byte per worker (each written by its own thread).
    std::vector<uint8_t> leaked(pools.size(), 0);
    {
      std::vector<Thread> workers;
      for (int w = 0; w < options_.concurrency; ++w) {
        workers.emplace_back(absl::StrCat("hymbench-w", w), [this, w, &pools, &leaked] {
          leaked[w] = !Worker(pools[w].get());
        });
      }
    }  // joins the workers
    {
      MutexLock l(&mu_);
      finished_ = true;
      cv_.SignalAll();
    }
    progress_thread.Join();
    result_.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    for (size_t w = 0; w < pools.size(); ++w) {
      if (leaked[w]) {
        pools[w]->LeakForever();  // a store may still read it: keep it mapped
      } else if (registered[w]) {
        client_->UnregisterMemory(pools[w]->base()).IgnoreError();  // freed next
      }
    }
    MutexLock l(&mu_);
    result_.load_calls = load_calls_;
    result_.load_errors = load_errors_;
    result_.first_load_error = first_load_error_;
    result_.first_store_error = first_store_error_;
    result_.corrupt_blocks = corrupt_blocks_;
    result_.first_corruption = first_corruption_;
    result_.store_queue_retries = store_queue_retries_;
    result_.store_queue_wait_seconds = store_queue_wait_seconds_;
    result_.pool_waits = pool_waits_;
    result_.hints_sent = hints_sent_;
    result_.hints_dropped = hints_dropped_;
    result_.ended_hints_sent = ended_hints_sent_;
    return std::move(result_);
  }

 private:
  // Runs requests until there are none left, then waits for its stores.
  // Returns false if a store never finished (its pool must stay mapped).
  bool Worker(KvPool* pool) {
    std::deque<PendingStore> pending;
    while (true) {
      size_t i;
      {
        MutexLock l(&mu_);
        if (next_ >= requests_.size()) break;
        i = next_++;
      }
      WaitForArrival(i, &pending, pool);
      RunRequest(i, &pending, pool);
      Reap(&pending, pool);
    }
    bool all_finished = true;
    while (!pending.empty()) {
      all_finished = WaitOldest(&pending, pool) && all_finished;
    }
    return all_finished;
  }

  // Waits for the oldest pending store (its deadline plus a grace period)
  // and finishes it. A store that never finishes is recorded as failed and
  // its slots are never reused; returns false then.
  bool WaitOldest(std::deque<PendingStore>* pending, KvPool* pool) {
    PendingStore p = std::move(pending->front());
    pending->pop_front();
    p.handle->Wait(absl::Now() + options_.store_timeout + kStoreGrace)
        .status()
        .IgnoreError();  // the outcome is read in FinishStore
    if (p.handle->Done()) {
      FinishStore(p, pool);
      return true;
    }
    LOG(WARNING) << "hymbench: the store of request " << p.request
                 << " did not finish; its pool slots are not reused";
    RequestRecord& rec = result_.records[p.request];
    rec.store_error = "store did not finish";
    rec.store_failed = rec.store_keys;
    MutexLock l(&mu_);
    for (uint64_t id : p.ids) SetFate(id, LossReason::kDeadline);
    store_failed_ += rec.store_failed;
    if (first_store_error_.ok()) {
      first_store_error_ = absl::DeadlineExceededError(rec.store_error);
    }
    return false;
  }

  // Sleeps until request i's scheduled arrival (time_scale > 0), reaping
  // finished stores meanwhile.
  void WaitForArrival(size_t i, std::deque<PendingStore>* pending, KvPool* pool) {
    if (options_.time_scale <= 0) return;
    const absl::Time due =
        start_ + absl::Milliseconds((requests_[i].timestamp_ms - first_timestamp_ms_) /
                                    options_.time_scale);
    for (absl::Time now = absl::Now(); now < due; now = absl::Now()) {
      Reap(pending, pool);
      absl::SleepFor(std::min(due - now, absl::Milliseconds(10)));
    }
    result_.records[i].start_delay_ms =
        std::max(0.0, absl::ToDoubleMilliseconds(absl::Now() - due));
  }

  void RunRequest(size_t i, std::deque<PendingStore>* pending, KvPool* pool) {
    const Request& q = requests_[i];
    RequestRecord& rec = result_.records[i];
    const size_t n = q.hash_ids.size();
    const uint64_t bb = options_.block_bytes;
    if (n == 0) {
      AddProgress(rec);
      return;
    }
    std::vector<std::string> keys;
    keys.reserve(n);
    for (uint64_t id : q.hash_ids) keys.push_back(codec_.Key(id));

    // Slots for every block: the worker's own stores may hold some.
    if (pool->free_slots() < n) {
      MutexLock l(&mu_);
      ++pool_waits_;
    }
    while (pool->free_slots() < n && !pending->empty()) WaitOldest(pending, pool);
    if (pool->free_slots() < n) {
      // Only stores that never finished hold the pool's slots now.
      rec.load_error = absl::StrCat("KV pool exhausted: ", pool->free_slots(), " of ",
                                    pool->bytes() / bb, " slots free, ", n,
                                    " needed (the rest held by unfinished stores)");
      MutexLock l(&mu_);
      ++load_calls_;
      ++load_errors_;
      if (first_load_error_.ok()) first_load_error_ = absl::ResourceExhaustedError(rec.load_error);
      rec.lost[static_cast<int>(LossReason::kOther)] += rec.ceiling_hits;
      AddProgressLocked(rec);
      return;
    }
    // Load fills the hits, Fill the rest; slots go back unless a store holds
    // them.
    std::vector<uint32_t> slots = pool->Take(n);
    auto block = [&](size_t b) { return pool->slot(slots[b]); };
    std::vector<MutableBuffer> out(n);
    for (size_t b = 0; b < n; ++b) out[b] = {block(b), bb};

    // What had become of each block an infinite cache would hold, as the
    // request starts: names the reason of a miss.
    std::vector<std::optional<BlockFate>> fates(std::min(rec.ceiling_hits, n));
    {
      MutexLock l(&mu_);
      for (size_t b = 0; b < fates.size(); ++b) {
        auto it = fates_.find(q.hash_ids[b]);
        if (it != fates_.end()) fates[b] = it->second;
      }
    }

    // 1. The read path.
    LoadOptions lo;
    lo.prefetch = options_.prefetch;
    if (options_.load_timeout > absl::ZeroDuration()) {
      lo.deadline = absl::Now() + options_.load_timeout;
    }
    const absl::Time t = absl::Now();
    absl::StatusOr<LoadResult> got = client_->Load(keys, out, lo);
    rec.load_ms = absl::ToDoubleMilliseconds(absl::Now() - t);
    rec.load_called = true;
    size_t loaded = 0;
    if (!got.ok()) {
      rec.load_error = got.status().ToString();
    } else {
      loaded = std::min(got->loaded, n);
      rec.loaded = loaded;
      rec.hit_prefix = std::max(got->hit_prefix, loaded);
      rec.loaded_bytes = got->bytes;
      if (loaded < rec.hit_prefix && !got->stop_reason.ok()) {
        rec.load_stop = got->stop_reason.ToString();
      }
      if (options_.verify) Verify(i, keys, *got, block);
    }
    CountLosses(got, fates, &rec);
    {
      MutexLock l(&mu_);
      ++load_calls_;
      if (!got.ok()) {
        ++load_errors_;
        if (first_load_error_.ok()) first_load_error_ = got.status();
      }
      AddProgressLocked(rec);
    }

    // 2. "Compute" the blocks that were not loaded and store them.
    std::vector<std::string> store_keys;
    std::vector<ConstBuffer> store_buffers;
    std::vector<uint64_t> store_ids;
    std::vector<uint32_t> held, free_now(slots.begin(), slots.begin() + loaded);
    absl::flat_hash_set<absl::string_view> seen;  // a malformed trace may repeat ids
    for (size_t b = loaded; b < n; ++b) {
      if (!options_.store || !seen.insert(keys[b]).second) {
        free_now.push_back(slots[b]);
        continue;
      }
      BlockCodec::Fill(keys[b], block(b), bb);
      store_keys.push_back(keys[b]);
      store_buffers.push_back({block(b), bb});
      store_ids.push_back(q.hash_ids[b]);
      held.push_back(slots[b]);
    }
    pool->Give(free_now);
    rec.store_keys = store_keys.size();
    if (store_keys.empty()) {
      HintTurn(i);
      return;
    }
    const uint64_t held_bytes = held.size() * bb;
    bool drop = false;
    {
      MutexLock l(&mu_);
      if (options_.max_store_bytes_in_flight > 0 && store_bytes_in_flight_ > 0 &&
          store_bytes_in_flight_ + held_bytes > options_.max_store_bytes_in_flight) {
        rec.store_dropped = store_keys.size();
        dropped_ += store_keys.size();
        for (uint64_t id : store_ids) SetFate(id, LossReason::kDropped);
        pool->Give(held);
        drop = true;
      }
    }
    if (drop) {
      HintTurn(i);
      return;
    }
    {
      MutexLock l(&mu_);
      store_bytes_in_flight_ += held_bytes;
      for (uint64_t id : store_ids) {
        auto [it, inserted] = fates_.try_emplace(id);
        if (!inserted && it->second.state != BlockFate::kStored) it->second = BlockFate{};
      }
    }
    StoreOptions so;
    if (loaded > 0) so.parent_key = keys[loaded - 1];
    PendingStore p;
    p.request = i;
    p.handle = IssueStore(store_keys, store_buffers, &so, pending, pool);
    p.ids = std::move(store_ids);
    p.slots = std::move(held);
    p.bytes = held_bytes;
    p.hint = options_.hint_next_turn || options_.hint_conversation_end;
    if (p.handle == nullptr) {  // the API promises a handle; do not crash
      rec.store_error = "Store returned no handle";
      rec.store_failed = store_keys.size();
      pool->Give(p.slots);
      MutexLock l(&mu_);
      for (uint64_t id : p.ids) SetFate(id, LossReason::kOther);
      store_bytes_in_flight_ -= held_bytes;
      if (first_store_error_.ok()) first_store_error_ = absl::InternalError(rec.store_error);
      return;
    }
    if (options_.wait_stores) {
      p.handle->Wait(absl::Now() + options_.store_timeout + kStoreGrace)
          .status()
          .IgnoreError();  // the outcome is read in FinishStore
    }
    pending->push_back(std::move(p));
  }

  // Client::Store; while the client refuses it for a full store queue,
  // retries every kStoreRetryInterval for up to store_queue_wait, reaping
  // this worker's finished stores meanwhile. Returns the last handle.
  std::shared_ptr<StoreHandle> IssueStore(const std::vector<std::string>& keys,
                                          const std::vector<ConstBuffer>& buffers,
                                          StoreOptions* so, std::deque<PendingStore>* pending,
                                          KvPool* pool) {
    const absl::Time start = absl::Now();
    const absl::Time give_up = start + options_.store_queue_wait;
    size_t retries = 0;
    std::shared_ptr<StoreHandle> h;
    while (true) {
      so->deadline = absl::Now() + options_.store_timeout;
      h = client_->Store(keys, buffers, *so);
      // A full queue completes the handle at once.
      if (h == nullptr || !h->Done() || !StoreQueueFull(h->Wait()) || absl::Now() >= give_up) {
        break;
      }
      ++retries;
      Reap(pending, pool);
      absl::SleepFor(kStoreRetryInterval);
    }
    if (retries > 0) {
      MutexLock l(&mu_);
      store_queue_retries_ += retries;
      store_queue_wait_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
    }
    return h;
  }

  // Attributes the request's ceiling hits that were not loaded (see
  // LossReason in report.h).
  void CountLosses(const absl::StatusOr<LoadResult>& got,
                   const std::vector<std::optional<BlockFate>>& fates, RequestRecord* rec) {
    auto add = [&](LossReason why, size_t blocks) {
      rec->lost[static_cast<int>(why)] += blocks;
    };
    const size_t ceiling = fates.size();
    if (!got.ok()) {
      add(LossReasonOf(got.status()), ceiling);
      return;
    }
    // [loaded, hit_prefix): the master had them; the read stopped.
    const size_t listed = std::min(rec->hit_prefix, ceiling);
    if (rec->loaded < listed) {
      add(got->stop_reason.ok() ? LossReason::kOther : LossReasonOf(got->stop_reason),
          listed - rec->loaded);
    }
    // [hit_prefix, ceiling): the first of them broke the prefix.
    if (rec->hit_prefix < ceiling) {
      const std::optional<BlockFate>& f = fates[rec->hit_prefix];
      LossReason why = LossReason::kInFlight;
      if (f.has_value() && f->state == BlockFate::kStored) why = LossReason::kNotFound;
      if (f.has_value() && f->state == BlockFate::kLost) why = f->reason;
      add(why, ceiling - rec->hit_prefix);
    }
  }

  // Records a block's failure unless it is stored (by another store).
  void SetFate(uint64_t id, LossReason why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    BlockFate& f = fates_[id];
    if (f.state != BlockFate::kStored) f = BlockFate{BlockFate::kLost, why};
  }

  // Checks loaded blocks [0, got.loaded) of request i.
  template <typename BlockFn>
  void Verify(size_t i, const std::vector<std::string>& keys, const LoadResult& got,
              BlockFn block) {
    const uint64_t bb = options_.block_bytes;
    RequestRecord& rec = result_.records[i];
    for (size_t b = 0; b < rec.loaded; ++b) {
      const uint64_t len = b < got.lengths.size() ? got.lengths[b] : 0;
      std::string what;
      if (len != bb) {
        what = absl::StrCat("length ", len, ", want ", bb);
      } else if (size_t at = BlockCodec::FirstMismatch(keys[b], block(b), bb); at != bb) {
        what = absl::StrCat("first wrong byte at offset ", at);
      } else {
        continue;
      }
      ++rec.corrupt_blocks;
      MutexLock l(&mu_);
      ++corrupt_blocks_;
      if (first_corruption_.empty()) {
        first_corruption_ = absl::StrCat("request ", i, " block ", b, " (hash id ",
                                         requests_[i].hash_ids[b], "): ", what);
      }
    }
  }

  // The think-time hint of a request whose turn is answered: the
  // conversation ended (its last request), or its next turn comes.
  void HintTurn(size_t request) {
    if (requests_[request].hash_ids.empty()) return;
    if (options_.hint_conversation_end && last_turn_[request]) {
      std::vector<std::string> keys;
      for (uint64_t id : requests_[request].hash_ids)
        keys.push_back(codec_.Key(id));
      const bool sent = client_->HintConversationEnded(keys).ok();
      MutexLock l(&mu_);
      ++(sent ? ended_hints_sent_ : hints_dropped_);
      return;
    }
    if (!options_.hint_next_turn) return;
    std::vector<std::string> keys;
    for (uint64_t id : requests_[request].hash_ids)
      keys.push_back(hint_codec_.Key(id));
    TurnHintOptions h;
    h.hold = options_.hint_hold;
    const bool sent = client_->HintNextTurn(keys, h).ok();
    MutexLock l(&mu_);
    ++(sent ? hints_sent_ : hints_dropped_);
  }

  // Records the stores that have finished and frees their slots.
  void Reap(std::deque<PendingStore>* pending, KvPool* pool) {
    for (auto it = pending->begin(); it != pending->end();) {
      if (it->handle->Done()) {
        FinishStore(*it, pool);
        it = pending->erase(it);
      } else {
        ++it;
      }
    }
  }

  // REQUIRES: p.handle->Done().
  void FinishStore(PendingStore& p, KvPool* pool) {
    RequestRecord& rec = result_.records[p.request];
    absl::StatusOr<PutResult> r = p.handle->Wait();
    absl::Status error = r.status();
    // Per block: stored, left to another writer, or lost to a reason.
    std::vector<std::optional<BlockFate>> fates(p.ids.size());
    if (!r.ok()) {
      // A full client store queue refuses the write like a full node does.
      if (absl::IsResourceExhausted(r.status())) {
        rec.refused = rec.store_keys;
      } else {
        rec.store_failed = rec.store_keys;
      }
      for (auto& f : fates) f = BlockFate{BlockFate::kLost, LossReasonOf(r.status())};
    } else {
      rec.stored = r->stored;
      rec.skipped = r->skipped;
      rec.refused = r->refused;
      rec.store_failed = r->failed - std::min(r->failed, r->refused);
      // Name the first failure that was not a refusal.
      for (size_t k = 0; rec.store_failed > 0 && k < r->errors.size(); ++k) {
        if (!r->errors[k].ok() && !absl::IsResourceExhausted(r->errors[k])) {
          error = r->errors[k];
          break;
        }
      }
      // A block after one that could not be stored is not kept: an
      // unspecific failure there inherits the chain's first reason.
      std::optional<LossReason> chain;
      for (size_t k = 0; k < fates.size() && k < r->outcomes.size(); ++k) {
        switch (r->outcomes[k]) {
          case PutOutcome::kStored:
          case PutOutcome::kAlreadyStored:
            fates[k] = BlockFate{BlockFate::kStored};
            break;
          case PutOutcome::kInProgress:
            break;  // another writer's store decides
          case PutOutcome::kFailed: {
            const absl::Status& e = k < r->errors.size() ? r->errors[k] : absl::OkStatus();
            LossReason why = LossReasonOf(e);
            if (chain.has_value() && (e.ok() || absl::IsUnknown(e))) why = *chain;
            if (!chain.has_value()) chain = why;
            fates[k] = BlockFate{BlockFate::kLost, why};
            break;
          }
        }
      }
    }
    if (!error.ok()) rec.store_error = error.ToString();
    pool->Give(p.slots);
    if (p.hint) HintTurn(p.request);
    MutexLock l(&mu_);
    for (size_t k = 0; k < fates.size(); ++k) {
      if (!fates[k].has_value()) continue;
      if (fates[k]->state == BlockFate::kStored) {
        fates_[p.ids[k]] = *fates[k];
      } else {
        SetFate(p.ids[k], fates[k]->reason);
      }
    }
    store_bytes_in_flight_ -= p.bytes;
    stored_ += rec.stored;
    refused_ += rec.refused;
    store_failed_ += rec.store_failed;
    if (first_store_error_.ok()) first_store_error_ = error;
  }

  void AddProgress(const RequestRecord& rec) {
    MutexLock l(&mu_);
    AddProgressLocked(rec);
  }
  void AddProgressLocked(const RequestRecord& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++done_;
    blocks_ += rec.blocks;
    ceiling_hits_ += rec.ceiling_hits;
    loaded_ += rec.loaded;
    loaded_bytes_ += rec.loaded_bytes;
    if (rec.load_called && rec.load_error.empty()) load_seconds_ += rec.load_ms / 1e3;
  }

  // Prints a progress line every interval, and a last one when the run ends.
  void ProgressLoop() {
    MutexLock l(&mu_);
    while (!finished_) {
      cv_.WaitWithDeadline(&mu_, absl::Now() + options_.progress_interval);
      PrintProgress();
    }
  }

  void PrintProgress() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto ratio = [](size_t a, size_t b) { return b == 0 ? 0.0 : double(a) / b; };
    *progress_ << absl::StrFormat(
        "hymbench: %6.1fs %d/%d requests, hit %.4f (ceiling %.4f), %.3f GB/s, "
        "stores %d stored %d refused %d failed %d dropped, %d load errors%s\n",
        absl::ToDoubleSeconds(absl::Now() - start_), done_, requests_.size(),
        ratio(loaded_, blocks_), ratio(ceiling_hits_, blocks_),
        load_seconds_ > 0 ? loaded_bytes_ / load_seconds_ / 1e9 : 0.0, stored_, refused_,
        store_failed_, dropped_, load_errors_, finished_ ? " (done)" : "");
    progress_->flush();
  }

  // Constant after construction.
  Client* const client_;
  const absl::Span<const Request> requests_;
  const ReplayOptions options_;
  std::ostream* const progress_;
  const BlockCodec codec_;
  const BlockCodec hint_codec_;
  // Set before the threads start.
  absl::Time start_;
  double first_timestamp_ms_ = 0;
  // records[i] is written only by the worker that took request i (and read
  // after the workers are joined).
  ReplayResult result_;

  Mutex mu_;
  CondVar cv_;
  // Protected by mu_.
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t store_bytes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  size_t blocks_ ABSL_GUARDED_BY(mu_) = 0;
  size_t ceiling_hits_ ABSL_GUARDED_BY(mu_) = 0;
  size_t loaded_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t loaded_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  double load_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  size_t stored_ ABSL_GUARDED_BY(mu_) = 0;
  size_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  size_t store_failed_ ABSL_GUARDED_BY(mu_) = 0;
  size_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  size_t load_calls_ ABSL_GUARDED_BY(mu_) = 0;
  size_t load_errors_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_load_error_ ABSL_GUARDED_BY(mu_);
  absl::Status first_store_error_ ABSL_GUARDED_BY(mu_);
  size_t corrupt_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_corruption_ ABSL_GUARDED_BY(mu_);
  size_t store_queue_retries_ ABSL_GUARDED_BY(mu_) = 0;
  double store_queue_wait_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  size_t pool_waits_ ABSL_GUARDED_BY(mu_) = 0;
  size_t hints_sent_ ABSL_GUARDED_BY(mu_) = 0;
  size_t hints_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  size_t ended_hints_sent_ ABSL_GUARDED_BY(mu_) = 0;
  // Per request: the last of its conversation (the highest turn; set in
  // Run).
  std::vector<bool> last_turn_;
  // By hash id: what became of each block handed to a store (absent: never
  // handed to one yet).
  absl::flat_hash_map<uint64_t, BlockFate> fates_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status ReplayOptions::Validate() const {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("ReplayOptions.", what));
  };
  if (block_bytes == 0) return bad("block_bytes must be > 0");
  if (concurrency < 1 || concurrency > 1024) return bad("concurrency must be in 1..1024");
  if (!(time_scale >= 0) || !std::isfinite(time_scale)) {
    return bad("time_scale must be >= 0 (0: as fast as possible)");
  }
  if (load_timeout < absl::ZeroDuration()) return bad("load_timeout must be >= 0");
  if (store_timeout <= absl::ZeroDuration()) return bad("store_timeout must be > 0");
  if (store_queue_wait < absl::ZeroDuration()) return bad("store_queue_wait must be >= 0");
  if (hint_hold <= absl::ZeroDuration()) return bad("hint_hold must be > 0");
  if (pool_bytes != 0 && pool_bytes < block_bytes) {
    return bad("pool_bytes must hold at least one block (or be 0: twice the largest request)");
  }
  return absl::OkStatus();
}

absl::StatusOr<ReplayResult> Replay(Client* client, absl::Span<const Request> requests,
                                    const ReplayOptions& options,
                                    std::ostream* progress) {
  if (auto s = options.Validate(); !s.ok()) return s;
  if (client == nullptr) return absl::InvalidArgumentError("Replay: no client");
  // Each worker's pool holds the largest request (twice by default).
  size_t largest = 0, largest_at = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].hash_ids.size() > largest) {
      largest = requests[i].hash_ids.size();
      largest_at = i;
    }
  }
  const uint64_t bb = options.block_bytes;
  uint64_t slots = options.pool_bytes / bb;
  if (options.pool_bytes == 0) slots = std::max<uint64_t>(2 * largest, 1);
  if (largest > slots) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request %d has %d blocks of %d bytes but the KV pool holds %d blocks "
        "(pool_bytes %d): raise the pool size",
        largest_at, largest, bb, slots, options.pool_bytes));
  }
  if (slots > UINT32_MAX || bb > UINT64_MAX / slots ||
      slots * bb > UINT64_MAX / static_cast<uint64_t>(options.concurrency)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV pools of ", slots, " blocks of ", bb, " bytes for ", options.concurrency,
        " workers overflow"));
  }
  std::vector<std::unique_ptr<KvPool>> pools;
  for (int w = 0; w < options.concurrency; ++w) {
    absl::StatusOr<std::unique_ptr<KvPool>> pool = KvPool::Create(slots, bb);
    if (!pool.ok()) return pool.status();
    pools.push_back(std::move(*pool));
  }
  Replayer replayer(client, requests, options, progress);
  return replayer.Run(std::move(pools));
}

absl::Status CheckCluster(Client* client, absl::Duration timeout) {
  CallOptions call;
  call.deadline = absl::Now() + timeout;
  absl::StatusOr<ClusterStatus> status = client->GetClusterStatus(call);
  if (!status.ok()) {
    return absl::Status(status.status().code(),
                        absl::StrCat("cannot reach the master: ", status.status().message()));
  }
  for (const NodeStatus& n : status->nodes) {
    if (n.alive) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the master has no live storage node (", status->nodes.size(),
                   " registered)"));
}

}  // namespace hymcache::hymbench
