// MemoryDevice: the seam between a storage node and the memory that holds
// object bytes. The node's data plane moves bytes between sockets and the
// pointers a device hands out, so a device never copies on the fast path.
//
// Implementations: DramDevice (NUMA-local DRAM regions), HybridDevice (a
// bounded DRAM staging window over an O_DIRECT capacity file, with a write
// buffer) and LruCacheDevice (the LRU-cache baseline over the same tier);
// FakeMemoryDevice for tests. The API is shaped for the hybrid device:
//   * reads hand out a pointer that stays valid only until ReleaseRead (a
//     staging-window slot or bounce buffer that the device may recycle after);
//   * writes go through BeginWrite, which may refuse at once (e.g.
//     ResourceExhausted "write buffer full"), then CommitWrite or AbortWrite;
//   * PrefetchObject/PrefetchWait/PrefetchRelease stage an object ahead of a
//     read (DRAM: ready at once).
//
// The device checks addresses against its regions but knows nothing of
// objects or generations: the caller (the ExtentTable) guarantees that no
// write overlaps a range that is being read or written.
//
// Thread safety: implementations are safe for concurrent use without external
// synchronization.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/stats.h"

namespace hymcache::storage {

// One addressable memory region of a device (maps to proto RegionInfo).
struct RegionDescriptor {
  uint32_t region_id = 0;
  uint64_t capacity_bytes = 0;
  // Allocations start at multiples of this (power of two).
  uint32_t alignment = 4096;
  // NUMA node the memory is on, -1 if unknown.
  int numa_node = -1;
  // "dram" or "hybrid".
  std::string device_kind;
  // Whether the contents survive a restart of the storage node.
  bool persistent = false;
};

// Readable bytes of [addr, addr + length) of a region, valid until
// ReleaseRead(view). `cookie` is private to the device.
struct ReadView {
  uint32_t region_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  const uint8_t* data = nullptr;
  uint64_t cookie = 0;
};

// Writable destination for [addr, addr + length) of a region, valid until
// CommitWrite or AbortWrite. `cookie` is private to the device.
struct WriteView {
  uint32_t region_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint8_t* data = nullptr;
  uint64_t cookie = 0;
};

// A pending prefetch; pass it back to PrefetchWait and PrefetchRelease.
struct PrefetchHandle {
  uint64_t id = 0;
  uint32_t region_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
};

// Every device's basic stats, declared once (common/stats.h).
#define HYM_MEMORY_DEVICE_STATS(COUNTER, GAUGE, DGAUGE)                     \
  GAUGE(capacity_bytes, "Bytes the device holds")                           \
  COUNTER(reads, "AcquireRead calls that succeeded")                        \
  COUNTER(read_bytes, "Bytes of successful AcquireRead calls")              \
  COUNTER(writes, "CommitWrite calls that succeeded")                       \
  COUNTER(write_bytes, "Bytes of successful CommitWrite calls")             \
  COUNTER(aborted_writes, "AbortWrite calls")                               \
  COUNTER(refused_writes, "BeginWrite refused for lack of resources")       \
  COUNTER(prefetches, "PrefetchObject calls that succeeded")                \
  GAUGE(outstanding_reads, "Reads acquired, not yet released")              \
  GAUGE(outstanding_writes, "Writes begun, not yet committed or aborted")
HYM_DECLARE_STATS_STRUCT(MemoryDeviceStats, HYM_MEMORY_DEVICE_STATS);

// An object a persistent device holds durably, as found at start-up.
struct RecoveredExtent {
  uint32_t region_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t generation = 0;
};

// A span of device memory that a data plane may expose for direct access by
// peers: registered with an RDMA NIC (one-sided READ/WRITE) or mapped by a
// same-host client (shared memory). The DRAM device's regions, the hybrid
// device's staging window and write buffer. Every pointer a device hands out
// for reads through PrefetchWait, and for writes through BeginWrite, lies in
// one area (AcquireRead may also return bounce buffers outside any area).
struct MemoryArea {
  // Distinct per device; stable for the device's lifetime.
  uint32_t area_id = 0;
  uint8_t* base = nullptr;
  uint64_t length = 0;
  // A memfd holding the bytes (mapped MAP_SHARED at `base`), which a same-host
  // peer can map; -1 if the area is private memory. Owned by the device.
  int fd = -1;
  // "region", "staging" or "write_buffer".
  std::string kind;
};

// Finds the area holding [p, p + len): its id and the offset of p in it.
// NotFound if no single area holds the whole range.
absl::StatusOr<std::pair<uint32_t, uint64_t>> LocateInAreas(
    const std::vector<MemoryArea>& areas, const uint8_t* p, uint64_t len);

// Checks that [addr, addr + len) lies in a region of `capacity` bytes:
// InvalidArgument for len 0, OutOfRange beyond the region or on overflow.
// Shared by the devices and the extent table so their errors agree.
absl::Status CheckRange(uint64_t capacity, uint64_t addr, uint64_t len);

class MemoryDevice {
 public:
  virtual ~MemoryDevice() = default;

