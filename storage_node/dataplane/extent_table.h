// ExtentTable: the storage node's record of which objects are in its memory,
// so that every data-plane read and write is checked against the region and
// the allocation the master handed out.
//
// The master hands out allocations (region, addr, length, generation).
// Generations are cluster-wide, unique and increasing; when the master frees
// space and hands it out again, the new allocation has a higher generation.
// The table enforces:
//   * A write of (region, addr, len, gen) is accepted if the range lies in the
//     region and no overlapping extent has a generation >= gen (else
//     FailedPrecondition). Overlapping extents with lower generations are
//     invalidated (no new read can pin them) and dropped once their readers
//     have finished, never before: a write that fails while it waits for
//     them (Unavailable after drain_timeout) leaves them readable.
//   * While the bytes are being written the extent is not readable. Commit
//     makes it readable; an aborted or failed write leaves nothing readable.
//   * A read succeeds only for a readable extent with exactly that addr,
//     length and generation (else NotFound), and pins the extent until the
//     ReadPin is released.
//   * A write never changes bytes under a reader or another writer: it waits
//     (up to drain_timeout) for the pins of the overlapping older extents
//     and the in-progress writes it supersedes to drain, and fails with
//     Unavailable if they do not. Only an older write still in progress
//     that outlives the wait makes it fail after it has invalidated the
//     older extents (the master then reallocated space a writer still
//     holds: the client's capability for it has expired by then or soon).
//   * Of two concurrent writes to overlapping ranges, the lower generation
//     loses (FailedPrecondition at its BeginWrite or at its Commit).
//   * A write whose generation is above the generation ceiling (the highest
//     the master says it has issued) is refused with FailedPrecondition, so
//     a bogus generation cannot shadow space.
//   * Clear() forgets every extent at once (the master no longer knows this
//     node's objects); it never changes bytes under a reader or a writer.
//
// Thread safety: safe for concurrent use without external synchronization.
// ReadPin and WriteTicket are used by one thread at a time and must not
// outlive the table.
#pragma once

#include <cstdint>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "storage_node/device/memory_device.h"

namespace hymcache::storage {

// One allocation as the master describes it (proto Location minus node id).
struct ExtentKey {
  uint32_t region_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t generation = 0;
};

struct ExtentTableOptions {
  // The regions whose space the table tracks (MemoryDevice::Regions()). Ids
  // must be distinct; at least one region.
  std::vector<RegionDescriptor> regions;
  // How long a write waits for readers (and an older in-progress write) of
  // the space it reuses before failing with Unavailable.
  // Default: 5 s
  absl::Duration drain_timeout = absl::Seconds(5);

  absl::Status Validate() const;
};

struct ExtentTableStats {
  uint64_t extents = 0;         // readable extents
  uint64_t bytes = 0;           // bytes of readable extents
  uint64_t writing = 0;         // writes in progress
  uint64_t retired = 0;         // invalidated extents still pinned/written
  uint64_t pinned_reads = 0;    // outstanding ReadPins
  uint64_t waiting_writes = 0;  // writes waiting for readers of the space
                                // they reuse (BeginWrite)
};

class ExtentTable {
 private:
  struct Extent;

 public:
  // A pinned readable extent. Releases the pin when destroyed. Move-only.
  class ReadPin {
   public:
    ReadPin() = default;
    ReadPin(ReadPin&& o) noexcept;
    ReadPin& operator=(ReadPin&& o) noexcept;
    ~ReadPin() { Release(); }
    ReadPin(const ReadPin&) = delete;
    ReadPin& operator=(const ReadPin&) = delete;

    bool valid() const { return extent_ != nullptr; }
    // Ends the pin. Idempotent.
    void Release();

   private:
    friend class ExtentTable;
    ReadPin(ExtentTable* table, Extent* extent)
        : table_(table), extent_(extent) {}
    ExtentTable* table_ = nullptr;
    Extent* extent_ = nullptr;
  };

  // An extent being written. Aborts when destroyed unless committed.
  // Move-only.
  class WriteTicket {
   public:
    WriteTicket() = default;
    WriteTicket(WriteTicket&& o) noexcept;
    WriteTicket& operator=(WriteTicket&& o) noexcept;
    ~WriteTicket() { Abort(); }
    WriteTicket(const WriteTicket&) = delete;
    WriteTicket& operator=(const WriteTicket&) = delete;

    bool valid() const { return extent_ != nullptr; }
    // Makes the extent readable. FailedPrecondition if a higher generation
    // took over the range meanwhile (the extent is then dropped).
    // REQUIRES: valid(). The ticket is finished either way.
    absl::Status Commit();
    // Drops the extent; nothing becomes readable. Idempotent.
    void Abort();

   private:
    friend class ExtentTable;
    WriteTicket(ExtentTable* table, Extent* extent)
        : table_(table), extent_(extent) {}
    ExtentTable* table_ = nullptr;
    Extent* extent_ = nullptr;
  };

  // Errors: InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<ExtentTable>> Create(
      const ExtentTableOptions& options);
  ~ExtentTable();
  ExtentTable(const ExtentTable&) = delete;
  ExtentTable& operator=(const ExtentTable&) = delete;

  // Pins the readable extent `key`.
  // Errors: InvalidArgument (unknown region, length 0), OutOfRange (beyond
  // the region), NotFound (no readable extent with exactly this addr, length
  // and generation: the object is not on this node or its space was reused).
  absl::StatusOr<ReadPin> PinRead(const ExtentKey& key);

