// HybridDevice: the software CXL hybrid-memory device. One region (id 0,
// kind "hybrid", persistent) whose bytes live in an SSD capacity tier
// (CapacityTier: region address `a` is file offset kHeaderBytes + a), with two
// bounded DRAM areas in front of it:
//
//   * The staging window (`staging_bytes`): NOT a cache of the footprint, but
//     a bounded window the caller fills ahead of its reads.
//     PrefetchObject reserves window space (best fit, 4 KiB granularity: the shared
//     RangeAllocator, common/range_allocator.h) and
//     reads the object from the tier in io_chunk_bytes chunks issued
//     concurrently. When the window is full, prefetches queue in FIFO order
//     (back-pressure) and start as PrefetchRelease frees space. Prefetches of
//     the same (region, addr, len) share one staged copy (refcounted, no
//     extra I/O); a prefetch of an object still in the write buffer is served
//     from there with no I/O. Released space is reused at once: nothing stays
//     staged without a handle or a read pinning it.
//   * The write buffer (`write_buffer_bytes`), separate from the window.
//     BeginWrite admits an object only if it fits right now, else answers
//     ResourceExhausted("write buffer full") at once: it never blocks.
//     CommitWrite makes the object readable from the buffer at once and
//     queues it for the flusher.
//
// Reads (AcquireRead) are served, in order of preference, from the write
// buffer, from the staging window (a "staging hit"; an object still being
// staged is waited for), else from the tier into a bounce buffer (a "staging
// miss": counted, slower, still correct). Outstanding bounce buffers are
// bounded by max_bounce_bytes (ResourceExhausted beyond; one bounce read is
// always allowed so that any object stays readable).
//
// Flush policy (the "hyb-flusher" thread). Committed objects are flushed in
// commit order (except that one waiting for its Forget, below, may be
// overtaken by a later one; queued objects never overlap), in batches of up
// to flush_batch_bytes; consecutive objects contiguous both in the tier and
// in the buffer are merged into one run, and runs are written in
// io_chunk_bytes pieces. When a batch starts and how many writes it keeps
// in flight is FlushPolicy's (flush_policy.h): a batch starts when no
// foreground read I/O (refill or miss) is queued or in flight, or a whole
// batch of committed bytes waits (under a steady read load the buffer
// drains continuously, in large writes), or the buffer is at least
// flush_high_watermark full, or the oldest waiting commit is older than
// flush_max_delay; flush writes in flight grow with the buffer's fill
// (ceil(io_queue_depth x fill), at least flush_depth_under_pressure under
// reads or flush_depth_idle without, at most 3/4 of the queue), so that
// the flush takes about the share of the device the incoming writes need.
// Foreground reads are issued before flush writes, except that a waiting
// flush always keeps its slots (a steady read load must not starve the
// flusher, or the write buffer would stay full and refuse every write). A
// flush never touches the staging window.
// An object is written only after CapacityTier::Forget has run over its
// range (an older durable object there is being overwritten). Forgets cover
// queued objects merged into contiguous address ranges, one synced call per
// range: all of them while reads are idle (a sync costs ~1 ms then; the
// flusher also forgets newly committed objects ahead), under read load
// (tens of ms per sync) only the range holding the oldest unforgotten
// object, so that its objects are written before the next range's sync.
// Up to four batches are being written at once (a batch waits for an
// in-flight batch it overlaps). Objects are written with their
// lengths rounded up to 4 KiB (the master allocates 4 KiB-aligned space, so
// the padding is the object's own).
//
// Recording is decoupled from freeing the buffer. When a batch's last write
// completes, its objects are on the tier: they leave the buffer (reads and
// prefetches go to the tier from then on, like any flushed object), their
// buffer space is freed as soon as the last reader or prefetch handle of
// the buffered copy lets go, and their records become pending. Whenever
// records are pending and no Record runs, the flusher records all of them
// in one synced CapacityTier::Record (a group commit, tag = BeginWrite's
// tag). The flusher makes every tier call, one at a time, so Forgets and
// Records alternate when both are due; under buffer pressure
// (flush_high_watermark) Records wait until the oldest pending record has
// waited record_max_delay, so that they do not hold up the Forgets that let
// buffered objects be written. (Under a read load each synced tier write
// takes 25-50 ms; when a batch's buffer space waited for its Record, the
// buffer drained too slowly and new writes were refused.)
//
// Durability: acknowledged (CommitWrite) -> in the buffer; written -> on
// the tier, record pending; recorded -> durable. Only recorded objects
// survive a crash (the others are absent: a miss, never wrong bytes). A
// write over a range drops the pending records overlapping it (they must
// not be recorded after the new object's Forget), and a record already in
// the running Record is removed again by the new object's Forget, which
// runs after that Record returns (the flusher makes every tier call). So a
// durable record never claims bytes that were overwritten.
//
// Errors: on a write or Forget error the batch stays in the buffer,
// readable, and is retried; on a Record error the records stay pending
// (the objects readable from the tier) and are retried; retries wait an
// exponential backoff (flush_retry_initial .. flush_retry_max); errors are
// logged and counted.
//
// A write over a range invalidates overlapping staged copies (new reads and
// prefetches no longer find them; handles already holding them keep their
// window space until released, but their bytes are those of the old object,
// or unspecified if the new one is flushed while the old one is still being
// read) and supersedes overlapping buffered objects.
//
// Restart: RecoveredExtents() returns the tier's durable extents as of Open,
// as region 0 objects with generation = tag. Destruction flushes what is
// buffered and records what is pending (up to shutdown_flush_timeout) and
// waits for every I/O in flight.
//
// Checksums. CommitWrite computes the CRC32C of each object (from the write
// buffer, outside the lock, on the writer's thread while the bytes are
// likely still in its cache: twice the rate the flusher managed on cold
// bytes, and off the one flusher thread) and the object's record carries
// it. When the tier adopted an existing file,
// Create verifies every recorded checksum against the bytes on the tier
// (verify_on_open): a torn or corrupt object is dropped from
// RecoveredExtents and its record forgotten, never served. With
// verify_reads, every read from the tier (refill or miss) is checked too,
// by the thread that first consumes it (PrefetchWait or AcquireRead, not
// the I/O completion thread): a mismatch fails that object with DataLoss,
// the object is refused from then on (DataLoss, no I/O) until a write
// replaces it, and the flusher durably forgets its record.
//
// Read errors. A failed tier read (an I/O error: the BlockIo's status, e.g.
// DataLoss for EIO) fails only that object's prefetch or read, with
// Unavailable; waiters are woken; other objects are served as before. It is
// not remembered: the next prefetch or read of the object reads the tier
// again (a transient error heals, a bad sector keeps failing).
//
// Writes require a 4 KiB-aligned addr (InvalidArgument otherwise).
//
// Memory: the window and the buffer are HostMemory on numa_node, memfds
// unless !shareable, exposed by Areas() for RDMA registration and same-host
// mapping (bounce buffers are plain heap memory).
//
// Parts: the pure policies, unit-tested without threads, are FlushPolicy
// (flush_policy.h: when a batch starts, how many writes it keeps in
// flight), FlushBatchChooser (flush_batch.h: which objects form the batch,
// merged into which writes) and IoPolicy (io_policy.h: how many of the
// queued reads and writes are issued now). Two pieces of its state are
// classes unit-tested without I/O: StagingWindow (staging_window.h: the
// staged objects, their sharing, the window's space and FIFO) and
// TierChecksums (tier_checksums.h: the checksums of the objects on the
// tier and the records to forget); neither locks, the device calls them
// under its mutex. The buffer's space comes from RangeAllocator
// (common/range_allocator.h). HybridDevice holds the state and the threads
// and evaluates the policies under its lock.
//
// Code: hybrid_device.cc (options, Create, destruction, stats),
// hybrid_device_io.cc (the I/O engine: queues, issue, completions),
// hybrid_device_prefetch.cc (prefetches into the staging window),
// hybrid_device_read.cc (AcquireRead, ReleaseRead, checksum checks),
// hybrid_device_write.cc (BeginWrite, CommitWrite, AbortWrite, Discard),
// hybrid_device_flush.cc (the flusher), hybrid_device_internal.h (the
// private structs they share).
//
// Concurrency: one mutex guards the window, buffer and I/O queues; it is
// never held while waiting for I/O or while calling into the tier. I/O
// completions run on the BlockIo's completion thread and only update state,
// signal waiters and issue queued I/O. Threads: the flusher only (plus the
// BlockIo's own).
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/range_allocator.h"
#include "common/stats.h"
#include "common/thread.h"
#include "storage_node/device/capacity_tier.h"
#include "storage_node/device/flush_batch.h"
#include "storage_node/device/flush_policy.h"
#include "storage_node/device/host_memory.h"
#include "storage_node/device/io_policy.h"
#include "storage_node/device/memory_device.h"
#include "storage_node/device/staging_window.h"
#include "storage_node/device/tier_checksums.h"

