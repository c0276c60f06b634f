// MetadataIndex: the master's in-memory map from object key to where the
// object lives, with each node's recency order and the objects' chain
// structure. Sized for 100 million entries, so it is compact:
//
//   - every entry is one 64-byte, line-aligned record holding the key, the
//     recency links (prev/next record numbers), the chain parent, the read
//     tick, the flags and the packed location; keys of up to 32 bytes (the
//     client's SHA-256 prefix keys are exactly 32) are stored inline, longer
//     ones in a separate heap buffer; a lookup reads one record line, a
//     touch writes it and its list neighbours';
//   - the location packs into 16 bytes: (node, region, length) is a shared,
//     reference-counted "shape" named by 21 bits (KV blocks take few
//     lengths), addr and generation 48 bits each; an entry whose values do
//     not fit (more than kMaxShapes shapes, addr or generation >= 2^48) keeps
//     its location in a side table instead: nothing is refused;
//   - same-node child counts of up to 6 live in the record, larger ones in a
//     side table (only shared prefixes have them);
//   - records live in fixed-size chunks (no large reallocations while
//     growing) and freed records are reused;
//   - the hash table holds 4-byte record numbers with a 1-byte hash tag
//     each, in groups of 7 with an overflow count (tags beside their slots;
//     a lookup, hit or miss, usually reads one group), at up to 7/8 load,
//     growing by 1.25x (5.9-7.3 bytes per entry);
//   - per node only the two list ends are kept (a small map).
//
// At 10 M 32-byte keys this is ~71 heap bytes per entry, against ~157 for
// absl::flat_hash_map<std::string, ObjectLocation> (run
// metadata_index_benchmark).
//
// Chains: a KV-cache object is a block of a prefix chain; a block is
// reachable (a reader's Load gets to it) only through every block before it.
// Upsert takes the key of the block before (the parent). When the parent is
// present the entry is linked to it: it records the parent and the parent
// counts it as a child. A link to a parent on another node (a chain
// continued elsewhere because its node was full or down) is a cross link:
// the child is a root of its node's recency list and its parent counts it
// apart (a small side table: cross links are rare), so eviction and recency
// stay per node, but erasing the parent still orphans the child. A leaf is
// an entry with no children on its node; PickEvictions only chooses leaves
// (or entries all of whose children it chose before), so no eviction leaves
// a block on the same node whose parent is gone, and the owner removes the
// cross-linked descendants of what it evicts (Orphans()).
//
// Erasing an entry that still has children (Remove of a middle block, a
// purge, a dropped listing) does not free its record at once: the record
// becomes a ghost (no key, not findable, not on any list) that its children
// still point to, and is freed when its last child goes. The entries below
// a ghost are orphans: their chain is broken, no reader reaches them.
// Orphans() finds them (a walk of the affected nodes' lists) so that the
// owner removes them; nothing is ever left pointing at a reused record.
//
// Recency and read ticks: Upsert puts a root entry at the most recent end
// of its node's list, and a linked entry just below its parent (a chain's
// continuation shares the recency of the chain it extends: the parent was
// just read by the Load that preceded the Store), both with read tick 0
// ("never read"). Touch moves a root to the most recent end and a linked
// entry just below its parent, and records a read tick. So every linked
// entry is less recent than its parent (FinishLoad builds the lists that
// way too; only a late Adopt can leave an exception), and the least recent
// entries are leaves. Ticks are opaque
// uint32 values chosen by the owner (MasterService uses milliseconds since
// a base it moves forward with RebaseReadTicks, so ticks never wrap); the
// index only stores them. ForEachLeastRecent walks one node's list from the
// least recent end.
//
// Persisting recency is the owner's job, lazily: with TrackUsed(true), Touch
// also queues the entry (once until collected) and CollectUsed hands out the
// queued keys and ticks. At start-up LoadEntry / FinishLoad rebuild the
// lists from persisted last-use times and parent keys.
//
// Limits: keys of 1..65535 bytes, lengths below 2^48, at most 2^32 - 1
// entries (ghosts included), at most 2^30 - 1 children per entry on its node
// (more are stored unlinked) and 2^32 - 1 on each other node; Upsert reports violations as InvalidArgument /
// ResourceExhausted.
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
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "master/object_location.h"

