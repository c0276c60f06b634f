#include "storage_node/capacity_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

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

TEST_CASE("invalid options", "[capacity_tier]") {
  CapacityTierOptions o = Options("invalid");
  o.node_name = "";
  CHECK(CapacityTier::Open(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o = Options("invalid");
  o.node_name = std::string(256, 'x');
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

}  // namespace
}  // namespace hymcache::storage