namespace hymcache::storage {

struct HybridDeviceOptions {
  // DRAM of the staging window; rounded up to 4 KiB. Production: tens of
  // GiB (e.g. 64 GiB).
  // Default: 256 MiB
  uint64_t staging_bytes = uint64_t{256} << 20;
  // DRAM of the write buffer; rounded up to 4 KiB.
  // Default: 64 MiB
  uint64_t write_buffer_bytes = uint64_t{64} << 20;
  // NUMA node of the window and the buffer; -1: wherever the kernel places
  // them. Unusable nodes fall back to plain memory with a warning.
  // Default: -1
  int numa_node = -1;
  // Back the window and the buffer with memfds (MemoryArea::fd) that a
  // same-host client can map; false: private anonymous memory (fd -1).
  // Shared pages count as Shmem in /proc/meminfo and get huge pages only if
  // /sys/kernel/mm/transparent_hugepage/shmem_enabled allows (see
  // host_memory.h).
  // Default: true
  bool shareable = true;
  // Fault in every page of the window and the buffer when the device is
  // created (HostMemoryOptions::populate: ~0.1 s per GiB at start-up).
  // Otherwise each page is allocated and zeroed by its first use: a refill
  // into fresh window space or a write into fresh buffer space pays for it
  // (a 2 MiB page: ~100 us) on the request's path, and space a request had
  // not used before (the window's share that think-time hints free and
  // take back) keeps costing that until the whole window has been touched:
  // staged copies held for hints once cut requests' load bandwidth by half.
  // Default: true
  bool populate_memory = true;
  // Refills, misses and flush runs are split into I/Os of this size (a
  // multiple of 4 KiB).
  // Default: 1 MiB
  uint64_t io_chunk_bytes = uint64_t{1} << 20;
  // Most I/Os the device keeps in flight; match BlockIoOptions::queue_depth.
  // Default: 64
  int io_queue_depth = 64;
  // Most bytes one flush batch writes.
  // Default: 8 MiB
  uint64_t flush_batch_bytes = uint64_t{8} << 20;
  // Buffer fill (fraction of write_buffer_bytes) at which a batch starts
  // even while foreground reads are in flight and less than a batch waits.
  // Default: 0.75
  double flush_high_watermark = 0.75;
  // A commit older than this is flushed even while reads are in flight.
  // absl::InfiniteDuration(): never (flush only when idle or above the
  // watermark).
  // Default: 1 s
  absl::Duration flush_max_delay = absl::Seconds(1);
  // Least flush writes in flight when no foreground read is queued or in
  // flight (more as the buffer fills: FlushPolicy).
  // Default: 4
  int flush_depth_idle = 4;
  // Least flush writes in flight while foreground reads are queued or in
  // flight (more as the buffer fills: FlushPolicy).
  // Default: 1
  int flush_depth_under_pressure = 1;
  // Under buffer pressure (flush_high_watermark), written objects are
  // recorded only once the oldest of them has waited this long (a Record
  // would hold up the Forgets that let buffered objects be written). Bounds
  // how long a flushed object stays non-durable under pressure.
  // Default: 500 ms
  absl::Duration record_max_delay = absl::Milliseconds(500);
  // Backoff after a failed write, Forget or Record: starts here, doubles
  // per failure up to flush_retry_max, resets on success.
  // Default: 10 ms, 2 s
  absl::Duration flush_retry_initial = absl::Milliseconds(10);
  absl::Duration flush_retry_max = absl::Seconds(2);
  // Most bytes of outstanding bounce buffers (staging misses). A miss beyond
  // it fails with ResourceExhausted, unless no other bounce is outstanding.
  // Default: 64 MiB
  uint64_t max_bounce_bytes = uint64_t{64} << 20;
  // How long AcquireRead waits for a staging miss (or an object being
  // staged) before failing with Unavailable.
  // Default: 30 s
  absl::Duration read_timeout = absl::Seconds(30);
  // How long destruction waits for the flusher to empty the buffer.
  // Default: 30 s
  absl::Duration shutdown_flush_timeout = absl::Seconds(30);
  // When the tier adopted an existing capacity file, Create reads every
  // recorded object that carries a checksum and drops (and durably forgets)
  // those whose bytes do not match: torn by a crash or corrupted at rest.
  // Costs a read of every such object at start-up (about the tier's
  // sequential read time: docs/hybrid_device.md); turn off when a huge
  // file must come back faster than that (verify_reads still guards reads).
  // Default: true
  bool verify_on_open = true;
  // How the verification at open reads (memory: read_bytes x depth).
  ExtentVerifyOptions open_verify;
  // Check the CRC32C of every object read from the tier (staging refill or
  // staging miss) before it is served. A mismatch fails the read with
  // DataLoss, and the object is refused (DataLoss) until a write replaces
  // it. Costs one CRC32C pass over each object read from the tier, made by
  // the reading thread (~15 GB/s per core with SSE4.2).
  // Default: false
  bool verify_reads = false;
  // The time the flush policy reads: commit ages (flush_max_delay, flush_lag),
  // record_max_delay and the retry backoff. Waits for I/O, callers'
  // deadlines, read_timeout, shutdown_flush_timeout and the measured
  // durations in the stats stay in real time. Not owned; outlives the
  // device. Tests pass a FakeClock and call SettleFlusherForTest after
  // advancing it.
  // Default: nullptr (Clock::Real())
  Clock* clock = nullptr;

