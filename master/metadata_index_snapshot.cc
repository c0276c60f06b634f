// MetadataIndex: loading (LoadEntry, FinishLoad: entries in any order,
// recency from persisted last use) and the snapshot stream (Save,
// Restore, ForEachSnapshotLocation).
#include "master/metadata_index.h"

#include <algorithm>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"

#include "master/metadata_index_internal.h"

namespace hymcache {
namespace master {

absl::Status MetadataIndex::LoadEntry(absl::string_view key,
                                      const ObjectLocation& entry,
                                      absl::string_view parent,
                                      uint64_t last_use) {
  absl::Status valid = ValidateKeyAndEntry(key, entry, parent);
  if (!valid.ok()) return valid;
  if (Lookup(key) != kNil) {
    return absl::AlreadyExistsError("index key loaded twice");
  }
  absl::StatusOr<uint32_t> fresh = NewRecord();
  if (!fresh.ok()) return fresh.status();
  const uint32_t i = *fresh;
  FillRecord(i, key, entry);
  TableInsert(i);
  if (load_ == nullptr) load_ = std::make_unique<LoadState>();
  LoadState& ls = *load_;
  if (ls.last_use.size() <= i) ls.last_use.resize(size_t{i} + 1, 0);
  ls.last_use[i] = last_use;
  if (parent.empty()) return absl::OkStatus();
  const uint32_t p = Lookup(parent);
  if (p == kNil) {
    ls.pending.push_back({i, static_cast<uint32_t>(parent.size()),
                          ls.parent_keys.size()});
    ls.parent_keys.append(parent.data(), parent.size());
  } else if (CanLink(p, entry.node_id)) {
    SetParent(i, p);
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, ObjectLocation>> MetadataIndex::FinishLoad() {
  std::vector<std::pair<std::string, ObjectLocation>> dropped;
  if (load_ == nullptr) return dropped;
  LoadState& ls = *load_;
  ls.last_use.resize(records_used_, 0);

  // Parents loaded after their children.
  std::vector<uint8_t> flags(records_used_, 0);
  constexpr uint8_t kKnown = 1, kBroken = 2, kMissingParent = 4;
  for (const LoadState::Pending& pending : ls.pending) {
    absl::string_view parent(ls.parent_keys.data() + pending.offset,
                             pending.length);
    const uint32_t p = Lookup(parent);
    if (p == kNil) {
      flags[pending.record] |= kMissingParent;
    } else if (CanLink(p, NodeOf(pending.record))) {
      SetParent(pending.record, p);
    }
  }
  ls.pending = {};
  ls.parent_keys = {};

  // Live records in load order (record numbers are handed out in order).
  std::vector<uint32_t> loaded;
  loaded.reserve(size_);
  for (uint32_t i = 0; i < records_used_; ++i) {
    if (IsLive(i)) loaded.push_back(i);
  }

  // Depth and brokenness (the chain above reaches a missing parent) of every
  // entry, each computed once.
  std::vector<uint32_t> depth(records_used_, 0);
  std::vector<uint32_t> path;
  for (uint32_t i : loaded) {
    path.clear();
    uint32_t a = i;
    while (a != kNil && (flags[a] & kKnown) == 0) {
      path.push_back(a);
      a = record(a).parent;
    }
    bool broken = a != kNil && (flags[a] & kBroken) != 0;
    uint32_t d = a == kNil ? 0 : depth[a] + 1;
    for (auto x = path.rbegin(); x != path.rend(); ++x) {
      broken = broken || (flags[*x] & kMissingParent) != 0;
      depth[*x] = d++;
      flags[*x] |= kKnown | (broken ? kBroken : 0);
    }
  }
  // A broken entry's whole chain up to the missing parent is broken, and so
  // is its subtree: erasing them all leaves no ghost.
  std::vector<uint32_t> kept;
  kept.reserve(loaded.size());
  for (uint32_t i : loaded) {
    if ((flags[i] & kBroken) == 0) {
      kept.push_back(i);
      continue;
    }
    dropped.emplace_back(std::string(KeyOf(i)), EntryOf(i));
    TableErase(i);
    RemoveRecord(i);  // on no list yet
  }
  loaded = {};
  flags = {};

  // Deepest first (a stable counting sort), to raise each parent's last use
  // to its subtree's.
  uint32_t max_depth = 0;
  for (uint32_t i : kept) max_depth = std::max(max_depth, depth[i]);
  std::vector<size_t> start(size_t{max_depth} + 2, 0);
  for (uint32_t i : kept) ++start[max_depth - depth[i] + 1];
  for (size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
  std::vector<uint32_t> order(kept.size());
  for (uint32_t i : kept) order[start[max_depth - depth[i]]++] = i;
  kept = {};
  depth = {};
  std::vector<uint64_t>& last_use = ls.last_use;
  for (uint32_t i : order) {
    const uint32_t p = record(i).parent;
    if (p != kNil) last_use[p] = std::max(last_use[p], last_use[i]);
  }
  // Least recent first; among equals deeper first (children below their
  // parents), then in load order. Sorting packed (time, position) pairs
  // keeps the sort's memory access sequential.
  struct Item {
    uint64_t last_use;
    uint32_t position;  // in `order`: deepest first, then load order
    uint32_t record;
  };
  std::vector<Item> items(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    items[k] = Item{last_use[order[k]], static_cast<uint32_t>(k), order[k]};
  }
  order = {};
  load_.reset();  // last_use
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.last_use != b.last_use ? a.last_use < b.last_use
                                    : a.position < b.position;
  });
  for (const Item& item : items) {
    LinkMostRecent(item.record, NodeOf(item.record));
  }
  return dropped;
}

// Snapshot stream: u64 entry count, then per entry (little-endian)
//   u16 key length, the key, u32 node id, u32 region id, u64 addr,
//   u64 length, u64 generation, u32 position of the parent in the stream
//   (0xffffffff: none);
// each node's entries least recent first (the nodes one after another).
namespace {
constexpr size_t kSnapshotFixed = 2 + 4 + 4 + 8 + 8 + 8 + 4;

// One entry of a Save stream at `*p` (before `end`): its key, location and
// parent position; advances *p past it. Returns what is wrong with it, or
// nullptr.
const char* ParseSnapshotEntry(const char** p, const char* end,
                               absl::string_view* key, ObjectLocation* e,
                               uint32_t* parent) {
  const char* q = *p;
  if (end - q < static_cast<ptrdiff_t>(kSnapshotFixed)) return "truncated";
  const size_t key_len = absl::little_endian::Load16(q);
  if (key_len == 0 ||
      end - q < static_cast<ptrdiff_t>(kSnapshotFixed + key_len)) {
    return "truncated or empty key";
  }
  *key = absl::string_view(q + 2, key_len);
  q += 2 + key_len;
  e->node_id = absl::little_endian::Load32(q);
  e->region_id = absl::little_endian::Load32(q + 4);
  e->addr = absl::little_endian::Load64(q + 8);
  e->length = absl::little_endian::Load64(q + 16);
  e->generation = absl::little_endian::Load64(q + 24);
  *parent = absl::little_endian::Load32(q + 32);
  *p = q + kSnapshotFixed - 2;
  if (e->length > MetadataIndex::kMaxLength) return "length out of range";
  return nullptr;
}
constexpr size_t kSnapshotPiece = size_t{1} << 20;
}  // namespace

absl::Status MetadataIndex::Save(
    const std::function<absl::Status(absl::string_view)>& write) const {
  if (ghost_count_ > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("index has ", ghost_count_, " ghosts: no snapshot"));
  }
  if (load_ != nullptr) {
    return absl::FailedPreconditionError("index is loading: no snapshot");
  }
  // Stream positions, in list order, so parents can be named before they
  // are written (a child is less recent than its parent: written first).
  std::vector<uint32_t> position(records_used_, kNil);
  uint32_t next = 0;
  for (const auto& [node_id, list] : lists_) {
    for (uint32_t i = list.least; i != kNil; i = record(i).next) {
      position[i] = next++;
    }
  }
  std::string out;
  out.reserve(kSnapshotPiece + kSnapshotFixed + kMaxKeyBytes);
  out.resize(8);
  absl::little_endian::Store64(out.data(), next);
  for (const auto& [node_id, list] : lists_) {
    for (uint32_t i = list.least; i != kNil; i = record(i).next) {
      const absl::string_view key = KeyOf(i);
      const uint32_t parent = record(i).parent;
      const size_t at = out.size();
      out.resize(at + kSnapshotFixed + key.size());
      char* p = out.data() + at;
      absl::little_endian::Store16(p, static_cast<uint16_t>(key.size()));
      std::memcpy(p + 2, key.data(), key.size());
      p += 2 + key.size();
      const ObjectLocation e = EntryOf(i);
      absl::little_endian::Store32(p, e.node_id);
      absl::little_endian::Store32(p + 4, e.region_id);
      absl::little_endian::Store64(p + 8, e.addr);
      absl::little_endian::Store64(p + 16, e.length);
      absl::little_endian::Store64(p + 24, e.generation);
      absl::little_endian::Store32(p + 32,
                                   parent == kNil ? kNil : position[parent]);
      if (out.size() >= kSnapshotPiece) {
        absl::Status s = write(out);
        if (!s.ok()) return s;
        out.clear();
      }
    }
  }
  return out.empty() ? absl::OkStatus() : write(out);
}

absl::Status MetadataIndex::Restore(absl::string_view data) {
  auto fail = [this](absl::string_view why) {
    Clear();
    return absl::DataLossError(absl::StrCat("index snapshot: ", why));
  };
  if (data.size() < 8) return fail("shorter than its header");
  const uint64_t count = absl::little_endian::Load64(data.data());
  // Every entry takes more than kSnapshotFixed bytes: a count beyond that
  // is corrupt (and must not size the tables).
  if (count > (data.size() - 8) / (kSnapshotFixed + 1)) {
    return fail(absl::StrCat("claims ", count, " entries in ", data.size(),
                             " bytes"));
  }
  Reserve(count);
  std::vector<uint32_t> parents(count);
  const char* p = data.data() + 8;
  const char* const end = data.data() + data.size();
  uint32_t node_id = kNil;
  List* list = nullptr;
  for (uint64_t k = 0; k < count; ++k) {
    absl::string_view key;
    ObjectLocation e;
    if (const char* bad = ParseSnapshotEntry(&p, end, &key, &e, &parents[k])) {
      return fail(bad);
    }
    // A fresh index hands out record numbers 0, 1, ...: record k is entry k.
    absl::StatusOr<uint32_t> fresh = NewRecord();
    if (!fresh.ok()) return fail(fresh.status().message());
    if (Lookup(key) != kNil) return fail("a key twice");
    FillRecord(*fresh, key, e);
    TableInsert(*fresh);
    if (e.node_id != node_id || list == nullptr) {
      node_id = e.node_id;
      list = &lists_[node_id];
    }
    LinkMostRecent(*fresh, *list);
  }
  if (p != end) return fail("bytes after the last entry");
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t parent = parents[i];
    if (parent == kNil) continue;
    if (parent >= count || parent == i) return fail("bad parent position");
    if (CanLink(parent, NodeOf(i))) SetParent(i, parent);
  }
  // Save wrote parents that were linked, so no cycle unless corrupt; a
  // cycle would make chain walks loop, so check: each entry's chain must
  // reach a root within `count` steps (O(n) with memoised depths).
  std::vector<uint8_t> state(count, 0);  // 1: on the current path, 2: done
  std::vector<uint32_t> path;
  for (uint32_t i = 0; i < count; ++i) {
    path.clear();
    uint32_t a = i;
    while (a != kNil && state[a] == 0) {
      state[a] = 1;
      path.push_back(a);
      a = record(a).parent;
    }
    if (a != kNil && state[a] == 1) return fail("a chain loops");
    for (uint32_t x : path) state[x] = 2;
  }
  return absl::OkStatus();
}

absl::Status MetadataIndex::ForEachSnapshotLocation(
    absl::string_view data,
    const std::function<void(const ObjectLocation&)>& fn) {
  if (data.size() < 8) {
    return absl::DataLossError("index snapshot: shorter than its header");
  }
  const uint64_t count = absl::little_endian::Load64(data.data());
  const char* p = data.data() + 8;
  const char* const end = data.data() + data.size();
  for (uint64_t k = 0; k < count; ++k) {
    absl::string_view key;
    ObjectLocation e;
    uint32_t parent;
    if (const char* bad = ParseSnapshotEntry(&p, end, &key, &e, &parent)) {
      return absl::DataLossError(absl::StrCat("index snapshot: ", bad));
    }
    fn(e);
  }
  return absl::OkStatus();
}

}  // namespace master
}  // namespace hymcache
