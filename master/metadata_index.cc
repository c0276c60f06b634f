#include "master/metadata_index.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <tuple>

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

// One entry, exactly one cache line (chunks are line-aligned): the key, the
// recency and chain links, the read tick and the packed location, so a
// lookup reads one line and a touch writes it and its neighbours' lines.
//
// Keys of up to kInlineKey bytes live in `key`; a longer key lives in a heap
// buffer (a u16 length, then the bytes) whose pointer is stored in the first
// bytes of `key`. A free record and a ghost have key length 0.
//
// The location: node, region and length are a shared Shape (`shape`
// indexes MetadataIndex::shapes_); addr and generation take 48 bits each.
// An entry whose values do not fit has shape kWideShape and its location
// in MetadataIndex::wide_.
struct alignas(64) MetadataIndex::Record {
  static constexpr size_t kInlineKey = 32;
  static constexpr uint32_t kOutOfLine = kInlineKey + 1;  // key length field
  static constexpr uint32_t kWideShape = (uint32_t{1} << 21) - 1;
  static constexpr uint32_t kManyKids = 7;  // count in many_children_

  // `bits`: key length field (6 bits: 0, 1..kInlineKey or kOutOfLine),
  // queued for CollectUsed (1), parent on another node (1), same-node
  // children (3 bits, kManyKids: more), shape (21).
  static constexpr uint32_t kKeyLenMask = 0x3f;
  static constexpr uint32_t kUsedBit = 1u << 6;
  static constexpr uint32_t kCrossBit = 1u << 7;
  static constexpr int kKidsShift = 8;
  static constexpr uint32_t kKidsMask = 7u << kKidsShift;
  static constexpr int kShapeShift = 11;

  char key[kInlineKey];
  uint32_t prev;       // less recent neighbour, or kNil
  uint32_t next;       // more recent neighbour, or kNil
  uint32_t parent;     // linked parent (see cross()), or kNil
  uint32_t read_tick;  // last Touch, 0 if none since Upsert
  uint32_t bits;
  uint32_t addr_lo;
  uint32_t generation_lo;
  uint16_t addr_hi;
  uint16_t generation_hi;

  uint32_t key_field() const { return bits & kKeyLenMask; }
  bool has_key() const { return key_field() != 0; }
  bool out_of_line() const { return key_field() == kOutOfLine; }
  void set_key_field(uint32_t f) { bits = (bits & ~kKeyLenMask) | f; }
  bool used() const { return (bits & kUsedBit) != 0; }
  void set_used(bool on) { bits = on ? bits | kUsedBit : bits & ~kUsedBit; }
  bool cross() const { return (bits & kCrossBit) != 0; }
  void set_cross(bool on) { bits = on ? bits | kCrossBit : bits & ~kCrossBit; }
  uint32_t kids() const { return (bits & kKidsMask) >> kKidsShift; }
  void set_kids(uint32_t k) {
    bits = (bits & ~kKidsMask) | (k << kKidsShift);
  }
  uint32_t shape() const { return bits >> kShapeShift; }
  void set_shape(uint32_t s) {
    bits = (bits & ((1u << kShapeShift) - 1)) | (s << kShapeShift);
  }
  uint64_t addr() const { return uint64_t{addr_hi} << 32 | addr_lo; }
  uint64_t generation() const {
    return uint64_t{generation_hi} << 32 | generation_lo;
  }
  void set_addr_generation(uint64_t addr, uint64_t generation) {
    addr_lo = static_cast<uint32_t>(addr);
    addr_hi = static_cast<uint16_t>(addr >> 32);
    generation_lo = static_cast<uint32_t>(generation);
    generation_hi = static_cast<uint16_t>(generation >> 32);
  }
  // An out-of-line key's buffer.
  const char* buffer() const {
    const char* p;
    std::memcpy(&p, key, sizeof(p));
    return p;
  }
  absl::string_view key_view() const {
    const uint32_t f = key_field();
    if (f != kOutOfLine) return absl::string_view(key, f);
    const char* p = buffer();
    return absl::string_view(p + 2, absl::little_endian::Load16(p));
  }
  // No key, no links, no location (wide, without a wide_ entry): a free
  // record.
  void Reset() {
    std::memset(key, 0, sizeof(key));
    prev = next = parent = kNil;
    read_tick = 0;
    bits = kWideShape << kShapeShift;  // holds no location
    set_addr_generation(0, 0);
  }
};