  absl::Status Validate() const;
};

// MemoryDeviceStats plus the hybrid device's own counters.
// The hybrid device's own stats, declared once (common/stats.h); exported
// beside the basic MemoryDeviceStats by VisitStats.
#define HYM_HYBRID_DEVICE_STATS(COUNTER, GAUGE, DGAUGE)                      \
  /* Staging window. */                                                      \
  GAUGE(staging_capacity_bytes, "Bytes of the DRAM staging window")          \
  GAUGE(staged_bytes, "Staging window space reserved now")                   \
  GAUGE(staged_objects, "Objects staged or being staged now")                \
  GAUGE(prefetch_queue_length, "Prefetches waiting for window space")        \
  COUNTER(prefetch_shared, "Prefetches that joined a staged copy")          \
  COUNTER(prefetch_from_buffer, "Prefetches served by the write buffer")     \
  COUNTER(prefetch_cancelled, "Prefetches released while queued or loading") \
  GAUGE(prefetch_waiters, "Threads blocked in PrefetchWait now")             \
  GAUGE(read_waiters, "Threads blocked in AcquireRead for an object being staged") \
  COUNTER(prefetch_errors, "Refills that failed")                            \
  COUNTER(unknown_releases, "Unknown or double releases, commits and aborts") \
  COUNTER(staging_hits, "Reads served from the staging window")             \
  COUNTER(buffer_hits, "Reads served from the write buffer")                 \
  COUNTER(staging_misses, "Reads through a bounce buffer")                   \
  GAUGE(bounce_bytes, "Bounce buffers outstanding now")                      \
  COUNTER(refill_bytes, "Bytes read from the tier by prefetches")            \
  DGAUGE(refill_seconds, "Time with refill I/O in flight")                   \
  DGAUGE(refill_bandwidth_bytes_per_s, "refill_bytes / refill_seconds")      \
  /* Reads in flight on average while any is (io_queue_depth at most). */    \
  DGAUGE(read_queue_depth_avg, "Tier reads in flight on average while any is") \
  COUNTER(read_io_errors, "Tier reads that failed")                          \
  /* Write buffer. */                                                        \
  GAUGE(write_buffer_capacity_bytes, "Bytes of the DRAM write buffer")       \
  COUNTER(write_buffer_admits, "Writes admitted to the write buffer")        \
  COUNTER(write_buffer_refusals, "Writes refused: write buffer full")        \
  GAUGE(buffered_bytes, "Write buffer space in use now")                     \
  GAUGE(unflushed_objects, "Objects committed, not yet on the tier")         \
  COUNTER(flushed_bytes, "Bytes flushed to the tier")                        \
  COUNTER(flushed_objects, "Objects flushed to the tier")                    \
  COUNTER(flush_batches, "Flush batches written")                            \
  COUNTER(flush_ios, "Flush I/Os issued")                                    \
  COUNTER(flush_errors, "Failed flush batch writes and forgets")             \
  COUNTER(superseded_writes, "Buffered objects overwritten unflushed")       \
  /* Durable extent records (group commits of flushed objects). */           \
  GAUGE(record_pending_objects, "Objects on the tier, not recorded yet")     \
  COUNTER(recorded_objects, "Objects durably recorded")                      \
  COUNTER(record_batches, "Successful Record calls")                         \
  COUNTER(record_errors, "Failed Record calls (retried)")                    \
  COUNTER(records_dropped, "Pending records of overwritten objects")        \
  /* Checksums (CRC32C of each object's bytes on the tier). */               \
  GAUGE(open_verified_objects, "Re-adopted at open, checksum matched")       \
  GAUGE(open_verified_bytes, "Bytes verified at open")                       \
  DGAUGE(open_verify_seconds, "Time the verification at open took")          \
  GAUGE(open_unchecked_objects, "Re-adopted at open unchecked")              \
  GAUGE(open_dropped_objects, "Not re-adopted at open: mismatch or unreadable") \
  COUNTER(checksum_failures, "Checksum mismatches, at open and on reads")    \
  COUNTER(verified_reads, "Tier reads checked (verify_reads)")               \
  COUNTER(read_checksum_failures, "Checked tier reads that mismatched")      \
  COUNTER(corrupt_refusals, "Reads or prefetches of a known-corrupt object refused") \
  COUNTER(corrupt_records_forgotten, "Records of corrupt objects durably forgotten") \
  /* Discard (reconciliation): calls acted on, their forgets done. */        \
  COUNTER(discarded_objects, "Discards acted on")                            \
  COUNTER(discarded_records_forgotten, "Records of discarded objects durably forgotten") \
  DGAUGE(commit_checksum_seconds, "CommitWrite time computing checksums")
HYM_DECLARE_STATS_STRUCT(HybridDeviceCounters, HYM_HYBRID_DEVICE_STATS);

struct HybridDeviceStats : HybridDeviceCounters {
  MemoryDeviceStats device;
  // Pages backing the window: "thp", "hugetlb-2m" or "4k" (slow for device
  // I/O: see host_memory.h).
  const char* staging_pages = "";
  absl::Duration flush_lag;  // age of the oldest unflushed commit
};

class HybridDevice final : public MemoryDevice {
 public:
  // Takes ownership of `tier` (the region is its data area).
  // Errors: InvalidArgument (options, null tier, tier capacity not a
  // multiple of 4 KiB), ResourceExhausted (DRAM cannot be reserved, the
  // flusher cannot start, or verify_on_open's buffers).
  static absl::StatusOr<std::unique_ptr<HybridDevice>> Create(
      const HybridDeviceOptions& options, std::unique_ptr<CapacityTier> tier);
  ~HybridDevice() override;
  HybridDevice(const HybridDevice&) = delete;
  HybridDevice& operator=(const HybridDevice&) = delete;

