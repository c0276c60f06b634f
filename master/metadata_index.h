// MetadataIndex: the master's in-memory map from object key to where the
// object lives. Sized for tens of millions of entries, so it is compact:
//
//   - every entry is one 64-byte record (one cache line) holding the key and
//     the location; keys of up to 32 bytes (the client's SHA-256 prefix keys
//     are exactly 32) are stored inline, longer ones in a separate heap
//     buffer;
//   - records live in fixed-size chunks (no large reallocations while
//     growing) and freed records are reused;
//   - the hash table (absl::flat_hash_set) holds only 4-byte record numbers;
//   - recency: every entry is on its node's exact LRU list, an intrusive
//     doubly-linked list threaded through a parallel array of 12-byte links
//     per record number (prev, next, read tick), chunked like the records;
//     insert, touch and unlink are O(1). Per node only the two list ends are
//     kept (a small map).
//
// At 1e6 32-byte keys this is ~87 heap bytes per entry, against ~150-190
// for absl::flat_hash_map<std::string, Entry> (run metadata_index_benchmark).
//
// Recency and read ticks: Upsert puts the entry at the most recent end of
// its node's list with read tick 0 ("never read"); Touch moves it there and
// records a read tick. Ticks are opaque uint32 values chosen by the owner
// (MasterService uses milliseconds since a base it moves forward with
// RebaseReadTicks, so ticks never wrap); the index only stores them.
// ForEachLeastRecent walks one node's list from the least recent end. None
// of this is persisted: the owner rebuilds the index in load order.
//
// Limits: keys of 1..65535 bytes, lengths below 2^48, at most 2^32 - 1
// entries; Insert reports violations as InvalidArgument.
//
// Thread safety: not thread-safe. Const methods may run concurrently with
// each other; anything else needs external synchronization (MasterService
// holds its mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hymcache {
namespace master {

// Where one committed object lives (the same fields as v1::Location).
struct IndexEntry {
  uint32_t node_id = 0;
  uint32_t region_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t generation = 0;

  bool operator==(const IndexEntry& o) const {
    return node_id == o.node_id && region_id == o.region_id &&
           addr == o.addr && length == o.length && generation == o.generation;
  }
};

class MetadataIndex {
 public:
  static constexpr size_t kMaxKeyBytes = 65535;
  static constexpr uint64_t kMaxLength = (uint64_t{1} << 48) - 1;

  MetadataIndex();
  ~MetadataIndex();
  MetadataIndex(const MetadataIndex&) = delete;
  MetadataIndex& operator=(const MetadataIndex&) = delete;

  // Adds `key` -> `entry`, or replaces the entry if `key` is present.
  // Either way the entry becomes the most recent of entry.node_id's list,
  // with read tick 0. Returns the replaced entry, if any.
  // Errors: InvalidArgument if the key is empty or too long or entry.length
  // > kMaxLength; ResourceExhausted at 2^32 - 1 entries (nothing changes).
  absl::StatusOr<std::optional<IndexEntry>> Upsert(absl::string_view key,
                                                   const IndexEntry& entry);

  // The entry of `key`, if present.
  std::optional<IndexEntry> Find(absl::string_view key) const;

  // Removes `key` (and unlinks it from its recency list); returns its entry
  // if it was present.
  std::optional<IndexEntry> Erase(absl::string_view key);

  // Makes `key` the most recent entry of its node's list and sets its read
  // tick to `read_tick`. Returns false (and changes nothing) if `key` is
  // absent. Touching keys k[n-1], ..., k[0] in that order leaves k[0] the
  // most recent: walks from the least recent end meet k[n-1] first.
  bool Touch(absl::string_view key, uint32_t read_tick);

  // The read tick of `key` (0 if never touched since its Upsert), if present.
  std::optional<uint32_t> ReadTick(absl::string_view key) const;

  // Calls `fn` for the entries of `node_id`, least recently used first,
  // until it returns false or the list ends. `fn` must not modify the index.
  void ForEachLeastRecent(
      uint32_t node_id,
      const std::function<bool(absl::string_view key, const IndexEntry& entry,
                               uint32_t read_tick)>& fn) const;