  // The device's regions. Constant for the device's lifetime.
  virtual std::vector<RegionDescriptor> Regions() const = 0;

  // Makes [addr, addr + len) of `region` readable. The returned pointer is
  // valid until ReleaseRead(view); every successful AcquireRead must be
  // released exactly once.
  // Errors: InvalidArgument (unknown region, len 0), OutOfRange (range beyond
  // the region or overflowing), ResourceExhausted/Unavailable (hybrid: no
  // staging space, I/O error).
  virtual absl::StatusOr<ReadView> AcquireRead(uint32_t region, uint64_t addr,
                                               uint64_t len) = 0;
  virtual void ReleaseRead(const ReadView& view) = 0;

  // Returns a writable destination for [addr, addr + len) of `region`. The
  // bytes become the region's contents only on CommitWrite; AbortWrite
  // discards the view (the range's contents are then unspecified). Every
  // successful BeginWrite must end in exactly one CommitWrite or AbortWrite.
  // `tag` is an opaque caller tag recorded with the object by durable
  // devices (the allocation generation), returned by RecoveredExtents after a
  // restart; DRAM ignores it.
  // Errors: as AcquireRead; ResourceExhausted ("write buffer full") when the
  // device refuses the write at once.
  virtual absl::StatusOr<WriteView> BeginWrite(uint32_t region, uint64_t addr,
                                               uint64_t len, uint64_t tag) = 0;
  // Errors: Unavailable/DataLoss (hybrid: the write could not be persisted).
  // The view is finished either way.
  virtual absl::Status CommitWrite(const WriteView& view) = 0;
  virtual void AbortWrite(const WriteView& view) = 0;

  // Starts staging [addr, addr + len) of `region` for a later read.
  // Every successful PrefetchObject must be released exactly once.
  virtual absl::StatusOr<PrefetchHandle> PrefetchObject(uint32_t region,
                                                        uint64_t addr,
                                                        uint64_t len) = 0;
  // Waits until the prefetch is staged or `deadline` passes
  // (DeadlineExceeded). The pointer is valid until PrefetchRelease(handle).
  virtual absl::StatusOr<const uint8_t*> PrefetchWait(
      const PrefetchHandle& handle, absl::Time deadline) = 0;
  virtual void PrefetchRelease(const PrefetchHandle& handle) = 0;

  virtual MemoryDeviceStats Stats() const = 0;

  // Reports every stat of the device (common/stats.h) under its name: the
  // storage node's GetStats map and Prometheus series come from here. The
  // default reports Stats(); a device with more to say overrides it.
  virtual void VisitStats(StatsVisitor* v) const { Stats().Visit(v); }

  // Objects a persistent device still holds after a restart, for the node to
  // re-adopt into its extent table (generation = the BeginWrite tag). Empty
  // for volatile devices. Constant for the device's lifetime.
  virtual std::vector<RecoveredExtent> RecoveredExtents() const { return {}; }

  // The node no longer holds the object written at [addr, addr + len) of
  // `region` with `tag` (the master neither lists it nor will commit it): a
  // persistent device stops keeping it, so it is not re-adopted after a
  // restart. Does nothing when a newer object (another tag or extent) covers
  // the range, or for volatile devices. Never fails: a device that cannot
  // forget the object now does so later or leaves it to the next
  // reconciliation. Readers already holding the object keep their view.
  virtual void Discard(uint32_t region, uint64_t addr, uint64_t len,
                       uint64_t tag) {}

  // The memory a data plane may expose for direct access (see MemoryArea).
  // Constant for the device's lifetime. Empty: no direct access (the data
  // plane moves bytes over TCP only).
  virtual std::vector<MemoryArea> Areas() const { return {}; }
};

}  // namespace hymcache::storage
