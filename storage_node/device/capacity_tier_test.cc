#include "storage_node/device/capacity_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <rocksdb/db.h>

#include "common/crc32c.h"
#include "common/limits.h"
#include "storage_node/device/fake_block_io.h"
#include "storage_node/device/faulty_block_io.h"

namespace hymcache::storage {
namespace {

constexpr uint64_t kCapacity = 4 << 20;

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// O_DIRECT where the test filesystem allows it.
bool DirectWorks(const std::string& dir_file) {
  int fd = open(dir_file.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
  if (fd < 0) {
    WARN("O_DIRECT refused on TEST_TMPDIR; testing with direct=false");
    return false;
  }
  close(fd);
  unlink(dir_file.c_str());
  return true;
}

CapacityTierOptions Options(const std::string& name,
                            const std::string& node = "node-a",
                            uint64_t capacity = kCapacity) {
  CapacityTierOptions o;
  o.path = TmpPath(name);
  o.capacity_bytes = capacity;
  o.node_name = node;
  o.io.direct = DirectWorks(TmpPath(name + ".probe"));
  o.io.queue_depth = 8;
  return o;
}

std::unique_ptr<CapacityTier> MustOpen(const CapacityTierOptions& o) {
  auto t = CapacityTier::Open(o);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  return std::move(*t);
}

bool Same(const std::vector<DurableExtent>& got,
          const std::vector<DurableExtent>& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].addr != want[i].addr || got[i].length != want[i].length ||
        got[i].tag != want[i].tag) {
      return false;
    }
  }
  return true;
}

std::string Describe(const std::vector<DurableExtent>& v) {
  std::string s;
  for (const auto& e : v) {
    s += "[" + std::to_string(e.addr) + "+" + std::to_string(e.length) +
         " tag " + std::to_string(e.tag) + "] ";
  }
  return s;
}

void FlipByte(const std::string& path, off_t at) {
  int fd = open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t b = 0;
  REQUIRE(pread(fd, &b, 1, at) == 1);
  b ^= 0x40;
  REQUIRE(pwrite(fd, &b, 1, at) == 1);
  REQUIRE(fsync(fd) == 0);
  close(fd);
}

TEST_CASE("format, then adopt with extents", "[capacity_tier]") {
  CapacityTierOptions o = Options("adopt");
  uint64_t inc;
  {
    auto t = MustOpen(o);
    inc = t->incarnation();
    REQUIRE(inc != 0);
    REQUIRE_FALSE(t->adopted());
    REQUIRE(t->capacity_bytes() == kCapacity);
    REQUIRE(t->Extents().empty());

    // Bytes land in the data area, after the header.
    auto buf = AllocateAligned(8192);
    std::memset(buf.get(), 0xAB, 8192);
    REQUIRE(t->io()->WriteSync(CapacityTier::kHeaderBytes + 4096, buf.get(),
                               8192)
                .ok());
    REQUIRE(t->Record({{4096, 8192, 7}, {65536, 4096, 8}}).ok());
  }
  auto t = MustOpen(o);
  REQUIRE(t->adopted());
  REQUIRE(t->incarnation() == inc);
  std::vector<DurableExtent> want = {{4096, 8192, 7}, {65536, 4096, 8}};
  INFO(Describe(t->Extents()));
  REQUIRE(Same(t->Extents(), want));
  auto buf = AllocateAligned(8192);
  REQUIRE(t->io()->ReadSync(CapacityTier::kHeaderBytes + 4096, buf.get(), 8192)
              .ok());
  REQUIRE(buf[0] == 0xAB);
  REQUIRE(buf[8191] == 0xAB);
}

