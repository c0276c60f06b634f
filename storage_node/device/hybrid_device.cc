// HybridDevice: options, creation and destruction, regions and areas, stats.
// The design is in hybrid_device.h; the other parts are in
// hybrid_device_{io,prefetch,read,write,flush}.cc.
#include "storage_node/device/hybrid_device.h"

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "storage_node/device/hybrid_device_internal.h"

namespace hymcache::storage {
using internal::kPage;
using internal::RoundUp;

namespace {

// Reserves `bytes` of DRAM for the staging window or the write buffer.
absl::StatusOr<std::unique_ptr<HostMemory>> AllocateArea(
    const HybridDeviceOptions& options, uint64_t bytes, const char* name,
    const char* what) {
  HostMemoryOptions m;
  m.bytes = bytes;
  m.numa_node = options.numa_node;
  m.huge_pages = true;
  m.shareable = options.shareable;
  m.populate = options.populate_memory;
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
      staging_(std::move(window_alloc)),
      buffer_alloc_(std::move(buffer_alloc)),
      checksums_(options.verify_reads),
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
      if (e.checksummed) checksums_.Adopt(e.addr, e.length, e.crc32c);
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
    staging_.FailQueued();
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

// ---------------------------------------------------------------- stats

HybridDeviceStats HybridDevice::HybridStats() const {
  MutexLock l(&mu_);
  HybridDeviceStats s = stats_;
  const absl::Time now = absl::Now();
  s.device.capacity_bytes = capacity_;
  s.staged_bytes = staging_.used_bytes();
  s.staged_objects = staging_.objects();
  s.prefetch_queue_length = staging_.queued();
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
