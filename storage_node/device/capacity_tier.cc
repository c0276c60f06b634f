#include "storage_node/device/capacity_tier.h"

#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/crc32c.h"
#include "common/limits.h"
#include "common/mutex.h"
#include "common/rocksdb_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "storage_node/device/host_memory.h"

namespace hymcache::storage {
namespace {

// ------------------------------------------------------------------ header
//
// The first kHeaderMeaningful bytes of the file, little-endian:
//   [0, 8)      magic "HYMCCAP\0"
//   [8, 12)     format version (u32)
//   [12, 16)    reserved, zero
//   [16, 24)    capacity_bytes (u64)
//   [24, 32)    incarnation (u64, nonzero)
//   [32, 40)    creation time, Unix microseconds (i64)
//   [40, 41)    node name length (u8)
//   [41, 296)   node name, zero-padded
//   [4092, 4096) CRC32C of bytes [0, 4092)
// The rest of kHeaderBytes is reserved (never read).
constexpr size_t kHeaderMeaningful = 4096;
constexpr char kMagic[8] = {'H', 'Y', 'M', 'C', 'C', 'A', 'P', '\0'};
constexpr size_t kVersionOff = 8;
constexpr size_t kCapacityOff = 16;
constexpr size_t kIncarnationOff = 24;
constexpr size_t kCreatedOff = 32;
constexpr size_t kNameLenOff = 40;
constexpr size_t kNameOff = 41;
constexpr size_t kChecksumOff = kHeaderMeaningful - 4;

// The name's length is one byte, its field 255 bytes.
static_assert(kMaxNodeNameBytes <= 255);
static_assert(kNameOff + 255 <= kChecksumOff);
static_assert(kHeaderMeaningful % BlockIo::kAlignment == 0);
static_assert(CapacityTier::kHeaderBytes % BlockIo::kAlignment == 0);

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint32_t Crc32c(const uint8_t* data, size_t n) { return crc32c::Value(data, n); }

struct Header {
  uint32_t version = 0;
  uint64_t capacity_bytes = 0;
  uint64_t incarnation = 0;
  int64_t created_micros = 0;
  std::string node_name;
};

void EncodeHeader(const Header& h, uint8_t* buf) {
  std::memset(buf, 0, kHeaderMeaningful);
  std::memcpy(buf, kMagic, sizeof(kMagic));
  Put32(buf + kVersionOff, h.version);
  Put64(buf + kCapacityOff, h.capacity_bytes);
  Put64(buf + kIncarnationOff, h.incarnation);
  Put64(buf + kCreatedOff, static_cast<uint64_t>(h.created_micros));
  buf[kNameLenOff] = static_cast<uint8_t>(h.node_name.size());
  std::memcpy(buf + kNameOff, h.node_name.data(), h.node_name.size());
  Put32(buf + kChecksumOff, Crc32c(buf, kChecksumOff));
}

// What the first bytes of the file turned out to be.
enum class HeaderKind {
  kValid,         // ours, version kFormatVersion, checksum good
  kOtherVersion,  // ours (magic), another format version: never touched
  kCorrupt,       // magic and our version, but a bad checksum
  kBlank,         // all zero: a new file
  kForeign,       // something else entirely
};

HeaderKind DecodeHeader(const uint8_t* buf, Header* h) {
  if (std::memcmp(buf, kMagic, sizeof(kMagic)) != 0) {
    for (size_t i = 0; i < kHeaderMeaningful; ++i) {
      if (buf[i] != 0) return HeaderKind::kForeign;
    }
    return HeaderKind::kBlank;
  }
  h->version = Get32(buf + kVersionOff);
  // Checked before the checksum: another version may lay the rest out
  // differently, and its file must never be reformatted by this one.
  if (h->version != CapacityTier::kFormatVersion) {
    return HeaderKind::kOtherVersion;
  }
  if (Crc32c(buf, kChecksumOff) != Get32(buf + kChecksumOff)) {
    return HeaderKind::kCorrupt;
  }
  size_t name_len = buf[kNameLenOff];
  h->capacity_bytes = Get64(buf + kCapacityOff);
  h->incarnation = Get64(buf + kIncarnationOff);
  h->created_micros = static_cast<int64_t>(Get64(buf + kCreatedOff));
  h->node_name.assign(reinterpret_cast<const char*>(buf + kNameOff), name_len);
  if (h->incarnation == 0) return HeaderKind::kCorrupt;
  return HeaderKind::kValid;
}

// ------------------------------------------------------------- metadata DB
//
// Keys (bytewise order):
//   "e" + big-endian addr (9 bytes) -> little-endian length u64 + tag u64
//                                      [+ CRC32C of the bytes u32]
//   "m:incarnation"                 -> little-endian u64: the header
//                                      incarnation the extents belong to
// Big-endian addresses make key order address order.
constexpr char kExtentPrefix = 'e';
constexpr size_t kExtentKeySize = 9;
// Without a checksum (as written before checksums existed), and with one.
constexpr size_t kUncheckedValueSize = 16;
constexpr size_t kCheckedValueSize = 20;
constexpr char kIncarnationKey[] = "m:incarnation";

std::string ExtentKey(uint64_t addr) {
  std::string k(kExtentKeySize, '\0');
  k[0] = kExtentPrefix;
  for (int i = 0; i < 8; ++i) {
    k[1 + i] = static_cast<char>(addr >> (8 * (7 - i)));
  }
  return k;
}

uint64_t ExtentKeyAddr(const rocksdb::Slice& k) {
  uint64_t v = 0;
  for (size_t i = 1; i < kExtentKeySize; ++i) {
    v = (v << 8) | static_cast<uint8_t>(k.data()[i]);
  }
  return v;
}

std::string U64Value(uint64_t v) {
  std::string s(8, '\0');
  Put64(reinterpret_cast<uint8_t*>(s.data()), v);
  return s;
}

std::string ExtentValue(const DurableExtent& e) {
  std::string v = U64Value(e.length) + U64Value(e.tag);
  if (e.checksummed) {
    v.resize(kCheckedValueSize);
    Put32(reinterpret_cast<uint8_t*>(v.data()) + kUncheckedValueSize, e.crc32c);
  }
  return v;
}

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  return FromRocksDb(s, "capacity tier", what);
}

// Memtable of the extent record (about 40 bytes an extent): also about the
// largest its WAL grows. Nothing is preallocated (SmallDbOptions).
constexpr size_t kExtentDbWriteBuffer = size_t{1} << 20;

struct ExtentInfo {
  uint64_t length = 0;
  uint64_t tag = 0;
  bool checksummed = false;
  uint32_t crc32c = 0;
};
using ExtentMap = std::map<uint64_t, ExtentInfo>;

class CapacityTierImpl final : public CapacityTier {
 public:
  CapacityTierImpl(const CapacityTierOptions& options, std::unique_ptr<BlockIo> io,
                   Header header, bool adopted)
      : options_(options),
        io_(std::move(io)),
        header_(std::move(header)),
        adopted_(adopted) {}

