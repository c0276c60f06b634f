// FakeMemoryDevice: a testonly MemoryDevice over heap memory whose failures
// tests can switch on (a refusing write buffer, failing commits), to exercise
// the paths a hybrid device takes.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage_node/device/memory_device.h"

namespace hymcache::storage {

class FakeMemoryDevice final : public MemoryDevice {
 public:
  explicit FakeMemoryDevice(uint64_t capacity_bytes, uint32_t region_id = 0)
      : region_id_(region_id),
        capacity_(capacity_bytes),
        mem_(new uint8_t[capacity_bytes]()) {}

  // BeginWrite answers ResourceExhausted("write buffer full") while set.
  void SetRefuseWritesForTest(bool refuse) { refuse_writes_ = refuse; }
  // CommitWrite answers Unavailable while set.
  void SetFailCommitsForTest(bool fail) { fail_commits_ = fail; }
  // Raw access to the region's bytes.
  uint8_t* DataForTest() { return mem_.get(); }

  std::vector<RegionDescriptor> Regions() const override {
    RegionDescriptor r;
    r.region_id = region_id_;
    r.capacity_bytes = capacity_;
    r.alignment = 1;
    r.numa_node = -1;
    r.device_kind = "fake";
    return {r};
  }

  absl::StatusOr<ReadView> AcquireRead(uint32_t region, uint64_t addr,
                                       uint64_t len) override {
    absl::Status s = Check(region, addr, len);
    if (!s.ok()) return s;
    ++reads_;
    ++outstanding_reads_;
    return ReadView{region, addr, len, mem_.get() + addr, 0};
  }
  void ReleaseRead(const ReadView&) override { --outstanding_reads_; }

  absl::StatusOr<WriteView> BeginWrite(uint32_t region, uint64_t addr,
                                       uint64_t len, uint64_t /*tag*/) override {
    absl::Status s = Check(region, addr, len);
    if (!s.ok()) return s;
    if (refuse_writes_) {
      ++refused_;
      return absl::ResourceExhaustedError("write buffer full");
    }
    ++outstanding_writes_;
    return WriteView{region, addr, len, mem_.get() + addr, 0};
  }
  absl::Status CommitWrite(const WriteView&) override {
    --outstanding_writes_;
    if (fail_commits_) return absl::UnavailableError("injected commit failure");
    ++writes_;
    return absl::OkStatus();
  }
  void AbortWrite(const WriteView&) override {
    --outstanding_writes_;
    ++aborted_;
  }

  absl::StatusOr<PrefetchHandle> PrefetchObject(uint32_t region, uint64_t addr,
                                                uint64_t len) override {
    absl::Status s = Check(region, addr, len);
    if (!s.ok()) return s;
    ++prefetches_;
    ++outstanding_prefetches_;
    outstanding_prefetch_bytes_ += static_cast<int64_t>(len);
    return PrefetchHandle{1, region, addr, len};
  }
  absl::StatusOr<const uint8_t*> PrefetchWait(const PrefetchHandle& h,
                                              absl::Time deadline) override {
    absl::Status s = Check(h.region_id, h.addr, h.length);
    if (!s.ok()) return s;
    if (deadline <= absl::Now() && not_ready_probes_.load() > 0) {
      --not_ready_probes_;
      return absl::DeadlineExceededError("fake device: still staging");
    }
    return static_cast<const uint8_t*>(mem_.get() + h.addr);
  }
  void PrefetchRelease(const PrefetchHandle& h) override {
    --outstanding_prefetches_;
    outstanding_prefetch_bytes_ -= static_cast<int64_t>(h.length);
  }

  // The next `n` PrefetchWait calls whose deadline has passed answer
  // DeadlineExceeded, as a device still staging the object would.
  void SetNotReadyProbesForTest(int n) { not_ready_probes_.store(n); }

  // Prefetch handles handed out, and those not yet released.
  int64_t PrefetchesForTest() const { return prefetches_.load(); }
  int64_t OutstandingPrefetchesForTest() const {
    return outstanding_prefetches_.load();
  }
  int64_t OutstandingPrefetchBytesForTest() const {
    return outstanding_prefetch_bytes_.load();
  }

  MemoryDeviceStats Stats() const override {
    MemoryDeviceStats s;
    s.capacity_bytes = capacity_;
    s.reads = reads_;
    s.writes = writes_;
    s.aborted_writes = aborted_;
    s.refused_writes = refused_;
    s.prefetches = static_cast<uint64_t>(prefetches_.load());
    s.outstanding_reads = static_cast<uint64_t>(outstanding_reads_.load());
    s.outstanding_writes = static_cast<uint64_t>(outstanding_writes_.load());
    return s;
  }

 private:
  absl::Status Check(uint32_t region, uint64_t addr, uint64_t len) const {
    if (region != region_id_) return absl::InvalidArgumentError("unknown region");
    return CheckRange(capacity_, addr, len);
  }

  const uint32_t region_id_;
  const uint64_t capacity_;
  std::unique_ptr<uint8_t[]> mem_;
  std::atomic<bool> refuse_writes_{false};
  std::atomic<bool> fail_commits_{false};
  std::atomic<uint64_t> reads_{0}, writes_{0}, aborted_{0}, refused_{0};
  std::atomic<int64_t> outstanding_reads_{0}, outstanding_writes_{0};
  std::atomic<int> not_ready_probes_{0};
  std::atomic<int64_t> prefetches_{0}, outstanding_prefetches_{0},
      outstanding_prefetch_bytes_{0};
};

}  // namespace hymcache::storage
