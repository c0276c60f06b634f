#include "tools/hymbench/replay.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/mutex.h"
#include "common/thread.h"
#include "glog/logging.h"
#include "tools/hymbench/block_data.h"

namespace hymcache::hymbench {
namespace {

// How long past its own timeout a store may take before hymbench gives up
// waiting for it at the end of the run.
constexpr absl::Duration kStoreGrace = absl::Seconds(30);

// Largest per-worker buffer allocated before the run (larger requests get
// theirs when they come).
constexpr uint64_t kMaxPreallocatedBytes = uint64_t{4} << 30;

// One worker's request buffers, reused from request to request as a
// serving engine reuses its preallocated KV pool: a buffer is faulted in
// once, when first allocated (outside the timed Load), and comes back when
// the request's store (if any) has finished. Fresh buffers per request put
// page faults inside the timed Load: writing 50 MiB of fresh memory took
// ~270 ms, of reused memory 2-8 ms.
struct PooledBuffer {
  std::shared_ptr<uint8_t[]> data;
  uint64_t capacity = 0;
};
class BufferPool {
 public:
  // A buffer of at least `bytes`, faulted in.
  PooledBuffer Take(uint64_t bytes) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->capacity >= bytes &&
          (best == free_.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best != free_.end()) {
      PooledBuffer b = std::move(*best);
      free_.erase(best);
      return b;
    }
    PooledBuffer b;
    b.data.reset(new uint8_t[bytes]);
    b.capacity = bytes;
    std::memset(b.data.get(), 0, bytes);  // fault it in now, untimed
    return b;
  }
  void Give(PooledBuffer b) {
    if (b.data != nullptr) free_.push_back(std::move(b));
  }

 private:
  std::vector<PooledBuffer> free_;
};

// A Store in flight, owned by the worker that issued it.
struct PendingStore {
  size_t request = 0;
  std::shared_ptr<StoreHandle> handle;
  // The request's buffers: the stored blocks point into them.
  PooledBuffer buffers;
  uint64_t bytes = 0;
};

class Replayer {
 public:
  Replayer(Client* client, absl::Span<const Request> requests,
           const ReplayOptions& options, std::ostream* progress)
      : client_(client),
        requests_(requests),
        options_(options),
        progress_(progress),
        codec_(options.key_namespace, options.block_bytes) {}

  ReplayResult Run() {
    const std::vector<size_t> ceiling = CeilingHits(requests_);
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

    // Each worker's KV pool: one buffer of the largest request, faulted in
    // before the clock starts (an engine preallocates its pool once).
    uint64_t largest = 0;
    for (const Request& q : requests_) {
      largest = std::max<uint64_t>(largest, q.hash_ids.size() * options_.block_bytes);
    }
    std::vector<BufferPool> pools(options_.concurrency);
    if (largest <= kMaxPreallocatedBytes) {
      for (BufferPool& p : pools) p.Give(p.Take(largest));
    }

    start_ = absl::Now();
    Thread progress_thread;
    if (progress_ != nullptr && options_.progress_interval > absl::ZeroDuration()) {
      progress_thread = Thread("hymbench-prog", [this] { ProgressLoop(); });
    }
    {
      std::vector<Thread> workers;
      for (int w = 0; w < options_.concurrency; ++w) {
        workers.emplace_back(absl::StrCat("hymbench-w", w),
                             [this, pool = &pools[w]] { Worker(pool); });
      }
    }  // joins the workers
    {
      MutexLock l(&mu_);
      finished_ = true;
      cv_.SignalAll();
    }
    progress_thread.Join();
    result_.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    MutexLock l(&mu_);
    result_.load_calls = load_calls_;
    result_.load_errors = load_errors_;
    result_.first_load_error = first_load_error_;
    result_.first_store_error = first_store_error_;
    result_.corrupt_blocks = corrupt_blocks_;
    result_.first_corruption = first_corruption_;
    return std::move(result_);
  }

 private:
  void Worker(BufferPool* pool_ptr) {
    std::deque<PendingStore> pending;
    BufferPool& pool = *pool_ptr;
    while (true) {
      size_t i;
      {
        MutexLock l(&mu_);
        if (next_ >= requests_.size()) break;
        i = next_++;
      }
      WaitForArrival(i, &pending, &pool);
      RunRequest(i, &pending, &pool);
      Reap(&pending, &pool);
    }
    for (PendingStore& p : pending) {
      p.handle->Wait(absl::Now() + options_.store_timeout + kStoreGrace)
          .status()
          .IgnoreError();  // the outcome is read in FinishStore
      if (!p.handle->Done()) {
        // Never free buffers a store may still read: leak them instead.
        LOG(WARNING) << "hymbench: the store of request " << p.request
                     << " did not finish; leaking its buffers";
        new std::shared_ptr<uint8_t[]>(std::move(p.buffers.data));
        RequestRecord& rec = result_.records[p.request];
        rec.store_error = "store did not finish";
        rec.store_failed = rec.store_keys;
        MutexLock l(&mu_);
        store_failed_ += rec.store_failed;
        if (first_store_error_.ok()) {
          first_store_error_ = absl::DeadlineExceededError(rec.store_error);
        }
        continue;
      }
      FinishStore(p, &pool);
    }
  }