  ~CapacityTierImpl() override {
    if (db_ != nullptr) {
      // Safe on a full disk after failed writes (common/rocksdb_util.h).
      rocksdb::Status s = db_->Close();
      if (!s.ok()) LOG(WARNING) << "capacity tier: close db: " << s.ToString();
    }
  }

  // Opens the extent DB and loads the extents of this incarnation.
  absl::Status OpenDb(const std::string& dir);

  uint64_t incarnation() const override { return header_.incarnation; }
  bool adopted() const override { return adopted_; }
  uint64_t capacity_bytes() const override { return header_.capacity_bytes; }
  BlockIo* io() override { return io_.get(); }

  // The current durable extents, in address order. Right after Open these
  // are the extents that survived from before; afterwards they include every
  // Record/Forget since.
  std::vector<DurableExtent> Extents() const override {
    MutexLock l(&mu_);
    std::vector<DurableExtent> out;
    out.reserve(extents_.size());
    for (const auto& [addr, e] : extents_) {
      out.push_back(
          DurableExtent{addr, e.length, e.tag, e.checksummed, e.crc32c});
    }
    return out;
  }

  absl::Status Forget(uint64_t addr, uint64_t length) override {
    if (length == 0) return absl::OkStatus();
    if (addr + length < addr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "capacity tier: Forget range [", addr, ", +", length, ") wraps"));
    }
    const TierRange r{addr, length};
    return ForgetRanges(absl::MakeConstSpan(&r, 1));
  }

  absl::Status ForgetRanges(absl::Span<const TierRange> ranges) override {
    for (const TierRange& r : ranges) {
      if (r.addr + r.length < r.addr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "capacity tier: Forget range [", r.addr, ", +", r.length,
            ") wraps"));
      }
    }
    MutexLock l(&mu_);
    rocksdb::WriteBatch batch;
    Undo undo;
    for (const TierRange& r : ranges) {
      if (r.length == 0) continue;
      if (r.exact) {
        auto it = extents_.find(r.addr);
        if (it == extents_.end() || it->second.length != r.length ||
            it->second.tag != r.tag) {
          continue;
        }
      }
      EraseOverlapsLocked(r.addr, r.length, &batch, &undo);
    }
    if (undo.empty()) return absl::OkStatus();
    return CommitLocked(&batch, &undo, "forget");
  }

  absl::Status Record(absl::Span<const DurableExtent> extents) override {
    for (const DurableExtent& e : extents) {
      if (e.length == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "capacity tier: Record of an empty extent at ", e.addr));
      }
      if (e.addr > header_.capacity_bytes ||
          e.length > header_.capacity_bytes - e.addr) {
        return absl::OutOfRangeError(absl::StrCat(
            "capacity tier: extent [", e.addr, ", +", e.length,
            ") outside the data area of ", header_.capacity_bytes, " bytes"));
      }
    }
    if (extents.empty()) return absl::OkStatus();
    // The bytes first: a record must never claim bytes that a power loss
    // can still take away (O_DIRECT writes may sit in the drive's volatile
    // cache, and a sparse file's new blocks in the filesystem's journal).
    RETURN_IF_ERROR(io_->Sync());
    MutexLock l(&mu_);
    rocksdb::WriteBatch batch;
    Undo undo;
    // In order, so a later extent of the batch replaces an earlier one.
    for (const DurableExtent& e : extents) {
      EraseOverlapsLocked(e.addr, e.length, &batch, &undo);
      batch.Put(ExtentKey(e.addr), ExtentValue(e));
      ExtentInfo info{e.length, e.tag, e.checksummed, e.crc32c};
      extents_.emplace(e.addr, info);
      undo.push_back(UndoStep{true, e.addr, info});
    }
    return CommitLocked(&batch, &undo, "record");
  }

 private:
  // Mirror changes are applied while the batch is built, so overlaps within
  // one batch resolve in order; if the batch then fails, they are undone in
  // reverse.
  struct UndoStep {
    bool inserted;  // else erased
    uint64_t addr;
    ExtentInfo info;
  };
  using Undo = std::vector<UndoStep>;

  void EraseOverlapsLocked(uint64_t addr, uint64_t length,
                           rocksdb::WriteBatch* batch, Undo* undo)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t end = addr + length;
    // The greatest extent starting at or before addr may reach into the
    // range; extents are disjoint, so no earlier one can.
    auto it = extents_.upper_bound(addr);
    if (it != extents_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second.length > addr) it = prev;
    }
    while (it != extents_.end() && it->first < end) {
      batch->Delete(ExtentKey(it->first));
      undo->push_back(UndoStep{false, it->first, it->second});
      it = extents_.erase(it);
    }
  }

  absl::Status CommitLocked(rocksdb::WriteBatch* batch, Undo* undo,
                            absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status s = WriteLocked(batch, what);
    if (s.ok()) return s;
    for (auto it = undo->rbegin(); it != undo->rend(); ++it) {
      if (it->inserted) {
        extents_.erase(it->addr);
      } else {
        extents_.emplace(it->addr, it->info);
      }
    }
    return s;
  }

  // One synced write. After a failed one RocksDB refuses writes (a
  // background error) until it is resumed: the next write tries that first,
  // so the record works again once space is freed.
  absl::Status WriteLocked(rocksdb::WriteBatch* batch, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (read_only_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "capacity tier: ", what, ": the extent record in ", db_dir_,
          " was opened read-only (its filesystem was full at start); restart "
          "the node once space is freed"));
    }
    if (!write_error_.ok()) {
      rocksdb::Status r = db_->Resume();
      // Busy: RocksDB's own recovery is under way (it waits for space).
      if (r.IsBusy()) return write_error_;
      if (!r.ok()) return Explain(FromRocks(r, "resume extent record"), what);
      write_error_ = absl::OkStatus();
      LOG(INFO) << "capacity tier: extent record in " << db_dir_
                << " takes writes again";
    }
    rocksdb::WriteOptions wo;
    wo.sync = true;
    absl::Status s = FromRocks(db_->Write(wo, batch), what);
    if (!s.ok()) write_error_ = Explain(s, what);
    return write_error_;
  }

  // Names the filesystem in a ResourceExhausted error.
  absl::Status Explain(const absl::Status& s, absl::string_view what) const {
    if (!absl::IsResourceExhausted(s)) return s;
    return absl::ResourceExhaustedError(absl::StrCat(
        "capacity tier: ", what, ": the filesystem of the extent record ",
        db_dir_, " is full (", s.message(), ")"));
  }

  // Constant after construction.
  const CapacityTierOptions options_;
  const std::unique_ptr<BlockIo> io_;
  const Header header_;
  const bool adopted_;
  // Set once by OpenDb.
  std::unique_ptr<rocksdb::DB> db_;
  std::string db_dir_;
  // The DB could only be opened read-only (a full filesystem): Record and
  // Forget fail with ResourceExhausted.
  bool read_only_ = false;

  // Serialises Record/Forget, so that DB and mirror change in the same order.
  mutable Mutex mu_;
  // Mirror of the DB's extents: disjoint, keyed by addr.
  ExtentMap extents_ ABSL_GUARDED_BY(mu_);
  // Why the last write failed: resume the DB before the next one.
  absl::Status write_error_ ABSL_GUARDED_BY(mu_);
};

