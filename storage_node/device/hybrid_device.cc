#include "storage_node/device/hybrid_device.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "glog/logging.h"

namespace hymcache::storage {
namespace {

constexpr uint64_t kPage = BlockIo::kAlignment;

uint64_t RoundUp(uint64_t v) { return (v + kPage - 1) / kPage * kPage; }
uint64_t RoundDown(uint64_t v) { return v / kPage * kPage; }

// Reserves `bytes` of DRAM for the staging window or the write buffer.
absl::StatusOr<std::unique_ptr<HostMemory>> AllocateArea(
    const HybridDeviceOptions& options, uint64_t bytes, const char* name,
    const char* what) {
  HostMemoryOptions m;
  m.bytes = bytes;
  m.numa_node = options.numa_node;
  m.huge_pages = true;
  m.shareable = options.shareable;
  m.name = name;
  auto mem = HostMemory::Allocate(m);
  if (!mem.ok()) {
    return absl::Status(
        mem.status().code(),
        absl::StrCat("hybrid device: cannot reserve a ", what, " of ", bytes,
                     " bytes: ", mem.status().message()));
  }
  return mem;
}

}  // namespace

// ---------------------------------------------------------------- internals

// An object staged (or being staged, or waiting for window space).
struct HybridDevice::Staged {
  // kLoaded: the bytes are in but their checksum is not checked yet
  // (verify_reads); kChecking: a consumer is checking it.
  enum class State { kQueued, kLoading, kLoaded, kChecking, kReady, kFailed };
  uint64_t addr = 0;
  uint64_t len = 0;
  uint64_t span_start = 0;  // addr rounded down to a page
  uint64_t span_len = 0;    // whole pages covering the object
  State state = State::kQueued;
  int refs = 0;  // prefetch handles
  int pins = 0;  // reads
  bool keyed = false;     // findable in staged_by_key_
  bool has_slot = false;  // holds window space
  uint64_t slot_off = 0;
  int chunks_pending = 0;    // in read_q_, not issued
  int chunks_in_flight = 0;  // issued, not completed
  int waiters = 0;           // threads waiting for it to be ready
  bool check = false;        // verify_reads and its checksum is known
  uint32_t crc = 0;          // the expected CRC32C
  bool corrupt = false;      // failed: checksum mismatch (else: I/O error)
  absl::Status error;
  // Signalled when state becomes kReady or kFailed: only the threads
  // waiting for this object wake up, not every reader on every I/O.
  CondVar cv;
  int owners() const { return refs + pins + waiters; }
};

// An object in the write buffer.
struct HybridDevice::Entry {
  uint64_t id = 0;
  uint64_t addr = 0;
  uint64_t len = 0;
  uint64_t tag = 0;
  uint64_t buf_off = 0;
  uint64_t buf_len = 0;  // len rounded up to a page
  bool writing = true;       // between BeginWrite and Commit/Abort
  bool live = false;         // in live_: readable from the buffer
  bool queued = false;       // in flush_queue_: not yet on the tier
  bool in_flight = false;    // in a batch being written
  bool forgotten = false;    // CapacityTier::Forget done over its range
  bool superseded = false;   // a newer write covers it
  bool committing = false;   // CommitWrite is computing its CRC
  bool has_crc = false;      // crc computed (at CommitWrite)
  uint32_t crc = 0;          // CRC32C of the object's len bytes
  int pins = 0;              // reads and prefetch handles
  uint64_t seq = 0;
  absl::Time commit_time;
};

// A staging miss: the object read into a bounce buffer.
struct HybridDevice::MissRead {
  uint8_t* buf = nullptr;
  uint64_t span_start = 0;
  uint64_t span_len = 0;
  int outstanding = 0;  // chunks not completed
  absl::Status status;
  bool check = false;      // verify_reads and the object's checksum is known
  uint32_t crc = 0;
  bool abandoned = false;  // the reader gave up; the last chunk frees it
  CondVar cv;              // signalled when outstanding reaches 0
};

// A batch of the flush pipeline: in pipeline_ from its first write until
// its last completes.
struct HybridDevice::FlushBatch {
  std::vector<Entry*> entries;  // in commit order, in_flight
  int outstanding = 0;          // writes not completed
  absl::Status status;          // first write error
  absl::Time issued;            // for the flush latency histogram
};


struct HybridDevice::IoReq {
  enum class Kind { kRefill, kMiss, kFlush };
  Kind kind = Kind::kRefill;
  void* owner = nullptr;  // Staged*, MissRead* or FlushBatch*
  uint64_t file_off = 0;
  uint8_t* buf = nullptr;
  size_t len = 0;
  bool write() const { return kind == Kind::kFlush; }
};

// ---------------------------------------------------------------- options

absl::Status HybridDeviceOptions::Validate() const {
  auto bad = [](const std::string& m) {
    return absl::InvalidArgumentError(absl::StrCat("hybrid device: ", m));
  };
  if (staging_bytes == 0) return bad("staging_bytes must be > 0");
  if (write_buffer_bytes == 0) return bad("write_buffer_bytes must be > 0");
  if (staging_bytes > (uint64_t{1} << 50) ||
      write_buffer_bytes > (uint64_t{1} << 50)) {
    return bad("staging_bytes/write_buffer_bytes implausibly large");
  }
  if (numa_node < -1) return bad(absl::StrCat("numa_node ", numa_node));
  if (io_chunk_bytes == 0 || io_chunk_bytes % kPage != 0) {
    return bad(absl::StrCat("io_chunk_bytes ", io_chunk_bytes,
                            " is not a positive multiple of 4096"));
  }
  if (io_queue_depth < 1) return bad("io_queue_depth must be >= 1");
  if (flush_batch_bytes == 0) return bad("flush_batch_bytes must be > 0");
  if (!(flush_high_watermark > 0 && flush_high_watermark <= 1)) {
    return bad("flush_high_watermark must be in (0, 1]");
  }
  if (flush_max_delay < absl::ZeroDuration()) {
    return bad("flush_max_delay must be >= 0");
  }
  if (flush_depth_idle < 1 || flush_depth_under_pressure < 1) {
    return bad("flush depths must be >= 1");
  }
  if (record_max_delay < absl::ZeroDuration()) {
    return bad("record_max_delay must be >= 0");
  }
  if (flush_retry_initial <= absl::ZeroDuration() ||
      flush_retry_max < flush_retry_initial) {
    return bad("need 0 < flush_retry_initial <= flush_retry_max");
  }
  if (max_bounce_bytes == 0) return bad("max_bounce_bytes must be > 0");
  if (read_timeout <= absl::ZeroDuration()) {
    return bad("read_timeout must be > 0");
  }
  if (shutdown_flush_timeout < absl::ZeroDuration()) {
    return bad("shutdown_flush_timeout must be >= 0");
  }
  if (verify_on_open) {
    absl::Status v = open_verify.Validate();
    if (!v.ok()) return bad(std::string(v.message()));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- lifetime

absl::StatusOr<std::unique_ptr<HybridDevice>> HybridDevice::Create(
    const HybridDeviceOptions& options, std::unique_ptr<CapacityTier> tier) {
  absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;
  if (tier == nullptr || tier->io() == nullptr) {
    return absl::InvalidArgumentError("hybrid device: a capacity tier is required");
  }
  const uint64_t cap = tier->capacity_bytes();
  if (cap == 0 || cap % kPage != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hybrid device: tier capacity ", cap,
        " is not a positive multiple of 4096"));
  }
  const uint64_t window_bytes = RoundUp(options.staging_bytes);
  const uint64_t buffer_bytes = RoundUp(options.write_buffer_bytes);
  auto window = AllocateArea(options, window_bytes, "hymcache-staging",
                             "staging window");
  if (!window.ok()) return window.status();
  auto buffer = AllocateArea(options, buffer_bytes, "hymcache-write-buffer",
                             "write buffer");
  if (!buffer.ok()) return buffer.status();

  // What survived, checked against the bytes unless told not to.
  std::vector<DurableExtent> durable = tier->Extents();
  OpenCheck check;
  if (options.verify_on_open && tier->adopted() && !durable.empty()) {
    absl::StatusOr<ExtentVerifyReport> report =
        tier->VerifyExtents(options.open_verify);
    if (!report.ok()) {
      return absl::Status(report.status().code(),
                          absl::StrCat("hybrid device: verifying the adopted "
                                       "objects: ",
                                       report.status().message()));
    }
    durable = std::move(report->good);
    check.verified_objects = report->verified_objects;
    check.verified_bytes = report->verified_bytes;
    check.unchecked_objects = report->unchecked_objects;
    check.checksum_failures = report->corrupt.size();
    check.dropped_objects = report->corrupt.size() + report->unreadable.size();
    check.elapsed = report->elapsed;
    const double secs = absl::ToDoubleSeconds(report->elapsed);
    const std::string summary = absl::StrCat(
        "hybrid device: verified ", report->verified_objects,
        " adopted objects (", report->verified_bytes, " bytes, ",
        report->bytes_read, " read) in ", secs, " s (",
        secs > 0 ? static_cast<double>(report->bytes_read) / secs / 1e9 : 0,
        " GB/s); dropped ", report->corrupt.size(),
        " with a checksum mismatch and ", report->unreadable.size(),
        " unreadable; ", report->unchecked_objects,
        " without a checksum adopted unchecked");
    if (check.dropped_objects > 0) {
      LOG(WARNING) << summary;
    } else {
      LOG(INFO) << summary;
    }
  } else {
    check.unchecked_objects = durable.size();
  }
  auto window_alloc = RangeAllocator::Create({window_bytes, kPage});
  if (!window_alloc.ok()) return window_alloc.status();
  auto buffer_alloc = RangeAllocator::Create({buffer_bytes, kPage});
  if (!buffer_alloc.ok()) return buffer_alloc.status();
  std::unique_ptr<HybridDevice> dev(new HybridDevice(
      options, std::move(tier), std::move(*window_alloc),
      std::move(*buffer_alloc), durable, check, std::move(*window),
      window_bytes, std::move(*buffer), buffer_bytes));
  HybridDevice* d = dev.get();
  absl::StatusOr<Thread> thread =
      Thread::Start("hyb-flusher", [d] { d->FlusherLoop(); });
  if (!thread.ok()) return thread.status();
  dev->flusher_ = std::move(*thread);
  LOG(INFO) << "hybrid device: " << cap << " bytes on the tier, staging window "
            << window_bytes << " bytes, write buffer " << buffer_bytes
            << " bytes, " << d->recovered_.size() << " durable objects";
  return dev;
}

namespace {
FlushPolicyOptions PolicyOptions(const HybridDeviceOptions& o) {
  FlushPolicyOptions p;
  p.flush_batch_bytes = o.flush_batch_bytes;
  p.high_watermark = o.flush_high_watermark;
  p.max_delay = o.flush_max_delay;
  p.depth_idle = o.flush_depth_idle;
  p.depth_under_pressure = o.flush_depth_under_pressure;
  p.queue_depth = o.io_queue_depth;
  return p;
}

std::vector<RecoveredExtent> ToRecovered(
    const std::vector<DurableExtent>& durable) {
  std::vector<RecoveredExtent> out;
  out.reserve(durable.size());
  for (const DurableExtent& e : durable) {
    out.push_back(RecoveredExtent{0, e.addr, e.length, e.tag});
  }
  return out;
}
}  // namespace

HybridDevice::HybridDevice(const HybridDeviceOptions& options,
                           std::unique_ptr<CapacityTier> tier,
                           std::unique_ptr<RangeAllocator> window_alloc,
                           std::unique_ptr<RangeAllocator> buffer_alloc,
                           const std::vector<DurableExtent>& durable,
                           const OpenCheck& open_check,
                           std::unique_ptr<HostMemory> window_memory,
                           uint64_t window_bytes,
                           std::unique_ptr<HostMemory> buffer_memory,
                           uint64_t buffer_bytes)
    : options_(options),
      tier_(std::move(tier)),
      io_(tier_->io()),
      capacity_(tier_->capacity_bytes()),
      recovered_(ToRecovered(durable)),
      flush_policy_(PolicyOptions(options)),
      io_policy_(options.io_queue_depth),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      window_memory_(std::move(window_memory)),
      buffer_memory_(std::move(buffer_memory)),
      window_(window_memory_->data()),
      window_bytes_(window_bytes),
      buffer_(buffer_memory_->data()),
      buffer_bytes_(buffer_bytes),
      window_alloc_(std::move(window_alloc)),
      buffer_alloc_(std::move(buffer_alloc)),
      backoff_(options.flush_retry_initial) {
  stats_.staging_capacity_bytes = window_bytes;
  stats_.staging_pages = PageBackingName(window_memory_->page_backing());
  stats_.write_buffer_capacity_bytes = buffer_bytes;
  stats_.open_verified_objects = open_check.verified_objects;
  stats_.open_verified_bytes = open_check.verified_bytes;
  stats_.open_unchecked_objects = open_check.unchecked_objects;
  stats_.open_dropped_objects = open_check.dropped_objects;
  stats_.checksum_failures = open_check.checksum_failures;
  stats_.open_verify_seconds = absl::ToDoubleSeconds(open_check.elapsed);
  if (options_.verify_reads) {
    MutexLock l(&mu_);
    for (const DurableExtent& e : durable) {
      if (e.checksummed) tier_sums_[e.addr] = TierSum{e.length, e.crc32c, false};
    }
  }
}

HybridDevice::~HybridDevice() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    stop_deadline_ = absl::Now() + options_.shutdown_flush_timeout;
    cv_.SignalAll();
  }
  flusher_.Join();
  std::vector<uint8_t*> bounces;
  {
    MutexLock l(&mu_);
    if (!flush_queue_.empty() || !record_pending_.empty()) {
      LOG(WARNING) << "hybrid device: " << flush_queue_.size()
                   << " committed objects were not flushed and "
                   << record_pending_.size()
                   << " flushed objects not recorded before shutdown (both "
                      "are absent after a restart)";
    }
    // Queued prefetches never started: nothing to wait for.
    for (Staged* s : window_fifo_) s->state = Staged::State::kFailed;
    window_fifo_.clear();
    // Every I/O issued or queued completes; its buffers must outlive it.
    while (reads_in_flight_ > 0 || writes_in_flight_ > 0 || !read_q_.empty() ||
           !write_q_.empty()) {
      cv_.Wait(&mu_);
    }
    if (!reads_out_.empty() || !handles_.empty() || stats_.device.outstanding_writes > 0) {
      LOG(ERROR) << "hybrid device destroyed with " << reads_out_.size()
                 << " reads, " << handles_.size() << " prefetch handles and "
                 << stats_.device.outstanding_writes << " writes outstanding";
    }
    for (auto& [cookie, rec] : reads_out_) {
      if (rec.kind == ReadKind::kBounce) {
        bounces.push_back(rec.miss->buf);
        delete rec.miss;
      }
    }
    reads_out_.clear();
  }
  // In-flight counts drop inside OnIoDone, which then still unlocks mu_.
  while (callbacks_running_.load() > 0) std::this_thread::yield();
  for (uint8_t* b : bounces) free(b);
  // window_memory_ and buffer_memory_ are unmapped after this body: no I/O
  // into them is left.
}

