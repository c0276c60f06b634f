// DramDevice: a MemoryDevice with one region of plain DRAM, allocated on a
// chosen NUMA node (libnuma) or, where NUMA is unavailable, with anonymous
// mmap. The memory is reserved lazily (pages are faulted in by the first write
// to them) and transparent huge pages are requested. Contents do not survive
// the process.
//
// Reads and writes hand out pointers straight into the region, so commit and
// abort are bookkeeping only and prefetches are ready at once.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage_node/memory_device.h"

namespace hymcache::storage {

struct DramDeviceOptions {
  // Id of the device's single region.
  // Default: 0
  uint32_t region_id = 0;
  // Size of the region in bytes; must be > 0.
  // Default: 1 GiB
  uint64_t capacity_bytes = uint64_t{1} << 30;
  // NUMA node to allocate on; -1 lets the kernel place pages on the node of
  // the first thread that touches them. An invalid node, or a machine without
  // NUMA support, falls back to ordinary anonymous memory with a warning.
  // Default: -1
  int numa_node = -1;
  // Allocation alignment advertised to the master (a power of two).
  // Default: 4096
  uint32_t alignment = 4096;
  // Ask for transparent huge pages (madvise MADV_HUGEPAGE; best effort).
  // Default: true
  bool huge_pages = true;

  absl::Status Validate() const;
};

class DramDevice final : public MemoryDevice {
 public:
  // Errors: InvalidArgument for bad options, ResourceExhausted when the
  // address space cannot be reserved.
  static absl::StatusOr<std::unique_ptr<DramDevice>> Create(
      const DramDeviceOptions& options);
  ~DramDevice() override;
  DramDevice(const DramDevice&) = delete;
  DramDevice& operator=(const DramDevice&) = delete;

  std::vector<RegionDescriptor> Regions() const override;

  absl::StatusOr<ReadView> AcquireRead(uint32_t region, uint64_t addr,
                                       uint64_t len) override;
  void ReleaseRead(const ReadView& view) override;

  absl::StatusOr<WriteView> BeginWrite(uint32_t region, uint64_t addr,
                                       uint64_t len, uint64_t tag) override;
  absl::Status CommitWrite(const WriteView& view) override;
  void AbortWrite(const WriteView& view) override;

  absl::StatusOr<PrefetchHandle> PrefetchObject(uint32_t region, uint64_t addr,
                                                uint64_t len) override;
  absl::StatusOr<const uint8_t*> PrefetchWait(const PrefetchHandle& handle,
                                              absl::Time deadline) override;
  void PrefetchRelease(const PrefetchHandle& handle) override;

  MemoryDeviceStats Stats() const override;

  // Whether the region came from libnuma (false: the mmap fallback).
  bool numa_allocated() const { return numa_allocated_; }

 private:
  DramDevice(const DramDeviceOptions& options, uint8_t* base,
             size_t mapped_bytes, bool numa_allocated, int numa_node);
  absl::Status Check(uint32_t region, uint64_t addr, uint64_t len) const;

  // Constant after construction.
  const DramDeviceOptions options_;
  uint8_t* const base_;
  const size_t mapped_bytes_;
  const bool numa_allocated_;
  const int numa_node_;  // as reported to the master; -1 unknown

  std::atomic<uint64_t> reads_{0};
  std::atomic<uint64_t> read_bytes_{0};
  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> write_bytes_{0};
  std::atomic<uint64_t> aborted_writes_{0};
  std::atomic<uint64_t> prefetches_{0};
  std::atomic<uint64_t> next_prefetch_id_{1};
  std::atomic<int64_t> outstanding_reads_{0};
  std::atomic<int64_t> outstanding_writes_{0};
};

}  // namespace hymcache::storage