namespace hymcache {
namespace master {

class RecordTable;

class MetadataIndex {
 public:
  static constexpr size_t kMaxKeyBytes = 65535;
  static constexpr uint64_t kMaxLength = (uint64_t{1} << 48) - 1;

  // Number of distinct (node, region, length) triples stored packed; the
  // entries of any further triple take more memory (a side table).
  static constexpr uint32_t kMaxShapes = (uint32_t{1} << 21) - 1;

  MetadataIndex() : MetadataIndex(kMaxShapes) {}
  // With at most `max_shapes` (<= kMaxShapes) packed shapes: for tests.
  explicit MetadataIndex(uint32_t max_shapes);
  ~MetadataIndex();
  MetadataIndex(const MetadataIndex&) = delete;
  MetadataIndex& operator=(const MetadataIndex&) = delete;

  // Adds `key` -> `entry`, or replaces the entry if `key` is present.
  // `parent` is the key of the block before `key` in its chain ("": none).
  // If `parent` is present on entry.node_id, the entry is linked to it and
  // placed just below it in the node's recency list; otherwise it is a root
  // at the most recent end, cross-linked to `parent` if that is present on
  // another node. Either way its read tick is 0. A replaced entry's children
  // stay, linked to it again as its new node makes them (same-node children
  // just below it, the others cross-linked): the key is still listed, so
  // readers still reach them through it. Its same-node children are
  // looked for just below it first (a chain's next block is found at once);
  // any not found there, and its children on other nodes, by walking the
  // lists of the nodes holding them. If `parent` is below `key`, `key`
  // becomes a root instead (no cycle). Returns the replaced entry, if any.
  // Errors: InvalidArgument if the key is empty or too long, entry.length >
  // kMaxLength or parent == key; ResourceExhausted at 2^32 - 1 records
  // (nothing changes either way).
  absl::StatusOr<std::optional<ObjectLocation>> Upsert(
      absl::string_view key, const ObjectLocation& entry,
      absl::string_view parent = absl::string_view());

  // Links `child` under `parent` after the fact: for a block committed
  // before the block before it (two puts of one chain racing). Requires
  // both present, `child` unlinked, and `parent` not below `child`; then
  // `child` moves just below `parent` if both are on the same node (else it
  // is cross-linked and stays where it is). Its own descendants
  // stay where they are, so if `child` was more recent than `parent` they
  // may end up more recent than it (PickEvictions copes). Returns whether
  // it linked.
  bool Adopt(absl::string_view child, absl::string_view parent);

  // Starts loading into the CPU's cache what a Find of each of `keys`
  // reads: its hash table group, then the record its hash's tag points at.
  // A batch's Finds that follow then wait on memory about once instead of
  // once per key: between two Finds a BatchLookup signs a capability, too
  // much work for the CPU to reach the next key's loads by itself. Changes
  // nothing. Takes the first kPrefetchKeys keys at most: more would push
  // the first ones out of the cache before their Finds.
  void Prefetch(absl::Span<const absl::string_view> keys) const;
  static constexpr size_t kPrefetchKeys = 64;

  // The entry of `key`, if present.
  std::optional<ObjectLocation> Find(absl::string_view key) const;
  // The same, with the record that holds it in `*record` (for TouchRecords;
  // valid until the index next changes).
  std::optional<ObjectLocation> Find(absl::string_view key,
                                     uint32_t* record) const;

  // Removes `key`: unlinks it from its recency list and its parent; if it
  // has children they become orphans (see the file comment). Returns its
  // entry if it was present.
  std::optional<ObjectLocation> Erase(absl::string_view key);

  // Marks `key` used: a root becomes the most recent entry of its node's
  // list, a linked entry moves just below its parent (a block is never more
  // recent than the block before it: a reader gets to it only through its
  // parent, whose use is what counts); sets its read tick to `read_tick`.
  // Returns false (and changes nothing) if `key` is absent. Touching roots
  // k[n-1], ..., k[0] in that order leaves k[0] the most recent: walks from
  // the least recent end meet k[n-1] first.
  bool Touch(absl::string_view key, uint32_t read_tick);