std::vector<RegionDescriptor> HybridDevice::Regions() const {
  RegionDescriptor r;
  r.region_id = 0;
  r.capacity_bytes = capacity_;
  r.alignment = kPage;
  // Where the DRAM in front of the tier actually is.
  r.numa_node = window_memory_->numa_node();
  r.device_kind = "hybrid";
  r.persistent = true;
  return {r};
}

std::vector<MemoryArea> HybridDevice::Areas() const {
  MemoryArea staging;
  staging.area_id = kStagingAreaId;
  staging.base = window_;
  staging.length = window_bytes_;
  staging.fd = window_memory_->fd();
  staging.kind = "staging";
  MemoryArea buffer;
  buffer.area_id = kWriteBufferAreaId;
  buffer.base = buffer_;
  buffer.length = buffer_bytes_;
  buffer.fd = buffer_memory_->fd();
  buffer.kind = "write_buffer";
  return {staging, buffer};
}

std::vector<RecoveredExtent> HybridDevice::RecoveredExtents() const {
  return recovered_;
}

absl::Status HybridDevice::Check(uint32_t region, uint64_t addr,
                                 uint64_t len) const {
  if (region != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown region ", region, " (the hybrid device has region 0)"));
  }
  return CheckRange(capacity_, addr, len);
}

// ---------------------------------------------------------------- I/O engine

bool HybridDevice::ForegroundBusyLocked() const {
  return reads_in_flight_ > 0 || !read_q_.empty();
}

void HybridDevice::QueueChunksLocked(IoReq proto, uint64_t span,
                                     std::deque<IoReq>* q) {
  for (uint64_t off = 0; off < span; off += options_.io_chunk_bytes) {
    IoReq r = proto;
    r.file_off = proto.file_off + off;
    r.buf = proto.buf + off;
    r.len = static_cast<size_t>(std::min(options_.io_chunk_bytes, span - off));
    q->push_back(r);
  }
}

