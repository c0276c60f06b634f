// CapacityTier: the durable side of the hybrid device.
//
// It owns the capacity file (a regular file or a block device) and its
// BlockIo, and remembers which object extents are durably in it:
//
//   [ header, kHeaderBytes ][ data area: capacity_bytes ]
//
// The header identifies the format (magic + version), the node that owns
// the file, the node's incarnation and the capacity, with a checksum. Opening
// a file without a valid header formats it (new random incarnation); opening
// one with a valid header adopts it (same incarnation), so a restarted node
// serves its flushed objects again. A header naming another node, another
// capacity, or another format version is refused (FailedPrecondition).
//
// Durable extents: after an object's bytes are written to the data area, the
// hybrid device calls Record(); before it overwrites space that a durable
// extent covers, it calls Forget() for that range. Both are durable when they
// return (RocksDB with synced writes, in `metadata_dir`); Record first makes
// the data area itself durable (BlockIo::Sync, fdatasync), so that a record
// never outlives its bytes, even across a power loss. On open, Extents()
// lists what survives, to be re-adopted by the node's extent table: an
// object acknowledged but never flushed before a crash is simply absent
// (a miss), never served with wrong bytes.
//
// Checksums: each record may carry the CRC32C (common/crc32c.h) of the
// object's bytes [addr, addr + length). VerifyExtents reads the data area
// and drops (forgets) every extent whose bytes do not match: torn by a
// crash, or corrupted at rest. Records written before checksums existed
// (16-byte values) are still read, as "unchecked" extents; new ones carry
// the checksum (20-byte values). A build that predates checksums discards
// the new records as malformed when it opens the file (a cache miss, never
// wrong bytes).
//
// Thread safety: safe for concurrent use.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "storage_node/device/block_io.h"

namespace hymcache::storage {

struct CapacityTierOptions {
  // Capacity file or block device. Required.
  std::string path;
  // Bytes of the data area (the region the master allocates in); a multiple
  // of BlockIo::kAlignment. Required.
  uint64_t capacity_bytes = 0;
  // Name of the owning storage node, stored in the header. Required.
  std::string node_name;
  // Directory of the durable extent record (RocksDB).
  // Default: "" = path + ".meta" (set it explicitly for block devices).
  std::string metadata_dir;
  // Open refuses a capacity file (a regular file; it is sparse) larger than
  // the free space of its filesystem plus what the file already holds, as
  // flushes would fail once the filesystem fills up. With this set it only
  // warns. Default: false
  bool allow_overcommit = false;
  // I/O engine settings; path and size_bytes are filled in by Open.
  BlockIoOptions io;
};

// One object's bytes durably in the data area. `tag` is the caller's
// (the allocation generation).
struct DurableExtent {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t tag = 0;
  // Whether crc32c holds the CRC32C of the object's `length` bytes (false:
  // an "unchecked" record, e.g. one written before checksums existed).
  bool checksummed = false;
  uint32_t crc32c = 0;
};

// A byte range of the data area.
struct TierRange {
  uint64_t addr = 0;
  uint64_t length = 0;
  // ForgetRanges: when set, only an extent of exactly [addr, +length) with
  // this tag is forgotten (a newer object recorded there since is kept).
  bool exact = false;
  uint64_t tag = 0;
};

// How CapacityTier::VerifyExtents reads the data area.
struct ExtentVerifyOptions {
  // Bytes per read, a multiple of BlockIo::kAlignment. Neighbouring extents
  // share reads; a longer extent takes several.
  // Default: 4 MiB
  uint64_t read_bytes = uint64_t{4} << 20;
  // Reads in flight. Memory used: read_bytes x depth.
  // Default: 8
  int depth = 8;
  // A gap between two extents up to this long is read through rather than
  // skipped with a new read.
  // Default: 256 KiB
  uint64_t max_gap_bytes = uint64_t{256} << 10;