absl::Status CapacityTierImpl::OpenDb(const std::string& dir) {
  db_dir_ = dir;
  rocksdb::Options db_options =
      SmallDbOptions("extent record " + dir, kExtentDbWriteBuffer);
  // Created here, as RocksDB logs an error for a missing directory even
  // with create_if_missing; a real problem is DB::Open's to report.
  mkdir(dir.c_str(), 0755);
  ReleasePreallocatedSpace(dir);
  rocksdb::DB* raw = nullptr;
  rocksdb::Status os = rocksdb::DB::Open(db_options, dir, &raw);
  if (os.IsNoSpace()) {
    // Opening writes a new MANIFEST (and OPTIONS file). On a full filesystem
    // the node can still serve what is durable: read-only, no writes at all.
    LOG(WARNING) << "capacity tier: the filesystem of the extent record "
                 << dir << " is full (" << os.ToString()
                 << "); opening it read-only: nothing new becomes durable "
                    "until the node restarts with space";
    raw = nullptr;
    rocksdb::Status ro = rocksdb::DB::OpenForReadOnly(db_options, dir, &raw);
    if (!ro.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "capacity tier: the filesystem of the extent record ", dir,
          " is full: ", os.ToString(), "; read-only open: ", ro.ToString()));
    }
    read_only_ = true;
  } else {
    RETURN_IF_ERROR(FromRocks(os, absl::StrCat("open ", dir)));
  }
  db_.reset(raw);

  std::string value;
  rocksdb::Status gs = db_->Get(rocksdb::ReadOptions(), kIncarnationKey, &value);
  if (!gs.ok() && !gs.IsNotFound()) {
    return FromRocks(gs, "read incarnation");
  }
  bool same = gs.ok() && value.size() == 8 &&
              Get64(reinterpret_cast<const uint8_t*>(value.data())) ==
                  header_.incarnation;

  rocksdb::WriteBatch wipe;
  size_t dropped = 0;
  ExtentMap loaded;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(std::string(1, kExtentPrefix));
       it->Valid() && !it->key().empty() && it->key()[0] == kExtentPrefix;
       it->Next()) {
    if (!same) {
      wipe.Delete(it->key());
      ++dropped;
      continue;
    }
    const rocksdb::Slice k = it->key();
    const rocksdb::Slice v = it->value();
    bool bad = k.size() != kExtentKeySize ||
               (v.size() != kUncheckedValueSize && v.size() != kCheckedValueSize);
    uint64_t addr = 0, length = 0, tag = 0;
    bool checksummed = false;
    uint32_t crc = 0;
    if (!bad) {
      const uint8_t* vp = reinterpret_cast<const uint8_t*>(v.data());
      addr = ExtentKeyAddr(k);
      length = Get64(vp);
      tag = Get64(vp + 8);
      checksummed = v.size() == kCheckedValueSize;
      if (checksummed) crc = Get32(vp + kUncheckedValueSize);
      bad = length == 0 || addr > header_.capacity_bytes ||
            length > header_.capacity_bytes - addr;
      if (!bad && !loaded.empty()) {
        auto last = std::prev(loaded.end());
        bad = last->first + last->second.length > addr;
      }
    }
    if (bad) {
      // Serving it could return wrong bytes; forgetting it is only a miss.
      LOG(WARNING) << "capacity tier: dropping malformed extent record in "
                   << dir;
      wipe.Delete(it->key());
      ++dropped;
      continue;
    }
    loaded.emplace(addr, ExtentInfo{length, tag, checksummed, crc});
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "scan extents"));
  it.reset();

  if (!same) {
    if (adopted_ && dropped > 0) {
      LOG(WARNING) << "capacity tier: extent record in " << dir
                   << " belongs to another incarnation than " << options_.path
                   << " (" << header_.incarnation << "); discarding "
                   << dropped << " extents";
    } else if (dropped > 0) {
      LOG(INFO) << "capacity tier: fresh format of " << options_.path
                << "; discarding " << dropped << " old extents";
    }
    wipe.Put(kIncarnationKey, U64Value(header_.incarnation));
  }
  MutexLock l(&mu_);
  // Read-only, the wipe waits for the next writable open: what it would
  // delete is not loaded, and nothing new is recorded meanwhile.
  if (wipe.Count() > 0 && !read_only_) {
    RETURN_IF_ERROR(WriteLocked(&wipe, "reset extents"));
  }
  extents_ = std::move(loaded);
  return absl::OkStatus();
}

