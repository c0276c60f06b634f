// The parts of MetadataIndex that its files (metadata_index*.cc) share:
// the record layout and the state of a load in progress (the hash table
// over record numbers is master/record_table.h). Private to the //master:metadata_index target.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "master/metadata_index.h"
#include "master/record_table.h"

namespace hymcache {
namespace master {

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

// InvalidArgument for a key or entry the index cannot hold, or a key
// named as its own parent (Upsert and LoadEntry).
inline absl::Status ValidateKeyAndEntry(absl::string_view key,
                                        const ObjectLocation& entry,
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

}  // namespace master
}  // namespace hymcache