void HybridDevice::RefillIoStartLocked() {
  if (refill_ios_++ == 0) refill_busy_since_ = absl::Now();
}

void HybridDevice::RefillIoEndLocked() {
  if (--refill_ios_ == 0) refill_busy_ += absl::Now() - refill_busy_since_;
}

int HybridDevice::FlushDepthLocked() const {
  // Runs on every I/O completion: only what WriteSlots reads (the fill and
  // the read pressure), not FlushStateLocked's walk of the queue.
  FlushPolicyState st;
  st.buffer_bytes = buffer_bytes_;
  st.buffer_used = buffer_alloc_->used_bytes();
  st.reads_busy = ForegroundBusyLocked();
  return flush_policy_.WriteSlots(st);
}

void HybridDevice::NoteDepthLocked() {
  const absl::Time now = absl::Now();
  if (reads_in_flight_ > 0) {
    const double dt = absl::ToDoubleSeconds(now - depth_since_);
    read_depth_integral_ += dt * reads_in_flight_;
    read_busy_seconds_ += dt;
  }
  depth_since_ = now;
}

FlushPolicyState HybridDevice::FlushStateLocked(absl::Time now) const {
  FlushPolicyState st;
  st.buffer_bytes = buffer_bytes_;
  st.buffer_used = buffer_alloc_->used_bytes();
  st.reads_busy = ForegroundBusyLocked();
  st.forced = stopping_ || force_flush_ > 0;
  // Enough of the queue to know whether a batch's worth is unflushed, and
  // the age of the oldest commit not being written yet.
  bool have_oldest = false;
  for (const auto& [seq, e] : flush_queue_) {
    if (!e->in_flight && !have_oldest) {
      st.oldest_waiting_age = now - e->commit_time;
      have_oldest = true;
    }
    st.unflushed_bytes += e->buf_len;
    if (st.unflushed_bytes >= options_.flush_batch_bytes) break;
  }
  st.any_waiting = have_oldest || st.unflushed_bytes >= options_.flush_batch_bytes;
  return st;
}

void HybridDevice::TakeIssuableLocked(std::vector<IoReq>* out) {
  NoteDepthLocked();
  IoQueueState q;
  q.reads_queued = static_cast<int>(std::min<size_t>(read_q_.size(), 1 << 30));
  q.writes_queued =
      static_cast<int>(std::min<size_t>(write_q_.size(), 1 << 30));
  q.reads_in_flight = reads_in_flight_;
  q.writes_in_flight = writes_in_flight_;
  q.write_slots = FlushDepthLocked();
  const IoIssue n = io_policy_.Next(q);
  for (int i = 0; i < n.reads; ++i) {
    IoReq r = read_q_.front();
    read_q_.pop_front();
    if (r.kind == IoReq::Kind::kRefill) {
      Staged* s = static_cast<Staged*>(r.owner);
      --s->chunks_pending;
      ++s->chunks_in_flight;
      RefillIoStartLocked();
    }
    ++reads_in_flight_;
    out->push_back(r);
  }
  for (int i = 0; i < n.writes; ++i) {
    out->push_back(write_q_.front());
    write_q_.pop_front();
    ++writes_in_flight_;
  }
}

void HybridDevice::FreeSpaceLocked(RangeAllocator* alloc, uint64_t off) {
  const absl::Status st = alloc->Free(off);
  if (!st.ok()) {
    // A broken invariant (a slot freed twice): the space stays lost, the
    // device goes on.
    LOG(ERROR) << "hybrid device: freeing "
               << (alloc == window_alloc_.get() ? "window" : "buffer")
               << " space at " << off << ": " << st;
  }
}

void HybridDevice::Issue(std::vector<IoReq>* reqs) {
  for (const IoReq& r : *reqs) {
    auto done = [this, r](absl::Status s) { OnIoDone(r, std::move(s)); };
    if (r.write()) {
      io_->Write(r.file_off, r.buf, r.len, std::move(done));
    } else {
      io_->Read(r.file_off, r.buf, r.len, std::move(done));
    }
  }
  reqs->clear();
}

void HybridDevice::OnIoDone(const IoReq& req, absl::Status status) {
  callbacks_running_.fetch_add(1);
  std::vector<IoReq> next;
  uint8_t* free_buf = nullptr;
  {
    MutexLock l(&mu_);
    NoteDepthLocked();
    if (req.write()) {
      --writes_in_flight_;
    } else {
      --reads_in_flight_;
    }
    switch (req.kind) {
      case IoReq::Kind::kRefill: {
        Staged* s = static_cast<Staged*>(req.owner);
        --s->chunks_in_flight;
        RefillIoEndLocked();
        stats_.refill_bytes += req.len;
        if (!status.ok()) {
          ++stats_.read_io_errors;
          if (s->error.ok()) s->error = status;
          // Chunks not issued yet are pointless now.
          if (s->chunks_pending > 0) {
            read_q_.erase(std::remove_if(read_q_.begin(), read_q_.end(),
                                         [s](const IoReq& r) {
                                           return r.owner == s;
                                         }),
                          read_q_.end());
            s->chunks_pending = 0;
          }
        }
        if (s->chunks_in_flight == 0 && s->chunks_pending == 0 &&
            s->state == Staged::State::kLoading) {
          if (s->error.ok()) {
            // A consumer checks it (CheckStagedLocked), not this thread.
            s->state = s->check ? Staged::State::kLoaded : Staged::State::kReady;
          } else {
            s->state = Staged::State::kFailed;
            ++stats_.prefetch_errors;
            LOG(WARNING) << "hybrid device: staging [" << s->addr << ", +"
                         << s->len << ") failed: " << s->error;
            UnkeyStagedLocked(s);
          }
          if (s->waiters > 0) s->cv.SignalAll();
        }
        MaybeFreeStagedLocked(s);
        break;
      }
      case IoReq::Kind::kMiss: {
        MissRead* m = static_cast<MissRead*>(req.owner);
        if (!status.ok() && m->status.ok()) {
          ++stats_.read_io_errors;
          m->status = status;
        }
        if (--m->outstanding == 0) {
          if (m->abandoned) {
            free_buf = m->buf;
            bounce_bytes_ -= m->span_len;
            delete m;
          } else {
            m->cv.SignalAll();
          }
        }
        break;
      }
      case IoReq::Kind::kFlush: {
        FlushBatch* b = static_cast<FlushBatch*>(req.owner);
        if (!status.ok() && b->status.ok()) b->status = status;
        if (--b->outstanding == 0) RetireBatchLocked(b);  // deletes b
        break;
      }
    }
    TakeIssuableLocked(&next);
    // The flusher (and destruction) care about a retired batch (signalled
    // there), reads going idle (a flush may be due now) and, when stopping,
    // every completion. Readers wait on their own object's CondVar.
    if (stopping_ || (!req.write() && !ForegroundBusyLocked() &&
                      !flush_queue_.empty())) {
      cv_.SignalAll();
    }
  }
  free(free_buf);
  Issue(&next);
  callbacks_running_.fetch_sub(1);  // the last touch of `this`
}

// ---------------------------------------------------------------- window

void HybridDevice::UnkeyStagedLocked(Staged* s) {
  if (!s->keyed) return;
  auto it = staged_by_key_.find({s->addr, s->len});
  if (it != staged_by_key_.end() && it->second == s) staged_by_key_.erase(it);
  s->keyed = false;
}

void HybridDevice::MaybeFreeStagedLocked(Staged* s) {
  if (s->owners() == 0 && s->chunks_pending > 0) {
    read_q_.erase(std::remove_if(read_q_.begin(), read_q_.end(),
                                 [s](const IoReq& r) { return r.owner == s; }),
                  read_q_.end());
    s->chunks_pending = 0;
  }
  // The slot is never handed on while a read still writes into it.
  if (s->chunks_in_flight > 0) return;
  bool freed_space = false;
  if (s->has_slot && (s->owners() == 0 || s->state == Staged::State::kFailed)) {
    FreeSpaceLocked(window_alloc_.get(), s->slot_off);
    s->has_slot = false;
    freed_space = true;
  }
  if (s->owners() == 0) {
    UnkeyStagedLocked(s);
    if (s->state == Staged::State::kQueued) {
      auto it = std::find(window_fifo_.begin(), window_fifo_.end(), s);
      if (it != window_fifo_.end()) {
        // The head may be what blocked the rest.
        freed_space = freed_space || it == window_fifo_.begin();
        window_fifo_.erase(it);
      }
    }
    staged_.erase(s);  // deletes s
  }
  if (freed_space) PumpWindowLocked();
}