  // Touches `keys` as one read of a chain prefix, with one hash lookup
  // each: first the roots, last key first, then the linked entries in
  // order, each ending up just below its parent. So a chain read in one or
  // several calls (head first) is ordered head most recent, tail least,
  // and unrelated keys as by Touch from the last to the first. Absent keys
  // are skipped; returns how many were present.
  size_t TouchPrefix(const std::vector<absl::string_view>& keys,
                     uint32_t read_tick);
  // TouchPrefix of keys already found: their records, from Find, with no
  // change to the index since.
  // Returns the most recent read tick the records had before (0: none
  // was read since written), which tells the owner how long ago the
  // chain was last read.
  uint32_t TouchRecords(absl::Span<const uint32_t> records, uint32_t read_tick);

  // A chain whose conversation ended (no reader is expected back): moves
  // its unshared tail to the least recent end of its node's list, so that
  // eviction takes it before anything else there. `keys` is the chain or a
  // run of it, head first. Walks from the last key to the first. The last
  // present one goes to the least recent end when it has no children; with
  // one child it stays and the walk goes on above it (a long chain comes in
  // runs, tail first, each ending with the head of the run before); with
  // more the walk ends. Each key before it goes just above the next one
  // when that is its only child (none on other nodes). The walk ends at a
  // key that is absent, not the next one's parent, or has other children:
  // a prefix other chains share keeps its place, and every entry stays more
  // recent than its children. Read ticks (read leases) are unchanged.
  // Returns how many entries moved.
  size_t DemoteChain(absl::Span<const absl::string_view> keys);

  // The read tick of `key` (0 if never touched since its Upsert), if present.
  std::optional<uint32_t> ReadTick(absl::string_view key) const;

  // Chain structure of one entry.
  struct ChainLinks {
    std::string parent;     // the linked parent's key; "" for none
    bool cross = false;     // the parent is on another node
    uint32_t children = 0;  // linked children on the same node
    uint32_t cross_children = 0;  // linked children on other nodes
    bool orphan = false;    // an ancestor was erased (a ghost): unreachable
  };
  // `key`'s links, if present. O(depth) for `orphan`.
  std::optional<ChainLinks> Chain(absl::string_view key) const;
  // The key of the parent `key` is linked to: Chain(key)->parent without
  // the walk. "" when `key` is absent, a root, or its parent was erased.
  std::string ParentOf(absl::string_view key) const;
  // How many chains continue from the entry in `record` (a record Find
  // gave, the index unchanged since): its linked children on its node and
  // on others. O(1) plus its other nodes.
  uint32_t Branches(uint32_t record) const;

  // Calls `fn` for the entries of `node_id`, least recently used first,
  // until it returns false or the list ends. `fn` must not modify the index.
  void ForEachLeastRecent(
      uint32_t node_id,
      const std::function<bool(absl::string_view key, const ObjectLocation& entry,
                               uint32_t read_tick)>& fn) const;

  // What the owner's policy says about one eviction candidate.
  enum class Verdict {
    kEvict,  // may go
    kKeep,   // must stay; the walk goes on past it
    kStop,   // must stay, and so must everything more recent: end the walk
  };
  // Why PickEvictions ended.
  enum class WalkEnd { kEnough, kStopped, kScanLimit, kListEnd };
  // Chooses eviction victims on `node_id` without stranding a chain: walks
  // the list from the least recent end and asks `judge` about each entry
  // (at most `max_scan` of them). An entry that may go is chosen if it is a
  // leaf, counting as gone the children chosen before it; otherwise it is
  // deferred, and chosen (before the walk goes on) as soon as its last
  // child is. Children are less recent than their parent (but see Adopt),
  // so the walk meets a chain's tail first and reaches the parent after
  // its children. Every chosen entry's children were chosen before it:
  // erasing the victims in the order chosen never orphans anything. `take`
  // is called once per chosen entry, in that order, and returns false when
  // it has enough. Nothing is modified; `judge` and `take` must not modify
  // the index.
  WalkEnd PickEvictions(
      uint32_t node_id, size_t max_scan,
      const std::function<Verdict(absl::string_view key,
                                  const ObjectLocation& entry,
                                  uint32_t read_tick)>& judge,
      const std::function<bool(absl::string_view key,
                               const ObjectLocation& entry)>& take) const;