  absl::Status Validate() const;
};

// What VerifyExtents found. Every extent it looked at is in exactly one of
// good, corrupt and unreadable (each in address order).
struct ExtentVerifyReport {
  // Checksum matched, or none recorded (unchecked_objects of them).
  std::vector<DurableExtent> good;
  // The bytes do not match the recorded checksum: forgotten.
  std::vector<DurableExtent> corrupt;
  // A read of their bytes failed: forgotten too (never served unverified).
  std::vector<DurableExtent> unreadable;
  uint64_t verified_objects = 0;  // good ones with a checksum
  uint64_t verified_bytes = 0;    // their bytes
  uint64_t unchecked_objects = 0; // good ones without a checksum (not read)
  uint64_t bytes_read = 0;        // including gaps read through
  absl::Duration elapsed;
  // The Forget of corrupt and unreadable extents (they are reported either
  // way; a failed Forget leaves their records, to be verified again).
  absl::Status forget_status;
};

class CapacityTier {
 public:
  static constexpr uint64_t kHeaderBytes = 1 << 20;
  static constexpr uint32_t kFormatVersion = 1;

  // Formats or adopts `path` (see the file comment).
  // Errors: InvalidArgument (bad options); FailedPrecondition (a header of
  // another node, capacity or format version); ResourceExhausted (the
  // filesystem lacks free space for the capacity file, see
  // allow_overcommit; or the extent record's filesystem is full and it
  // cannot even be opened read-only); DataLoss (a corrupt extent record);
  // Unavailable / Internal (I/O errors).
  // The extent record is opened read-only when its filesystem is too full
  // to open it for writing: Record and Forget then fail (see below).
  static absl::StatusOr<std::unique_ptr<CapacityTier>> Open(
      const CapacityTierOptions& options);
  virtual ~CapacityTier() = default;

  // The incarnation in the header: new when formatted, kept when adopted.
  virtual uint64_t incarnation() const = 0;
  // Whether Open adopted an existing file (vs formatting a new one).
  virtual bool adopted() const = 0;
  virtual uint64_t capacity_bytes() const = 0;

  // I/O on the file. Data-area address `addr` is file offset
  // kHeaderBytes + addr.
  virtual BlockIo* io() = 0;

  // The durable extents now (right after Open: what survived).
  virtual std::vector<DurableExtent> Extents() const = 0;
  // Durably forgets every extent overlapping [addr, addr + length).
  // Errors (nothing changed): ResourceExhausted when the extent record's
  // filesystem is full or it was opened read-only; Unavailable / Internal
  // on other I/O errors. After a failure the next call first tries to
  // resume the extent record (it works again once space is freed).
  virtual absl::Status Forget(uint64_t addr, uint64_t length) = 0;
  // As Forget, for several ranges in one synced batch (ranges marked
  // `exact` forget only their own extent).
  virtual absl::Status ForgetRanges(absl::Span<const TierRange> ranges) = 0;
  // Durably records extents whose bytes are now in the data area: makes the
  // data area durable (BlockIo::Sync), then writes one synced batch. Each
  // extent replaces any extent overlapping it.
  // Errors: InvalidArgument / OutOfRange (bad extents); the Sync's error
  // (nothing recorded); otherwise as Forget.
  virtual absl::Status Record(absl::Span<const DurableExtent> extents) = 0;

  // Reads the bytes of every extent in Extents() that carries a checksum
  // (through io(), options.depth reads of options.read_bytes in flight, in
  // address order) and compares their CRC32C; durably forgets the extents
  // that do not match or cannot be read, in one ForgetRanges. Meant for
  // open, before anything else uses the tier: the extents must not change
  // meanwhile. Each failure is logged (WARNING).
  // Errors: InvalidArgument (options), ResourceExhausted (read buffers).
  // Read errors and mismatches are per-extent results, never an error.
  absl::StatusOr<ExtentVerifyReport> VerifyExtents(
      const ExtentVerifyOptions& options);
};

}  // namespace hymcache::storage