void HybridDevice::PumpWindowLocked() {
  if (stopping_) return;
  while (!window_fifo_.empty()) {
    Staged* s = window_fifo_.front();
    std::optional<uint64_t> off = window_alloc_->TryAllocate(s->span_len);
    if (!off) break;  // strict FIFO: later ones wait behind the head
    window_fifo_.pop_front();
    s->has_slot = true;
    s->slot_off = *off;
    s->state = Staged::State::kLoading;
    IoReq proto;
    proto.kind = IoReq::Kind::kRefill;
    proto.owner = s;
    proto.file_off = CapacityTier::kHeaderBytes + s->span_start;
    proto.buf = window_ + s->slot_off;
    const size_t before = read_q_.size();
    QueueChunksLocked(proto, s->span_len, &read_q_);
    s->chunks_pending = static_cast<int>(read_q_.size() - before);
  }
}

void HybridDevice::InvalidateStagedLocked(uint64_t addr, uint64_t len) {
  if (staged_by_key_.empty()) return;
  const uint64_t from = addr > max_staged_span_ ? addr - max_staged_span_ : 0;
  const uint64_t end = addr + len;
  for (auto it = staged_by_key_.lower_bound({from, 0});
       it != staged_by_key_.end() && it->first.first < end;) {
    Staged* s = it->second;
    ++it;
    if (s->span_start < end && addr < s->span_start + s->span_len) {
      // Handles and reads holding it keep their (old) bytes.
      UnkeyStagedLocked(s);
    }
  }
}

// ---------------------------------------------------------------- checksums

HybridDevice::TierSum* HybridDevice::FindSumLocked(uint64_t addr, uint64_t len) {
  if (!options_.verify_reads) return nullptr;
  auto it = tier_sums_.find(addr);
  if (it == tier_sums_.end() || it->second.len != len) return nullptr;
  return &it->second;
}

void HybridDevice::EraseSumsLocked(uint64_t addr, uint64_t len) {
  const uint64_t end = addr + len;
  auto it = tier_sums_.lower_bound(addr);
  if (it != tier_sums_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.len > addr) it = prev;
  }
  while (it != tier_sums_.end() && it->first < end) it = tier_sums_.erase(it);
  auto overlaps = [addr, end](const CorruptForget& f) {
    return f.range.addr < end && addr < f.range.addr + f.range.length;
  };
  forget_corrupt_.erase(
      std::remove_if(forget_corrupt_.begin(), forget_corrupt_.end(), overlaps),
      forget_corrupt_.end());
  for (CorruptForget& f : forgetting_corrupt_) {
    if (overlaps(f)) f.dropped = true;
  }
}

void HybridDevice::MarkCorruptLocked(uint64_t addr, uint64_t len, uint32_t crc) {
  TierSum* sum = FindSumLocked(addr, len);
  // Replaced by a write since the read began: that object is not this one.
  if (sum == nullptr || sum->crc != crc || sum->corrupt) return;
  sum->corrupt = true;
  // Never recorded from now on; one in the running Record is forgotten
  // below, after that Record returns (the flusher makes every tier call).
  DropPendingRecordsLocked(addr, len);
  forget_corrupt_.push_back(
      CorruptForget{TierRange{addr, len, false, 0}, false, false});
  cv_.SignalAll();  // the flusher
}

void HybridDevice::CheckStagedLocked(Staged* s) {
  s->state = Staged::State::kChecking;
  ++s->waiters;  // keeps `s` and its window slot while mu_ is released
  const uint8_t* data = window_ + s->slot_off + (s->addr - s->span_start);
  const uint64_t len = s->len;
  mu_.Unlock();
  const uint32_t got = crc32c::Value(data, len);
  mu_.Lock();
  --s->waiters;
  ++stats_.verified_reads;
  if (got == s->crc) {
    s->state = Staged::State::kReady;
  } else {
    s->state = Staged::State::kFailed;
    s->corrupt = true;
    s->error = absl::DataLossError(absl::StrCat(
        "hybrid device: the object at ", s->addr, " (", s->len,
        " bytes) does not match its checksum on the capacity tier"));
    ++stats_.read_checksum_failures;
    ++stats_.checksum_failures;
    LOG(WARNING) << "hybrid device: the object at " << s->addr << " ("
                 << s->len << " bytes) staged from the capacity tier does not "
                 << "match its checksum (recorded " << std::hex << s->crc
                 << ", read " << got << std::dec
                 << "); refused until it is overwritten";
    UnkeyStagedLocked(s);
    MarkCorruptLocked(s->addr, s->len, s->crc);
  }
  s->cv.SignalAll();
  MaybeFreeStagedLocked(s);  // may delete s
}

absl::StatusOr<PrefetchHandle> HybridDevice::PrefetchObject(uint32_t region,
                                                            uint64_t addr,
                                                            uint64_t len) {
  absl::Status st = Check(region, addr, len);
  if (!st.ok()) return st;
  const uint64_t span_start = RoundDown(addr);
  const uint64_t span_len = RoundUp(addr + len) - span_start;
  if (span_len > window_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "hybrid device: object of ", len, " bytes is larger than the ",
        window_bytes_, "-byte staging window"));
  }
  PrefetchHandle h;
  h.region_id = region;
  h.addr = addr;
  h.length = len;
  std::vector<IoReq> next;
  {
    MutexLock l(&mu_);
    h.id = next_id_++;
    ++stats_.device.prefetches;
    HandleRec rec;
    rec.addr = addr;
    rec.len = len;
    if (Entry* e = FindBufferedLocked(addr, len)) {
      ++e->pins;
      rec.entry = e;
      ++stats_.prefetch_from_buffer;
    } else if (auto it = staged_by_key_.find({addr, len});
               it != staged_by_key_.end()) {
      ++it->second->refs;
      rec.staged = it->second;
      ++stats_.prefetch_shared;
    } else {
      const TierSum* sum = FindSumLocked(addr, len);
      if (sum != nullptr && sum->corrupt) {
        ++stats_.corrupt_refusals;
        return absl::DataLossError(absl::StrCat(
            "hybrid device: the object at ", addr, " (", len,
            " bytes) failed its checksum on the capacity tier"));
      }
      auto owned = std::make_unique<Staged>();
      Staged* s = owned.get();
      s->addr = addr;
      s->len = len;
      s->span_start = span_start;
      s->span_len = span_len;
      s->refs = 1;
      s->keyed = true;
      if (sum != nullptr) {
        s->check = true;
        s->crc = sum->crc;
      }
      staged_[s] = std::move(owned);
      staged_by_key_[{addr, len}] = s;
      max_staged_span_ = std::max(max_staged_span_, span_len);
      window_fifo_.push_back(s);
      rec.staged = s;
      PumpWindowLocked();
      TakeIssuableLocked(&next);
    }
    handles_[h.id] = rec;
  }
  Issue(&next);
  return h;
}