  // One candidate of PickEvictionsScored, as its `score` sees it.
  struct Candidate {
    absl::string_view key;
    ObjectLocation entry;
    // Blocks above it in its chain (0: a root), counting cross-linked
    // parents; at most kMaxScoredDepth (a deeper chain counts as that).
    uint32_t depth = 0;
    // Its read tick, or else the nearest nonzero one above it in its chain
    // (a block written after its chain's last read shares that read's
    // time); 0 if none is.
    uint32_t last_use_tick = 0;
    // Its conversation ended (DemoteChain with TrackEnded on) and it has
    // not been read since.
    bool ended = false;
  };
  static constexpr uint32_t kMaxScoredDepth = 4096;
  // PickEvictions with a choice: the walk keeps a pool of up to `pool`
  // entries it may choose (leaves, counting as gone the children chosen
  // before them), filled from the least recent end, and chooses the one
  // with the lowest `score` each time the pool is full or the walk has
  // ended. A chosen entry's parent, when that was its last child and the
  // walk deferred it, joins the pool. A tie goes to the entry
  // PickEvictions would choose first. So with `pool` 1, or equal scores,
  // it chooses
  // exactly what PickEvictions does; a larger
  // pool trades recency for the score among the least recent entries, and
  // still chooses only leaves (every chosen entry's children were chosen
  // before it). `judge` and `take` as for PickEvictions (after kStop, or
  // at the scan limit, the walk chooses from the pool it has); `score` is
  // called once per entry that joins the pool. Nothing is modified.
  WalkEnd PickEvictionsScored(
      uint32_t node_id, size_t max_scan, size_t pool,
      const std::function<Verdict(absl::string_view key,
                                  const ObjectLocation& entry,
                                  uint32_t read_tick)>& judge,
      const std::function<double(const Candidate&)>& score,
      const std::function<bool(absl::string_view key,
                               const ObjectLocation& entry)>& take) const;

  // With `on`, DemoteChain marks the entries it demotes as ended until they
  // are read, replaced or erased (Candidate::ended). Off by default (the
  // marks take memory until their entries go); turning it off drops them.
  void TrackEnded(bool on);
  // Entries marked ended.
  size_t ended_count() const { return ended_.size(); }

  // Number of erased entries whose children are still present (ghosts).
  // While it is nonzero, Orphans() has something to return.
  size_t ghost_count() const { return ghost_count_; }

  // The orphans (entries with an erased ancestor), in no particular order.
  // Walks the lists of the nodes that have ghosts, and of the nodes where
  // orphans' chains continue (cross links): O(their entries);
  // returns {} at once when there are no ghosts. Erasing the returned keys
  // (in any order) frees every ghost.
  std::vector<std::pair<std::string, ObjectLocation>> Orphans() const;

  // With `on`, Touch queues each entry it touches (once until collected)
  // for CollectUsed. Off by default; turning it off drops the queue.
  void TrackUsed(bool on);
  // Up to `max` entries touched since they were last collected, oldest
  // queued first, as (key, read tick); they leave the queue. Entries erased
  // meanwhile are skipped.
  std::vector<std::pair<std::string, uint32_t>> CollectUsed(size_t max);
  // Entries waiting in the queue (an upper bound: erased ones count until
  // collected).
  size_t used_queued() const { return used_.size() - used_head_; }

  // Lowers every nonzero read tick by `shift`; ticks <= `shift` become 0.
  // O(entries); lets the owner keep ticks small without wrapping.
  void RebaseReadTicks(uint32_t shift);

  // Removes every entry for which `pred` returns true and returns the
  // removed (key, entry) pairs. Their children that stay become orphans.
  std::vector<std::pair<std::string, ObjectLocation>> EraseIf(
      const std::function<bool(absl::string_view, const ObjectLocation&)>& pred);