absl::Status Validate(const CapacityTierOptions& o) {
  if (o.path.empty()) return absl::InvalidArgumentError("capacity tier: empty path");
  if (o.capacity_bytes == 0 || o.capacity_bytes % BlockIo::kAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity tier: capacity_bytes ", o.capacity_bytes,
        " must be a positive multiple of ", BlockIo::kAlignment));
  }
  if (o.capacity_bytes > (uint64_t{1} << 62)) {
    return absl::InvalidArgumentError("capacity tier: capacity_bytes too large");
  }
  if (o.node_name.empty() || o.node_name.size() > kMaxNodeNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity tier: node_name must have 1 to ",
                     kMaxNodeNameBytes, " bytes"));
  }
  return absl::OkStatus();
}

std::string ParentDir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Room left beside a full capacity file for the extent record when both
// share a filesystem (an empty record takes tens of KiB; see
// kExtentDbWriteBuffer for its WAL).
constexpr uint64_t kExtentRecordHeadroom = uint64_t{4} << 20;

// Whether a filesystem has room for the capacity file, which is sparse: its
// blocks are allocated as objects are flushed, and a flush that finds the
// filesystem full fails. A regular file is checked against the free space
// of its filesystem plus what it already holds (st_blocks), keeping
// kExtentRecordHeadroom for the extent record if that lives on the same
// filesystem; a block device is not checked.
absl::Status CheckSpace(const CapacityTierOptions& o, const std::string& db_dir) {
  uint64_t file_bytes = CapacityTier::kHeaderBytes + o.capacity_bytes;
  bool headroom = false;
  uint64_t allocated = 0;
  struct stat st;
  if (stat(o.path.c_str(), &st) == 0) {
    if (S_ISBLK(st.st_mode)) return absl::OkStatus();
    if (S_ISREG(st.st_mode)) allocated = static_cast<uint64_t>(st.st_blocks) * 512;
  } else if (errno != ENOENT) {
    return absl::OkStatus();  // BlockIo::Open reports it
  }
  struct statvfs vfs;
  const std::string dir = ParentDir(o.path);
  if (statvfs(dir.c_str(), &vfs) != 0) {
    return absl::OkStatus();  // likewise: a missing directory
  }
  struct stat dir_st, db_st;
  const std::string db_probe =
      stat(db_dir.c_str(), &db_st) == 0 ? db_dir : ParentDir(db_dir);
  if (stat(dir.c_str(), &dir_st) == 0 && stat(db_probe.c_str(), &db_st) == 0 &&
      dir_st.st_dev == db_st.st_dev) {
    file_bytes += kExtentRecordHeadroom;
    headroom = true;
  }
  const uint64_t free_bytes =
      static_cast<uint64_t>(vfs.f_bavail) * static_cast<uint64_t>(vfs.f_frsize);
  const uint64_t needed = file_bytes > allocated ? file_bytes - allocated : 0;
  if (needed <= free_bytes) return absl::OkStatus();
  const std::string numbers = absl::StrCat(
      o.path, " needs ", file_bytes, " bytes (header + capacity_bytes ",
      o.capacity_bytes,
      headroom ? absl::StrCat(" + ", kExtentRecordHeadroom,
                              " for the extent record")
               : std::string(),
      "), ", allocated, " of them already allocated, but ",
      dir, " has ", free_bytes, " bytes free (short by ", needed - free_bytes,
      ")");
  if (o.allow_overcommit) {
    LOG(WARNING) << "capacity tier: overcommitted: " << numbers
                 << "; flushes will fail with ENOSPC and stores be refused "
                    "once the filesystem is full";
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "capacity tier: not enough free space: ", numbers,
      ". Lower capacity_bytes, free space, or allow overcommit "
      "(--allow_overcommit)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CapacityTier>> CapacityTier::Open(
    const CapacityTierOptions& options) {
  RETURN_IF_ERROR(Validate(options));
  const std::string dir = options.metadata_dir.empty()
                              ? options.path + ".meta"
                              : options.metadata_dir;
  RETURN_IF_ERROR(CheckSpace(options, dir));
  BlockIoOptions io_options = options.io;
  io_options.path = options.path;
  io_options.size_bytes = kHeaderBytes + options.capacity_bytes;
  // A regular file shorter than this is grown (sparsely) before its header
  // is read, even if the header then refuses the open: harmless, as growth
  // never touches the header or existing data.
  ASSIGN_OR_RETURN(std::unique_ptr<BlockIo> io, BlockIo::Open(io_options));

  AlignedBuffer buf = AllocateAligned(kHeaderMeaningful);
  if (buf == nullptr) {
    return absl::ResourceExhaustedError("capacity tier: header buffer");
  }
  RETURN_IF_ERROR(io->ReadSync(0, buf.get(), kHeaderMeaningful));
  Header header;
  HeaderKind kind = DecodeHeader(buf.get(), &header);
  bool adopted = false;
  switch (kind) {
    case HeaderKind::kValid:
      if (header.node_name != options.node_name) {
        return absl::FailedPreconditionError(absl::StrCat(
            "capacity tier: ", options.path, " belongs to node \"",
            header.node_name, "\", not \"", options.node_name, "\""));
      }
      if (header.capacity_bytes != options.capacity_bytes) {
        return absl::FailedPreconditionError(absl::StrCat(
            "capacity tier: ", options.path, " was formatted with capacity ",
            header.capacity_bytes, " bytes, but capacity_bytes is ",
            options.capacity_bytes));
      }
      adopted = true;
      break;
    case HeaderKind::kOtherVersion:
      return absl::FailedPreconditionError(absl::StrCat(
          "capacity tier: ", options.path, " has format version ",
          header.version, ", this build reads version ", kFormatVersion));
    case HeaderKind::kCorrupt:
      LOG(WARNING) << "capacity tier: " << options.path
                   << " has a corrupt header; reformatting (its extents are "
                      "lost)";
      break;
    case HeaderKind::kForeign:
      LOG(WARNING) << "capacity tier: " << options.path
                   << " holds no HyMCache header; formatting it";
      break;
    case HeaderKind::kBlank:
      break;
  }

  if (!adopted) {
    absl::BitGen gen;
    header = Header();
    header.version = kFormatVersion;
    header.capacity_bytes = options.capacity_bytes;
    do {
      header.incarnation = absl::Uniform<uint64_t>(gen);
    } while (header.incarnation == 0);
    header.created_micros = absl::ToUnixMicros(absl::Now());
    header.node_name = options.node_name;
    EncodeHeader(header, buf.get());
    // The header is durable before the extent DB learns the new incarnation:
    // a crash in between leaves a DB whose incarnation differs, which the
    // next open discards.
    RETURN_IF_ERROR(io->WriteSync(0, buf.get(), kHeaderMeaningful));
    RETURN_IF_ERROR(io->Sync());
    LOG(INFO) << "capacity tier: formatted " << options.path << " for node "
              << options.node_name << ", incarnation " << header.incarnation
              << ", " << options.capacity_bytes << " bytes";
  } else {
    LOG(INFO) << "capacity tier: adopted " << options.path << " of node "
              << header.node_name << ", incarnation " << header.incarnation;
  }

  auto tier = std::make_unique<CapacityTierImpl>(options, std::move(io),
                                                 std::move(header), adopted);
  RETURN_IF_ERROR(tier->OpenDb(dir));
  return std::unique_ptr<CapacityTier>(std::move(tier));
}


// ------------------------------------------------------------ verification

absl::Status ExtentVerifyOptions::Validate() const {
  if (read_bytes == 0 || read_bytes % BlockIo::kAlignment != 0 ||
      read_bytes > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extent verification: read_bytes ", read_bytes,
        " must be a positive multiple of ", BlockIo::kAlignment,
        " up to 1 GiB"));
  }
  if (depth < 1 || depth > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extent verification: depth ", depth, " must be in 1..1024"));
  }
  return absl::OkStatus();
}