absl::StatusOr<const uint8_t*> HybridDevice::PrefetchWait(
    const PrefetchHandle& handle, absl::Time deadline) {
  MutexLock l(&mu_);
  while (true) {
    auto it = handles_.find(handle.id);
    if (it == handles_.end() || it->second.addr != handle.addr ||
        it->second.len != handle.length || handle.region_id != 0) {
      return absl::InvalidArgumentError("hybrid device: unknown prefetch handle");
    }
    const HandleRec& rec = it->second;
    if (rec.entry != nullptr) {
      return static_cast<const uint8_t*>(buffer_ + rec.entry->buf_off +
                                         (handle.addr - rec.entry->addr));
    }
    Staged* s = rec.staged;
    if (s->state == Staged::State::kLoaded) {
      // The handle keeps `s` alive while it is checked; looked up again
      // afterwards, as the handle may be released meanwhile.
      CheckStagedLocked(s);
      continue;
    }
    if (s->state == Staged::State::kReady) {
      return static_cast<const uint8_t*>(window_ + s->slot_off +
                                         (s->addr - s->span_start));
    }
    if (s->state == Staged::State::kFailed) {
      if (s->corrupt) return s->error;
      return absl::UnavailableError(absl::StrCat(
          "hybrid device: staging failed: ", s->error.message()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          s->state == Staged::State::kQueued
              ? "hybrid device: prefetch still waiting for window space"
          : s->state == Staged::State::kChecking
              ? "hybrid device: prefetch still checking its checksum"
              : "hybrid device: prefetch still reading");
    }
    // `waiters` keeps `s` alive while this thread waits on its CondVar,
    // even if the handle is released meanwhile (looked up again below).
    ++s->waiters;
    ++stats_.prefetch_waiters;
    s->cv.WaitWithDeadline(&mu_, deadline);
    --stats_.prefetch_waiters;
    --s->waiters;
    MaybeFreeStagedLocked(s);
  }
}

void HybridDevice::PrefetchRelease(const PrefetchHandle& handle) {
  std::vector<IoReq> next;
  {
    MutexLock l(&mu_);
    auto it = handles_.find(handle.id);
    if (it == handles_.end() || it->second.addr != handle.addr ||
        it->second.len != handle.length) {
      ++stats_.unknown_releases;
      VLOG(1) << "hybrid device: release of unknown prefetch " << handle.id;
      return;
    }
    HandleRec rec = it->second;
    handles_.erase(it);
    if (rec.entry != nullptr) {
      --rec.entry->pins;
      MaybeFreeEntryLocked(rec.entry);
    } else {
      Staged* s = rec.staged;
      --s->refs;
      if (s->owners() == 0 && (s->state == Staged::State::kQueued ||
                               s->state == Staged::State::kLoading)) {
        ++stats_.prefetch_cancelled;
      }
      MaybeFreeStagedLocked(s);
    }
    TakeIssuableLocked(&next);
    // A cancelled refill may leave the reads idle: a flush may be due.
    if (!ForegroundBusyLocked() && !flush_queue_.empty()) cv_.SignalAll();
  }
  Issue(&next);
}

// ---------------------------------------------------------------- reads

HybridDevice::Entry* HybridDevice::FindBufferedLocked(uint64_t addr,
                                                      uint64_t len) {
  auto it = live_.upper_bound(addr);
  if (it == live_.begin()) return nullptr;
  Entry* e = std::prev(it)->second;
  if (e->addr <= addr && addr + len <= e->addr + e->len) return e;
  return nullptr;
}

absl::StatusOr<ReadView> HybridDevice::AcquireRead(uint32_t region,
                                                   uint64_t addr,
                                                   uint64_t len) {
  absl::Status st = Check(region, addr, len);
  if (!st.ok()) return st;
  ReadView v;
  v.region_id = region;
  v.addr = addr;
  v.length = len;
  const uint64_t span_start = RoundDown(addr);
  const uint64_t span_len = RoundUp(addr + len) - span_start;

  MutexLock l(&mu_);
  auto admit = [&](const uint8_t* data, ReadRec rec) {
    v.data = data;
    v.cookie = next_id_++;
    reads_out_[v.cookie] = rec;
    ++stats_.device.reads;
    stats_.device.read_bytes += len;
    ++stats_.device.outstanding_reads;
  };
  if (Entry* e = FindBufferedLocked(addr, len)) {
    ++e->pins;
    ++stats_.buffer_hits;
    ReadRec rec{ReadKind::kBuffer};
    rec.entry = e;
    admit(buffer_ + e->buf_off + (addr - e->addr), rec);
    return v;
  }
  if (auto it = staged_by_key_.find({addr, len}); it != staged_by_key_.end() &&
      it->second->state != Staged::State::kQueued) {
    Staged* s = it->second;
    ++s->pins;  // keeps `s` alive, also while it is checked
    const absl::Time deadline = absl::Now() + options_.read_timeout;
    while (true) {
      if (s->state == Staged::State::kLoaded) {
        CheckStagedLocked(s);
        continue;
      }
      if (s->state != Staged::State::kLoading &&
          s->state != Staged::State::kChecking) {
        break;
      }
      // Counted as a waiter: the completion signals s->cv only when one
      // waits (a pin alone went unwoken until read_timeout).
      ++s->waiters;
      ++stats_.read_waiters;
      const bool timed_out = s->cv.WaitWithDeadline(&mu_, deadline);
      --stats_.read_waiters;
      --s->waiters;
      if (timed_out) break;
    }
    if (s->state == Staged::State::kReady) {
      ++stats_.staging_hits;
      ReadRec rec{ReadKind::kWindow};
      rec.staged = s;
      admit(window_ + s->slot_off + (addr - s->span_start), rec);
      return v;
    }
    const bool corrupt = s->state == Staged::State::kFailed && s->corrupt;
    absl::Status error = s->error;
    --s->pins;
    MaybeFreeStagedLocked(s);
    if (corrupt) return error;
    // Failed or too slow: read it directly below.
  }

  // Staging miss. Known to be corrupt: refused without I/O.
  const TierSum* sum = FindSumLocked(addr, len);
  if (sum != nullptr && sum->corrupt) {
    ++stats_.corrupt_refusals;
    return absl::DataLossError(absl::StrCat(
        "hybrid device: the object at ", addr, " (", len,
        " bytes) failed its checksum on the capacity tier"));
  }

  // Staging miss: read into a bounce buffer.
  if (bounce_bytes_ > 0 && bounce_bytes_ + span_len > options_.max_bounce_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "hybrid device: too many staging-miss bounce buffers (",
        bounce_bytes_, " bytes outstanding)"));
  }
  uint8_t* buf = static_cast<uint8_t*>(aligned_alloc(kPage, span_len));
  if (buf == nullptr) {
    return absl::ResourceExhaustedError(
        "hybrid device: cannot allocate a bounce buffer");
  }
  bounce_bytes_ += span_len;
  ++stats_.staging_misses;
  MissRead* m = new MissRead;
  m->buf = buf;
  m->span_start = span_start;
  m->span_len = span_len;
  if (sum != nullptr) {
    m->check = true;
    m->crc = sum->crc;
  }
  IoReq proto;
  proto.kind = IoReq::Kind::kMiss;
  proto.owner = m;
  proto.file_off = CapacityTier::kHeaderBytes + span_start;
  proto.buf = buf;
  const size_t before = read_q_.size();
  QueueChunksLocked(proto, span_len, &read_q_);
  m->outstanding = static_cast<int>(read_q_.size() - before);
  std::vector<IoReq> next;
  TakeIssuableLocked(&next);
  mu_.Unlock();
  Issue(&next);
  mu_.Lock();
  const absl::Time deadline = absl::Now() + options_.read_timeout;
  while (m->outstanding > 0) {
    if (m->cv.WaitWithDeadline(&mu_, deadline) && m->outstanding > 0) {
      m->abandoned = true;  // the last completion frees it
      return absl::UnavailableError(absl::StrCat(
          "hybrid device: tier read of [", addr, ", +", len,
          ") timed out after ", absl::FormatDuration(options_.read_timeout)));
    }
  }
  bool corrupt = false;
  if (m->status.ok() && m->check) {
    // Only this thread holds `m` now (no chunk is outstanding).
    mu_.Unlock();
    const uint32_t got = crc32c::Value(buf + (addr - span_start), len);
    mu_.Lock();
    ++stats_.verified_reads;
    if (got != m->crc) {
      corrupt = true;
      ++stats_.read_checksum_failures;
      ++stats_.checksum_failures;
      LOG(WARNING) << "hybrid device: the object at " << addr << " (" << len
                   << " bytes) read from the capacity tier does not match its "
                      "checksum (recorded "
                   << std::hex << m->crc << ", read " << got << std::dec
                   << "); refused until it is overwritten";
      MarkCorruptLocked(addr, len, m->crc);
    }
  }
  if (corrupt || !m->status.ok()) {
    absl::Status s =
        corrupt ? absl::DataLossError(absl::StrCat(
                      "hybrid device: the object at ", addr, " (", len,
                      " bytes) does not match its checksum on the capacity "
                      "tier"))
                : absl::UnavailableError(absl::StrCat(
                      "hybrid device: tier read of [", addr, ", +", len,
                      ") failed: ", m->status.ToString()));
    bounce_bytes_ -= span_len;
    delete m;
    free(buf);
    return s;
  }
  ReadRec rec{ReadKind::kBounce};
  rec.miss = m;
  admit(buf + (addr - span_start), rec);
  return v;
}

void HybridDevice::ReleaseRead(const ReadView& view) {
  std::vector<IoReq> next;
  uint8_t* free_buf = nullptr;
  {
    MutexLock l(&mu_);
    auto it = reads_out_.find(view.cookie);
    if (it == reads_out_.end()) {
      ++stats_.unknown_releases;
      return;
    }
    ReadRec rec = it->second;
    reads_out_.erase(it);
    --stats_.device.outstanding_reads;
    switch (rec.kind) {
      case ReadKind::kBuffer:
        --rec.entry->pins;
        MaybeFreeEntryLocked(rec.entry);
        break;
      case ReadKind::kWindow:
        --rec.staged->pins;
        MaybeFreeStagedLocked(rec.staged);
        break;
      case ReadKind::kBounce:
        free_buf = rec.miss->buf;
        bounce_bytes_ -= rec.miss->span_len;
        delete rec.miss;
        break;
    }
    TakeIssuableLocked(&next);
  }
  free(free_buf);
  Issue(&next);
}