  std::vector<RegionDescriptor> Regions() const override;

  // Errors: InvalidArgument/OutOfRange (range), ResourceExhausted (too many
  // bounce bytes outstanding), Unavailable (tier read failed or timed out),
  // DataLoss (verify_reads: the object's checksum does not match).
  absl::StatusOr<ReadView> AcquireRead(uint32_t region, uint64_t addr,
                                       uint64_t len) override;
  // Unknown or repeated views are counted (unknown_releases) and ignored.
  void ReleaseRead(const ReadView& view) override;

  // Errors: InvalidArgument (range, unaligned addr), OutOfRange,
  // ResourceExhausted("write buffer full") at once when the object does not
  // fit in the buffer now.
  absl::StatusOr<WriteView> BeginWrite(uint32_t region, uint64_t addr,
                                       uint64_t len, uint64_t tag) override;
  // Makes the object readable from the buffer and queues it for flushing,
  // after computing its CRC32C on the calling thread (about 50 us per MiB
  // with SSE4.2 on bytes still in the cache).
  // Errors: InvalidArgument for an unknown view.
  absl::Status CommitWrite(const WriteView& view) override;
  void AbortWrite(const WriteView& view) override;

  // Errors: InvalidArgument/OutOfRange (range), ResourceExhausted (larger
  // than the whole window), DataLoss (verify_reads: the object failed its
  // checksum before).
  absl::StatusOr<PrefetchHandle> PrefetchObject(uint32_t region, uint64_t addr,
                                                uint64_t len) override;
  // Errors: DeadlineExceeded (not staged yet; the handle stays valid),
  // Unavailable (the refill failed), DataLoss (verify_reads: the staged
  // bytes do not match the object's checksum), InvalidArgument (unknown
  // handle).
  absl::StatusOr<const uint8_t*> PrefetchWait(const PrefetchHandle& handle,
                                              absl::Time deadline) override;
  // Drops the handle. A queued prefetch is cancelled; an in-flight one keeps
  // its window space until its I/O completes. Unknown or repeated handles
  // are counted (unknown_releases) and ignored.
  void PrefetchRelease(const PrefetchHandle& handle) override;