namespace {

uint64_t PageDown(uint64_t v) { return v / BlockIo::kAlignment * BlockIo::kAlignment; }
uint64_t PageUp(uint64_t v) { return PageDown(v + BlockIo::kAlignment - 1); }

// The reads of a verification pass: consecutive file ranges of at most
// read_bytes, each holding pieces of one or more extents (in address order),
// so that every extent's CRC is extended piece by piece in order.
class VerifyPlan {
 public:
  struct Piece {
    size_t extent;       // index into the extents
    uint64_t buf_off;    // where its bytes start in the read
    uint64_t len;
    bool last;           // the extent's final piece
  };
  struct Read {
    uint64_t addr = 0;   // data-area address, page-aligned
    uint64_t len = 0;    // whole pages
    std::vector<Piece> pieces;
  };

  VerifyPlan(const std::vector<DurableExtent>& extents,
             const ExtentVerifyOptions& o)
      : extents_(extents), o_(o) {}

  // The next read; false when every extent is covered.
  bool Next(Read* r) {
    if (i_ >= extents_.size()) return false;
    r->pieces.clear();
    r->addr = PageDown(extents_[i_].addr + off_);
    const uint64_t limit = r->addr + o_.read_bytes;
    uint64_t end = r->addr;
    while (i_ < extents_.size()) {
      const DurableExtent& e = extents_[i_];
      const uint64_t from = e.addr + off_;
      // Extents are disjoint and sorted: from >= end.
      if (!r->pieces.empty() &&
          (from >= limit || from - end > o_.max_gap_bytes)) {
        break;
      }
      const uint64_t to = std::min(e.addr + e.length, limit);
      const bool last = to == e.addr + e.length;
      r->pieces.push_back(Piece{i_, from - r->addr, to - from, last});
      end = to;
      if (!last) {
        off_ = to - e.addr;
        break;
      }
      ++i_;
      off_ = 0;
    }
    r->len = PageUp(end) - r->addr;
    return true;
  }