  // Calls `fn` for every entry (unspecified order). `fn` must not modify the
  // index.
  void ForEach(
      const std::function<void(absl::string_view, const ObjectLocation&)>& fn)
      const;

  // Calls `fn` for up to `max` entries in record-number order, starting at
  // record `begin`, until it returns false; returns the record number to
  // resume at (the one `fn` declined, or records_end() when the walk is
  // complete). Entries inserted or erased between calls may or may not be
  // visited; none is visited twice unless it is erased and inserted again.
  // `fn` must not modify the index.
  uint32_t ForEachFrom(
      uint32_t begin, size_t max,
      const std::function<bool(absl::string_view, const ObjectLocation&)>& fn)
      const;
  // One past the highest record number in use.
  uint32_t records_end() const { return records_used_; }

  // Start-up loading. LoadEntry adds `key` -> `entry` with the key of its
  // chain parent ("" for none) and its persisted time of last use (any
  // monotonic unit; 0 means unknown, i.e. oldest), in any order. The entry
  // is findable at once but on no recency list until FinishLoad.
  // REQUIRES: the index was empty before the first LoadEntry, and only
  // LoadEntry and const methods are called until FinishLoad.
  // Errors: as Upsert, and AlreadyExists for a key loaded twice.
  absl::Status LoadEntry(absl::string_view key, const ObjectLocation& entry,
                         absl::string_view parent, uint64_t last_use);
  // Links every loaded entry to its parent when the parent is present (a
  // cross link when on another node), and erases the entries whose parent
  // is not present on any node, with all their descendants (nothing reaches them); returns those.
  // Then builds each node's recency list: by the last use of the entry's
  // subtree (a chain is as recent as its most recently used block), least
  // recent first, and children before their parent on ties. O(n log n).
  std::vector<std::pair<std::string, ObjectLocation>> FinishLoad();

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Live entries that are copies of other keys (master/replica_key.h): 0
  // lets a lookup skip looking for copies at all.
  size_t copy_count() const { return copy_count_; }

  // Objects and bytes of the entries whose key is in a tenant's key space
  // (master/tenant.h), kept up to date by every insert, replace and erase.
  struct TenantUsage {
    uint64_t objects = 0;
    uint64_t bytes = 0;
  };
  // One tenant's ("default" for unqualified keys).
  TenantUsage UsageOf(absl::string_view tenant) const;
  // Every tenant with entries.
  absl::flat_hash_map<std::string, TenantUsage> AllTenantUsage() const;

  // Called with every key that leaves the index (erased, evicted, orphaned,
  // or replaced by Upsert: then with its old location) and its location,
  // before it goes; the master's KV events (master/event_log.h). Runs
  // inside the index's calls, under the caller's lock. nullptr: none.
  using RemovalListener =
      std::function<void(absl::string_view key, const ObjectLocation& at)>;
  void set_removal_listener(RemovalListener listener) {
    removal_listener_ = std::move(listener);
  }
  // Bytes of a named tenant's entries on node `node_id` (placement's
  // per-node share, master/placement.h); 0 for the default tenant, which
  // is not counted per node.
  uint64_t TenantBytesOnNode(absl::string_view tenant, uint32_t node_id) const;

  // Heap bytes held by the index (hash table, record chunks, free list and
  // out-of-line keys); an estimate from capacities, not a malloc census.
  size_t MemoryBytes() const;

  // Snapshots: every entry with its location, its chain parent and its
  // place in its node's recency order, as a compact byte stream (per entry
  // 38 bytes plus the key). Restore rebuilds an index from it with one pass
  // of sequential reads: no sort, no hash lookup of parents (they are
  // stream positions). Read ticks are not kept (0 after Restore, as after
  // FinishLoad); neither is the CollectUsed queue.
  //
  // Save calls `write` with consecutive pieces of the stream (about 1 MiB
  // each) and returns the first error it returns. Errors:
  // FailedPrecondition while the index has ghosts (erased entries whose
  // orphans are still present) or a load is in progress.
  absl::Status Save(
      const std::function<absl::Status(absl::string_view)>& write) const;
  // Rebuilds the index from a whole stream written by Save; pieces may be
  // concatenated. REQUIRES: the index is empty. Errors: DataLoss if `data`
  // is not such a stream (truncated, a key twice, a parent position out of
  // range); the index is then empty again.
  absl::Status Restore(absl::string_view data);
  // Calls `fn` with each entry's location in a stream written by Save, in
  // order, without building anything (the master builds its allocators
  // from them while Restore builds the index). Checks less than Restore:
  // DataLoss for a stream it cannot read to the end.
  static absl::Status ForEachSnapshotLocation(
      absl::string_view data,
      const std::function<void(const ObjectLocation&)>& fn);

