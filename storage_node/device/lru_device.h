// LruCacheDevice: the baseline a hybrid DRAM+SSD device is measured against.
// It is what a generic CXL hybrid-memory device does with its DRAM: a
// transparent, write-back LRU cache of fixed-size lines over the capacity
// tier, with no knowledge of what will be read next.
//
//   * The region is the tier's data area: region address `a` lives at file
//     offset data_offset + a (data_offset defaults to
//     CapacityTier::kHeaderBytes, the same layout as the hybrid device).
//   * `cache_bytes` of DRAM are split into `line_bytes` lines. A read or a
//     write of an object touches the lines it overlaps; a missing line is
//     filled from the tier (write-allocate: a write fills a line it only
//     partly covers, and a line it covers whole is allocated without a fill).
//     The misses of one access are issued concurrently, up to
//     max_concurrent_fills at a time.
//   * The victim is the least recently used line that nobody is using. A
//     dirty victim is written back before its line is reused, in the
//     foreground: the access that needs the space waits for the write-back,
//     as on a real device.
//   * Lines are not contiguous, so AcquireRead copies the object's bytes into
//     a bounce buffer (freed by ReleaseRead), and BeginWrite hands out a
//     bounce buffer that CommitWrite copies into lines and marks dirty.
//     BeginWrite never refuses: a generic device has no admission control.
//   * There is no real prefetch: PrefetchObject only records the request and
//     PrefetchWait reads through the cache into a bounce buffer.
//   * Not persistent: dirty lines are lost on a crash (or on destruction
//     without Flush()).
//
// Concurrency: one mutex guards the line table; it is never held while waiting
// for I/O. A line being filled is pinned and visible in the table, so a
// second reader of the same missing line waits for that fill instead of
// issuing its own. A line being written back has left the table and is
// re-read from the tier only after the write-back completes. Pinned or busy
// lines are never chosen as victims. An access waits for free lines only
// while it holds no pins, so accesses cannot deadlock on each other.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "storage_node/device/block_io.h"
#include "storage_node/device/memory_device.h"

namespace hymcache::storage {

struct LruCacheDeviceOptions {
  // Id of the device's single region.
  // Default: 0
  uint32_t region_id = 0;
  // Bytes of the region (the tier's data area). 0: everything of the BlockIo
  // after data_offset. A multiple of BlockIo::kAlignment.
  // Default: 0
  uint64_t capacity_bytes = 0;
  // File offset of region address 0 (CapacityTier::kHeaderBytes: the
  // capacity tier's header precedes its data area). A multiple of
  // BlockIo::kAlignment.
  // Default: 1 MiB
  uint64_t data_offset = uint64_t{1} << 20;
  // DRAM of the cache; rounded down to whole lines, at least one line. Give
  // it the hybrid device's staging window + write buffer for a fair baseline.
  // Default: 160 MiB
  uint64_t cache_bytes = uint64_t{160} << 20;
  // Cache line size: the unit of fill, eviction and write-back. 1 MiB keeps
  // tier I/Os as large as the hybrid device's object-sized ones, so the
  // comparison is about policy, not request size. A multiple of
  // BlockIo::kAlignment.
  // Default: 1 MiB
  uint64_t line_bytes = uint64_t{1} << 20;
  // Most line fills (or write-backs) one access keeps in flight; match the
  // BlockIo's queue depth.
  // Default: 64
  int max_concurrent_fills = 64;
  // Allocation alignment advertised to the master (a power of two).
  // Default: 4096
  uint32_t alignment = 4096;
  // Back the cache with transparent huge pages (madvise MADV_HUGEPAGE; best
  // effort). A device's DRAM is physically contiguous; with 4 KiB pages every
  // 1 MiB O_DIRECT transfer is 256 scatter-gather segments, which on a
  // virtio disk costs real bandwidth. The hybrid device's window does the same.
  // Default: true
  bool huge_pages = true;