 private:
  const std::vector<DurableExtent>& extents_;
  const ExtentVerifyOptions o_;
  size_t i_ = 0;      // extent of the next piece
  uint64_t off_ = 0;  // bytes of it already covered
};

// Completion state of the reads in flight (BlockIo callbacks run on its
// completion thread).
struct VerifySlot {
  uint8_t* buf = nullptr;  // read_bytes of the verification buffers
  VerifyPlan::Read read;
  bool done = false;
  absl::Status status;
};

// Sorts the extents (`all`, in address order; read_error, corrupt and crc
// per checksummed one, in that order) into the report's good, unreadable
// and corrupt ones, logging the first 20 dropped; returns the dropped
// ones' ranges, to forget.
std::vector<TierRange> ClassifyExtents(
    const std::vector<DurableExtent>& all,
    const std::vector<absl::Status>& read_error,
    const std::vector<bool>& corrupt, const std::vector<uint32_t>& crc,
    ExtentVerifyReport* report) {
  std::vector<TierRange> drop;
  size_t ci = 0;
  int logged = 0;
  constexpr int kMaxLogged = 20;
  for (const DurableExtent& e : all) {
    if (!e.checksummed) {
      report->good.push_back(e);
      ++report->unchecked_objects;
      continue;
    }
    const size_t k = ci++;
    if (!read_error[k].ok()) {
      report->unreadable.push_back(e);
      if (logged++ < kMaxLogged) {
        LOG(WARNING) << "capacity tier: dropping the object at " << e.addr
                     << " (" << e.length << " bytes, tag " << e.tag
                     << "): its bytes cannot be read: " << read_error[k];
      }
    } else if (corrupt[k]) {
      report->corrupt.push_back(e);
      if (logged++ < kMaxLogged) {
        LOG(WARNING) << "capacity tier: dropping the object at " << e.addr
                     << " (" << e.length << " bytes, tag " << e.tag
                     << "): checksum mismatch (recorded " << std::hex
                     << e.crc32c << ", read " << crc[k] << std::dec
                     << "): torn by a crash or corrupted at rest";
      }
    } else {
      report->good.push_back(e);
      ++report->verified_objects;
      report->verified_bytes += e.length;
      continue;
    }
    drop.push_back(TierRange{e.addr, e.length});
  }
  if (logged > kMaxLogged) {
    LOG(WARNING) << "capacity tier: ... and " << logged - kMaxLogged
                 << " more objects dropped";
  }
  return drop;
}

}  // namespace

