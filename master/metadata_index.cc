#include "master/metadata_index.h"

#include <cstring>
#include <limits>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

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
MetadataIndex::MetadataIndex() : set_(0, Hash{this}, Eq{this}) {
  static_assert(sizeof(Record) == 64, "Record must be one cache line");
  static_assert(sizeof(Links) == 12, "Links must stay small");
}

MetadataIndex::~MetadataIndex() {
  // Release out-of-line keys; record chunks go with chunks_.
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

uint32_t MetadataIndex::NewRecord() {
  if (!free_records_.empty()) {
    uint32_t i = free_records_.back();
    free_records_.pop_back();
    return i;
  }
  if ((records_used_ >> kChunkShift) >= chunks_.size()) {
    chunks_.push_back(std::make_unique<Record[]>(kChunkSize));
    link_chunks_.push_back(std::make_unique<Links[]>(kChunkSize));
  }
  return records_used_++;
}

void MetadataIndex::FreeRecord(uint32_t i) {
  Record& r = record(i);
  if (r.key_len() > Record::kInlineKey) {
    out_of_line_key_bytes_ -= MallocSize(r.key_len());
    delete[] r.key_data();
  }
  std::memset(&r, 0, sizeof(r));
  links(i) = Links{kNil, kNil, 0};
  free_records_.push_back(i);
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

absl::StatusOr<std::optional<IndexEntry>> MetadataIndex::Upsert(
    absl::string_view key, const IndexEntry& entry) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("index key of ", key.size(), " bytes (want 1..",
                     kMaxKeyBytes, ")"));
  }
  if (entry.length > kMaxLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("index entry length ", entry.length, " exceeds ",
                     kMaxLength));
  }
  auto it = set_.find(key);
  if (it != set_.end()) {
    const uint32_t i = *it;
    Record& r = record(i);
    IndexEntry old = r.entry();
    Unlink(i, old.node_id);
    r.SetEntry(entry, r.key_len());
    LinkMostRecent(i, entry.node_id);
    links(i).read_tick = 0;
    return std::optional<IndexEntry>(old);
  }
  if (free_records_.empty() &&
      records_used_ == std::numeric_limits<uint32_t>::max()) {
    return absl::ResourceExhaustedError("index is full (2^32 - 1 entries)");
  }
  uint32_t i = NewRecord();
  Record& r = record(i);
  r.SetEntry(entry, key.size());
  if (key.size() <= Record::kInlineKey) {
    std::memcpy(r.key, key.data(), key.size());
  } else {
    char* p = new char[key.size()];
    std::memcpy(p, key.data(), key.size());
    std::memcpy(r.key, &p, sizeof(p));
    out_of_line_key_bytes_ += MallocSize(key.size());
  }
  set_.insert(i);
  LinkMostRecent(i, entry.node_id);
  links(i).read_tick = 0;
  return std::optional<IndexEntry>();
}

std::optional<IndexEntry> MetadataIndex::Find(absl::string_view key) const {
  auto it = set_.find(key);
  if (it == set_.end()) return std::nullopt;
  return record(*it).entry();
}

std::optional<IndexEntry> MetadataIndex::Erase(absl::string_view key) {
  auto it = set_.find(key);
  if (it == set_.end()) return std::nullopt;
  uint32_t i = *it;
  IndexEntry e = record(i).entry();
  set_.erase(it);
  Unlink(i, e.node_id);
  FreeRecord(i);
  return e;
}

bool MetadataIndex::Touch(absl::string_view key, uint32_t read_tick) {
  auto it = set_.find(key);
  if (it == set_.end()) return false;
  const uint32_t i = *it;
  const uint32_t node_id = record(i).node_id;
  auto list = lists_.find(node_id);
  if (list == lists_.end()) {
    LinkMostRecent(i, node_id);  // not linked (cannot happen)
  } else if (list->second.most != i) {
    // Not the most recent, so the list keeps at least one other record.
    Unlink(i, list->second);
    LinkMostRecent(i, list->second);
  }
  links(i).read_tick = read_tick;
  return true;
}

std::optional<uint32_t> MetadataIndex::ReadTick(absl::string_view key) const {
  auto it = set_.find(key);
  if (it == set_.end()) return std::nullopt;
  return links(*it).read_tick;
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
    Unlink(i, out.back().second.node_id);
    FreeRecord(i);
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
    if (r.key_len() == 0) continue;  // free (FreeRecord zeroes it)
    if (!fn(KeyOf(i), r.entry())) return i;
    ++visited;
  }
  return i;
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
  return table + records + links + lists + free_list + out_of_line_key_bytes_;
}

void MetadataIndex::Reserve(size_t n) { set_.reserve(n); }

}  // namespace master
}  // namespace hymcache