// ---------------------------------------------------------------- writes

void HybridDevice::MaybeFreeEntryLocked(Entry* e) {
  if (e->writing || e->live || e->queued || e->in_flight || e->pins > 0) {
    return;
  }
  FreeSpaceLocked(buffer_alloc_.get(), e->buf_off);
  entries_.erase(e->id);  // deletes e
}

void HybridDevice::Discard(uint32_t region, uint64_t addr, uint64_t len,
                           uint64_t tag) {
  if (!Check(region, addr, len).ok() || addr % kPage != 0) return;
  MutexLock l(&mu_);
  const uint64_t span = RoundUp(len);
  const uint64_t end = addr + span;
  // A write committed over the range since is newer: it replaces the object
  // (and its record) itself. One still being written needs no check: its
  // commit cancels the queued forget, and if it aborts the old object is
  // still the one to forget.
  auto it = live_.lower_bound(addr);
  if (it != live_.begin() && std::prev(it)->second->addr +
                                     std::prev(it)->second->buf_len > addr) {
    it = std::prev(it);
  }
  for (; it != live_.end() && it->first < end; ++it) {
    const Entry* e = it->second;
    if (e->addr != addr || e->len != len || e->tag != tag) return;
  }
  auto rit = record_pending_.lower_bound(addr);
  if (rit != record_pending_.begin() &&
      std::prev(rit)->first + std::prev(rit)->second.extent.length > addr) {
    rit = std::prev(rit);
  }
  for (; rit != record_pending_.end() && rit->first < end; ++rit) {
    const DurableExtent& x = rit->second.extent;
    if (x.addr != addr || x.length != len || x.tag != tag) return;
  }
  SupersedeLocked(addr, span);
  InvalidateStagedLocked(addr, span);
  // The checksum (verify_reads) stays: exact forgets leave a newer object
  // recorded there, and only a committed write replaces it.
  forget_corrupt_.push_back(
      CorruptForget{TierRange{addr, len, /*exact=*/true, tag}, true, false});
  ++stats_.discarded_objects;
  cv_.SignalAll();
}

void HybridDevice::SupersedeLocked(uint64_t addr, uint64_t len) {
  const uint64_t end = addr + len;
  auto it = live_.lower_bound(addr);
  if (it != live_.begin()) {
    auto prev = std::prev(it);
    if (prev->second->addr + prev->second->buf_len > addr) it = prev;
  }
  while (it != live_.end() && it->first < end) {
    Entry* e = it->second;
    it = live_.erase(it);
    e->live = false;
    e->superseded = true;
    if (e->queued) ++stats_.superseded_writes;
    if (e->queued && !e->in_flight) {
      flush_queue_.erase(e->seq);
      e->queued = false;
    }
    MaybeFreeEntryLocked(e);
  }
  DropPendingRecordsLocked(addr, len);
}

void HybridDevice::DropPendingRecordsLocked(uint64_t addr, uint64_t len) {
  // The new object's flush forgets the range before writing it, but a
  // pending record of an old object there would be recorded after that
  // Forget, claiming bytes the new object overwrites. It is not durable
  // yet, so dropping it is all it takes (the old object is merely absent
  // after a crash, as the new one is until it is recorded).
  stats_.records_dropped += ErasePendingRecordsLocked(addr, len);
  // One in the running Record becomes durable anyway; the new object's
  // Forget, which comes after that Record returns, removes it again. Only
  // if that Record fails must it not come back.
  const uint64_t end = addr + len;
  for (PendingRecord& r : recording_) {
    if (r.extent.addr < end && addr < r.extent.addr + r.extent.length) {
      r.dropped = true;
    }
  }
}

int HybridDevice::ErasePendingRecordsLocked(uint64_t addr, uint64_t len) {
  const uint64_t end = addr + len;
  int n = 0;
  auto it = record_pending_.lower_bound(addr);
  if (it != record_pending_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.extent.length > addr) it = prev;
  }
  while (it != record_pending_.end() && it->first < end) {
    it = record_pending_.erase(it);
    ++n;
  }
  return n;
}

void HybridDevice::AddPendingRecordLocked(PendingRecord r) {
  // Pending records never overlap (see DropPendingRecordsLocked); stay safe
  // if that ever breaks: the newer object wins.
  if (ErasePendingRecordsLocked(r.extent.addr, r.extent.length) > 0) {
    LOG(DFATAL) << "hybrid device: overlapping pending records at "
                << r.extent.addr;
  }
  r.dropped = false;
  record_pending_[r.extent.addr] = r;
}

absl::StatusOr<WriteView> HybridDevice::BeginWrite(uint32_t region,
                                                   uint64_t addr, uint64_t len,
                                                   uint64_t tag) {
  absl::Status st = Check(region, addr, len);
  if (!st.ok()) return st;
  if (addr % kPage != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hybrid device: write address ", addr, " is not 4 KiB aligned"));
  }
  const uint64_t buf_len = RoundUp(len);
  MutexLock l(&mu_);
  std::optional<uint64_t> off;
  if (buf_len <= buffer_bytes_ && !stopping_) off = buffer_alloc_->TryAllocate(buf_len);
  if (!off) {
    ++stats_.write_buffer_refusals;
    ++stats_.device.refused_writes;
    // While flushes fail (e.g. a full filesystem), say why the buffer does
    // not drain.
    const bool failing = !last_flush_error_.ok();
    return absl::ResourceExhaustedError(absl::StrCat(
        "write buffer full (", buffer_alloc_->used_bytes(), " of ", buffer_bytes_,
        " bytes in use; object of ", len, " bytes)",
        failing ? absl::StrCat("; flushes to the capacity tier are failing: ",
                               last_flush_error_.message())
                : std::string()));
  }
  // The caller has drained readers of the old objects in this range.
  SupersedeLocked(addr, buf_len);
  InvalidateStagedLocked(addr, buf_len);
  auto owned = std::make_unique<Entry>();
  Entry* e = owned.get();
  e->id = next_id_++;
  e->addr = addr;
  e->len = len;
  e->tag = tag;
  e->buf_off = *off;
  e->buf_len = buf_len;
  entries_[e->id] = std::move(owned);
  // The padding is flushed with the object: make it deterministic.
  if (buf_len > len) std::memset(buffer_ + *off + len, 0, buf_len - len);
  ++stats_.write_buffer_admits;
  ++stats_.device.outstanding_writes;
  WriteView v;
  v.region_id = region;
  v.addr = addr;
  v.length = len;
  v.data = buffer_ + *off;
  v.cookie = e->id;
  return v;
}

absl::Status HybridDevice::CommitWrite(const WriteView& view) {
  MutexLock l(&mu_);
  auto it = entries_.find(view.cookie);
  if (it == entries_.end() || !it->second->writing ||
      it->second->committing || it->second->addr != view.addr ||
      it->second->len != view.length) {
    ++stats_.unknown_releases;
    return absl::InvalidArgumentError("hybrid device: unknown write view");
  }
  Entry* e = it->second.get();
  // The object's CRC32C, while its bytes are likely still in this core's
  // cache, on the writer's thread (not the one flusher), outside mu_. The
  // entry cannot be freed while `writing`; `committing` turns away a
  // concurrent Commit or Abort of the same view.
  e->committing = true;
  const uint8_t* data = buffer_ + e->buf_off;
  const uint64_t len = e->len;
  mu_.Unlock();
  const absl::Time crc_start = absl::Now();
  const uint32_t crc = crc32c::Value(data, len);
  const absl::Duration crc_took = absl::Now() - crc_start;
  mu_.Lock();
  e->committing = false;
  e->crc = crc;
  e->has_crc = true;
  stats_.commit_checksum_seconds += absl::ToDoubleSeconds(crc_took);
  e->writing = false;
  --stats_.device.outstanding_writes;
  ++stats_.device.writes;
  stats_.device.write_bytes += e->len;
  // A prefetch may have staged the old bytes since BeginWrite.
  SupersedeLocked(e->addr, e->buf_len);
  InvalidateStagedLocked(e->addr, e->buf_len);
  // The old objects' bytes on the tier are being replaced (not at
  // BeginWrite: an aborted write leaves them, corrupt ones still refused).
  EraseSumsLocked(e->addr, e->buf_len);
  e->live = true;
  live_[e->addr] = e;
  e->queued = true;
  e->seq = next_seq_++;
  e->commit_time = clock_->Now();
  flush_queue_[e->seq] = e;
  cv_.SignalAll();
  return absl::OkStatus();
}