absl::StatusOr<ExtentVerifyReport> CapacityTier::VerifyExtents(
    const ExtentVerifyOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  const absl::Time start = absl::Now();
  ExtentVerifyReport report;
  std::vector<DurableExtent> all = Extents();
  std::sort(all.begin(), all.end(),
            [](const DurableExtent& a, const DurableExtent& b) {
              return a.addr < b.addr;
            });
  std::vector<DurableExtent> checked;
  for (const DurableExtent& e : all) {
    if (e.checksummed) checked.push_back(e);
  }
  const int depth = static_cast<int>(
      std::min<uint64_t>(static_cast<uint64_t>(options.depth),
                         std::max<uint64_t>(1, checked.size())));
  std::vector<VerifySlot> slots(static_cast<size_t>(depth));
  // On huge pages where the kernel allows: an O_DIRECT read into 4 KiB
  // pages pins one page per 4 KiB and can exceed a device's segment limit
  // (on a virtio disk verification ran at half the speed it does on 2 MiB
  // pages).
  std::unique_ptr<HostMemory> buffers;
  if (!checked.empty()) {
    HostMemoryOptions m;
    m.bytes = options.read_bytes * static_cast<uint64_t>(depth);
    m.huge_pages = true;
    m.shareable = false;
    m.name = "hymcache-verify";
    absl::StatusOr<std::unique_ptr<HostMemory>> mem = HostMemory::Allocate(m);
    if (!mem.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "capacity tier: cannot allocate ", depth, " verification buffers of ",
          options.read_bytes, " bytes: ", mem.status().message()));
    }
    buffers = std::move(*mem);
    for (size_t i = 0; i < slots.size(); ++i) {
      slots[i].buf = buffers->data() + i * options.read_bytes;
    }
  }

  // Per checked extent: the CRC so far, and whether a read of it failed.
  std::vector<uint32_t> crc(checked.size(), 0);
  std::vector<absl::Status> read_error(checked.size());
  std::vector<bool> corrupt(checked.size(), false);
  Mutex mu;
  CondVar cv;
  VerifyPlan plan(checked, options);
  BlockIo* const io = this->io();
  size_t issued = 0;   // reads issued, in slot order: slot = index % depth
  size_t consumed = 0;
  bool more = true;
  while (true) {
    // Keep every free slot reading, in order.
    while (more && issued - consumed < slots.size()) {
      VerifySlot& slot = slots[issued % slots.size()];
      if (!plan.Next(&slot.read)) {
        more = false;
        break;
      }
      {
        MutexLock l(&mu);
        slot.done = false;
        slot.status = absl::OkStatus();
      }
      report.bytes_read += slot.read.len;
      io->Read(kHeaderBytes + slot.read.addr, slot.buf,
               static_cast<size_t>(slot.read.len),
               [&mu, &cv, &slot](absl::Status s) {
                 MutexLock l(&mu);
                 slot.status = std::move(s);
                 slot.done = true;
                 cv.SignalAll();
               });
      ++issued;
    }
    if (consumed == issued) break;
    VerifySlot& slot = slots[consumed % slots.size()];
    absl::Status status;
    {
      MutexLock l(&mu);
      while (!slot.done) cv.Wait(&mu);
      status = slot.status;
    }
    ++consumed;
    for (const VerifyPlan::Piece& p : slot.read.pieces) {
      if (status.ok()) {
        crc[p.extent] =
            crc32c::Extend(crc[p.extent], slot.buf + p.buf_off, p.len);
      } else if (read_error[p.extent].ok()) {
        read_error[p.extent] = status;
      }
      if (p.last && read_error[p.extent].ok()) {
        corrupt[p.extent] = crc[p.extent] != checked[p.extent].crc32c;
      }
    }
  }

  // Classify, in address order.
  const std::vector<TierRange> drop =
      ClassifyExtents(all, read_error, corrupt, crc, &report);
  if (!drop.empty()) {
    report.forget_status = ForgetRanges(drop);
    if (!report.forget_status.ok()) {
      LOG(WARNING) << "capacity tier: forgetting " << drop.size()
                   << " dropped objects failed (their records stay, and are "
                      "verified again at the next open): "
                   << report.forget_status;
    }
  }
  report.elapsed = absl::Now() - start;
  return report;
}

}  // namespace hymcache::storage