  absl::Status Validate() const;
};

// Cache counters. Line granularity: an access touching three lines counts
// three hits or misses.
// The LRU cache's stats, declared once (common/stats.h); exported with the
// prefix "lru_" beside the basic MemoryDeviceStats.
#define HYM_LRU_CACHE_STATS(COUNTER, GAUGE, DGAUGE)                         \
  COUNTER(hits, "Lines found in the cache (or being filled)")              \
  COUNTER(misses, "Lines not in the cache")                                \
  COUNTER(fills, "Lines read from the tier")                               \
  COUNTER(evictions, "Lines dropped to make room")                         \
  COUNTER(dirty_writebacks, "Evicted lines written back to the tier")      \
  COUNTER(tier_read_bytes, "Bytes read from the tier")                     \
  COUNTER(tier_write_bytes, "Bytes written to the tier")                   \
  COUNTER(io_errors, "Failed fills and write-backs")
HYM_DECLARE_STATS_STRUCT(LruCacheCounters, HYM_LRU_CACHE_STATS);

struct LruCacheStats : LruCacheCounters {
  double hit_ratio() const {
    return hits + misses == 0
               ? 0.0
               : static_cast<double>(hits) / static_cast<double>(hits + misses);
  }
};

class LruCacheDevice final : public MemoryDevice {
 public:
  // `io` is the capacity tier's I/O (e.g. CapacityTier::io()); not owned, it
  // must outlive the device.
  // Errors: InvalidArgument (options, or a region beyond io->size()),
  // ResourceExhausted (cannot allocate the cache).
  static absl::StatusOr<std::unique_ptr<LruCacheDevice>> Create(
      const LruCacheDeviceOptions& options, BlockIo* io);
  ~LruCacheDevice() override;
  LruCacheDevice(const LruCacheDevice&) = delete;
  LruCacheDevice& operator=(const LruCacheDevice&) = delete;

  // One region: kind "hybrid-lru", not persistent.
  std::vector<RegionDescriptor> Regions() const override;

  // Errors: as MemoryDevice; Unavailable on a tier read error, DataLoss for
  // a line whose write-back failed.
  absl::StatusOr<ReadView> AcquireRead(uint32_t region, uint64_t addr,
                                       uint64_t len) override;
  void ReleaseRead(const ReadView& view) override;

  // Never ResourceExhausted. `tag` is ignored (not persistent).
  absl::StatusOr<WriteView> BeginWrite(uint32_t region, uint64_t addr,
                                       uint64_t len, uint64_t tag) override;
  // Copies the bounce buffer into lines (filling partly covered ones first).
  // Errors: Unavailable/DataLoss when a fill or a victim's write-back fails.
  absl::Status CommitWrite(const WriteView& view) override;
  void AbortWrite(const WriteView& view) override;

  absl::StatusOr<PrefetchHandle> PrefetchObject(uint32_t region, uint64_t addr,
                                                uint64_t len) override;
  // Reads through the cache (the deadline is not enforced once the read has
  // started). Errors: InvalidArgument (unknown handle), as AcquireRead.
  absl::StatusOr<const uint8_t*> PrefetchWait(const PrefetchHandle& handle,
                                              absl::Time deadline) override;
  void PrefetchRelease(const PrefetchHandle& handle) override;

  MemoryDeviceStats Stats() const override;
  LruCacheStats CacheStats() const;
  // Stats(), then CacheStats() prefixed "lru_" and "lru_hit_ratio".
  void VisitStats(StatsVisitor* v) const override;

  // Writes every dirty line back to the tier (lines stay cached, now clean).
  // Errors: the first failed write-back.
  absl::Status Flush();

  uint64_t line_bytes() const { return line_bytes_; }
  uint64_t num_lines() const { return num_lines_; }

