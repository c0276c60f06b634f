// DramDevice: a MemoryDevice of plain DRAM, allocated with HostMemory on a
// chosen NUMA node (or wherever the kernel places it). By default the memory
// is shareable (memfds that a same-host client can map) and every region is
// exposed as a MemoryArea, for RDMA registration and shared-memory access.
// The memory is reserved lazily (pages are faulted in by the first write to
// them) and transparent huge pages are requested. Contents do not survive
// the process.
//
// Regions: one of capacity_bytes, or, with max_region_bytes, several
// (ids region_id, region_id + 1, ...), each at most max_region_bytes, so that
// the master allocates every object inside one region and no object
// straddles two memory registrations. Each region is its own HostMemory (its
// own memfd, mapped from offset 0), and Areas() returns one area per region
// with area_id == region_id, kind "region".
//
// Reads and writes hand out pointers straight into the regions, so commit
// and abort are bookkeeping only and prefetches are ready at once.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage_node/device/host_memory.h"
#include "storage_node/device/memory_device.h"

namespace hymcache::storage {

struct DramDeviceOptions {
  // Id of the device's first (or only) region; further regions take the
  // following ids.
  // Default: 0
  uint32_t region_id = 0;
  // Total size of the regions in bytes; must be > 0.
  // Default: 1 GiB
  uint64_t capacity_bytes = uint64_t{1} << 30;
  // Largest region. When capacity_bytes exceeds it, the capacity is split
  // into regions of max_region_bytes rounded down to the alignment (the last
  // one takes the rest); at most kMaxRegions regions. 0: one region.
  // Default: 0
  uint64_t max_region_bytes = 0;
  // NUMA node to allocate on; -1 lets the kernel place pages on the node of
  // the first thread that touches them. An invalid node, or a machine without
  // NUMA support, falls back to memory without NUMA placement with a warning.
  // Default: -1
  int numa_node = -1;
  // Allocation alignment advertised to the master (a power of two).
  // Default: 4096
  uint32_t alignment = 4096;
  // Ask for transparent huge pages (madvise MADV_HUGEPAGE; best effort).
  // Default: true
  bool huge_pages = true;
  // Back each region with a memfd (MemoryArea::fd) that a same-host client
  // can map; false: private anonymous memory (fd -1; RDMA only). Shared
  // pages count as Shmem in /proc/meminfo, and get huge pages only if
  // /sys/kernel/mm/transparent_hugepage/shmem_enabled allows (see
  // host_memory.h).
  // Default: true
  bool shareable = true;

  // Most regions max_region_bytes may split the capacity into (each holds a
  // file descriptor).
  static constexpr uint64_t kMaxRegions = 256;

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

  // One area per region: area_id = region id, kind "region", fd = the
  // region's memfd (-1 unless shareable), base/length = the region's bytes.
  std::vector<MemoryArea> Areas() const override;

  // Whether every region is bound to options.numa_node (false: numa_node
  // -1, or the node was unusable and the memory fell back).
  bool numa_allocated() const;

 private:
  struct Region {
    uint32_t id = 0;
    uint64_t capacity = 0;
    std::unique_ptr<HostMemory> memory;
  };

  DramDevice(const DramDeviceOptions& options, std::vector<Region> regions);
  // The bytes of [addr, addr + len) of `region`, or the error of a bad range
  // (InvalidArgument for an unknown region).
  absl::StatusOr<uint8_t*> Locate(uint32_t region, uint64_t addr,
                                  uint64_t len) const;

  // Constant after construction.
  const DramDeviceOptions options_;
  // By id: regions_[i].id == options_.region_id + i.
  const std::vector<Region> regions_;

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