// The hash table: record numbers in open addressing with linear probing over
// groups of 7 slots. A group is 36 bytes: the 7 record numbers, then 8
// control bytes, one per slot (a 7-bit tag of the key's hash, or empty) and
// the group's overflow count: how many entries whose probe started at or
// before it went past it because it was full (F14's scheme). A lookup reads
// its home group and stops there unless that group has overflowed, so a
// miss usually costs one group, and erasing needs no tombstones. 5.14 bytes
// per slot at up to 7/8 load; it grows by 1.25x (not 2x: between 5.9 and
// 7.3 bytes per entry), rebuilt from the records in record order. The table
// does not know keys: callers pass hashes and compare keys themselves.
class MetadataIndex::Table {
 public:
  static constexpr uint32_t kNone = 0xffffffffu;

  // Empty, sized for `n` entries.
  explicit Table(size_t n) {
    const size_t slots = n + n / 7 + 1;  // n at 7/8 load
    num_groups_ = std::max<size_t>(1, (slots + kGroup - 1) / kGroup);
    groups_.reset(new Group[num_groups_]);
    for (size_t g = 0; g < num_groups_; ++g) {
      for (uint32_t& slot : groups_[g].slot) slot = kNone;
      SetCtrl(groups_[g], kAllEmpty);
    }
    max_size_ = num_groups_ * kGroup * 7 / 8;
  }

  // The record among those whose tag matches `hash` for which `eq` holds,
  // or kNone.
  template <typename Eq>
  uint32_t Find(size_t hash, const Eq& eq) const {
    const uint64_t pattern = kLsbs * Tag(hash);
    size_t g = Home(hash);
    for (size_t probed = 0; probed < num_groups_; ++probed) {
      const Group& group = groups_[g];
      const uint64_t ctrl = Ctrl(group);
      for (uint64_t m = Match(ctrl, pattern); m != 0; m &= m - 1) {
        const uint32_t r = group.slot[Lowest(m)];
        if (eq(r)) return r;
      }
      if (Overflow(ctrl) == 0) return kNone;
      g = Next(g);
    }
    return kNone;
  }

  bool HasRoom() const { return size_ < max_size_; }
  // Whether `n` entries fit without a rebuild.
  bool HasRoomFor(size_t n) const { return n <= max_size_; }

  // Adds record `r` (absent). REQUIRES: HasRoom().
  void Insert(size_t hash, uint32_t r) {
    for (size_t g = Home(hash);; g = Next(g)) {
      Group& group = groups_[g];
      const uint64_t ctrl = Ctrl(group);
      const uint64_t free = ctrl & kSlotMsbs;  // empty slots
      if (free == 0) {
        // Full: one more entry probes past it.
        if (Overflow(ctrl) < 0xff) SetCtrl(group, ctrl + kOverflowOne);
        continue;
      }
      const int k = Lowest(free);
      SetCtrl(group, WithByte(ctrl, k, Tag(hash)));
      group.slot[k] = r;
      ++size_;
      return;
    }
  }

  // Removes record `r` (present, with this hash).
  void Erase(size_t hash, uint32_t r) {
    const uint64_t pattern = kLsbs * Tag(hash);
    const size_t home = Home(hash);
    size_t g = home;
    for (size_t probed = 0; probed < num_groups_; ++probed) {
      Group& group = groups_[g];
      const uint64_t ctrl = Ctrl(group);
      for (uint64_t m = Match(ctrl, pattern); m != 0; m &= m - 1) {
        const int k = Lowest(m);
        if (group.slot[k] != r) continue;
        SetCtrl(group, WithByte(ctrl, k, kEmpty));
        group.slot[k] = kNone;
        --size_;
        // The groups it went past count one fewer (saturated counts stay).
        for (size_t x = home; x != g; x = Next(x)) {
          const uint64_t c = Ctrl(groups_[x]);
          if (Overflow(c) < 0xff) SetCtrl(groups_[x], c - kOverflowOne);
        }
        return;
      }
      if (Overflow(ctrl) == 0) return;  // absent (cannot happen)
      g = Next(g);
    }
  }