  // Removes every entry (ghosts, queued uses and a load in progress too);
  // the index is as new, except that TrackUsed stays as set.
  void Clear();

  // Pre-sizes the hash table for `n` entries.
  void Reserve(size_t n);

 private:
  struct Record;
  struct LoadState;

  static constexpr size_t kChunkShift = 12;  // 4096 records (256 KiB) per chunk
  static constexpr size_t kChunkSize = size_t{1} << kChunkShift;
  static constexpr uint32_t kNil = 0xffffffffu;  // no record (list end)
  static constexpr uint32_t kMaxChildren = (uint32_t{1} << 30) - 1;

  // One node's recency list.
  struct List {
    uint32_t least = kNil;  // least recently used end
    uint32_t most = kNil;   // most recently used end
  };
  // What records share, interned: node, region and length (a KV block's
  // length takes few values per node and region).
  struct Shape {
    uint32_t node_id;
    uint32_t region_id;
    uint64_t length;
    uint32_t refs;  // records using it; 0: free
  };

  static size_t HashKey(absl::string_view key);
  absl::string_view KeyOf(uint32_t i) const;
  Record& record(uint32_t i) const;
  // The live record holding `key`, or kNil.
  uint32_t Lookup(absl::string_view key) const;
  // Adds live record i (its key is not in the table yet) to the table.
  void TableInsert(uint32_t i);
  // Takes live record i out of the table.
  void TableErase(uint32_t i);
  // Rebuilds the table for at least `n` entries from the live records.
  void RebuildTable(size_t n);
  // Node, location and child count of record i.
  uint32_t NodeOf(uint32_t i) const;
  ObjectLocation EntryOf(uint32_t i) const;
  uint32_t ChildCount(uint32_t i) const;
  void AddChild(uint32_t i);
  void RemoveChild(uint32_t i);
  // The same-node parent of record i, or kNil.
  uint32_t LocalParent(uint32_t i) const;
  // Stores `entry` in record i (packed, or in wide_ if a field does not
  // fit), releasing what it held.
  void SetLocation(uint32_t i, const ObjectLocation& entry);
  // Drops record i's location (its shape reference or wide_ entry).
  void ReleaseLocation(uint32_t i);
  uint32_t AcquireShape(const ObjectLocation& entry);
  void ReleaseShape(uint32_t shape);
  // A record number for a new entry, with room for it in the table.
  // Errors: ResourceExhausted when every record number is in use.
  absl::StatusOr<uint32_t> NewRecord();
  // Stores `key` and `entry` in the fresh record i.
  void FillRecord(uint32_t i, absl::string_view key, const ObjectLocation& entry);
  // Releases record i's key and location and puts it on the free list.
  void FreeRecord(uint32_t i);
  // Releases record i's key (out-of-line buffer) and tenant count.
  void DropKey(uint32_t i);
  // Takes live record i out of its list and its parent (not the table);
  // frees it, or makes it a ghost if it has children.
  void RemoveRecord(uint32_t i);
  // Links live record i under `parent` (cross-linked when on another node),
  // or makes it a root.
  void SetParent(uint32_t i, uint32_t parent);
  // Whether record `parent` can take record i's node as a child's.
  bool CanLink(uint32_t parent, uint32_t node_id) const;
  // Whether record i has linked children on any node.
  bool HasChildren(uint32_t i) const;
  // Counts one more / one fewer child of record `parent` on `node_id`
  // (another node than its own).
  void AddCrossChild(uint32_t parent, uint32_t node_id);
  void RemoveCrossChild(uint32_t parent, uint32_t node_id);
  // Unlinks every child of live record i (on every node) and returns them.
  std::vector<uint32_t> DetachChildren(uint32_t i);
  // One fewer ghost whose orphans may be on `node_id`.
  void DropGhostNode(uint32_t node_id);
  // Drops record i's link to its parent (which may become free if it was a
  // ghost and i its last child).
  void DetachFromParent(uint32_t i);
  // Appends record i at the most recent end of `node_id`'s list / `list`.
  void LinkMostRecent(uint32_t i, uint32_t node_id);
  void LinkMostRecent(uint32_t i, List& list);
  // Inserts record i into `list` just below (less recent than) `above`.
  void LinkBelow(uint32_t i, uint32_t above, List& list);
  // Inserts record i into `list` just above (more recent than) `below`.
  void LinkAbove(uint32_t i, uint32_t below, List& list);
  // Inserts record i at the least recent end of `list` (which may be empty).
  void LinkLeastRecent(uint32_t i, List& list);
  // Takes record i out of `node_id`'s list, dropping the list if empty.
  void Unlink(uint32_t i, uint32_t node_id);
  // Takes record i out of `list` (which may become empty).
  void Unlink(uint32_t i, List& list);
  // Touch of live record i.
  void TouchRecord(uint32_t i, uint32_t read_tick);
  bool IsGhost(uint32_t i) const;
  // Whether record i holds a findable entry (not free, not a ghost).
  bool IsLive(uint32_t i) const;