  // Sleeps until request i's scheduled arrival (time_scale > 0), reaping
  // finished stores meanwhile.
  void WaitForArrival(size_t i, std::deque<PendingStore>* pending,
                      BufferPool* pool) {
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

  void RunRequest(size_t i, std::deque<PendingStore>* pending,
                  BufferPool* pool) {
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
    // Load fills the hits, Fill the rest. Back to the pool when no store
    // holds it.
    PooledBuffer buffers = pool->Take(n * bb);
    auto block = [&](size_t b) { return buffers.data.get() + b * bb; };
    struct GiveBack {
      BufferPool* pool;
      PooledBuffer* b;
      ~GiveBack() { pool->Give(std::move(*b)); }
    } give_back{pool, &buffers};
    std::vector<MutableBuffer> out(n);
    for (size_t b = 0; b < n; ++b) out[b] = {block(b), bb};

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
    {
      MutexLock l(&mu_);
      ++load_calls_;
      if (!got.ok()) {
        ++load_errors_;
        if (first_load_error_.ok()) first_load_error_ = got.status();
      }
    }
    AddProgress(rec);

    // 2. "Compute" the blocks that were not loaded and store them.
    if (!options_.store) return;
    std::vector<std::string> store_keys;
    std::vector<ConstBuffer> store_buffers;
    absl::flat_hash_set<absl::string_view> seen;  // a malformed trace may repeat ids
    for (size_t b = loaded; b < n; ++b) {
      if (!seen.insert(keys[b]).second) continue;
      BlockCodec::Fill(keys[b], block(b), bb);
      store_keys.push_back(keys[b]);
      store_buffers.push_back({block(b), bb});
    }
    rec.store_keys = store_keys.size();
    if (store_keys.empty()) return;
    const uint64_t held = n * bb;
    {
      MutexLock l(&mu_);
      if (options_.max_store_bytes_in_flight > 0 && store_bytes_in_flight_ > 0 &&
          store_bytes_in_flight_ + held > options_.max_store_bytes_in_flight) {
        rec.store_dropped = store_keys.size();
        dropped_ += store_keys.size();
        return;
      }
      store_bytes_in_flight_ += held;
    }
    StoreOptions so;
    so.deadline = absl::Now() + options_.store_timeout;
    if (loaded > 0) so.parent_key = keys[loaded - 1];
    PendingStore p;
    p.request = i;
    p.handle = client_->Store(store_keys, store_buffers, so);
    p.buffers = std::move(buffers);
    p.bytes = held;
    if (p.handle == nullptr) {  // the API promises a handle; do not crash
      rec.store_error = "Store returned no handle";
      rec.store_failed = store_keys.size();
      MutexLock l(&mu_);
      store_bytes_in_flight_ -= held;
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

  // Records the stores that have finished and frees their buffers.
  void Reap(std::deque<PendingStore>* pending, BufferPool* pool) {
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
  void FinishStore(PendingStore& p, BufferPool* pool) {
    RequestRecord& rec = result_.records[p.request];
    absl::StatusOr<PutResult> r = p.handle->Wait();
    absl::Status error = r.status();
    if (!r.ok()) {
      // A full client store queue refuses the write like a full node does.
      if (absl::IsResourceExhausted(r.status())) {
        rec.refused = rec.store_keys;
      } else {
        rec.store_failed = rec.store_keys;
      }
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
    }
    if (!error.ok()) rec.store_error = error.ToString();
    pool->Give(std::move(p.buffers));
    MutexLock l(&mu_);
    store_bytes_in_flight_ -= p.bytes;
    stored_ += rec.stored;
    refused_ += rec.refused;
    store_failed_ += rec.store_failed;
    if (first_store_error_.ok()) first_store_error_ = error;
  }

  void AddProgress(const RequestRecord& rec) {
    MutexLock l(&mu_);
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
  return absl::OkStatus();
}

absl::StatusOr<ReplayResult> Replay(Client* client, absl::Span<const Request> requests,
                                    const ReplayOptions& options,
                                    std::ostream* progress) {
  if (auto s = options.Validate(); !s.ok()) return s;
  if (client == nullptr) return absl::InvalidArgumentError("Replay: no client");
  // A request's buffers are one allocation: refuse sizes that overflow.
  for (const Request& q : requests) {
    if (!q.hash_ids.empty() &&
        options.block_bytes > UINT64_MAX / q.hash_ids.size()) {
      return absl::InvalidArgumentError("block_bytes x blocks overflows");
    }
  }
  Replayer replayer(client, requests, options, progress);
  return replayer.Run();
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