  MemoryDeviceStats Stats() const override;
  HybridDeviceStats HybridStats() const;
  // Stats(), HybridStats() ("flush_lag_seconds" for flush_lag) and the
  // flush latency histogram ("flush_seconds").
  void VisitStats(StatsVisitor* v) const override;

  std::vector<RecoveredExtent> RecoveredExtents() const override;

  // Drops the object (a buffered copy is superseded, a staged one
  // invalidated, a pending record dropped) and has the flusher durably
  // forget its record, unless a newer write covers the range (its commit
  // cancels a queued forget). Readers holding the object keep their views.
  void Discard(uint32_t region, uint64_t addr, uint64_t len,
               uint64_t tag) override;

  // Area ids of Areas(): the staging window and the write buffer.
  static constexpr uint32_t kStagingAreaId = 1;
  static constexpr uint32_t kWriteBufferAreaId = 2;
  // Two areas: the staging window (kStagingAreaId, kind "staging") and the
  // write buffer (kWriteBufferAreaId, kind "write_buffer"), each with its
  // memfd (-1 unless options.shareable). PrefetchWait pointers lie in one of
  // them, BeginWrite views in the write buffer; AcquireRead bounce buffers
  // (staging misses) lie outside both.
  std::vector<MemoryArea> Areas() const override;