 private:
  enum class LineState {
    kFree,     // holds no line
    kFilling,  // in the table, being filled (or allocated for a full write)
    kValid,    // in the table, readable
    kFailed,   // fill failed; left the table, freed when unpinned
  };
  struct Slot {
    uint64_t line = 0;
    LineState state = LineState::kFree;
    bool dirty = false;
    int pins = 0;
    std::list<int>::iterator lru;  // valid while in the table
  };
  // A bounce buffer handed out by AcquireRead / BeginWrite / PrefetchWait.
  struct Bounce {
    uint64_t addr = 0;
    uint64_t len = 0;
    std::unique_ptr<uint8_t[]> data;
  };

  LruCacheDevice(const LruCacheDeviceOptions& options, BlockIo* io,
                 uint64_t capacity, uint8_t* cache, size_t cache_mapped,
                 uint64_t num_lines);
  absl::Status Check(uint32_t region, uint64_t addr, uint64_t len) const;
  // Reads (write=false: line bytes -> buf) or writes (buf -> lines, dirty)
  // [addr, addr + len) through the cache.
  absl::Status Access(uint64_t addr, uint64_t len, uint8_t* buf, bool write);
  // One batch of at most max_concurrent_fills lines: [first, last].
  absl::Status AccessLines(uint64_t first, uint64_t last, uint64_t addr,
                           uint64_t len, uint8_t* buf, bool write)
      ABSL_LOCKS_EXCLUDED(mu_);
  // AccessLines' steps, over the batch's state (lru_device.cc).
  struct LineBatch;
  // Bytes of the access inside line `line`: [lo, hi) relative to the line.
  void SpanOf(const LineBatch& b, uint64_t line, uint64_t* lo,
              uint64_t* hi) const;
  // Waits until every line is in the table or claimable, refuses lines
  // lost in a failed write-back (DataLoss, nothing pinned), then pins the
  // hits and claims the misses (victims to write back noted).
  absl::Status PinLinesLocked(LineBatch* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the dirty victims back before their slots are refilled.
  void WriteBackVictims(const LineBatch& b) ABSL_LOCKS_EXCLUDED(mu_);
  // Fills the misses, then waits for hits another access is filling; on
  // failure the claimed lines leave the table and every pin is dropped.
  absl::Status FillLines(LineBatch* b) ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes of line `line` that exist in the region (the last may be short,
  // rounded up to kAlignment; the region is a multiple of it).
  uint64_t LineLength(uint64_t line) const;
  uint8_t* SlotData(int slot) const {
    return cache_ + static_cast<uint64_t>(slot) * line_bytes_;
  }
  // Whether `need` lines can be claimed now without touching [first, last].
  bool CanClaim(uint64_t first, uint64_t last, int need) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a free or evictable slot out of the table. Sets *writeback_line
  // and returns true in *dirty when the old line must be written back.
  int TakeVictim(bool* dirty, uint64_t* old_line)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unpin(int slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NewBounce(uint64_t addr, uint64_t len, uint8_t** data);

  // Constant after construction.
  const LruCacheDeviceOptions options_;
  BlockIo* const io_;
  const uint64_t capacity_;
  const uint64_t line_bytes_;
  const uint64_t num_lines_;
  uint8_t* const cache_;  // mmap'd, cache_mapped_ bytes
  const size_t cache_mapped_;

  mutable Mutex mu_;
  // Signalled (all) when a slot is unpinned, a fill finishes, or a
  // write-back finishes.
  CondVar cv_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, int> table_ ABSL_GUARDED_BY(mu_);  // line->slot
  std::list<int> lru_ ABSL_GUARDED_BY(mu_);  // slots in the table, MRU first
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
  // Lines being written back: not in the table, not yet readable from the
  // tier.
  absl::flat_hash_set<uint64_t> writing_back_ ABSL_GUARDED_BY(mu_);
  // Lines whose write-back failed: reading them is DataLoss until a write
  // covers them whole.
  absl::flat_hash_set<uint64_t> lost_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Bounce> bounces_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, PrefetchHandle> prefetches_pending_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  LruCacheStats cache_stats_ ABSL_GUARDED_BY(mu_);
  MemoryDeviceStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hymcache::storage
