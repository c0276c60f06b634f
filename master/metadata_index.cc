#include "master/metadata_index.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <tuple>

#include "absl/base/internal/endian.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "master/metadata_index_internal.h"
#include "master/replica_key.h"
#include "master/tenant.h"

namespace hymcache {
namespace master {
namespace {

// Approximate heap footprint of a malloc(n): glibc adds an 8-byte header and
// rounds chunks to 16 bytes.
size_t MallocSize(size_t n) { return (n + 8 + 15) & ~size_t{15}; }

}  // namespace

void MetadataIndex::ChunkDeleter::operator()(Record* chunk) const {
  ::operator delete[](chunk, std::align_val_t(alignof(Record)));
}

MetadataIndex::MetadataIndex(uint32_t max_shapes)
    : table_(std::make_unique<RecordTable>(0)),
      max_shapes_(std::min(max_shapes, kMaxShapes)) {
  static_assert(sizeof(Record) == 64, "Record must be one cache line");
  static_assert(Record::kWideShape == kMaxShapes, "shape field width");
}

MetadataIndex::~MetadataIndex() {
  // Release out-of-line keys; record chunks go with chunks_. Ghosts have
  // released theirs already.
  for (uint32_t i = 0; i < records_used_; ++i) {
    if (record(i).out_of_line()) delete[] record(i).buffer();
  }
}

size_t MetadataIndex::HashKey(absl::string_view key) {
  return absl::Hash<absl::string_view>{}(key);
}

MetadataIndex::Record& MetadataIndex::record(uint32_t i) const {
  return chunks_[i >> kChunkShift].get()[i & (kChunkSize - 1)];
}

absl::string_view MetadataIndex::KeyOf(uint32_t i) const {
  return record(i).key_view();
}

uint32_t MetadataIndex::Lookup(absl::string_view key) const {
  // The comparison takes the key's pointer and size by value, not `key` by
  // reference. By reference, GCC 12 -O2 kept `key` in memory (two 8-byte
  // stores) wherever Lookup is inlined into a caller that does more than
  // Find (Touch, ReadTick), and copied it for the hash with one 16-byte
  // load; such a load cannot be forwarded from the two stores and waits
  // until they retire, i.e. until the previous call's cache misses are
  // done, so consecutive Touches stopped overlapping their misses: 32
  // Touches took twice as long as 32 Finds of the same keys
  // (metadata_index_benchmark, docs/performance.md).
  const char* const data = key.data();
  const size_t size = key.size();
  const uint32_t r = table_->Find(HashKey(key), [this, data, size](uint32_t i) {
    const Record& rec = record(i);
    if (size <= Record::kInlineKey) {
      return rec.key_field() == size && std::memcmp(rec.key, data, size) == 0;
    }
    return rec.out_of_line() &&
           rec.key_view() == absl::string_view(data, size);
  });
  return r == RecordTable::kNone ? kNil : r;
}

void MetadataIndex::TableInsert(uint32_t i) {
  const absl::string_view key = KeyOf(i);
  table_->Insert(HashKey(key), i);
  ++size_;
  if (IsReplicaKey(key)) ++copy_count_;
}

void MetadataIndex::TableErase(uint32_t i) {
  const absl::string_view key = KeyOf(i);
  table_->Erase(HashKey(key), i);
  --size_;
  if (IsReplicaKey(key)) --copy_count_;
}

void MetadataIndex::RebuildTable(size_t n) {
  table_.reset();  // the old one goes first: no peak of both
  table_ = std::make_unique<RecordTable>(n);
  for (uint32_t i = 0; i < records_used_; ++i) {
    if (record(i).has_key()) table_->Insert(HashKey(KeyOf(i)), i);
  }
}

bool MetadataIndex::IsLive(uint32_t i) const { return record(i).has_key(); }

bool MetadataIndex::IsGhost(uint32_t i) const {
  return !record(i).has_key() && HasChildren(i);
}

bool MetadataIndex::HasChildren(uint32_t i) const {
  return record(i).kids() > 0 || cross_children_.contains(i);
}

absl::StatusOr<uint32_t> MetadataIndex::NewRecord() {
  if (!table_->HasRoom()) RebuildTable(table_->GrowTarget());
  if (!free_records_.empty()) {
    uint32_t i = free_records_.back();
    free_records_.pop_back();
    return i;
  }
  if (records_used_ == std::numeric_limits<uint32_t>::max()) {
    return absl::ResourceExhaustedError("index is full (2^32 - 1 records)");
  }
  if ((records_used_ >> kChunkShift) >= chunks_.size()) {
    auto* chunk = static_cast<Record*>(::operator new[](
        kChunkSize * sizeof(Record), std::align_val_t(alignof(Record))));
    for (size_t k = 0; k < kChunkSize; ++k) chunk[k].Reset();
    chunks_.emplace_back(chunk);
  }
  return records_used_++;
}

void MetadataIndex::FillRecord(uint32_t i, absl::string_view key,
                               const ObjectLocation& entry) {
  Record& r = record(i);
  r.Reset();
  CountTenant(key, +1, static_cast<int64_t>(entry.length));
  CountTenantOnNode(key, entry.node_id, static_cast<int64_t>(entry.length));
  if (key.size() <= Record::kInlineKey) {
    std::memcpy(r.key, key.data(), key.size());
    r.set_key_field(static_cast<uint32_t>(key.size()));
  } else {
    char* p = new char[2 + key.size()];
    absl::little_endian::Store16(p, static_cast<uint16_t>(key.size()));
    std::memcpy(p + 2, key.data(), key.size());
    std::memcpy(r.key, &p, sizeof(p));
    r.set_key_field(Record::kOutOfLine);
    out_of_line_key_bytes_ += MallocSize(2 + key.size());
  }
  SetLocation(i, entry);
}

void MetadataIndex::CountTenant(absl::string_view key, int objects,
                                int64_t bytes) {
  const absl::string_view tenant = TenantOfKey(key);
  if (tenant == kDefaultTenantName) {
    default_usage_.objects += objects;
    default_usage_.bytes += bytes;
    return;
  }
  auto it = tenant_usage_.find(tenant);
  if (it == tenant_usage_.end()) {
    it = tenant_usage_.emplace(std::string(tenant), TenantUsage()).first;
  }
  it->second.objects += objects;
  it->second.bytes += bytes;
  if (it->second.objects == 0) tenant_usage_.erase(it);
}

void MetadataIndex::CountTenantOnNode(absl::string_view key, uint32_t node_id,
                                      int64_t bytes) {
  const absl::string_view tenant = TenantOfKey(key);
  if (tenant == kDefaultTenantName || bytes == 0) return;
  auto t = tenant_node_bytes_.find(tenant);
  if (t == tenant_node_bytes_.end()) {
    if (bytes < 0) return;
    t = tenant_node_bytes_.emplace(std::string(tenant), 0).first;
  }
  uint64_t& b = t->second[node_id];
  b = bytes >= 0 ? b + static_cast<uint64_t>(bytes)
                 : b - std::min(b, static_cast<uint64_t>(-bytes));
  if (b == 0) {
    t->second.erase(node_id);
    if (t->second.empty()) tenant_node_bytes_.erase(t);
  }
}

uint64_t MetadataIndex::TenantBytesOnNode(absl::string_view tenant,
                                          uint32_t node_id) const {
  auto t = tenant_node_bytes_.find(tenant);
  if (t == tenant_node_bytes_.end()) return 0;
  auto b = t->second.find(node_id);
  return b == t->second.end() ? 0 : b->second;
}

MetadataIndex::TenantUsage MetadataIndex::UsageOf(
    absl::string_view tenant) const {
  if (tenant == kDefaultTenantName) return default_usage_;
  auto it = tenant_usage_.find(tenant);
  return it == tenant_usage_.end() ? TenantUsage() : it->second;
}

absl::flat_hash_map<std::string, MetadataIndex::TenantUsage>
MetadataIndex::AllTenantUsage() const {
  absl::flat_hash_map<std::string, TenantUsage> out = tenant_usage_;
  if (default_usage_.objects > 0) {
    out[std::string(kDefaultTenantName)] = default_usage_;
  }
  return out;
}

void MetadataIndex::DropKey(uint32_t i) {
  Record& r = record(i);
  if (!r.has_key()) return;
  const ObjectLocation gone = EntryOf(i);
  if (removal_listener_) removal_listener_(KeyOf(i), gone);
  CountTenant(KeyOf(i), -1, -static_cast<int64_t>(gone.length));
  CountTenantOnNode(KeyOf(i), gone.node_id, -static_cast<int64_t>(gone.length));
  if (r.out_of_line()) {
    out_of_line_key_bytes_ -= MallocSize(2 + KeyOf(i).size());
    delete[] r.buffer();
  }
  std::memset(r.key, 0, sizeof(r.key));
  r.set_key_field(0);
}

void MetadataIndex::FreeRecord(uint32_t i) {
  DropKey(i);
  ReleaseLocation(i);
  record(i).Reset();
  free_records_.push_back(i);
}

void MetadataIndex::RemoveRecord(uint32_t i) {
  const uint32_t node_id = NodeOf(i);
  if (!ended_.empty()) ended_.erase(i);
  Unlink(i, node_id);
  DetachFromParent(i);
  if (!HasChildren(i)) {
    FreeRecord(i);
    return;
  }
  // A ghost: keyless, unfindable, unlisted, keeping its location (its
  // node); freed with its last child.
  DropKey(i);
  Record& r = record(i);
  r.read_tick = 0;
  r.set_used(false);  // no longer queued for CollectUsed
  ++ghost_count_;
  ++ghosts_by_node_[node_id];
  // Its orphans on other nodes are found through those nodes' lists.
  auto cross = cross_children_.find(i);
  if (cross != cross_children_.end()) {
    for (const auto& [node, count] : cross->second) ++ghosts_by_node_[node];
  }
}

uint32_t MetadataIndex::Branches(uint32_t i) const {
  uint32_t n = ChildCount(i);
  auto cross = cross_children_.find(i);
  if (cross != cross_children_.end()) {
    for (const auto& [node, count] : cross->second) n += count;
  }
  return n;
}

void MetadataIndex::DropGhostNode(uint32_t node_id) {
  auto g = ghosts_by_node_.find(node_id);
  if (g != ghosts_by_node_.end() && --g->second == 0) ghosts_by_node_.erase(g);
}

bool MetadataIndex::CanLink(uint32_t parent, uint32_t node_id) const {
  return NodeOf(parent) != node_id || ChildCount(parent) < kMaxChildren;
}

void MetadataIndex::SetParent(uint32_t i, uint32_t parent) {
  Record& l = record(i);
  l.parent = parent;
  l.set_cross(false);
  if (parent == kNil) return;
  const uint32_t node_id = NodeOf(i);
  if (NodeOf(parent) == node_id) {
    AddChild(parent);
  } else {
    l.set_cross(true);
    AddCrossChild(parent, node_id);
  }
}

void MetadataIndex::AddCrossChild(uint32_t parent, uint32_t node_id) {
  auto& nodes = cross_children_[parent];
  for (auto& [node, count] : nodes) {
    if (node == node_id) {
      ++count;
      return;
    }
  }
  nodes.emplace_back(node_id, 1);
}

void MetadataIndex::RemoveCrossChild(uint32_t parent, uint32_t node_id) {
  auto it = cross_children_.find(parent);
  if (it == cross_children_.end()) return;  // cannot happen
  auto& nodes = it->second;
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (nodes[k].first != node_id) continue;
    if (--nodes[k].second == 0) {
      nodes.erase(nodes.begin() + static_cast<ptrdiff_t>(k));
      // A ghost's last orphan on that node is gone.
      if (!record(parent).has_key()) DropGhostNode(node_id);
    }
    break;
  }
  if (nodes.empty()) cross_children_.erase(it);
}

void MetadataIndex::DetachFromParent(uint32_t i) {
  Record& l = record(i);
  const uint32_t p = l.parent;
  if (p == kNil) return;
  l.parent = kNil;
  if (l.cross()) {
    l.set_cross(false);
    RemoveCrossChild(p, NodeOf(i));
  } else {
    RemoveChild(p);
  }
  if (!record(p).has_key() && !HasChildren(p)) {
    // A ghost's last child: the ghost goes.
    --ghost_count_;
    DropGhostNode(NodeOf(p));
    FreeRecord(p);
  }
}

std::vector<uint32_t> MetadataIndex::DetachChildren(uint32_t i) {
  std::vector<uint32_t> out;
  // Same-node children sit just below their parent (see the file comment):
  // look there first, so that moving a chain's blocks one by one (a
  // relocation, head first) finds each block's child at once. Only a late
  // Adopt leaves one elsewhere: the walks below find it.
  for (uint32_t j = record(i).prev; j != kNil && ChildCount(i) > 0;) {
    const uint32_t prev = record(j).prev;
    if (record(j).parent == i && !record(j).cross()) {
      DetachFromParent(j);
      out.push_back(j);
    }
    j = prev;
  }
  // Least recent first, as the walks below find them (Upsert relinks them
  // in this order, keeping their order).
  std::reverse(out.begin(), out.end());
  std::vector<uint32_t> nodes;
  if (ChildCount(i) > 0) nodes.push_back(NodeOf(i));
  auto cross = cross_children_.find(i);
  if (cross != cross_children_.end()) {
    for (const auto& [node, count] : cross->second) nodes.push_back(node);
  }
  for (uint32_t node : nodes) {
    auto list = lists_.find(node);
    if (list == lists_.end()) continue;
    for (uint32_t j = list->second.least; j != kNil && HasChildren(i);) {
      const uint32_t next = record(j).next;
      if (record(j).parent == i) {
        DetachFromParent(j);
        out.push_back(j);
      }
      j = next;
    }
  }
  return out;
}

absl::StatusOr<std::optional<ObjectLocation>> MetadataIndex::Upsert(
    absl::string_view key, const ObjectLocation& entry, absl::string_view parent) {
  absl::Status valid = ValidateKeyAndEntry(key, entry, parent);
  if (!valid.ok()) return valid;
  // The parent, if present (on the same node: with room for another child).
  uint32_t p = kNil;
  if (!parent.empty()) {
    const uint32_t found = Lookup(parent);
    if (found != kNil && CanLink(found, entry.node_id)) p = found;
  }
  const uint32_t existing = Lookup(key);
  auto place = [&](uint32_t i) {
    List& list = lists_[entry.node_id];
    SetParent(i, p);
    if (LocalParent(i) != kNil) {
      LinkBelow(i, p, list);
    } else {
      LinkMostRecent(i, list);
    }
  };

  std::optional<ObjectLocation> old;
  if (existing != kNil) {
    const uint32_t i = existing;
    old = EntryOf(i);
    if (removal_listener_) removal_listener_(key, *old);
    // The key stays listed (at its new location), so the blocks after it
    // are still reachable through it: they stay, linked to it again (same
    // node or cross links as its new node says), so that losing it later
    // still orphans them. A key with children is stored again when its
    // node is dead, or relocated (a chain's blocks head first: each one's
    // child is just below it).
    std::vector<uint32_t> kids;
    if (HasChildren(i)) {
      // A parent below the key would close a cycle: the key becomes a root.
      for (uint32_t a = p; a != kNil; a = record(a).parent) {
        if (a == i) {
          p = kNil;
          break;
        }
      }
      kids = DetachChildren(i);
    }
    // Reuse the record: a fresh entry in place of the old one.
    Unlink(i, old->node_id);
    DetachFromParent(i);
    SetLocation(i, entry);
    CountTenant(key, 0,
                static_cast<int64_t>(entry.length) -
                    static_cast<int64_t>(old->length));
    CountTenantOnNode(key, old->node_id, -static_cast<int64_t>(old->length));
    CountTenantOnNode(key, entry.node_id, static_cast<int64_t>(entry.length));
    record(i).read_tick = 0;
    if (!ended_.empty()) ended_.erase(i);  // a new entry
    place(i);
    for (uint32_t j : kids) {
      const uint32_t node_id = NodeOf(j);
      if (!CanLink(i, node_id)) continue;  // stays a root
      SetParent(j, i);
      if (record(j).cross()) continue;
      List& list = lists_[node_id];
      Unlink(j, list);
      LinkBelow(j, i, list);
    }
    return old;
  }
  absl::StatusOr<uint32_t> fresh = NewRecord();
  if (!fresh.ok()) return fresh.status();
  const uint32_t i = *fresh;
  FillRecord(i, key, entry);
  TableInsert(i);
  place(i);
  return old;
}

bool MetadataIndex::Adopt(absl::string_view child, absl::string_view parent) {
  const uint32_t ci = Lookup(child);
  const uint32_t pi = Lookup(parent);
  if (ci == kNil || pi == kNil || ci == pi) return false;
  const uint32_t node_id = NodeOf(ci);
  if (record(ci).parent != kNil || !CanLink(pi, node_id)) return false;
  for (uint32_t a = pi; a != kNil; a = record(a).parent) {
    if (a == ci) return false;  // parent is below child: a cycle
  }
  SetParent(ci, pi);
  if (record(ci).cross()) return true;  // stays a root of its node's list
  List& list = lists_[node_id];
  Unlink(ci, list);
  LinkBelow(ci, pi, list);
  return true;
}

void MetadataIndex::Prefetch(absl::Span<const absl::string_view> keys) const {
  const size_t n = std::min(keys.size(), kPrefetchKeys);
  size_t hashes[kPrefetchKeys];
  for (size_t k = 0; k < n; ++k) {
    hashes[k] = HashKey(keys[k]);
    table_->PrefetchHome(hashes[k]);
  }
  // The groups arrive about together; each names its key's record.
  for (size_t k = 0; k < n; ++k) {
    table_->ForEachHomeMatch(hashes[k],
                             [this](uint32_t r) { PrefetchLine(&record(r)); });
  }
}

std::optional<ObjectLocation> MetadataIndex::Find(absl::string_view key) const {
  uint32_t i;
  return Find(key, &i);
}

std::optional<ObjectLocation> MetadataIndex::Find(absl::string_view key,
                                                  uint32_t* record) const {
  const uint32_t i = Lookup(key);
  *record = i;
  if (i == kNil) return std::nullopt;
  return EntryOf(i);
}

std::optional<ObjectLocation> MetadataIndex::Erase(absl::string_view key) {
  const uint32_t i = Lookup(key);
  if (i == kNil) return std::nullopt;
  ObjectLocation e = EntryOf(i);
  TableErase(i);
  RemoveRecord(i);
  return e;
}

std::optional<MetadataIndex::ChainLinks> MetadataIndex::Chain(
    absl::string_view key) const {
  const uint32_t i = Lookup(key);
  if (i == kNil) return std::nullopt;
  ChainLinks out;
  const Record& l = record(i);
  out.children = ChildCount(i);
  out.cross = l.cross();
  auto cross = cross_children_.find(i);
  if (cross != cross_children_.end()) {
    for (const auto& [node, count] : cross->second) out.cross_children += count;
  }
  if (l.parent != kNil) out.parent = std::string(KeyOf(l.parent));
  for (uint32_t a = l.parent; a != kNil; a = record(a).parent) {
    if (IsGhost(a)) {
      out.orphan = true;
      break;
    }
  }
  return out;
}

std::string MetadataIndex::ParentOf(absl::string_view key) const {
  const uint32_t i = Lookup(key);
  if (i == kNil || record(i).parent == kNil) return std::string();
  return std::string(KeyOf(record(i).parent));
}

std::vector<std::pair<std::string, ObjectLocation>> MetadataIndex::EraseIf(
    const std::function<bool(absl::string_view, const ObjectLocation&)>& pred) {
  std::vector<uint32_t> doomed;
  for (uint32_t i = 0; i < records_used_; ++i) {
    if (IsLive(i) && pred(KeyOf(i), EntryOf(i))) doomed.push_back(i);
  }
  std::vector<std::pair<std::string, ObjectLocation>> out;
  out.reserve(doomed.size());
  for (uint32_t i : doomed) {
    out.emplace_back(std::string(KeyOf(i)), EntryOf(i));
    TableErase(i);  // hashes record i, which is still intact
    RemoveRecord(i);
  }
  return out;
}

void MetadataIndex::ForEach(
    const std::function<void(absl::string_view, const ObjectLocation&)>& fn)
    const {
  for (uint32_t i = 0; i < records_used_; ++i) {
    if (IsLive(i)) fn(KeyOf(i), EntryOf(i));
  }
}

uint32_t MetadataIndex::ForEachFrom(
    uint32_t begin, size_t max,
    const std::function<bool(absl::string_view, const ObjectLocation&)>& fn)
    const {
  size_t visited = 0;
  uint32_t i = begin;
  for (; i < records_used_ && visited < max; ++i) {
    if (!IsLive(i)) continue;  // free or a ghost
    if (!fn(KeyOf(i), EntryOf(i))) return i;
    ++visited;
  }
  return i;
}

size_t MetadataIndex::MemoryBytes() const {
  size_t records = chunks_.size() * kChunkSize * sizeof(Record) +
                   chunks_.capacity() * sizeof(chunks_[0]);
  // flat_hash_map slot plus its control byte.
  size_t lists = lists_.capacity() * (sizeof(uint32_t) + sizeof(List) + 1);
  size_t shapes = shapes_.capacity() * sizeof(Shape) +
                  free_shapes_.capacity() * sizeof(uint32_t) +
                  shape_ids_.capacity() * (16 + sizeof(uint32_t) + 1);
  size_t wide = wide_.capacity() * (8 + sizeof(ObjectLocation) + 1);
  size_t many = many_children_.capacity() * (2 * sizeof(uint32_t) + 1);
  size_t free_list = free_records_.capacity() * sizeof(uint32_t);
  size_t used = used_.capacity() * sizeof(uint32_t);
  size_t cross = cross_children_.capacity() *
                 (sizeof(uint32_t) + sizeof(std::vector<int>) + 1);
  for (const auto& [parent, nodes] : cross_children_) {
    cross += nodes.capacity() * sizeof(nodes[0]);
  }
  return table_->MemoryBytes() + records + lists + shapes + wide + many +
         free_list + used + cross + out_of_line_key_bytes_;
}

void MetadataIndex::Reserve(size_t n) {
  if (n > size_ && !table_->HasRoomFor(n)) RebuildTable(n);
}

void MetadataIndex::Clear() {
  for (uint32_t i = 0; i < records_used_; ++i) {
    if (record(i).out_of_line()) delete[] record(i).buffer();
  }
  table_ = std::make_unique<RecordTable>(0);
  size_ = 0;
  copy_count_ = 0;
  chunks_.clear();
  lists_.clear();
  records_used_ = 0;
  free_records_.clear();
  out_of_line_key_bytes_ = 0;
  ghost_count_ = 0;
  shapes_.clear();
  free_shapes_.clear();
  shape_ids_.clear();
  wide_.clear();
  many_children_.clear();
  default_usage_ = TenantUsage();
  tenant_usage_.clear();
  tenant_node_bytes_.clear();
  ghosts_by_node_.clear();
  cross_children_.clear();
  used_.clear();
  used_head_ = 0;
  ended_.clear();
  load_.reset();
}

}  // namespace master
}  // namespace hymcache