void HybridDevice::AbortWrite(const WriteView& view) {
  MutexLock l(&mu_);
  auto it = entries_.find(view.cookie);
  if (it == entries_.end() || !it->second->writing) {
    ++stats_.unknown_releases;
    return;
  }
  Entry* e = it->second.get();
  if (e->committing) {
    ++stats_.unknown_releases;
    return;
  }
  e->writing = false;
  --stats_.device.outstanding_writes;
  ++stats_.device.aborted_writes;
  MaybeFreeEntryLocked(e);
}

// ---------------------------------------------------------------- flusher

bool HybridDevice::FlushDueLocked(absl::Time now, absl::Time* wake) const {
  *wake = absl::InfiniteFuture();
  if (flush_queue_.empty()) return false;
  if (now < retry_after_) {
    *wake = retry_after_;
    return false;
  }
  absl::Duration recheck;
  if (flush_policy_.Due(FlushStateLocked(now), &recheck)) return true;
  if (recheck != absl::InfiniteDuration()) *wake = now + recheck;
  return false;
}

std::vector<HybridDevice::Entry*> HybridDevice::PickBatchLocked() const {
  // The rules are FlushBatchChooser's (flush_batch.h).
  std::vector<FlushExtent> writing;
  for (const auto& fb : pipeline_) {
    for (const Entry* o : fb->entries) {
      writing.push_back(FlushExtent{o->addr, o->buf_len});
    }
  }
  FlushBatchChooser chooser(options_.flush_batch_bytes, std::move(writing));
  std::vector<Entry*> batch;
  for (const auto& [seq, e] : flush_queue_) {
    const FlushBatchChooser::Verdict v = chooser.Offer(
        FlushCandidate{e->addr, e->buf_len, e->in_flight, e->forgotten});
    if (v == FlushBatchChooser::Verdict::kStop) break;
    if (v == FlushBatchChooser::Verdict::kTake) batch.push_back(e);
  }
  return batch;
}

bool HybridDevice::ForgetNeededLocked() const {
  for (const auto& [seq, e] : flush_queue_) {
    if (!e->forgotten) return true;
  }
  return false;
}

absl::Status HybridDevice::ForgetQueuedLocked(bool all) {
  // Queued objects not forgotten yet, merged into contiguous address ranges:
  // a backlog (e.g. a burst of rewrites) then costs one synced tier write
  // per range instead of one per object. While reads are idle a sync costs
  // ~1 ms and every range is forgotten at once; under read load each one
  // waits behind the queued reads (tens of ms), so only the range holding
  // the oldest such object is forgotten, and its objects can be written
  // before the next range's sync. An object forgotten ahead of its flush is
  // merely absent after a crash, which is what an unflushed object is
  // anyway.
  std::vector<Entry*> todo;
  for (const auto& [seq, e] : flush_queue_) {
    if (!e->forgotten) todo.push_back(e);
  }
  if (todo.empty()) return absl::OkStatus();
  const uint64_t oldest_addr = todo.front()->addr;  // flush_queue_ order
  std::sort(todo.begin(), todo.end(),
            [](const Entry* a, const Entry* b) { return a->addr < b->addr; });
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end)
  for (const Entry* e : todo) {
    if (!ranges.empty() && e->addr <= ranges.back().second) {
      ranges.back().second = std::max(ranges.back().second, e->addr + e->buf_len);
    } else {
      ranges.emplace_back(e->addr, e->addr + e->buf_len);
    }
  }
  if (!all) {
    for (const auto& r : ranges) {
      if (r.first <= oldest_addr && oldest_addr < r.second) {
        ranges = {r};
        break;
      }
    }
  }
  absl::Status status;
  mu_.Unlock();
  for (const auto& [begin, end] : ranges) {
    status = tier_->Forget(begin, end - begin);
    if (!status.ok()) break;
  }
  mu_.Lock();
  last_was_forget_ = true;
  if (!status.ok()) return status;
  // `todo` may have been superseded (and freed) meanwhile; objects queued
  // meanwhile inside a forgotten range are covered too (only this thread
  // records extents, and it recorded none since).
  for (auto& [seq, e] : flush_queue_) {
    for (const auto& [begin, end] : ranges) {
      if (begin <= e->addr && e->addr + e->buf_len <= end) {
        e->forgotten = true;
        break;
      }
    }
  }
  return absl::OkStatus();
}

void HybridDevice::FlusherLoop() {
  MutexLock l(&mu_);
  while (true) {
    // A SettleFlusherForTest request made before this pass's clock read.
    const uint64_t settle_seen = settle_requested_;
    const absl::Time now = clock_->Now();
    const bool past_deadline = stopping_ && absl::Now() >= stop_deadline_;
    if (stopping_ && pipeline_.empty() &&
        ((flush_queue_.empty() && record_pending_.empty() &&
          forget_corrupt_.empty()) ||
         past_deadline)) {
      break;
    }
    const bool busy = ForegroundBusyLocked();
    const bool retrying = now < retry_after_;
    absl::Time wake = absl::InfiniteFuture();
    const bool due = !past_deadline && FlushDueLocked(now, &wake);
    // 1. Start a batch of forgotten objects (no tier call).
    if (due && static_cast<int>(pipeline_.size()) < kMaxFlushBatchesInFlight) {
      std::vector<Entry*> batch = PickBatchLocked();
      if (!batch.empty()) {
        StartBatchLocked(std::move(batch));
        continue;
      }
    }
    // 2. A synced tier call: a Forget that lets objects be written (or, while
    // reads are idle and syncs are cheap, one ahead of time), or one Record
    // of every object written since the last one; when both are due they
    // alternate. While the buffer is under pressure (at the high watermark:
    // freeing space is what lets new writes in) Records wait until the
    // oldest pending one is record_max_delay old, so that a Record (tens of
    // ms under read load) does not hold up the next Forget.
    const bool forget_wanted =
        (due || (!busy && !retrying && !past_deadline)) && ForgetNeededLocked();
    bool record_due = !record_pending_.empty() && !retrying;
    if (record_due && PressureLocked() && !stopping_ && force_flush_ == 0) {
      absl::Time oldest = absl::InfiniteFuture();
      for (const auto& [addr, r] : record_pending_) {
        oldest = std::min(oldest, r.since);
      }
      if (now - oldest < options_.record_max_delay) {
        record_due = false;
        wake = std::min(wake, oldest + options_.record_max_delay);
      }
    }
    // Corrupt objects' records go first: they are few, and until forgotten
    // a restart without verify_on_open would adopt them again.
    if (!forget_corrupt_.empty() && !retrying && !past_deadline) {
      ForgetCorruptLocked();
      continue;
    }
    const bool record_first = record_due && last_was_forget_;
    if (forget_wanted && !record_first) {
      absl::Status forget = ForgetQueuedLocked(/*all=*/!busy);
      if (!forget.ok()) {
        ++stats_.flush_errors;
        last_flush_error_ = forget;
        LOG(WARNING) << "hybrid device: forgetting the extents of queued "
                        "objects failed (will retry in "
                     << absl::FormatDuration(backoff_) << "): " << forget;
        BackOffLocked();
      }
      continue;
    }
    if (record_due) {
      RecordPendingLocked();
      continue;
    }
    // 3. Nothing to do until a write completes, a commit arrives, reads go
    // idle, a retry or the shutdown deadline is due.
    if ((!record_pending_.empty() || !forget_corrupt_.empty()) && retrying) {
      wake = std::min(wake, retry_after_);
    }
    // `wake` is on clock_; the shutdown deadline and the wait are real time.
    absl::Time real_wake = absl::InfiniteFuture();
    if (wake != absl::InfiniteFuture()) {
      real_wake = absl::Now() + (wake - clock_->Now());
    }
    if (stopping_) real_wake = std::min(real_wake, stop_deadline_);
    if (settled_ != settle_seen) {
      settled_ = settle_seen;
      cv_.SignalAll();
    }
    cv_.WaitWithDeadline(&mu_, real_wake);
  }
}

bool HybridDevice::PressureLocked() const {
  return static_cast<double>(buffer_alloc_->used_bytes()) >=
         options_.flush_high_watermark * static_cast<double>(buffer_bytes_);
}

void HybridDevice::BackOffLocked() {
  retry_after_ = clock_->Now() + backoff_;
  backoff_ = std::min(backoff_ * 2, options_.flush_retry_max);
}

void HybridDevice::ResetBackoffLocked() {
  backoff_ = options_.flush_retry_initial;
  retry_after_ = absl::InfinitePast();
}