  // Lowers every nonzero read tick by `shift`; ticks <= `shift` become 0.
  // O(entries); lets the owner keep ticks small without wrapping.
  void RebaseReadTicks(uint32_t shift);

  // Removes every entry for which `pred` returns true and returns the
  // removed (key, entry) pairs.
  std::vector<std::pair<std::string, IndexEntry>> EraseIf(
      const std::function<bool(absl::string_view, const IndexEntry&)>& pred);

  // Calls `fn` for every entry (unspecified order). `fn` must not modify the
  // index.
  void ForEach(
      const std::function<void(absl::string_view, const IndexEntry&)>& fn)
      const;

  // Calls `fn` for up to `max` entries in record-number order, starting at
  // record `begin`, until it returns false; returns the record number to
  // resume at (the one `fn` declined, or records_end() when the walk is
  // complete). Entries inserted or erased between calls may or may not be
  // visited; none is visited twice unless it is erased and inserted again.
  // `fn` must not modify the index.
  uint32_t ForEachFrom(
      uint32_t begin, size_t max,
      const std::function<bool(absl::string_view, const IndexEntry&)>& fn)
      const;
  // One past the highest record number in use.
  uint32_t records_end() const { return records_used_; }

  size_t size() const { return set_.size(); }
  bool empty() const { return set_.empty(); }

  // Heap bytes held by the index (hash table, record chunks, free list and
  // out-of-line keys); an estimate from capacities, not a malloc census.
  size_t MemoryBytes() const;

  // Pre-sizes the hash table for `n` entries.
  void Reserve(size_t n);

 private:
  struct Record;
  // Hash and equality of record numbers by the key they hold, and of keys
  // (heterogeneous lookup without building a record).
  struct Hash {
    using is_transparent = void;
    const MetadataIndex* index;
    size_t operator()(uint32_t i) const { return HashKey(index->KeyOf(i)); }
    size_t operator()(absl::string_view k) const { return HashKey(k); }
  };
  struct Eq {
    using is_transparent = void;
    const MetadataIndex* index;
    bool operator()(uint32_t a, uint32_t b) const {
      return a == b || index->KeyOf(a) == index->KeyOf(b);
    }
    bool operator()(uint32_t a, absl::string_view b) const {
      return index->KeyOf(a) == b;
    }
    bool operator()(absl::string_view a, uint32_t b) const {
      return a == index->KeyOf(b);
    }
  };
  using Set = absl::flat_hash_set<uint32_t, Hash, Eq>;

  static constexpr size_t kChunkShift = 12;  // 4096 records (256 KiB) per chunk
  static constexpr size_t kChunkSize = size_t{1} << kChunkShift;
  static constexpr uint32_t kNil = 0xffffffffu;  // no record (list end)

  // Recency links of one record number; parallel to the records.
  struct Links {
    uint32_t prev;       // less recent neighbour, or kNil
    uint32_t next;       // more recent neighbour, or kNil
    uint32_t read_tick;  // last Touch, 0 if none since Upsert
  };
  // One node's recency list.
  struct List {
    uint32_t least = kNil;  // least recently used end
    uint32_t most = kNil;   // most recently used end
  };

  static size_t HashKey(absl::string_view key);
  absl::string_view KeyOf(uint32_t i) const;
  Record& record(uint32_t i) const;
  Links& links(uint32_t i) const;
  uint32_t NewRecord();
  void FreeRecord(uint32_t i);
  // Appends record i at the most recent end of `node_id`'s list / `list`.
  void LinkMostRecent(uint32_t i, uint32_t node_id);
  void LinkMostRecent(uint32_t i, List& list);
  // Takes record i out of `node_id`'s list, dropping the list if empty.
  void Unlink(uint32_t i, uint32_t node_id);
  // Takes record i out of `list` (which may become empty).
  void Unlink(uint32_t i, List& list);

  std::vector<std::unique_ptr<Record[]>> chunks_;
  std::vector<std::unique_ptr<Links[]>> link_chunks_;  // parallel to chunks_
  absl::flat_hash_map<uint32_t, List> lists_;           // by node id
  uint32_t records_used_ = 0;       // high-water mark of record numbers
  std::vector<uint32_t> free_records_;
  size_t out_of_line_key_bytes_ = 0;
  Set set_;
};

}  // namespace master
}  // namespace hymcache
