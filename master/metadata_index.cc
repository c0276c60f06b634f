#include "master/metadata_index.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/base/internal/endian.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "master/tenant.h"

namespace hymcache {
namespace master {
namespace {

// Approximate heap footprint of a malloc(n): glibc adds an 8-byte header and
// rounds chunks to 16 bytes.
size_t MallocSize(size_t n) { return (n + 8 + 15) & ~size_t{15}; }

}  // namespace

// One entry, exactly one cache line. Keys of up to kInlineKey bytes live in
// `key`; a longer key lives in a heap buffer whose pointer is stored in the
// first bytes of `key`. A free record has key length 0.
struct MetadataIndex::Record {
  static constexpr size_t kInlineKey = 32;
  static constexpr int kLengthBits = 48;

  uint64_t addr;
  uint64_t generation;
  // Low 48 bits: object length; high 16 bits: key length.
  uint64_t length_and_key_len;
  uint32_t node_id;
  uint32_t region_id;
  char key[kInlineKey];

  size_t key_len() const { return length_and_key_len >> kLengthBits; }
  uint64_t length() const {
    return length_and_key_len & ((uint64_t{1} << kLengthBits) - 1);
  }
  const char* key_data() const {
    if (key_len() <= kInlineKey) return key;
    const char* p;
    std::memcpy(&p, key, sizeof(p));
    return p;
  }
  void SetEntry(const IndexEntry& e, size_t klen) {
    addr = e.addr;
    generation = e.generation;
    length_and_key_len = (uint64_t{klen} << kLengthBits) | e.length;
    node_id = e.node_id;
    region_id = e.region_id;
  }
  IndexEntry entry() const {
    IndexEntry e;
    e.node_id = node_id;
    e.region_id = region_id;
    e.addr = addr;
    e.length = length();
    e.generation = generation;
    return e;
  }
};
// State kept between LoadEntry and FinishLoad.
struct MetadataIndex::LoadState {
  // Persisted last use, by record number.
  std::vector<uint64_t> last_use;
  // Parents not yet loaded when their child was: resolved by FinishLoad.
  struct Pending {
    uint32_t record;
    uint32_t length;
    uint64_t offset;  // into parent_keys
  };
  std::vector<Pending> pending;
  std::string parent_keys;
};

MetadataIndex::MetadataIndex() : set_(0, Hash{this}, Eq{this}) {
  static_assert(sizeof(Record) == 64, "Record must be one cache line");
  static_assert(sizeof(Links) == 20, "Links must stay small");
}

MetadataIndex::~MetadataIndex() {
  // Release out-of-line keys; record chunks go with chunks_. Ghosts have
  // released theirs already.
  for (uint32_t i : set_) {
    Record& r = record(i);
    if (r.key_len() > Record::kInlineKey) delete[] r.key_data();
  }
}

size_t MetadataIndex::HashKey(absl::string_view key) {
  return absl::Hash<absl::string_view>{}(key);
}

MetadataIndex::Record& MetadataIndex::record(uint32_t i) const {
  return chunks_[i >> kChunkShift][i & (kChunkSize - 1)];
}

MetadataIndex::Links& MetadataIndex::links(uint32_t i) const {
  return link_chunks_[i >> kChunkShift][i & (kChunkSize - 1)];
}

absl::string_view MetadataIndex::KeyOf(uint32_t i) const {
  const Record& r = record(i);
  return absl::string_view(r.key_data(), r.key_len());
}

bool MetadataIndex::IsGhost(uint32_t i) const {
  return record(i).key_len() == 0 && HasChildren(i);
}

bool MetadataIndex::HasChildren(uint32_t i) const {
  return links(i).child_count() > 0 || cross_children_.contains(i);
}

absl::StatusOr<uint32_t> MetadataIndex::NewRecord() {
  if (!free_records_.empty()) {
    uint32_t i = free_records_.back();
    free_records_.pop_back();
    return i;
  }
  if (records_used_ == std::numeric_limits<uint32_t>::max()) {
    return absl::ResourceExhaustedError("index is full (2^32 - 1 records)");
  }
  if ((records_used_ >> kChunkShift) >= chunks_.size()) {
    chunks_.push_back(std::make_unique<Record[]>(kChunkSize));
    link_chunks_.push_back(std::make_unique<Links[]>(kChunkSize));
  }
  return records_used_++;
}

void MetadataIndex::FillRecord(uint32_t i, absl::string_view key,
                               const IndexEntry& entry) {
  Record& r = record(i);
  r.SetEntry(entry, key.size());
  CountTenant(key, +1, static_cast<int64_t>(entry.length));
  if (key.size() <= Record::kInlineKey) {
    std::memcpy(r.key, key.data(), key.size());
  } else {
    char* p = new char[key.size()];
    std::memcpy(p, key.data(), key.size());
    std::memcpy(r.key, &p, sizeof(p));
    out_of_line_key_bytes_ += MallocSize(key.size());
  }
  links(i) = Links{kNil, kNil, 0, kNil, 0};
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

void MetadataIndex::FreeRecord(uint32_t i) {
  Record& r = record(i);
  if (r.key_len() > 0) {
    CountTenant(KeyOf(i), -1, -static_cast<int64_t>(r.entry().length));
  }
  if (r.key_len() > Record::kInlineKey) {
    out_of_line_key_bytes_ -= MallocSize(r.key_len());
    delete[] r.key_data();
  }
  std::memset(&r, 0, sizeof(r));
  links(i) = Links{kNil, kNil, 0, kNil, 0};
  free_records_.push_back(i);
}

void MetadataIndex::RemoveRecord(uint32_t i) {
  Record& r = record(i);
  const uint32_t node_id = r.node_id;
  Unlink(i, node_id);
  DetachFromParent(i);
  Links& l = links(i);
  if (!HasChildren(i)) {
    FreeRecord(i);
    return;
  }
  // A ghost: keyless, unfindable, unlisted; freed with its last child.
  CountTenant(KeyOf(i), -1, -static_cast<int64_t>(r.entry().length));
  if (r.key_len() > Record::kInlineKey) {
    out_of_line_key_bytes_ -= MallocSize(r.key_len());
    delete[] r.key_data();
  }
  std::memset(r.key, 0, sizeof(r.key));
  r.length_and_key_len = 0;
  l.read_tick = 0;
  l.children &= ~kUsedBit;  // no longer queued for CollectUsed
  ++ghost_count_;
  ++ghosts_by_node_[node_id];
  // Its orphans on other nodes are found through those nodes' lists.
  auto cross = cross_children_.find(i);
  if (cross != cross_children_.end()) {
    for (const auto& [node, count] : cross->second) ++ghosts_by_node_[node];
  }
}

void MetadataIndex::DropGhostNode(uint32_t node_id) {
  auto g = ghosts_by_node_.find(node_id);
  if (g != ghosts_by_node_.end() && --g->second == 0) ghosts_by_node_.erase(g);
}

bool MetadataIndex::CanLink(uint32_t parent, uint32_t node_id) const {
  return record(parent).node_id != node_id ||
         links(parent).child_count() < kMaxChildren;
}

void MetadataIndex::SetParent(uint32_t i, uint32_t parent) {
  Links& l = links(i);
  l.parent = parent;
  l.children &= ~kCrossBit;
  if (parent == kNil) return;
  const uint32_t node_id = record(i).node_id;
  if (record(parent).node_id == node_id) {
    ++links(parent).children;
  } else {
    l.children |= kCrossBit;
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
      if (record(parent).key_len() == 0) DropGhostNode(node_id);
    }
    break;
  }
  if (nodes.empty()) cross_children_.erase(it);
}

void MetadataIndex::DetachFromParent(uint32_t i) {
  Links& l = links(i);
  const uint32_t p = l.parent;
  if (p == kNil) return;
  l.parent = kNil;
  if (l.cross()) {
    l.children &= ~kCrossBit;
    RemoveCrossChild(p, record(i).node_id);
  } else {
    --links(p).children;  // the count is > 0: the flag bits are untouched
  }
  if (record(p).key_len() == 0 && !HasChildren(p)) {
    // A ghost's last child: the ghost goes.
    --ghost_count_;
    DropGhostNode(record(p).node_id);
    FreeRecord(p);
  }
}

std::vector<uint32_t> MetadataIndex::DetachChildren(uint32_t i) {
  std::vector<uint32_t> nodes;
  if (links(i).child_count() > 0) nodes.push_back(record(i).node_id);
  auto cross = cross_children_.find(i);
  if (cross != cross_children_.end()) {
    for (const auto& [node, count] : cross->second) nodes.push_back(node);
  }
  std::vector<uint32_t> out;
  for (uint32_t node : nodes) {
    auto list = lists_.find(node);
    if (list == lists_.end()) continue;
    for (uint32_t j = list->second.least; j != kNil && HasChildren(i);) {
      const uint32_t next = links(j).next;
      if (links(j).parent == i) {
        DetachFromParent(j);
        out.push_back(j);
      }
      j = next;
    }
  }
  return out;
}

void MetadataIndex::LinkMostRecent(uint32_t i, uint32_t node_id) {
  LinkMostRecent(i, lists_[node_id]);
}

void MetadataIndex::LinkMostRecent(uint32_t i, List& list) {
  Links& l = links(i);
  l.prev = list.most;
  l.next = kNil;
  if (list.most != kNil) {
    links(list.most).next = i;
  } else {
    list.least = i;
  }
  list.most = i;
}

void MetadataIndex::LinkBelow(uint32_t i, uint32_t above, List& list) {
  Links& l = links(i);
  Links& a = links(above);
  l.next = above;
  l.prev = a.prev;
  if (a.prev != kNil) {
    links(a.prev).next = i;
  } else {
    list.least = i;
  }
  a.prev = i;
}

void MetadataIndex::Unlink(uint32_t i, uint32_t node_id) {
  auto it = lists_.find(node_id);
  if (it == lists_.end()) return;  // not linked (cannot happen)
  Unlink(i, it->second);
  if (it->second.least == kNil) lists_.erase(it);
}

void MetadataIndex::Unlink(uint32_t i, List& list) {
  Links& l = links(i);
  if (l.prev != kNil) {
    links(l.prev).next = l.next;
  } else {
    list.least = l.next;
  }
  if (l.next != kNil) {
    links(l.next).prev = l.prev;
  } else {
    list.most = l.prev;
  }
  l.prev = l.next = kNil;
}

namespace {

absl::Status ValidateKeyAndEntry(absl::string_view key, const IndexEntry& entry,
                                 absl::string_view parent) {
  if (key.empty() || key.size() > MetadataIndex::kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("index key of ", key.size(), " bytes (want 1..",
                     MetadataIndex::kMaxKeyBytes, ")"));
  }
  if (entry.length > MetadataIndex::kMaxLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("index entry length ", entry.length, " exceeds ",
                     MetadataIndex::kMaxLength));
  }
  if (!parent.empty() && parent == key) {
    return absl::InvalidArgumentError("index key is its own parent");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<IndexEntry>> MetadataIndex::Upsert(
    absl::string_view key, const IndexEntry& entry, absl::string_view parent) {
  absl::Status valid = ValidateKeyAndEntry(key, entry, parent);
  if (!valid.ok()) return valid;
  // The parent, if present (on the same node: with room for another child).
  uint32_t p = kNil;
  if (!parent.empty()) {
    auto pit = set_.find(parent);
    if (pit != set_.end() && CanLink(*pit, entry.node_id)) p = *pit;
  }
  auto it = set_.find(key);
  auto place = [&](uint32_t i) {
    List& list = lists_[entry.node_id];
    SetParent(i, p);
    if (links(i).local_parent() != kNil) {
      LinkBelow(i, p, list);
    } else {
      LinkMostRecent(i, list);
    }
  };

  std::optional<IndexEntry> old;
  if (it != set_.end()) {
    const uint32_t i = *it;
    Record& r = record(i);
    old = r.entry();
    // The key stays listed (at its new location), so the blocks after it
    // are still reachable through it: they stay, linked to it again (same
    // node or cross links as its new node says), so that losing it later
    // still orphans them. O(entries of the nodes holding them); a key with
    // children is stored again only when its node is dead.
    std::vector<uint32_t> kids;
    if (HasChildren(i)) {
      // A parent below the key would close a cycle: the key becomes a root.
      for (uint32_t a = p; a != kNil; a = links(a).parent) {
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
    r.SetEntry(entry, r.key_len());
    CountTenant(key, 0,
                static_cast<int64_t>(entry.length) -
                    static_cast<int64_t>(old->length));
    links(i).read_tick = 0;
    place(i);
    for (uint32_t j : kids) {
      const uint32_t node_id = record(j).node_id;
      if (!CanLink(i, node_id)) continue;  // stays a root
      SetParent(j, i);
      if (links(j).cross()) continue;
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
  set_.insert(i);
  place(i);
  return old;
}

bool MetadataIndex::Adopt(absl::string_view child, absl::string_view parent) {
  auto c = set_.find(child);
  auto p = set_.find(parent);
  if (c == set_.end() || p == set_.end() || *c == *p) return false;
  const uint32_t ci = *c;
  const uint32_t pi = *p;
  const uint32_t node_id = record(ci).node_id;
  if (links(ci).parent != kNil || !CanLink(pi, node_id)) return false;
  for (uint32_t a = pi; a != kNil; a = links(a).parent) {
    if (a == ci) return false;  // parent is below child: a cycle
  }
  SetParent(ci, pi);
  if (links(ci).cross()) return true;  // stays a root of its node's list
  List& list = lists_[node_id];
  Unlink(ci, list);
  LinkBelow(ci, pi, list);
  return true;
}

std::optional<IndexEntry> MetadataIndex::Find(absl::string_view key) const {
  auto it = set_.find(key);
  if (it == set_.end()) return std::nullopt;
  return record(*it).entry();
}

std::optional<IndexEntry> MetadataIndex::Erase(absl::string_view key) {
  auto it = set_.find(key);
  if (it == set_.end()) return std::nullopt;
  const uint32_t i = *it;
  IndexEntry e = record(i).entry();
  set_.erase(it);
  RemoveRecord(i);
  return e;
}

bool MetadataIndex::Touch(absl::string_view key, uint32_t read_tick) {
  auto it = set_.find(key);
  if (it == set_.end()) return false;
  TouchRecord(*it, read_tick);
  return true;
}

size_t MetadataIndex::TouchPrefix(const std::vector<absl::string_view>& keys,
                                  uint32_t read_tick) {
  std::vector<uint32_t> found;
  found.reserve(keys.size());
  for (absl::string_view key : keys) {
    auto it = set_.find(key);
    if (it != set_.end()) found.push_back(*it);
  }
  for (auto i = found.rbegin(); i != found.rend(); ++i) {
    if (links(*i).local_parent() == kNil) TouchRecord(*i, read_tick);
  }
  for (uint32_t i : found) {
    if (links(i).local_parent() != kNil) TouchRecord(i, read_tick);
  }
  return found.size();
}

void MetadataIndex::TouchRecord(uint32_t i, uint32_t read_tick) {
  const uint32_t node_id = record(i).node_id;
  Links& l = links(i);
  auto list = lists_.find(node_id);
  if (list == lists_.end()) {
    LinkMostRecent(i, node_id);  // not linked (cannot happen)
  } else if (l.local_parent() != kNil && record(l.parent).key_len() != 0) {
    // The parent is on the same list and stays there. (An orphan's parent
    // may be a ghost, on no list: the orphan is touched as a root.)
    if (l.next != l.parent) {
      Unlink(i, list->second);
      LinkBelow(i, l.parent, list->second);
    }
  } else if (list->second.most != i) {
    // Not the most recent, so the list keeps at least one other record.
    Unlink(i, list->second);
    LinkMostRecent(i, list->second);
  }
  l.read_tick = read_tick;
  if (track_used_ && (l.children & kUsedBit) == 0) {
    l.children |= kUsedBit;
    used_.push_back(i);
  }
}

std::optional<uint32_t> MetadataIndex::ReadTick(absl::string_view key) const {
  auto it = set_.find(key);
  if (it == set_.end()) return std::nullopt;
  return links(*it).read_tick;
}

std::optional<MetadataIndex::ChainLinks> MetadataIndex::Chain(
    absl::string_view key) const {
  auto it = set_.find(key);
  if (it == set_.end()) return std::nullopt;
  ChainLinks out;
  const Links& l = links(*it);
  out.children = l.child_count();
  out.cross = l.cross();
  auto cross = cross_children_.find(*it);
  if (cross != cross_children_.end()) {
    for (const auto& [node, count] : cross->second) out.cross_children += count;
  }
  if (l.parent != kNil) out.parent = std::string(KeyOf(l.parent));
  for (uint32_t a = l.parent; a != kNil; a = links(a).parent) {
    if (IsGhost(a)) {
      out.orphan = true;
      break;
    }
  }
  return out;
}

void MetadataIndex::ForEachLeastRecent(
    uint32_t node_id,
    const std::function<bool(absl::string_view, const IndexEntry&, uint32_t)>&
        fn) const {
  auto it = lists_.find(node_id);
  if (it == lists_.end()) return;
  for (uint32_t i = it->second.least; i != kNil;) {
    const uint32_t next = links(i).next;
    if (!fn(KeyOf(i), record(i).entry(), links(i).read_tick)) return;
    i = next;
  }
}

MetadataIndex::WalkEnd MetadataIndex::PickEvictions(
    uint32_t node_id, size_t max_scan,
    const std::function<Verdict(absl::string_view, const IndexEntry&,
                                uint32_t)>& judge,
    const std::function<bool(absl::string_view, const IndexEntry&)>& take)
    const {
  auto it = lists_.find(node_id);
  if (it == lists_.end()) return WalkEnd::kListEnd;
  // Children chosen so far, per parent; entries passed over because they
  // still had children (only after an Adopt are children more recent).
  absl::flat_hash_map<uint32_t, uint32_t> chosen_children;
  absl::flat_hash_set<uint32_t> deferred;
  size_t scanned = 0;
  for (uint32_t i = it->second.least; i != kNil; i = links(i).next) {
    if (scanned == max_scan) return WalkEnd::kScanLimit;
    ++scanned;
    const Verdict v = judge(KeyOf(i), record(i).entry(), links(i).read_tick);
    if (v == Verdict::kStop) return WalkEnd::kStopped;
    if (v == Verdict::kKeep) continue;
    const uint32_t children = links(i).child_count();
    if (children > 0) {
      auto c = chosen_children.find(i);
      if (c == chosen_children.end() || c->second < children) {
        deferred.insert(i);
        continue;
      }
    }
    // Choose i, then every deferred ancestor it was the last child of.
    for (uint32_t x = i;;) {
      if (!take(KeyOf(x), record(x).entry())) return WalkEnd::kEnough;
      // A cross-linked parent is on another node's list: not this walk's.
      const uint32_t p = links(x).local_parent();
      if (p == kNil) break;
      const uint32_t n = ++chosen_children[p];
      if (n < links(p).child_count() || deferred.erase(p) == 0) break;
      x = p;
    }
  }
  return WalkEnd::kListEnd;
}

std::vector<std::pair<std::string, IndexEntry>> MetadataIndex::Orphans()
    const {
  std::vector<std::pair<std::string, IndexEntry>> out;
  if (ghost_count_ == 0) return out;
  // Per record: 0 unknown, 1 reachable, 2 orphan.
  std::vector<uint8_t> state(records_used_, 0);
  std::vector<uint32_t> path;
  // The lists to walk: the ghosts' nodes, then the nodes of orphans'
  // cross-linked children (their descendants there are orphans too).
  std::vector<uint32_t> nodes;
  absl::flat_hash_set<uint32_t> queued;
  for (const auto& [node_id, count] : ghosts_by_node_) {
    nodes.push_back(node_id);
    queued.insert(node_id);
  }
  for (size_t n = 0; n < nodes.size(); ++n) {
    auto list = lists_.find(nodes[n]);
    if (list == lists_.end()) continue;
    for (uint32_t i = list->second.least; i != kNil; i = links(i).next) {
      path.clear();
      uint32_t a = i;
      uint8_t verdict = 1;
      while (a != kNil) {
        if (state[a] != 0) {
          verdict = state[a];
          break;
        }
        if (IsGhost(a)) {
          verdict = 2;
          break;
        }
        path.push_back(a);
        a = links(a).parent;
      }
      for (uint32_t x : path) state[x] = verdict;
      if (verdict != 2) continue;
      out.emplace_back(std::string(KeyOf(i)), record(i).entry());
      auto cross = cross_children_.find(i);
      if (cross == cross_children_.end()) continue;
      for (const auto& [node, count] : cross->second) {
        if (queued.insert(node).second) nodes.push_back(node);
      }
    }
  }
  return out;
}

void MetadataIndex::TrackUsed(bool on) {
  if (!on) {
    for (size_t k = used_head_; k < used_.size(); ++k) {
      const uint32_t i = used_[k];
      if (i < records_used_) links(i).children &= ~kUsedBit;
    }
    used_.clear();
    used_.shrink_to_fit();
    used_head_ = 0;
  }
  track_used_ = on;
}

std::vector<std::pair<std::string, uint32_t>> MetadataIndex::CollectUsed(
    size_t max) {
  std::vector<std::pair<std::string, uint32_t>> out;
  while (out.size() < max && used_head_ < used_.size()) {
    const uint32_t i = used_[used_head_++];
    Links& l = links(i);
    if ((l.children & kUsedBit) == 0 || record(i).key_len() == 0) continue;
    l.children &= ~kUsedBit;
    out.emplace_back(std::string(KeyOf(i)), l.read_tick);
  }
  if (used_head_ == used_.size()) {
    used_.clear();
    if (used_.capacity() > (size_t{1} << 16)) used_.shrink_to_fit();
    used_head_ = 0;
  } else if (used_head_ > (size_t{1} << 12) && used_head_ > used_.size() / 2) {
    used_.erase(used_.begin(), used_.begin() + used_head_);
    used_head_ = 0;
  }
  return out;
}

void MetadataIndex::RebaseReadTicks(uint32_t shift) {
  for (uint32_t i : set_) {
    uint32_t& t = links(i).read_tick;
    t = t > shift ? t - shift : 0;
  }
}

std::vector<std::pair<std::string, IndexEntry>> MetadataIndex::EraseIf(
    const std::function<bool(absl::string_view, const IndexEntry&)>& pred) {
  std::vector<uint32_t> doomed;
  for (uint32_t i : set_) {
    if (pred(KeyOf(i), record(i).entry())) doomed.push_back(i);
  }
  std::vector<std::pair<std::string, IndexEntry>> out;
  out.reserve(doomed.size());
  for (uint32_t i : doomed) {
    out.emplace_back(std::string(KeyOf(i)), record(i).entry());
    set_.erase(i);  // hashes record i, which is still intact
    RemoveRecord(i);
  }
  return out;
}

void MetadataIndex::ForEach(
    const std::function<void(absl::string_view, const IndexEntry&)>& fn)
    const {
  for (uint32_t i : set_) fn(KeyOf(i), record(i).entry());
}

uint32_t MetadataIndex::ForEachFrom(
    uint32_t begin, size_t max,
    const std::function<bool(absl::string_view, const IndexEntry&)>& fn)
    const {
  size_t visited = 0;
  uint32_t i = begin;
  for (; i < records_used_ && visited < max; ++i) {
    const Record& r = record(i);
    if (r.key_len() == 0) continue;  // free (FreeRecord zeroes it) or a ghost
    if (!fn(KeyOf(i), r.entry())) return i;
    ++visited;
  }
  return i;
}

absl::Status MetadataIndex::LoadEntry(absl::string_view key,
                                      const IndexEntry& entry,
                                      absl::string_view parent,
                                      uint64_t last_use) {
  absl::Status valid = ValidateKeyAndEntry(key, entry, parent);
  if (!valid.ok()) return valid;
  absl::StatusOr<uint32_t> fresh = NewRecord();
  if (!fresh.ok()) return fresh.status();
  const uint32_t i = *fresh;
  FillRecord(i, key, entry);
  if (!set_.insert(i).second) {  // one probe, no separate find
    FreeRecord(i);
    return absl::AlreadyExistsError("index key loaded twice");
  }
  if (load_ == nullptr) load_ = std::make_unique<LoadState>();
  LoadState& ls = *load_;
  if (ls.last_use.size() <= i) ls.last_use.resize(size_t{i} + 1, 0);
  ls.last_use[i] = last_use;
  if (parent.empty()) return absl::OkStatus();
  auto p = set_.find(parent);
  if (p == set_.end()) {
    ls.pending.push_back({i, static_cast<uint32_t>(parent.size()),
                          ls.parent_keys.size()});
    ls.parent_keys.append(parent.data(), parent.size());
  } else if (CanLink(*p, entry.node_id)) {
    SetParent(i, *p);
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, IndexEntry>> MetadataIndex::FinishLoad() {
  std::vector<std::pair<std::string, IndexEntry>> dropped;
  if (load_ == nullptr) return dropped;
  LoadState& ls = *load_;
  ls.last_use.resize(records_used_, 0);

  // Parents loaded after their children.
  std::vector<uint8_t> flags(records_used_, 0);
  constexpr uint8_t kKnown = 1, kBroken = 2, kMissingParent = 4;
  for (const LoadState::Pending& pending : ls.pending) {
    absl::string_view parent(ls.parent_keys.data() + pending.offset,
                             pending.length);
    auto p = set_.find(parent);
    if (p == set_.end()) {
      flags[pending.record] |= kMissingParent;
    } else if (CanLink(*p, record(pending.record).node_id)) {
      SetParent(pending.record, *p);
    }
  }
  ls.pending = {};
  ls.parent_keys = {};

  // Live records in load order (record numbers are handed out in order).
  std::vector<uint32_t> loaded;
  loaded.reserve(set_.size());
  for (uint32_t i = 0; i < records_used_; ++i) {
    if (record(i).key_len() != 0) loaded.push_back(i);
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
      a = links(a).parent;
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
    dropped.emplace_back(std::string(KeyOf(i)), record(i).entry());
    set_.erase(i);
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
    const uint32_t p = links(i).parent;
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
    LinkMostRecent(item.record, record(item.record).node_id);
  }
  return dropped;
}

size_t MetadataIndex::MemoryBytes() const {
  // Swiss table: one control byte plus one slot per bucket, plus a group of
  // cloned control bytes.
  size_t table = set_.capacity() * (sizeof(uint32_t) + 1) + 16;
  size_t records = chunks_.size() * kChunkSize * sizeof(Record) +
                   chunks_.capacity() * sizeof(chunks_[0]);
  size_t links = link_chunks_.size() * kChunkSize * sizeof(Links) +
                 link_chunks_.capacity() * sizeof(link_chunks_[0]);
  // flat_hash_map slot (node id + List) plus its control byte.
  size_t lists = lists_.capacity() * (sizeof(uint32_t) + sizeof(List) + 1);
  size_t free_list = free_records_.capacity() * sizeof(uint32_t);
  size_t used = used_.capacity() * sizeof(uint32_t);
  size_t cross = cross_children_.capacity() *
                 (sizeof(uint32_t) + sizeof(std::vector<int>) + 1);
  for (const auto& [parent, nodes] : cross_children_) {
    cross += nodes.capacity() * sizeof(nodes[0]);
  }
  return table + records + links + lists + free_list + used + cross +
         out_of_line_key_bytes_;
}

void MetadataIndex::Reserve(size_t n) { set_.reserve(n); }

// Snapshot stream: u64 entry count, then per entry (little-endian)
//   u16 key length, the key, u32 node id, u32 region id, u64 addr,
//   u64 length, u64 generation, u32 position of the parent in the stream
//   (0xffffffff: none);
// each node's entries least recent first (the nodes one after another).
namespace {
constexpr size_t kSnapshotFixed = 2 + 4 + 4 + 8 + 8 + 8 + 4;
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
    for (uint32_t i = list.least; i != kNil; i = links(i).next) {
      position[i] = next++;
    }
  }
  std::string out;
  out.reserve(kSnapshotPiece + kSnapshotFixed + kMaxKeyBytes);
  out.resize(8);
  absl::little_endian::Store64(out.data(), next);
  for (const auto& [node_id, list] : lists_) {
    for (uint32_t i = list.least; i != kNil; i = links(i).next) {
      const Record& r = record(i);
      const absl::string_view key = KeyOf(i);
      const uint32_t parent = links(i).parent;
      const size_t at = out.size();
      out.resize(at + kSnapshotFixed + key.size());
      char* p = out.data() + at;
      absl::little_endian::Store16(p, static_cast<uint16_t>(key.size()));
      std::memcpy(p + 2, key.data(), key.size());
      p += 2 + key.size();
      absl::little_endian::Store32(p, r.node_id);
      absl::little_endian::Store32(p + 4, r.region_id);
      absl::little_endian::Store64(p + 8, r.addr);
      absl::little_endian::Store64(p + 16, r.length());
      absl::little_endian::Store64(p + 24, r.generation);
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
  set_.reserve(count);
  std::vector<uint32_t> parents(count);
  const char* p = data.data() + 8;
  const char* const end = data.data() + data.size();
  uint32_t node_id = kNil;
  List* list = nullptr;
  for (uint64_t k = 0; k < count; ++k) {
    if (end - p < static_cast<ptrdiff_t>(kSnapshotFixed)) {
      return fail("truncated");
    }
    const size_t key_len = absl::little_endian::Load16(p);
    if (key_len == 0 ||
        end - p < static_cast<ptrdiff_t>(kSnapshotFixed + key_len)) {
      return fail("truncated or empty key");
    }
    const absl::string_view key(p + 2, key_len);
    p += 2 + key_len;
    IndexEntry e;
    e.node_id = absl::little_endian::Load32(p);
    e.region_id = absl::little_endian::Load32(p + 4);
    e.addr = absl::little_endian::Load64(p + 8);
    e.length = absl::little_endian::Load64(p + 16);
    e.generation = absl::little_endian::Load64(p + 24);
    parents[k] = absl::little_endian::Load32(p + 32);
    p += kSnapshotFixed - 2;
    if (e.length > kMaxLength) return fail("length out of range");
    // A fresh index hands out record numbers 0, 1, ...: record k is entry k.
    absl::StatusOr<uint32_t> fresh = NewRecord();
    if (!fresh.ok()) return fail(fresh.status().message());
    FillRecord(*fresh, key, e);
    if (!set_.insert(*fresh).second) return fail("a key twice");
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
    if (CanLink(parent, record(i).node_id)) SetParent(i, parent);
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
      a = links(a).parent;
    }
    if (a != kNil && state[a] == 1) return fail("a chain loops");
    for (uint32_t x : path) state[x] = 2;
  }
  return absl::OkStatus();
}

void MetadataIndex::Clear() {
  for (uint32_t i : set_) {
    Record& r = record(i);
    if (r.key_len() > Record::kInlineKey) delete[] r.key_data();
  }
  set_.clear();
  chunks_.clear();
  link_chunks_.clear();
  lists_.clear();
  records_used_ = 0;
  free_records_.clear();
  out_of_line_key_bytes_ = 0;
  ghost_count_ = 0;
  default_usage_ = TenantUsage();
  tenant_usage_.clear();
  ghosts_by_node_.clear();
  cross_children_.clear();
  used_.clear();
  used_head_ = 0;
  load_.reset();
}

}  // namespace master
}  // namespace hymcache