  size_t size() const { return size_; }
  // Entries a rebuild should make room for: the live ones and a quarter
  // more.
  size_t GrowTarget() const { return size_ + size_ / 4 + kGroup; }
  size_t MemoryBytes() const { return num_groups_ * sizeof(Group); }

 private:
  static constexpr int kGroup = 7;
  static constexpr uint8_t kEmpty = 0x80;
  static constexpr uint64_t kLsbs = 0x0001010101010101ull;  // slot bytes
  static constexpr uint64_t kSlotMsbs = 0x0080808080808080ull;
  static constexpr uint64_t kAllEmpty = kLsbs * kEmpty;  // overflow 0
  static constexpr uint64_t kOverflowOne = uint64_t{1} << 56;
  struct Group {
    uint32_t slot[kGroup];
    // Bytes 0-6: slot k's tag (< 0x80) or kEmpty; byte 7: overflow count
    // (saturating at 255). Read and written as one little-endian u64.
    unsigned char ctrl[8];
  };
  static_assert(sizeof(Group) == 36, "a group is 36 bytes");

  static uint64_t Ctrl(const Group& g) {
    uint64_t c;
    std::memcpy(&c, g.ctrl, 8);
    return absl::little_endian::ToHost64(c);
  }
  static void SetCtrl(Group& g, uint64_t c) {
    c = absl::little_endian::FromHost64(c);
    std::memcpy(g.ctrl, &c, 8);
  }
  static uint64_t Overflow(uint64_t ctrl) { return ctrl >> 56; }
  static uint8_t Tag(size_t hash) { return hash & 0x7f; }
  size_t Home(size_t hash) const {
    return static_cast<size_t>(
        (static_cast<unsigned __int128>(hash >> 7) << 7) * num_groups_ >> 64);
  }
  size_t Next(size_t g) const { return g + 1 == num_groups_ ? 0 : g + 1; }
  // Slot bytes equal to the pattern's (a few false positives above a true
  // match, never on an empty slot: callers compare the record).
  static uint64_t Match(uint64_t ctrl, uint64_t pattern) {
    const uint64_t x = (ctrl ^ pattern) | ~(kLsbs * 0xff);  // no overflow byte
    return (x - kLsbs) & ~x & kSlotMsbs;
  }
  static int Lowest(uint64_t mask) { return __builtin_ctzll(mask) >> 3; }
  static uint64_t WithByte(uint64_t ctrl, int k, uint8_t b) {
    return (ctrl & ~(uint64_t{0xff} << (8 * k))) | (uint64_t{b} << (8 * k));
  }

  // (Not on transparent huge pages: tried, restoring 10 M entries took
  // 0.5 s less, but 32 lookups at 10 M entries took twice as long, 23 vs 11
  // µs p50 in metadata_index_benchmark on the development VM. Prefaulting
  // the record chunks in one call, MADV_POPULATE_WRITE, did the same to
  // lookups, 25 vs 11 µs.)
  std::unique_ptr<Group[]> groups_;
  size_t num_groups_ = 0;
  size_t size_ = 0;
  size_t max_size_ = 0;
};

void MetadataIndex::ChunkDeleter::operator()(Record* chunk) const {
  ::operator delete[](chunk, std::align_val_t(alignof(Record)));
}

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

MetadataIndex::MetadataIndex(uint32_t max_shapes)
    : table_(std::make_unique<Table>(0)),
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
  return r == Table::kNone ? kNil : r;
}

void MetadataIndex::TableInsert(uint32_t i) {
  table_->Insert(HashKey(KeyOf(i)), i);
  ++size_;
}

void MetadataIndex::TableErase(uint32_t i) {
  table_->Erase(HashKey(KeyOf(i)), i);
  --size_;
}