  // Starts writing `key`; may block up to drain_timeout for older readers,
  // and never past `deadline` (a data-plane request's io_timeout).
  // Errors: InvalidArgument/OutOfRange as PinRead, FailedPrecondition (the
  // generation is above the generation ceiling, or an overlapping extent has
  // the same or a higher generation), Unavailable (readers of the reused
  // space did not drain in time).
  absl::StatusOr<WriteTicket> BeginWrite(
      const ExtentKey& key, absl::Time deadline = absl::InfiniteFuture());

  // Writes with a generation above `ceiling` are refused from now on
  // (writes already begun are not affected). The ceiling may go down: a
  // master that lost its state issues generations from a low value again.
  // Initially there is no ceiling (UINT64_MAX).
  void SetGenerationCeiling(uint64_t ceiling);
  uint64_t generation_ceiling() const;

  // Forgets every extent: nothing is readable afterwards and no old
  // generation blocks a new write. Reads already pinned finish normally and
  // keep their bytes until released (a new write of the space waits for
  // them as usual); writes in progress never become readable (their Commit
  // fails with FailedPrecondition).
  void Clear();

  // The sequence number the next BeginWrite gets (writes are numbered in
  // the order they begin).
  uint64_t WriteSequence() const;
  // As Clear(), but only for extents whose write began before `before_seq`
  // (WriteSequence() at some earlier point) or whose generation is above
  // `max_generation`. A node that re-registers uses it to drop what it held
  // before the master forgot it, without dropping writes the master placed
  // after it registered.
  void ClearStale(uint64_t before_seq, uint64_t max_generation);

  // Drops the readable extent with exactly `key` (the master neither lists
  // it nor has a put pending for it): nothing can pin it afterwards. Pins
  // already taken keep their bytes until released, as with Clear(). Returns
  // false (and changes nothing) if no readable extent matches exactly.
  bool Drop(const ExtentKey& key);

  // Position of a ListReadable walk; a default cursor starts at the
  // beginning.
  struct Cursor {
    uint32_t region_id = 0;
    uint64_t addr = 0;
    bool done = false;
  };
  // Appends up to `max` readable extents to `out` in (region, addr) order,
  // starting at `*cursor`, and advances it (cursor->done once the walk has
  // passed the last region). The walk takes the table's lock once per call,
  // so a long listing does not block writers; extents written or dropped
  // meanwhile may or may not appear.
  void ListReadable(Cursor* cursor, size_t max, std::vector<ExtentKey>* out)
      const;

  ExtentTableStats Stats() const;

 private:
  struct Region {
    uint64_t capacity = 0;
    // Readable and being-written extents by addr; never overlapping.
    std::map<uint64_t, std::unique_ptr<Extent>> live;
  };

  // Writes waiting in BeginWrite for the readers of the space they reuse
  // (not yet in the live map); a waiting write gives way to a newer one.
  struct Waiting {
    ExtentKey key;
    uint64_t seq;
    bool cleared = false;  // by ClearStale: the write fails
  };
  using LiveIterators =
      std::vector<std::map<uint64_t, std::unique_ptr<Extent>>::iterator>;

  explicit ExtentTable(const ExtentTableOptions& options);

  absl::StatusOr<Region*> FindRegion(const ExtentKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Live extents of `region` that overlap [addr, addr + len).
  std::vector<std::map<uint64_t, std::unique_ptr<Extent>>::iterator>
  OverlappingLive(Region* region, uint64_t addr, uint64_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RetiredBlocks(const ExtentKey& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `e` from its region's live map; keeps it in retired_ while it is
  // pinned or written, else frees it. A retired extent blocks writes of
  // lower generations over its space until it is freed, unless it was
  // cleared.
  void Retire(Region* region, Extent* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees a retired extent once nothing refers to it.
  void MaybeFreeRetired(Extent* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BeginWrite's wait until nothing blocks a write of `key`: not a newer
  // write waiting or live over its space, nor readers of the extents it
  // replaces or of retired ones there. Enters waiting_ (`*me`) when it first
  // has to wait, up to `deadline`. OK when nothing blocks it (then
  // `*overlapping` is current); else why the write fails.
  absl::Status WaitToWriteLocked(const ExtentKey& key, Region* region,
                                 uint64_t seq, absl::Time deadline,
                                 std::list<Waiting>::iterator* me,
                                 LiveIterators* overlapping)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Unpin(Extent* e);
  absl::Status Commit(Extent* e);
  void Abort(Extent* e);

  // Constant after construction.
  const absl::Duration drain_timeout_;

  static constexpr uint64_t kNoCeiling = std::numeric_limits<uint64_t>::max();

  mutable Mutex mu_;
  CondVar cv_;  // signalled when a retired extent loses a pin or writer
  std::map<uint32_t, Region> regions_ ABSL_GUARDED_BY(mu_);
  // Invalidated extents that still have pins or an in-progress write.
  std::vector<std::unique_ptr<Extent>> retired_ ABSL_GUARDED_BY(mu_);
  // Writes waiting in BeginWrite for the readers of the space they reuse
  // (Waiting, above).
  std::list<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  uint64_t readable_count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t readable_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t writing_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pins_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ceiling_ ABSL_GUARDED_BY(mu_) = kNoCeiling;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace hymcache::storage