void HybridDevice::StartBatchLocked(std::vector<Entry*> batch) {
  for (Entry* e : batch) e->in_flight = true;
  auto owned = std::make_unique<FlushBatch>();
  FlushBatch* fb = owned.get();
  fb->entries = std::move(batch);
  pipeline_.push_back(std::move(owned));
  IssueBatchLocked(fb);  // fb may be retired (deleted) once this returns
}

void HybridDevice::ForgetCorruptLocked() {
  forgetting_corrupt_ = std::move(forget_corrupt_);
  forget_corrupt_.clear();
  std::vector<TierRange> ranges;
  for (const CorruptForget& f : forgetting_corrupt_) ranges.push_back(f.range);
  mu_.Unlock();
  const absl::Status status = tier_->ForgetRanges(ranges);
  mu_.Lock();
  last_was_forget_ = true;
  if (status.ok()) {
    for (const CorruptForget& f : forgetting_corrupt_) {
      ++(f.discarded ? stats_.discarded_records_forgotten
                     : stats_.corrupt_records_forgotten);
    }
  } else {
    LOG(WARNING) << "hybrid device: forgetting the records of "
                 << ranges.size() << " corrupt objects failed (will retry in "
                 << absl::FormatDuration(backoff_) << "): " << status;
    for (const CorruptForget& f : forgetting_corrupt_) {
      if (!f.dropped) forget_corrupt_.push_back(f);
    }
    BackOffLocked();
  }
  forgetting_corrupt_.clear();
  cv_.SignalAll();
}

void HybridDevice::RecordPendingLocked() {
  recording_.clear();
  for (const auto& [addr, r] : record_pending_) recording_.push_back(r);
  record_pending_.clear();
  std::sort(recording_.begin(), recording_.end(),
            [](const PendingRecord& a, const PendingRecord& b) {
              return a.seq < b.seq;
            });
  std::vector<DurableExtent> extents;
  extents.reserve(recording_.size());
  for (const PendingRecord& r : recording_) extents.push_back(r.extent);
  mu_.Unlock();
  const absl::Status status = tier_->Record(extents);
  mu_.Lock();
  last_was_forget_ = false;
  if (status.ok()) {
    ++stats_.record_batches;
    stats_.recorded_objects += recording_.size();
    ResetBackoffLocked();
  } else {
    ++stats_.record_errors;
    LOG(WARNING) << "hybrid device: recording " << recording_.size()
                 << " flushed objects failed (they stay readable; will retry "
                 << "in " << absl::FormatDuration(backoff_) << "): " << status;
    for (const PendingRecord& r : recording_) {
      if (!r.dropped) AddPendingRecordLocked(r);
    }
    BackOffLocked();
  }
  recording_.clear();
  cv_.SignalAll();
}

void HybridDevice::IssueBatchLocked(FlushBatch* fb) {
  fb->issued = absl::Now();
  // Entry addr/len/buf fields are constant after BeginWrite. Objects
  // contiguous both in the tier and in the buffer are written as one run
  // (FlushRuns, flush_batch.h).
  std::vector<FlushRun> objects;
  objects.reserve(fb->entries.size());
  for (const Entry* e : fb->entries) {
    objects.push_back(FlushRun{e->addr, e->buf_off, e->buf_len});
  }
  for (const FlushRun& r : FlushRuns(objects)) {
    IoReq proto;
    proto.kind = IoReq::Kind::kFlush;
    proto.owner = fb;
    proto.file_off = CapacityTier::kHeaderBytes + r.addr;
    proto.buf = buffer_ + r.buf_off;
    const size_t before = write_q_.size();
    QueueChunksLocked(proto, r.len, &write_q_);
    fb->outstanding += static_cast<int>(write_q_.size() - before);
  }
  stats_.flush_ios += static_cast<uint64_t>(fb->outstanding);
  std::vector<IoReq> next;
  TakeIssuableLocked(&next);
  mu_.Unlock();
  Issue(&next);
  mu_.Lock();
}

void HybridDevice::RetireBatchLocked(FlushBatch* fb) {
  for (Entry* e : fb->entries) e->in_flight = false;
  if (fb->status.ok()) {
    flush_latency_.Observe(absl::Now() - fb->issued);
    // The bytes are on the tier: readers go there from now on, and the
    // buffer space is freed as soon as no reader or prefetch handle holds
    // the buffered copy. Only the record remains (RecordPendingLocked).
    ++stats_.flush_batches;
    for (Entry* e : fb->entries) {
      e->queued = false;
      flush_queue_.erase(e->seq);
      if (!e->superseded) {
        stats_.flushed_bytes += e->len;
        ++stats_.flushed_objects;
        if (options_.verify_reads && e->has_crc) {
          EraseSumsLocked(e->addr, e->buf_len);
          tier_sums_[e->addr] = TierSum{e->len, e->crc, false};
        }
        PendingRecord r;
        r.extent = DurableExtent{e->addr, e->len, e->tag, e->has_crc, e->crc};
        r.seq = e->seq;
        r.since = clock_->Now();
        AddPendingRecordLocked(r);
      }
      if (e->live) {
        live_.erase(e->addr);
        e->live = false;
      }
      MaybeFreeEntryLocked(e);
    }
    ResetBackoffLocked();
    last_flush_error_ = absl::OkStatus();
  } else {
    ++stats_.flush_errors;
    last_flush_error_ = fb->status;
    LOG(WARNING) << "hybrid device: writing " << fb->entries.size()
                 << " objects to the tier failed (kept in the write buffer, "
                 << "will retry in " << absl::FormatDuration(backoff_)
                 << "): " << fb->status;
    for (Entry* e : fb->entries) {
      if (e->superseded) {
        e->queued = false;
        flush_queue_.erase(e->seq);
        MaybeFreeEntryLocked(e);
      }
    }
    BackOffLocked();
  }
  auto it = std::find_if(pipeline_.begin(), pipeline_.end(),
                         [fb](const auto& p) { return p.get() == fb; });
  if (it != pipeline_.end()) pipeline_.erase(it);  // deletes fb
  cv_.SignalAll();
}

bool HybridDevice::WaitFlushedForTest(absl::Time deadline, bool force) {
  MutexLock l(&mu_);
  if (force) ++force_flush_;
  cv_.SignalAll();
  auto durable = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return flush_queue_.empty() && record_pending_.empty() &&
           recording_.empty();
  };
  while (!durable()) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (force) --force_flush_;
  return durable();
}

bool HybridDevice::SettleFlusherForTest(absl::Time deadline) {
  MutexLock l(&mu_);
  const uint64_t want = ++settle_requested_;
  cv_.SignalAll();
  while (settled_ < want) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) return settled_ >= want;
  }
  return true;
}

// ---------------------------------------------------------------- stats

HybridDeviceStats HybridDevice::HybridStats() const {
  MutexLock l(&mu_);
  HybridDeviceStats s = stats_;
  const absl::Time now = absl::Now();
  s.device.capacity_bytes = capacity_;
  s.staged_bytes = window_alloc_->used_bytes();
  s.staged_objects = staged_.size();
  s.prefetch_queue_length = window_fifo_.size();
  s.bounce_bytes = bounce_bytes_;
  absl::Duration busy = refill_busy_;
  if (refill_ios_ > 0) busy += now - refill_busy_since_;
  s.refill_seconds = absl::ToDoubleSeconds(busy);
  s.refill_bandwidth_bytes_per_s =
      s.refill_seconds > 0 ? static_cast<double>(s.refill_bytes) / s.refill_seconds
                           : 0;
  double integral = read_depth_integral_, busy_s = read_busy_seconds_;
  if (reads_in_flight_ > 0) {
    const double dt = absl::ToDoubleSeconds(now - depth_since_);
    integral += dt * reads_in_flight_;
    busy_s += dt;
  }
  s.read_queue_depth_avg = busy_s > 0 ? integral / busy_s : 0;
  s.buffered_bytes = buffer_alloc_->used_bytes();
  s.unflushed_objects = flush_queue_.size();
  s.record_pending_objects = record_pending_.size() + recording_.size();
  s.flush_lag = flush_queue_.empty()
                    ? absl::ZeroDuration()
                    : clock_->Now() - flush_queue_.begin()->second->commit_time;
  return s;
}

MemoryDeviceStats HybridDevice::Stats() const { return HybridStats().device; }

void HybridDevice::VisitStats(StatsVisitor* v) const {
  const HybridDeviceStats s = HybridStats();
  s.device.Visit(v);
  s.Visit(v);
  v->Gauge("flush_lag_seconds", "Age of the oldest unflushed commit",
           absl::ToDoubleSeconds(s.flush_lag));
  v->Histogram("flush_seconds",
               "Flush batches: issued to written (successful batches)",
               flush_latency_.Snapshot());
}

}  // namespace hymcache::storage
