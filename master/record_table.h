// RecordTable: MetadataIndex's hash table of record numbers (uint32_t, any
// value but kNone). Open addressing with linear probing over groups of 7
// slots. A group is 36 bytes: the 7 record numbers, then 8
// control bytes, one per slot (a 7-bit tag of the key's hash, or empty) and
// the group's overflow count: how many entries whose probe started at or
// before it went past it because it was full (F14's scheme). A lookup reads
// its home group and stops there unless that group has overflowed, so a
// miss usually costs one group, and erasing needs no tombstones. 5.14 bytes
// per slot at up to 7/8 load; it grows by 1.25x (not 2x: between 5.9 and
// 7.3 bytes per entry), rebuilt from the records in record order. The table
// does not know keys: callers pass hashes and compare keys themselves.
//
// Not thread-safe: its owner serializes every call (MetadataIndex is
// guarded by the master's lock).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/base/internal/endian.h"

namespace hymcache {
namespace master {

// Starts loading the cache line of `p` (prefetcht0). An asm statement the
// compiler must keep: GCC 12 -O2 deleted __builtin_prefetch calls whose
// loop did nothing else (MetadataIndex::Prefetch's record pass), and those
// of a group's last byte reached by `char*` arithmetic together with the
// loop around them.
inline void PrefetchLine(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p);
#endif
}

class RecordTable {
 public:
  static constexpr uint32_t kNone = 0xffffffffu;

  // Empty, sized for `n` entries.
  explicit RecordTable(size_t n) {
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

  // Starts loading the group a Find of `hash` reads first into the CPU's
  // cache: its first and last bytes (a group may straddle two cache
  // lines).
  void PrefetchHome(size_t hash) const {
    const Group& group = groups_[Home(hash)];
    PrefetchLine(group.slot);
    PrefetchLine(&group.ctrl[sizeof(group.ctrl) - 1]);
  }
  // Calls `fn(r)` for each record `r` whose tag matches `hash` in its home
  // group: those a Find of `hash` compares first. Changes nothing.
  template <typename Fn>
  void ForEachHomeMatch(size_t hash, const Fn& fn) const {
    const Group& group = groups_[Home(hash)];
    for (uint64_t m = Match(Ctrl(group), kLsbs * Tag(hash)); m != 0;
         m &= m - 1) {
      fn(group.slot[Lowest(m)]);
    }
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

}  // namespace master
}  // namespace hymcache