  // Blocks until every committed object is durable (written and recorded)
  // or `deadline` passes; returns whether nothing is left to flush or
  // record. Flushing itself still follows the policy above unless `force`,
  // which ignores read pressure (as shutdown does).
  bool WaitFlushedForTest(absl::Time deadline, bool force = false);

  // Wakes the flusher and waits until it has made one whole pass of its
  // decisions begun after this call (reading options.clock then: a
  // FakeClock advanced before the call is seen) and is waiting again, so
  // that whatever it decided (a batch, a Forget, a Record) has been issued.
  // Tests call it before asserting that something did NOT happen. False if
  // `deadline` (real time) passes first.
  bool SettleFlusherForTest(absl::Time deadline);

  CapacityTier* tier() const { return tier_.get(); }

 private:
  using Staged = StagedObject;
  struct Entry;
  struct MissRead;
  struct FlushBatch;
  struct IoReq;
  // An object on the tier whose extent is not recorded yet.
  struct PendingRecord {
    DurableExtent extent;
    uint64_t seq = 0;  // commit sequence: records go in commit order
    absl::Time since;  // when its bytes landed
    // A write over its range began while it was in the running Record: it
    // must not be put back if that Record fails.
    bool dropped = false;
  };
  // What verify_on_open found, for the stats.
  struct OpenCheck {
    uint64_t verified_objects = 0;
    uint64_t verified_bytes = 0;
    uint64_t unchecked_objects = 0;
    uint64_t dropped_objects = 0;
    uint64_t checksum_failures = 0;
    absl::Duration elapsed;
  };
  enum class ReadKind { kWindow, kBuffer, kBounce };
  struct ReadRec {
    ReadKind kind;
    Staged* staged = nullptr;
    Entry* entry = nullptr;
    MissRead* miss = nullptr;
  };
  struct HandleRec {
    uint64_t addr = 0;
    uint64_t len = 0;
    Staged* staged = nullptr;  // exactly one of staged / entry
    Entry* entry = nullptr;
  };

  HybridDevice(const HybridDeviceOptions& options,
               std::unique_ptr<CapacityTier> tier,
               std::unique_ptr<RangeAllocator> window_alloc,
               std::unique_ptr<RangeAllocator> buffer_alloc,
               const std::vector<DurableExtent>& durable,
               const OpenCheck& open_check,
               std::unique_ptr<HostMemory> window_memory,
               uint64_t window_bytes,
               std::unique_ptr<HostMemory> buffer_memory,
               uint64_t buffer_bytes);
  absl::Status Check(uint32_t region, uint64_t addr, uint64_t len) const;