  struct ChunkDeleter {
    void operator()(Record* chunk) const;
  };
  std::vector<std::unique_ptr<Record, ChunkDeleter>> chunks_;
  std::unique_ptr<RecordTable> table_;  // record_table.h
  absl::flat_hash_map<uint32_t, List> lists_;           // by node id
  uint32_t records_used_ = 0;       // high-water mark of record numbers
  std::vector<uint32_t> free_records_;
  size_t out_of_line_key_bytes_ = 0;
  size_t ghost_count_ = 0;
  // Interned shapes (index = Record shape field), the free ones, and the
  // lookup by (node, region, length).
  std::vector<Shape> shapes_;
  std::vector<uint32_t> free_shapes_;
  absl::flat_hash_map<std::tuple<uint32_t, uint32_t, uint64_t>, uint32_t>
      shape_ids_;
  uint32_t max_shapes_;
  // Locations that do not pack (addr or generation >= 2^48, or no free
  // shape), by record number.
  absl::flat_hash_map<uint32_t, ObjectLocation> wide_;
  // Child counts of records with more same-node children than the record's
  // field holds.
  absl::flat_hash_map<uint32_t, uint32_t> many_children_;
  // See UsageOf(): the default tenant apart (no hashing on its path).
  TenantUsage default_usage_;
  absl::flat_hash_map<std::string, TenantUsage> tenant_usage_;
  RemovalListener removal_listener_;
  // Bytes per node of each named tenant (TenantBytesOnNode).
  absl::flat_hash_map<std::string, absl::flat_hash_map<uint32_t, uint64_t>>
      tenant_node_bytes_;
  void CountTenant(absl::string_view key, int objects, int64_t bytes);
  void CountTenantOnNode(absl::string_view key, uint32_t node_id,
                         int64_t bytes);
  // Per node id: its ghosts, plus the ghosts with cross-linked children on
  // it (the lists Orphans() walks).
  absl::flat_hash_map<uint32_t, size_t> ghosts_by_node_;
  // Cross-linked children per parent record: (node id, count) pairs.
  absl::flat_hash_map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>>
      cross_children_;
  // CollectUsed queue: record numbers, [used_head_, end) pending.
  bool track_used_ = false;
  std::vector<uint32_t> used_;
  // Records marked ended (TrackEnded).
  bool track_ended_ = false;
  absl::flat_hash_set<uint32_t> ended_;
  size_t used_head_ = 0;
  std::unique_ptr<LoadState> load_;  // between LoadEntry and FinishLoad
  size_t size_ = 0;  // live entries (findable keys)
  size_t copy_count_ = 0;  // of them, copies (IsReplicaKey)
};

}  // namespace master
}  // namespace hymcache