void MetadataIndex::RebuildTable(size_t n) {
  table_.reset();  // the old one goes first: no peak of both
  table_ = std::make_unique<Table>(n);
  for (uint32_t i = 0; i < records_used_; ++i) {
    if (record(i).has_key()) table_->Insert(HashKey(KeyOf(i)), i);
  }
}

bool MetadataIndex::IsLive(uint32_t i) const { return record(i).has_key(); }

bool MetadataIndex::IsGhost(uint32_t i) const {
  return !record(i).has_key() && HasChildren(i);
}

uint32_t MetadataIndex::NodeOf(uint32_t i) const {
  const uint32_t s = record(i).shape();
  if (s == Record::kWideShape) {
    auto it = wide_.find(i);
    return it == wide_.end() ? 0 : it->second.node_id;
  }
  return shapes_[s].node_id;
}

ObjectLocation MetadataIndex::EntryOf(uint32_t i) const {
  const Record& r = record(i);
  const uint32_t s = r.shape();
  if (s == Record::kWideShape) {
    auto it = wide_.find(i);
    return it == wide_.end() ? ObjectLocation() : it->second;
  }
  const Shape& shape = shapes_[s];
  ObjectLocation e;
  e.node_id = shape.node_id;
  e.region_id = shape.region_id;
  e.addr = r.addr();
  e.length = shape.length;
  e.generation = r.generation();
  return e;
}

uint32_t MetadataIndex::ChildCount(uint32_t i) const {
  const uint32_t k = record(i).kids();
  if (k < Record::kManyKids) return k;
  auto it = many_children_.find(i);
  return it == many_children_.end() ? 0 : it->second;
}

void MetadataIndex::AddChild(uint32_t i) {
  Record& r = record(i);
  const uint32_t k = r.kids();
  if (k + 1 < Record::kManyKids) {
    r.set_kids(k + 1);
  } else if (k + 1 == Record::kManyKids) {
    r.set_kids(Record::kManyKids);
    many_children_[i] = k + 1;
  } else {
    ++many_children_[i];
  }
}

void MetadataIndex::RemoveChild(uint32_t i) {
  Record& r = record(i);
  const uint32_t k = r.kids();
  if (k < Record::kManyKids) {
    if (k > 0) r.set_kids(k - 1);
    return;
  }
  auto it = many_children_.find(i);
  if (it == many_children_.end()) return;  // cannot happen
  if (--it->second < Record::kManyKids) {
    r.set_kids(it->second);
    many_children_.erase(it);
  }
}

uint32_t MetadataIndex::LocalParent(uint32_t i) const {
  const Record& r = record(i);
  return r.cross() ? kNil : r.parent;
}

uint32_t MetadataIndex::AcquireShape(const ObjectLocation& e) {
  auto [it, fresh] =
      shape_ids_.try_emplace(std::make_tuple(e.node_id, e.region_id, e.length),
                             Record::kWideShape);
  if (!fresh) {
    ++shapes_[it->second].refs;
    return it->second;
  }
  uint32_t s;
  if (!free_shapes_.empty()) {
    s = free_shapes_.back();
    free_shapes_.pop_back();
  } else if (shapes_.size() < max_shapes_) {
    s = static_cast<uint32_t>(shapes_.size());
    shapes_.emplace_back();
  } else {
    shape_ids_.erase(it);
    return Record::kWideShape;
  }
  shapes_[s] = Shape{e.node_id, e.region_id, e.length, 1};
  it->second = s;
  return s;
}

void MetadataIndex::ReleaseShape(uint32_t s) {
  Shape& shape = shapes_[s];
  if (--shape.refs > 0) return;
  shape_ids_.erase(std::make_tuple(shape.node_id, shape.region_id,
                                   shape.length));
  free_shapes_.push_back(s);
}

void MetadataIndex::SetLocation(uint32_t i, const ObjectLocation& e) {
  ReleaseLocation(i);
  Record& r = record(i);
  constexpr uint64_t kPacked = uint64_t{1} << 48;
  uint32_t s = Record::kWideShape;
  if (e.addr < kPacked && e.generation < kPacked) s = AcquireShape(e);
  r.set_shape(s);
  if (s == Record::kWideShape) {
    wide_[i] = e;
    r.set_addr_generation(0, 0);
  } else {
    r.set_addr_generation(e.addr, e.generation);
  }
}