TEST_CASE("Record replaces overlapping extents", "[capacity_tier]") {
  CapacityTierOptions o = Options("record");
  auto t = MustOpen(o);
  REQUIRE(t->Record({{0, 4096, 1}, {8192, 8192, 2}, {32768, 4096, 3}}).ok());
  // Overlaps the tail of [8192, 16384) only.
  REQUIRE(t->Record({{12288, 8192, 4}}).ok());
  std::vector<DurableExtent> want = {{0, 4096, 1}, {12288, 8192, 4},
                                     {32768, 4096, 3}};
  INFO(Describe(t->Extents()));
  REQUIRE(Same(t->Extents(), want));
  // Covers several; the same start address replaces too.
  REQUIRE(t->Record({{0, 36864, 5}}).ok());
  want = {{0, 36864, 5}};
  REQUIRE(Same(t->Extents(), want));
  // Within one batch, later entries win.
  REQUIRE(t->Record({{40960, 8192, 6}, {45056, 4096, 7}, {40960, 4096, 8}})
              .ok());
  want = {{0, 36864, 5}, {40960, 4096, 8}, {45056, 4096, 7}};
  INFO(Describe(t->Extents()));
  REQUIRE(Same(t->Extents(), want));

  // Durable as the mirror says.
  t.reset();
  t = MustOpen(o);
  INFO(Describe(t->Extents()));
  REQUIRE(Same(t->Extents(), want));

  CHECK(t->Record({{kCapacity - 4096, 8192, 1}}).code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(t->Record({{0, 0, 1}}).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(Same(t->Extents(), want));
}

TEST_CASE("Forget removes overlapping extents", "[capacity_tier]") {
  CapacityTierOptions o = Options("forget");
  auto t = MustOpen(o);
  REQUIRE(t->Record({{0, 4096, 1}, {8192, 8192, 2}, {32768, 4096, 3}}).ok());
  REQUIRE(t->Forget(16384, 16384).ok());  // touches none: ends are exclusive
  REQUIRE(t->Extents().size() == 3);
  REQUIRE(t->Forget(4095, 4098).ok());  // last byte of 1, first of 2
  std::vector<DurableExtent> want = {{32768, 4096, 3}};
  INFO(Describe(t->Extents()));
  REQUIRE(Same(t->Extents(), want));
  REQUIRE(t->Forget(0, 0).ok());
  t.reset();
  t = MustOpen(o);
  REQUIRE(Same(t->Extents(), want));
  REQUIRE(t->Forget(0, kCapacity).ok());
  REQUIRE(t->Extents().empty());
}

TEST_CASE("exact ForgetRanges forget only their own extent", "[capacity_tier]") {
  CapacityTierOptions o = Options("forget_exact");
  auto t = MustOpen(o);
  REQUIRE(t->Record({{0, 4096, 1}, {8192, 8192, 2}, {32768, 4096, 3}}).ok());
  const std::vector<TierRange> ranges = {
      {0, 4096, /*exact=*/true, 9},       // another tag: kept
      {8192, 4096, /*exact=*/true, 2},    // another length: kept
      {32768, 4096, /*exact=*/true, 3}};  // the extent: forgotten
  REQUIRE(t->ForgetRanges(ranges).ok());
  std::vector<DurableExtent> want = {{0, 4096, 1}, {8192, 8192, 2}};
  INFO(Describe(t->Extents()));
  REQUIRE(Same(t->Extents(), want));
  t.reset();
  t = MustOpen(o);
  REQUIRE(Same(t->Extents(), want));
}

TEST_CASE("a file of another node is refused", "[capacity_tier]") {
  CapacityTierOptions o = Options("othernode", "node-a");
  { MustOpen(o); }
  CapacityTierOptions other = Options("othernode", "node-b");
  auto t = CapacityTier::Open(other);
  REQUIRE(t.status().code() == absl::StatusCode::kFailedPrecondition);
  std::string msg(t.status().message());
  CHECK(msg.find("node-a") != std::string::npos);
  CHECK(msg.find("node-b") != std::string::npos);
  // And left alone: the owner still adopts it.
  REQUIRE(MustOpen(o)->adopted());
}

TEST_CASE("capacity mismatch is refused", "[capacity_tier]") {
  CapacityTierOptions o = Options("capacity");
  { MustOpen(o); }
  CapacityTierOptions bigger = o;
  bigger.capacity_bytes = 2 * kCapacity;
  REQUIRE(CapacityTier::Open(bigger).status().code() ==
          absl::StatusCode::kFailedPrecondition);
  CapacityTierOptions smaller = o;
  smaller.capacity_bytes = kCapacity / 2;
  REQUIRE(CapacityTier::Open(smaller).status().code() ==
          absl::StatusCode::kFailedPrecondition);
  REQUIRE(MustOpen(o)->adopted());
}

TEST_CASE("a corrupt header is reformatted without old extents",
          "[capacity_tier]") {
  CapacityTierOptions o = Options("corrupt");
  uint64_t inc;
  {
    auto t = MustOpen(o);
    inc = t->incarnation();
    REQUIRE(t->Record({{0, 4096, 1}}).ok());
  }
  FlipByte(o.path, 30);  // inside the incarnation
  auto t = MustOpen(o);
  REQUIRE_FALSE(t->adopted());
  REQUIRE(t->incarnation() != inc);
  REQUIRE(t->incarnation() != 0);
  REQUIRE(t->Extents().empty());
  // The new format sticks.
  uint64_t inc2 = t->incarnation();
  t.reset();
  t = MustOpen(o);
  REQUIRE(t->adopted());
  REQUIRE(t->incarnation() == inc2);
}

TEST_CASE("a zeroed header formats afresh; the old record is discarded",
          "[capacity_tier]") {
  CapacityTierOptions o = Options("zeroed");
  {
    auto t = MustOpen(o);
    REQUIRE(t->Record({{0, 4096, 1}, {4096, 4096, 2}}).ok());
  }
  {
    int fd = open(o.path.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    std::vector<uint8_t> zeros(4096, 0);
    REQUIRE(pwrite(fd, zeros.data(), zeros.size(), 0) == 4096);
    close(fd);
  }
  auto t = MustOpen(o);
  REQUIRE_FALSE(t->adopted());
  REQUIRE(t->Extents().empty());
}

TEST_CASE("another format version is refused, not reformatted",
          "[capacity_tier]") {
  CapacityTierOptions o = Options("version");
  { MustOpen(o); }
  FlipByte(o.path, 8);  // version field
  REQUIRE(CapacityTier::Open(o).status().code() ==
          absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("explicit metadata_dir", "[capacity_tier]") {
  CapacityTierOptions o = Options("metadir");
  o.metadata_dir = TmpPath("metadir_db");
  {
    auto t = MustOpen(o);
    REQUIRE(t->Record({{4096, 4096, 9}}).ok());
  }
  auto t = MustOpen(o);
  REQUIRE(Same(t->Extents(), {{4096, 4096, 9}}));
}

// Bytes the files directly in `dir` take on disk (the larger of their size
// and their allocated blocks: fallocate allocates past the size).
uint64_t DiskBytes(const std::string& dir) {
  uint64_t total = 0;
  DIR* d = opendir(dir.c_str());
  REQUIRE(d != nullptr);
  while (struct dirent* e = readdir(d)) {
    struct stat st;
    std::string p = dir + "/" + e->d_name;
    if (stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    total += std::max<uint64_t>(static_cast<uint64_t>(st.st_size),
                                static_cast<uint64_t>(st.st_blocks) * 512);
  }
  closedir(d);
  return total;
}

uint64_t FreeBytes(const std::string& dir) {
  struct statvfs vfs;
  REQUIRE(statvfs(dir.c_str(), &vfs) == 0);
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

TEST_CASE("the empty extent record takes little disk", "[capacity_tier]") {
  CapacityTierOptions o = Options("footprint");
  {
    auto t = MustOpen(o);
    uint64_t open_bytes = DiskBytes(o.path + ".meta");
    INFO("extent record while open: " << open_bytes << " bytes");
    CHECK(open_bytes < (1 << 20));
    REQUIRE(t->Record({{0, 4096, 1}, {8192, 4096, 2}}).ok());
    CHECK(DiskBytes(o.path + ".meta") < (1 << 20));
  }
  uint64_t closed_bytes = DiskBytes(o.path + ".meta");
  INFO("extent record after close: " << closed_bytes << " bytes");
  CHECK(closed_bytes < (1 << 20));
  auto t = MustOpen(o);
  CHECK(Same(t->Extents(), {{0, 4096, 1}, {8192, 4096, 2}}));
}

TEST_CASE("a capacity file larger than the free space is refused",
          "[capacity_tier]") {
  CapacityTierOptions o = Options("overcommit");
  const uint64_t tib = uint64_t{1} << 40;
  o.capacity_bytes = (FreeBytes(TmpPath("")) + tib) / 4096 * 4096;
  auto t = CapacityTier::Open(o);
  REQUIRE(t.status().code() == absl::StatusCode::kResourceExhausted);
  INFO(t.status().ToString());
  CHECK(t.status().message().find("free") != absl::string_view::npos);
  CHECK(t.status().message().find(std::to_string(o.capacity_bytes)) !=
        absl::string_view::npos);
  // Refused before the file was created or grown.
  struct stat st;
  CHECK(stat(o.path.c_str(), &st) != 0);

  o.allow_overcommit = true;
  auto ok = MustOpen(o);
  REQUIRE(stat(o.path.c_str(), &st) == 0);
  CHECK(static_cast<uint64_t>(st.st_size) ==
        CapacityTier::kHeaderBytes + o.capacity_bytes);
  // Sparse: only the header (and little else) is allocated.
  CHECK(static_cast<uint64_t>(st.st_blocks) * 512 <=
        2 * CapacityTier::kHeaderBytes);
}

// A small tmpfs under TEST_TMPDIR, unmounted at the end; mounting needs
// root (or a user namespace that allows it): without, tests skip.
class SmallFs {
 public:
  SmallFs(const std::string& name, uint64_t bytes) : dir_(TmpPath(name)) {
    mkdir(dir_.c_str(), 0755);
    std::string opts = "size=" + std::to_string(bytes);
    mounted_ = mount("tmpfs", dir_.c_str(), "tmpfs", 0, opts.c_str()) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~SmallFs() {
    if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Fills the filesystem with `name` until writes fail with ENOSPC.
  void Fill(const std::string& name) const {
    int fd = open(Path(name).c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    REQUIRE(fd >= 0);
    std::vector<char> chunk(64 << 10, 'f');
    while (true) {
      ssize_t n = write(fd, chunk.data(), chunk.size());
      if (n < 0) {
        REQUIRE(errno == ENOSPC);
        break;
      }
      if (n < static_cast<ssize_t>(chunk.size())) {
        // Partial: the next write reports ENOSPC (or fills a last page).
        chunk.resize(std::max<size_t>(1, chunk.size() / 2));
      }
    }
    close(fd);
  }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string error_;
};

TEST_CASE("an existing file's allocated blocks count as free space",
          "[capacity_tier]") {
  SmallFs fs("smallfs3", 4 << 20);
  if (!fs.mounted()) {
    WARN("cannot mount a tmpfs (" << fs.error() << "); skipping");
    return;
  }
  CapacityTierOptions o = Options("unused3");
  o.path = fs.Path("cap");
  o.metadata_dir = TmpPath("allocated_meta");  // another filesystem
  o.io.direct = false;
  o.capacity_bytes = 3 << 20;  // the file: 4 MiB, the whole filesystem
  {
    int fd = open(o.path.c_str(), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(posix_fallocate(fd, 0, CapacityTier::kHeaderBytes +
                                       o.capacity_bytes) == 0);
    close(fd);
  }
  CHECK(FreeBytes(fs.Path("")) < CapacityTier::kHeaderBytes);
  // Fully allocated already: it needs nothing more.
  MustOpen(o);
  // Another file of the same size does not fit.
  o.path = fs.Path("cap2");
  o.metadata_dir = TmpPath("allocated_meta2");
  auto t = CapacityTier::Open(o);
  INFO(t.status().ToString());
  CHECK(t.status().code() == absl::StatusCode::kResourceExhausted);
}

TEST_CASE("a full filesystem: records fail cleanly, nothing is lost",
          "[capacity_tier]") {
  SmallFs fs("smallfs", 4 << 20);
  if (!fs.mounted()) {
    WARN("cannot mount a tmpfs (" << fs.error() << "); skipping");
    return;
  }
  CapacityTierOptions o = Options("unused");
  o.path = fs.Path("cap");
  o.io.direct = false;  // tmpfs has no O_DIRECT
  o.capacity_bytes = 16 << 20;
  // 16 MiB of capacity on a 4 MiB filesystem.
  REQUIRE(CapacityTier::Open(o).status().code() ==
          absl::StatusCode::kResourceExhausted);
  o.allow_overcommit = true;
  {
    auto t = MustOpen(o);
    REQUIRE(t->Record({{0, 4096, 1}}).ok());
    fs.Fill("filler");
    // RocksDB's first write to a full filesystem fails; whether a small
    // one does depends on what its WAL page already holds: write until
    // one fails.
    absl::Status s;
    uint64_t addr = 4096;
    for (int i = 0; i < 1000 && s.ok(); ++i, addr += 4096) {
      s = t->Record({{addr, 4096, 2}});
    }
    REQUIRE(!s.ok());
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kResourceExhausted);
    CHECK(s.message().find("full") != absl::string_view::npos);
    // And keeps failing (not asserting) while the filesystem is full.
    CHECK(t->Record({{1 << 20, 4096, 3}}).code() ==
          absl::StatusCode::kResourceExhausted);
    CHECK(t->Forget(0, 4096).code() == absl::StatusCode::kResourceExhausted);
    CHECK(t->Extents().front().addr == 0);
    // The tier closes here, on the full filesystem.
  }
  std::vector<DurableExtent> before;
  {
    // Reopening on the full filesystem: read-only or refused, never a crash.
    auto t = CapacityTier::Open(o);
    if (t.ok()) {
      before = (*t)->Extents();
      CHECK(!before.empty());
      CHECK(before.front().addr == 0);
      CHECK((*t)->Record({{1 << 20, 4096, 3}}).code() ==
            absl::StatusCode::kResourceExhausted);
    } else {
      INFO(t.status().ToString());
      CHECK(t.status().code() == absl::StatusCode::kResourceExhausted);
    }
  }
  REQUIRE(unlink(fs.Path("filler").c_str()) == 0);
  auto t = MustOpen(o);
  std::vector<DurableExtent> after = t->Extents();
  REQUIRE(!after.empty());
  CHECK(after.front().addr == 0);
  CHECK(after.front().tag == 1);
  if (!before.empty()) CHECK(Same(after, before));
  REQUIRE(t->Record({{1 << 20, 4096, 3}}).ok());
}

TEST_CASE("after a full filesystem has room again, records resume",
          "[capacity_tier]") {
  SmallFs fs("smallfs2", 4 << 20);
  if (!fs.mounted()) {
    WARN("cannot mount a tmpfs (" << fs.error() << "); skipping");
    return;
  }
  CapacityTierOptions o = Options("unused2");
  o.path = fs.Path("cap");
  o.io.direct = false;
  o.capacity_bytes = 16 << 20;
  o.allow_overcommit = true;
  auto t = MustOpen(o);
  fs.Fill("filler");
  absl::Status s;
  uint64_t addr = 0;
  for (int i = 0; i < 1000 && s.ok(); ++i, addr += 4096) {
    s = t->Record({{addr, 4096, 1}});
  }
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  std::vector<DurableExtent> recorded = t->Extents();
  REQUIRE(unlink(fs.Path("filler").c_str()) == 0);
  // RocksDB may be resuming by itself: retry briefly.
  absl::Status r;
  for (int i = 0; i < 400; ++i) {
    r = t->Record({{8 << 20, 4096, 2}});
    if (r.ok()) break;
    usleep(50 * 1000);
  }
  INFO(r.ToString());
  REQUIRE(r.ok());
  t.reset();
  auto again = MustOpen(o);
  recorded.push_back({8 << 20, 4096, 2});
  CHECK(Same(again->Extents(), recorded));
}

TEST_CASE("invalid options", "[capacity_tier]") {
  CapacityTierOptions o = Options("invalid");
  o.node_name = "";
  CHECK(CapacityTier::Open(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o = Options("invalid");
  // One byte past the name cap the master enforces (common/limits.h).
  o.node_name = std::string(kMaxNodeNameBytes + 1, 'x');
  CHECK(CapacityTier::Open(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o = Options("invalid");
  o.capacity_bytes = 1000;
  CHECK(CapacityTier::Open(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o = Options("invalid");
  o.path = "";
  CHECK(CapacityTier::Open(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

// ------------------------------------------------------------- checksums

std::vector<uint8_t> Bytes(uint64_t addr, uint64_t len, uint64_t seed) {
  std::vector<uint8_t> v(len);
  for (uint64_t i = 0; i < len; ++i) {
    v[i] = static_cast<uint8_t>(((addr + i) * 2654435761u) >> 13 ^ seed * 97);
  }
  return v;
}

// Writes an object's bytes (padded to whole pages with zeros) into the data
// area and returns its extent with the checksum.
DurableExtent WriteObject(BlockIo* io, uint64_t addr, uint64_t len,
                          uint64_t tag) {
  const uint64_t span = (len + 4095) / 4096 * 4096;
  auto buf = AllocateAligned(span);
  std::memset(buf.get(), 0, span);
  std::vector<uint8_t> v = Bytes(addr, len, tag);
  std::memcpy(buf.get(), v.data(), len);
  REQUIRE(io->WriteSync(CapacityTier::kHeaderBytes + addr, buf.get(), span).ok());
  return DurableExtent{addr, len, tag, true, crc32c::Value(v.data(), len)};
}

std::vector<uint64_t> Tags(const std::vector<DurableExtent>& v) {
  std::vector<uint64_t> out;
  for (const DurableExtent& e : v) out.push_back(e.tag);
  return out;
}

TEST_CASE("records keep their checksums across a reopen", "[capacity_tier]") {
  CapacityTierOptions o = Options("crc_keep");
  DurableExtent a, b;
  {
    auto t = MustOpen(o);
    a = WriteObject(t->io(), 0, 5000, 1);
    b = WriteObject(t->io(), 65536, 4096, 2);
    REQUIRE(t->Record({a, b, {131072, 4096, 3}}).ok());  // the last unchecked
  }
  auto t = MustOpen(o);
  auto ext = t->Extents();
  REQUIRE(ext.size() == 3);
  CHECK(ext[0].checksummed);
  CHECK(ext[0].crc32c == a.crc32c);
  CHECK(ext[1].checksummed);
  CHECK(ext[1].crc32c == b.crc32c);
  CHECK_FALSE(ext[2].checksummed);
}

TEST_CASE("records written before checksums existed are read as unchecked",
          "[capacity_tier]") {
  CapacityTierOptions o = Options("crc_old");
  std::string incarnation_key_value;
  { MustOpen(o); }
  {
    // An extent as the previous format wrote it: a 16-byte value.
    rocksdb::DB* raw = nullptr;
    rocksdb::Options dbo;
    REQUIRE(rocksdb::DB::Open(dbo, o.path + ".meta", &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    std::string key(9, '\0');
    key[0] = 'e';
    key[7] = 0x10;  // addr 0x1000 big-endian
    std::string value(16, '\0');
    value[1] = 0x20;  // length 0x2000 little-endian
    value[8] = 42;    // tag
    REQUIRE(db->Put(rocksdb::WriteOptions(), key, value).ok());
    REQUIRE(db->Close().ok());
  }
  auto t = MustOpen(o);
  auto ext = t->Extents();
  REQUIRE(ext.size() == 1);
  CHECK(ext[0].addr == 0x1000);
  CHECK(ext[0].length == 0x2000);
  CHECK(ext[0].tag == 42);
  CHECK_FALSE(ext[0].checksummed);
  // Not read, adopted as it is.
  auto report = t->VerifyExtents(ExtentVerifyOptions());
  REQUIRE(report.ok());
  CHECK(report->good.size() == 1);
  CHECK(report->unchecked_objects == 1);
  CHECK(report->bytes_read == 0);
}

TEST_CASE("VerifyExtents drops and forgets flipped and torn objects",
          "[capacity_tier]") {
  CapacityTierOptions o = Options("crc_verify");
  std::vector<DurableExtent> all;
  {
    auto t = MustOpen(o);
    // Sizes around the read size (16 KiB below): objects sharing one read,
    // spanning several, odd lengths, small gaps read through and large
    // gaps skipped.
    all.push_back(WriteObject(t->io(), 0, 3000, 1));
    all.push_back(WriteObject(t->io(), 4096, 4096, 2));
    all.push_back(WriteObject(t->io(), 8192, 50000, 3));   // flipped below
    all.push_back(WriteObject(t->io(), 65536, 12288, 4));
    all.push_back(WriteObject(t->io(), 1 << 20, 40000, 5));  // torn below
    all.push_back(WriteObject(t->io(), (1 << 20) + 40960, 100, 6));
    all.push_back(WriteObject(t->io(), 3 << 20, 70000, 7));
    REQUIRE(t->Record(all).ok());
  }
  FlipByte(o.path, CapacityTier::kHeaderBytes + 8192 + 49999);  // its last byte
  {
    // Torn: the record made it, the bytes (after the first page) did not.
    int fd = open(o.path.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    std::vector<uint8_t> zeros(36864, 0);
    REQUIRE(pwrite(fd, zeros.data(), zeros.size(),
                   CapacityTier::kHeaderBytes + (1 << 20) + 4096) ==
            static_cast<ssize_t>(zeros.size()));
    REQUIRE(fsync(fd) == 0);
    close(fd);
  }
  auto t = MustOpen(o);
  REQUIRE(t->Extents().size() == 7);
  ExtentVerifyOptions vo;
  vo.read_bytes = 16384;
  vo.depth = 3;
  vo.max_gap_bytes = 8192;
  auto report = t->VerifyExtents(vo);
  REQUIRE(report.ok());
  CHECK(Tags(report->good) == std::vector<uint64_t>{1, 2, 4, 6, 7});
  CHECK(Tags(report->corrupt) == std::vector<uint64_t>{3, 5});
  CHECK(report->unreadable.empty());
  CHECK(report->verified_objects == 5);
  CHECK(report->verified_bytes == 3000 + 4096 + 12288 + 100 + 70000);
  CHECK(report->unchecked_objects == 0);
  CHECK(report->forget_status.ok());
  CHECK(Tags(t->Extents()) == std::vector<uint64_t>{1, 2, 4, 6, 7});
  // Forgotten durably; the rest verifies clean, also read all at once.
  t.reset();
  t = MustOpen(o);
  CHECK(Tags(t->Extents()) == std::vector<uint64_t>{1, 2, 4, 6, 7});
  report = t->VerifyExtents(ExtentVerifyOptions());
  REQUIRE(report.ok());
  CHECK(report->good.size() == 5);
  CHECK(report->corrupt.empty());

  ExtentVerifyOptions bad;
  bad.read_bytes = 1000;
  CHECK(t->VerifyExtents(bad).status().code() ==
        absl::StatusCode::kInvalidArgument);
  bad = ExtentVerifyOptions();
  bad.depth = 0;
  CHECK(t->VerifyExtents(bad).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("VerifyExtents drops objects whose reads fail", "[capacity_tier]") {
  constexpr uint64_t kCap = 1 << 20;
  FakeBlockIo disk(CapacityTier::kHeaderBytes + kCap);
  FaultyBlockIo faulty(&disk);
  std::vector<DurableExtent> ext;
  ext.push_back(WriteObject(&disk, 0, 8192, 1));
  ext.push_back(WriteObject(&disk, 65536, 20000, 2));
  ext.push_back(WriteObject(&disk, 131072, 4096, 3));
  FakeCapacityTier tier(&faulty, kCap, ext);
  // A bad sector in the middle of the second object.
  faulty.FailReadsForTest(CapacityTier::kHeaderBytes + 65536 + 8192, 4096);
  ExtentVerifyOptions vo;
  vo.read_bytes = 8192;
  vo.max_gap_bytes = 0;
  auto report = tier.VerifyExtents(vo);
  REQUIRE(report.ok());
  CHECK(Tags(report->good) == std::vector<uint64_t>{1, 3});
  CHECK(Tags(report->unreadable) == std::vector<uint64_t>{2});
  CHECK(report->corrupt.empty());
  CHECK(faulty.FailedReadsForTest() == 1);
  CHECK(Tags(tier.ExtentsNowForTest()) == std::vector<uint64_t>{1, 3});
}

}  // namespace
}  // namespace hymcache::storage