  // --- all below: REQUIRES mu_ held, unless noted.
  Entry* FindBufferedLocked(uint64_t addr, uint64_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AcquireRead's parts. Hands `v` out: its data, a new cookie, the stats.
  void AdmitReadLocked(ReadView* v, const uint8_t* data, const ReadRec& rec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A read of a staged object not queued any more: waits (up to
  // read_timeout, releasing mu_) for it to be staged and checked. True:
  // served from the window; false: failed or too slow (read the tier);
  // DataLoss: its checksum failed.
  absl::StatusOr<bool> ReadStagedLocked(Staged* s, ReadView* v)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A staging miss: reads `v`'s object from the tier into a bounce buffer
  // (mu_ released around the I/O submission, the wait and the CRC).
  absl::StatusOr<ReadView> ReadMissLocked(ReadView v)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks buffered objects overlapping the range superseded and drops
  // pending records overlapping it.
  void SupersedeLocked(uint64_t addr, uint64_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropPendingRecordsLocked(uint64_t addr, uint64_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases pending records overlapping the range; returns how many.
  int ErasePendingRecordsLocked(uint64_t addr, uint64_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddPendingRecordLocked(PendingRecord r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A read of (addr, len) did not match `crc`: refuse the object from now
  // on, drop its pending record and have the flusher forget its record
  // (unless a write replaced it meanwhile: TierChecksums::MarkCorrupt).
  void MarkCorruptLocked(uint64_t addr, uint64_t len, uint32_t crc)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks a staged object whose bytes are in (state kLoaded), releasing
  // mu_ while the CRC is computed; leaves it kReady or kFailed. `s` stays
  // alive only if the caller holds a reference.
  void CheckStagedLocked(Staged* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeFreeEntryLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeFreeStagedLocked(Staged* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the queued refill chunks of `s` if nothing owns it, has the
  // window free what it can (StagingWindow::Release) and starts what fits
  // then. May delete `s`.
  void PumpWindowLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueChunksLocked(IoReq proto, uint64_t span, std::deque<IoReq>* q)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves I/O the limits allow from the queues to `out` (issue after
  // unlocking, with Issue()).
  // Flush writes allowed in flight now (see the flush policy above).
  int FlushDepthLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeIssuableLocked(std::vector<IoReq>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns write buffer space; a failure (a broken invariant) is logged.
  void FreeBufferSpaceLocked(uint64_t off) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ForegroundBusyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FlushDueLocked(absl::Time now, absl::Time* wake) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The flush policy's view of the write side now.
  FlushPolicyState FlushStateLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Accounts the reads in flight since the last change (call before
  // changing reads_in_flight_).
  void NoteDepthLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefillIoStartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefillIoEndLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Without mu_.
  void Issue(std::vector<IoReq>* reqs) ABSL_LOCKS_EXCLUDED(mu_);
  void OnIoDone(const IoReq& req, absl::Status status)
      ABSL_LOCKS_EXCLUDED(mu_);
  void FlusherLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // The flusher's steps; REQUIRES mu_ held (they release it around tier
  // calls and I/O submission).
  // The next batch: queued objects forgotten and not in flight, in commit
  // order, up to flush_batch_bytes, stopping before one that overlaps a
  // batch in flight (FlushBatchChooser decides).
  std::vector<Entry*> PickBatchLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a queued object is not forgotten yet.
  bool ForgetNeededLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CapacityTier::Forget over queued objects not forgotten yet, one call
  // per contiguous address range: every range if `all`, else the one
  // holding the oldest such object.
  absl::Status ForgetQueuedLocked(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Buffer fill at or above flush_high_watermark.
  bool PressureLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the writes of a batch of forgotten objects.
  void StartBatchLocked(std::vector<Entry*> batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void IssueBatchLocked(FlushBatch* fb) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One synced CapacityTier::Record of every pending record.
  void RecordPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One synced CapacityTier::ForgetRanges of the corrupt objects' records.
  void ForgetCorruptLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BackOffLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResetBackoffLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the last write of `fb` completes (any thread): frees the buffer
  // space of its objects (once unpinned) and makes their records pending,
  // or keeps them queued on an error. Deletes fb.
  void RetireBatchLocked(FlushBatch* fb) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Flush batches whose writes may be queued or in flight at once (how many
  // writes are in flight is FlushDepthLocked's).
  static constexpr int kMaxFlushBatchesInFlight = 4;

  // Constant after construction.
  const HybridDeviceOptions options_;
  const std::unique_ptr<CapacityTier> tier_;
  BlockIo* const io_;
  const uint64_t capacity_;
  const std::vector<RecoveredExtent> recovered_;
  const FlushPolicy flush_policy_;
  const IoPolicy io_policy_;
  Clock* const clock_;
  // The DRAM of the staging window and the write buffer (page-rounded;
  // window_bytes_ and buffer_bytes_ of them are used).
  const std::unique_ptr<HostMemory> window_memory_;
  const std::unique_ptr<HostMemory> buffer_memory_;
  uint8_t* const window_;
  const uint64_t window_bytes_;
  uint8_t* const buffer_;
  const uint64_t buffer_bytes_;

  // One mutex for the window, the buffer, the I/O queues and the flush
  // pipeline, on purpose: the decisions couple them (which I/O to issue
  // reads both queues, the in-flight counts and the buffer's fill; one
  // completion retires a batch, frees buffer space, records, and issues
  // the next refills; a write supersedes buffered objects, invalidates
  // staged copies and drops pending records atomically), so split locks
  // would be taken together on every hot path, with an ordering to keep.
  // Every critical section is short: the lock is never held across I/O, a
  // tier call or a CRC pass (CheckStagedLocked and CommitWrite release it),
  // and on the device bench the device is I/O bound, not lock bound. So
  // staging_ and checksums_ do not lock either: every call into them is
  // made with mu_ held.
  mutable Mutex mu_;
  CondVar cv_;  // any state change a waiter may care about

  // Protected by mu_.
  // The window's space, its staged objects (keyed, unkeyed with owners,
  // or waiting for I/O or for space) and its FIFO.
  StagingWindow staging_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<RangeAllocator> buffer_alloc_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, HandleRec> handles_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, ReadRec> reads_out_ ABSL_GUARDED_BY(mu_);
  // Every Entry alive, by id (= WriteView cookie).
  std::map<uint64_t, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  // Committed, not superseded, not yet durable+released: readable, by addr.
  std::map<uint64_t, Entry*> live_ ABSL_GUARDED_BY(mu_);
  // Committed and not yet on the tier, by commit sequence.
  std::map<uint64_t, Entry*> flush_queue_ ABSL_GUARDED_BY(mu_);
  // Batches with writes queued or in flight, oldest first.
  std::deque<std::unique_ptr<FlushBatch>> pipeline_ ABSL_GUARDED_BY(mu_);
  // On the tier, record not issued yet, by addr; never overlapping.
  std::map<uint64_t, PendingRecord> record_pending_ ABSL_GUARDED_BY(mu_);
  // The records of the Record call running now (empty when none runs).
  std::vector<PendingRecord> recording_ ABSL_GUARDED_BY(mu_);
  // The flusher's last tier call was a Forget (vs a Record).
  bool last_was_forget_ ABSL_GUARDED_BY(mu_) = false;
  // verify_reads: checksums of the objects on the tier (recorded or
  // pending); and the corrupt and discarded objects' records to forget,
  // and those being forgotten now.
  TierChecksums checksums_ ABSL_GUARDED_BY(mu_);
  std::deque<IoReq> read_q_ ABSL_GUARDED_BY(mu_);
  std::deque<IoReq> write_q_ ABSL_GUARDED_BY(mu_);
  int reads_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int writes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int refill_ios_ ABSL_GUARDED_BY(mu_) = 0;  // refill reads in flight
  absl::Time refill_busy_since_ ABSL_GUARDED_BY(mu_);
  absl::Duration refill_busy_ ABSL_GUARDED_BY(mu_);
  absl::Time depth_since_ ABSL_GUARDED_BY(mu_);
  double read_depth_integral_ ABSL_GUARDED_BY(mu_) = 0;  // depth x seconds
  double read_busy_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bounce_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time stop_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  int force_flush_ ABSL_GUARDED_BY(mu_) = 0;
  // SettleFlusherForTest: requests made, and the last request the flusher
  // saw at the start of a pass that then reached its wait.
  uint64_t settle_requested_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t settled_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_);
  // The last failed flush write or Forget, until a batch is written again
  // (named in write refusals: why the buffer does not drain).
  absl::Status last_flush_error_ ABSL_GUARDED_BY(mu_);
  HybridDeviceStats stats_ ABSL_GUARDED_BY(mu_);
  LatencyHistogram flush_latency_;  // lock-free

  // OnIoDone calls still running (they touch `this` after the in-flight
  // counts drop, so destruction also waits for this to reach 0).
  std::atomic<int> callbacks_running_{0};

  Thread flusher_;
};

}  // namespace hymcache::storage
