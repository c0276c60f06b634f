// TierChecksums: what the hybrid device knows about the checksums of the
// objects on its capacity tier, and which of their records the flusher is
// to forget durably.
//
//   * With verify_reads, the CRC32C of every object whose bytes are on the
//     tier (recorded at open, or flushed since), by address, never
//     overlapping. A read checks the object against Find(); a mismatch
//     marks it corrupt (MarkCorrupt): it is refused from then on, until a
//     write replaces it (Erase). Without verify_reads nothing is kept and
//     Find finds nothing.
//   * Whatever verify_reads says, the records to forget: those of corrupt
//     objects (MarkCorrupt) and of discarded ones (QueueDiscard). The
//     flusher takes them all at once (StartForget), makes one synced
//     CapacityTier::ForgetRanges call without the device's lock, and then
//     reports how it went (FinishForget). A write over a range (Erase)
//     cancels the queued forgets overlapping it, and those being forgotten
//     then are not put back if that call fails: the write's own Forget
//     comes later and covers them.
//
// Pure logic: no I/O, no threads, no clock (tier_checksums_test.cc drives
// it directly). Not internally synchronized: HybridDevice owns one and
// calls it only with its mutex held (ABSL_GUARDED_BY(mu_) there; the
// header hybrid_device.h says why the device keeps one mutex).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "storage_node/device/capacity_tier.h"

namespace hymcache::storage {

// The checksum of one object on the tier.
struct TierChecksum {
  uint64_t len = 0;
  uint32_t crc = 0;
  bool corrupt = false;  // a read found a mismatch: refused
};

class TierChecksums {
 public:
  // How many forgets of the call FinishForget concludes were of corrupt
  // objects and how many of discarded ones (zero unless it succeeded).
  struct ForgetCounts {
    uint64_t corrupt = 0;
    uint64_t discarded = 0;
  };

  // `verify_reads`: keep checksums (HybridDeviceOptions::verify_reads).
  explicit TierChecksums(bool verify_reads) : verify_reads_(verify_reads) {}

  // The checksum of exactly the object (addr, len), or null (unknown, or
  // verify_reads is off: served unchecked). Valid until the next call that
  // changes this object.
  const TierChecksum* Find(uint64_t addr, uint64_t len) const;

  // At open: the recorded object (addr, len) has checksum `crc`. The
  // tier's recorded extents never overlap. Nothing is kept without
  // verify_reads.
  void Adopt(uint64_t addr, uint64_t len, uint32_t crc);

  // The object (addr, len) is on the tier now with checksum `crc`: drops
  // whatever overlapped [addr, addr + span) before (as Erase does) and
  // keeps the new checksum. REQUIRES: span >= len. Nothing is kept without
  // verify_reads.
  void Set(uint64_t addr, uint64_t len, uint64_t span, uint32_t crc);

  // A write committed over [addr, addr + len): the checksums of the objects
  // it overlaps are void, their queued forgets are cancelled and those
  // being forgotten now are not put back if that forget fails.
  void Erase(uint64_t addr, uint64_t len);

  // A read of (addr, len) did not match `crc`. Returns true when that marks
  // the object corrupt now: it is refused from then on and its record is
  // queued to be forgotten (the caller keeps it from being recorded).
  // False, with nothing changed, when the object is unknown, is no longer
  // the one read (another checksum: a write replaced it since the read
  // began) or is already marked.
  bool MarkCorrupt(uint64_t addr, uint64_t len, uint32_t crc);

  // A discarded object's record is to be forgotten (`range`, exact).
  void QueueDiscard(const TierRange& range);

  // Whether forgets are queued (the flusher has a ForgetRanges to make).
  bool forget_queued() const { return !queued_.empty(); }

  // Moves every queued forget into the call about to be made and returns
  // their ranges. REQUIRES: no call in progress (FinishForget since the
  // last StartForget).
  std::vector<TierRange> StartForget();
  // The ForgetRanges call of the last StartForget returned: on success,
  // counts what it forgot; on failure, queues its forgets again, except
  // those a write cancelled meanwhile (Erase).
  ForgetCounts FinishForget(bool ok);

  // Checksums kept.
  size_t size() const { return sums_.size(); }

 private:
  // A record to forget.
  struct Forget {
    TierRange range;
    bool discarded = false;  // Discard, not a checksum failure
    // A write committed over the range while it was being forgotten (its
    // own Forget comes later): must not be put back if this one fails.
    bool dropped = false;
  };

  const bool verify_reads_;
  std::map<uint64_t, TierChecksum> sums_;  // by addr
  std::vector<Forget> queued_;
  std::vector<Forget> forgetting_;  // the call in progress
};

}  // namespace hymcache::storage