void MetadataIndex::ReleaseLocation(uint32_t i) {
  Record& r = record(i);
  const uint32_t s = r.shape();
  if (s == Record::kWideShape) {
    wide_.erase(i);  // none for a free record
  } else {
    ReleaseShape(s);
  }
  r.set_shape(Record::kWideShape);
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
  CountTenant(KeyOf(i), -1, -static_cast<int64_t>(EntryOf(i).length));
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
  std::vector<uint32_t> nodes;
  if (ChildCount(i) > 0) nodes.push_back(NodeOf(i));
  auto cross = cross_children_.find(i);
  if (cross != cross_children_.end()) {
    for (const auto& [node, count] : cross->second) nodes.push_back(node);
  }
  std::vector<uint32_t> out;
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

void MetadataIndex::LinkMostRecent(uint32_t i, uint32_t node_id) {
  LinkMostRecent(i, lists_[node_id]);
}

void MetadataIndex::LinkMostRecent(uint32_t i, List& list) {
  Record& l = record(i);
  l.prev = list.most;
  l.next = kNil;
  if (list.most != kNil) {
    record(list.most).next = i;
  } else {
    list.least = i;
  }
  list.most = i;
}

void MetadataIndex::LinkBelow(uint32_t i, uint32_t above, List& list) {
  Record& l = record(i);
  Record& a = record(above);
  l.next = above;
  l.prev = a.prev;
  if (a.prev != kNil) {
    record(a.prev).next = i;
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
  Record& l = record(i);
  if (l.prev != kNil) {
    record(l.prev).next = l.next;
  } else {
    list.least = l.next;
  }
  if (l.next != kNil) {
    record(l.next).prev = l.prev;
  } else {
    list.most = l.prev;
  }
  l.prev = l.next = kNil;
}

namespace {

absl::Status ValidateKeyAndEntry(absl::string_view key, const ObjectLocation& entry,
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
    // The key stays listed (at its new location), so the blocks after it
    // are still reachable through it: they stay, linked to it again (same
    // node or cross links as its new node says), so that losing it later
    // still orphans them. O(entries of the nodes holding them); a key with
    // children is stored again only when its node is dead.
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
    record(i).read_tick = 0;
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

bool MetadataIndex::Touch(absl::string_view key, uint32_t read_tick) {
  const uint32_t i = Lookup(key);
  if (i == kNil) return false;
  TouchRecord(i, read_tick);
  return true;
}

size_t MetadataIndex::TouchPrefix(const std::vector<absl::string_view>& keys,
                                  uint32_t read_tick) {
  std::vector<uint32_t> found;
  found.reserve(keys.size());
  for (absl::string_view key : keys) {
    const uint32_t i = Lookup(key);
    if (i != kNil) found.push_back(i);
  }
  TouchRecords(found, read_tick);
  return found.size();
}

void MetadataIndex::TouchRecords(absl::Span<const uint32_t> records,
                                 uint32_t read_tick) {
  for (auto i = records.rbegin(); i != records.rend(); ++i) {
    if (LocalParent(*i) == kNil) TouchRecord(*i, read_tick);
  }
  for (uint32_t i : records) {
    if (LocalParent(i) != kNil) TouchRecord(i, read_tick);
  }
}

void MetadataIndex::TouchRecord(uint32_t i, uint32_t read_tick) {
  Record& l = record(i);
  // A linked entry goes just below its parent when the parent is on the
  // same list. (An orphan's parent may be a ghost, on no list: the orphan
  // is touched as a root.) A parent that is the entry's more recent
  // neighbour is on the list, so the common case reads no other record.
  const bool below_parent =
      !l.cross() && l.parent != kNil &&
      (l.next == l.parent || record(l.parent).has_key());
  if (!below_parent || l.next != l.parent) {
    const uint32_t node_id = NodeOf(i);
    auto list = lists_.find(node_id);
    if (list == lists_.end()) {
      LinkMostRecent(i, node_id);  // not linked (cannot happen)
    } else if (below_parent) {
      Unlink(i, list->second);
      LinkBelow(i, l.parent, list->second);
    } else if (list->second.most != i) {
      // Not the most recent, so the list keeps at least one other record.
      Unlink(i, list->second);
      LinkMostRecent(i, list->second);
    }
  }
  l.read_tick = read_tick;
  if (track_used_ && !l.used()) {
    l.set_used(true);
    used_.push_back(i);
  }
}

std::optional<uint32_t> MetadataIndex::ReadTick(absl::string_view key) const {
  const uint32_t i = Lookup(key);
  if (i == kNil) return std::nullopt;
  return record(i).read_tick;
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

void MetadataIndex::ForEachLeastRecent(
    uint32_t node_id,
    const std::function<bool(absl::string_view, const ObjectLocation&, uint32_t)>&
        fn) const {
  auto it = lists_.find(node_id);
  if (it == lists_.end()) return;
  for (uint32_t i = it->second.least; i != kNil;) {
    const uint32_t next = record(i).next;
    if (!fn(KeyOf(i), EntryOf(i), record(i).read_tick)) return;
    i = next;
  }
}

MetadataIndex::WalkEnd MetadataIndex::PickEvictions(
    uint32_t node_id, size_t max_scan,
    const std::function<Verdict(absl::string_view, const ObjectLocation&,
                                uint32_t)>& judge,
    const std::function<bool(absl::string_view, const ObjectLocation&)>& take)
    const {
  auto it = lists_.find(node_id);
  if (it == lists_.end()) return WalkEnd::kListEnd;
  // Children chosen so far, per parent; entries passed over because they
  // still had children (only after an Adopt are children more recent).
  absl::flat_hash_map<uint32_t, uint32_t> chosen_children;
  absl::flat_hash_set<uint32_t> deferred;
  size_t scanned = 0;
  for (uint32_t i = it->second.least; i != kNil; i = record(i).next) {
    if (scanned == max_scan) return WalkEnd::kScanLimit;
    ++scanned;
    const Verdict v = judge(KeyOf(i), EntryOf(i), record(i).read_tick);
    if (v == Verdict::kStop) return WalkEnd::kStopped;
    if (v == Verdict::kKeep) continue;
    const uint32_t children = ChildCount(i);
    if (children > 0) {
      auto c = chosen_children.find(i);
      if (c == chosen_children.end() || c->second < children) {
        deferred.insert(i);
        continue;
      }
    }
    // Choose i, then every deferred ancestor it was the last child of.
    for (uint32_t x = i;;) {
      if (!take(KeyOf(x), EntryOf(x))) return WalkEnd::kEnough;
      // A cross-linked parent is on another node's list: not this walk's.
      const uint32_t p = LocalParent(x);
      if (p == kNil) break;
      const uint32_t n = ++chosen_children[p];
      if (n < ChildCount(p) || deferred.erase(p) == 0) break;
      x = p;
    }
  }
  return WalkEnd::kListEnd;
}

std::vector<std::pair<std::string, ObjectLocation>> MetadataIndex::Orphans()
    const {
  std::vector<std::pair<std::string, ObjectLocation>> out;
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
    for (uint32_t i = list->second.least; i != kNil; i = record(i).next) {
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
        a = record(a).parent;
      }
      for (uint32_t x : path) state[x] = verdict;
      if (verdict != 2) continue;
      out.emplace_back(std::string(KeyOf(i)), EntryOf(i));
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
      if (i < records_used_) record(i).set_used(false);
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
    Record& l = record(i);
    if (!l.used() || !l.has_key()) continue;
    l.set_used(false);
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
  for (uint32_t i = 0; i < records_used_; ++i) {
    uint32_t& t = record(i).read_tick;
    t = t > shift ? t - shift : 0;
  }
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

void MetadataIndex::Clear() {
  for (uint32_t i = 0; i < records_used_; ++i) {
    if (record(i).out_of_line()) delete[] record(i).buffer();
  }
  table_ = std::make_unique<Table>(0);
  size_ = 0;
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
  ghosts_by_node_.clear();
  cross_children_.clear();
  used_.clear();
  used_head_ = 0;
  load_.reset();
}

}  // namespace master
}  // namespace hymcache
