#include "storage_node/device/dram_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>

#include <catch2/catch.hpp>

namespace hymcache::storage {
namespace {

constexpr uint64_t kCap = 8 << 20;

std::unique_ptr<DramDevice> MakeDevice(int numa_node = -1) {
  DramDeviceOptions o;
  o.capacity_bytes = kCap;
  o.region_id = 3;
  o.numa_node = numa_node;
  auto d = DramDevice::Create(o);
  REQUIRE(d.ok());
  return std::move(*d);
}

TEST_CASE("DramDevice describes one non-persistent dram region") {
  auto dev = MakeDevice();
  auto regions = dev->Regions();
  REQUIRE(regions.size() == 1);
  CHECK(regions[0].region_id == 3);
  CHECK(regions[0].capacity_bytes == kCap);
  CHECK(regions[0].alignment == 4096);
  CHECK(regions[0].device_kind == "dram");
  CHECK_FALSE(regions[0].persistent);
  CHECK(regions[0].numa_node >= -1);
  CHECK(dev->Stats().capacity_bytes == kCap);
}

TEST_CASE("DramDevice writes and reads bytes in place") {
  auto dev = MakeDevice();
  auto w = dev->BeginWrite(3, 4096, 5, /*tag=*/1);
  REQUIRE(w.ok());
  std::memcpy(w->data, "hello", 5);
  REQUIRE(dev->CommitWrite(*w).ok());

  auto r = dev->AcquireRead(3, 4096, 5);
  REQUIRE(r.ok());
  CHECK(std::memcmp(r->data, "hello", 5) == 0);
  CHECK(r->data == w->data);  // no copy: the same memory
  dev->ReleaseRead(*r);

  // The last byte of the region is addressable.
  auto last = dev->BeginWrite(3, kCap - 1, 1, /*tag=*/1);
  REQUIRE(last.ok());
  last->data[0] = 0x7f;
  dev->AbortWrite(*last);

  MemoryDeviceStats s = dev->Stats();
  CHECK(s.reads == 1);
  CHECK(s.read_bytes == 5);
  CHECK(s.writes == 1);
  CHECK(s.write_bytes == 5);
  CHECK(s.aborted_writes == 1);
  CHECK(s.outstanding_reads == 0);
  CHECK(s.outstanding_writes == 0);
}

TEST_CASE("DramDevice bounds-checks every call") {
  auto dev = MakeDevice();
  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  CHECK(dev->AcquireRead(4, 0, 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(dev->AcquireRead(3, 0, 0).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(dev->AcquireRead(3, kCap, 1).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(dev->AcquireRead(3, kCap - 10, 11).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(dev->AcquireRead(3, kMax - 1, 10).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(dev->AcquireRead(3, 10, kMax).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(dev->BeginWrite(3, kMax, kMax, /*tag=*/1).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(dev->BeginWrite(0, 0, 1, /*tag=*/1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(dev->PrefetchObject(3, kCap, 1).status().code() ==
        absl::StatusCode::kOutOfRange);
  PrefetchHandle forged{99, 3, kCap - 1, 2};
  CHECK(dev->PrefetchWait(forged, absl::InfiniteFuture()).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(dev->Stats().outstanding_reads == 0);
}

TEST_CASE("DramDevice prefetches are ready at once") {
  auto dev = MakeDevice();
  auto w = dev->BeginWrite(3, 100, 3, /*tag=*/1);
  REQUIRE(w.ok());
  std::memcpy(w->data, "abc", 3);
  REQUIRE(dev->CommitWrite(*w).ok());
  auto h = dev->PrefetchObject(3, 100, 3);
  REQUIRE(h.ok());
  auto p = dev->PrefetchWait(*h, absl::Now());  // deadline already passed
  REQUIRE(p.ok());
  CHECK(std::memcmp(*p, "abc", 3) == 0);
  dev->PrefetchRelease(*h);
  CHECK(dev->Stats().prefetches == 1);
}

TEST_CASE("DramDevice falls back when the NUMA node does not exist") {
  auto dev = MakeDevice(/*numa_node=*/4000);
  CHECK_FALSE(dev->numa_allocated());
  // The node the memory is actually on (or unknown), never the one asked for.
  CHECK(dev->Regions()[0].numa_node < 4000);
  auto w = dev->BeginWrite(3, 0, 1, /*tag=*/1);
  REQUIRE(w.ok());
  w->data[0] = 1;
  REQUIRE(dev->CommitWrite(*w).ok());
}

TEST_CASE("DramDevice on NUMA node 0 reports a node") {
  auto dev = MakeDevice(/*numa_node=*/0);
  // Node 0 exists wherever NUMA is available; otherwise the fallback.
  if (dev->numa_allocated()) CHECK(dev->Regions()[0].numa_node == 0);
}

TEST_CASE("DramDevice exposes its region as a shareable area") {
  auto dev = MakeDevice();
  auto areas = dev->Areas();
  REQUIRE(areas.size() == 1);
  CHECK(areas[0].area_id == 3);
  CHECK(areas[0].kind == "region");
  CHECK(areas[0].length == kCap);
  CHECK(areas[0].fd >= 0);

  auto w = dev->BeginWrite(3, 8192, 4, /*tag=*/1);
  REQUIRE(w.ok());
  CHECK(w->data == areas[0].base + 8192);
  auto where = LocateInAreas(areas, w->data, w->length);
  REQUIRE(where.ok());
  CHECK(where->first == 3);
  CHECK(where->second == 8192);
  std::memcpy(w->data, "shm!", 4);
  REQUIRE(dev->CommitWrite(*w).ok());

  auto h = dev->PrefetchObject(3, 8192, 4);
  REQUIRE(h.ok());
  auto p = dev->PrefetchWait(*h, absl::InfiniteFuture());
  REQUIRE(p.ok());
  CHECK(LocateInAreas(areas, *p, 4).ok());
  dev->PrefetchRelease(*h);

  // A same-host peer maps the memfd from offset 0 and sees the bytes.
  const std::string path = "/proc/self/fd/" + std::to_string(areas[0].fd);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  void* m = mmap(nullptr, kCap, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(m != MAP_FAILED);
  CHECK(std::memcmp(static_cast<uint8_t*>(m) + 8192, "shm!", 4) == 0);
  munmap(m, kCap);
  close(fd);
}

TEST_CASE("DramDevice with shareable=false exposes private areas") {
  DramDeviceOptions o;
  o.capacity_bytes = kCap;
  o.shareable = false;
  auto dev = DramDevice::Create(o);
  REQUIRE(dev.ok());
  auto areas = (*dev)->Areas();
  REQUIRE(areas.size() == 1);
  CHECK(areas[0].area_id == 0);
  CHECK(areas[0].fd == -1);
  CHECK(areas[0].length == kCap);
  auto w = (*dev)->BeginWrite(0, kCap - 1, 1, /*tag=*/1);
  REQUIRE(w.ok());
  CHECK(LocateInAreas(areas, w->data, 1).ok());
  w->data[0] = 9;
  REQUIRE((*dev)->CommitWrite(*w).ok());
}

TEST_CASE("DramDevice splits its capacity into regions of max_region_bytes") {
  constexpr uint64_t kMiB = 1 << 20;
  DramDeviceOptions o;
  o.region_id = 3;
  o.capacity_bytes = 10 * kMiB + 100;
  o.max_region_bytes = 4 * kMiB + 1;  // rounded down to the alignment
  auto created = DramDevice::Create(o);
  REQUIRE(created.ok());
  auto& dev = *created;

  auto regions = dev->Regions();
  REQUIRE(regions.size() == 3);
  const uint64_t caps[] = {4 * kMiB, 4 * kMiB, 2 * kMiB + 100};
  for (int i = 0; i < 3; ++i) {
    CHECK(regions[i].region_id == 3u + i);
    CHECK(regions[i].capacity_bytes == caps[i]);
    CHECK(regions[i].alignment == 4096);
    CHECK(regions[i].device_kind == "dram");
  }
  CHECK(dev->Stats().capacity_bytes == o.capacity_bytes);

  auto areas = dev->Areas();
  REQUIRE(areas.size() == 3);
  std::set<int> fds;
  for (int i = 0; i < 3; ++i) {
    CHECK(areas[i].area_id == 3u + i);
    CHECK(areas[i].kind == "region");
    CHECK(areas[i].length == caps[i]);
    CHECK(areas[i].fd >= 0);
    fds.insert(areas[i].fd);
  }
  CHECK(fds.size() == 3);  // one memfd per region, each mapped from offset 0

  // Every method serves every region, at its own bytes.
  for (int i = 0; i < 3; ++i) {
    const uint32_t id = 3 + i;
    INFO("region " << id);
    for (uint64_t addr : {uint64_t{0}, caps[i] - 1}) {
      auto w = dev->BeginWrite(id, addr, 1, /*tag=*/1);
      REQUIRE(w.ok());
      auto where = LocateInAreas(areas, w->data, 1);
      REQUIRE(where.ok());
      CHECK(where->first == id);
      CHECK(where->second == addr);
      w->data[0] = static_cast<uint8_t>(id);
      REQUIRE(dev->CommitWrite(*w).ok());
    }
    auto r = dev->AcquireRead(id, caps[i] - 1, 1);
    REQUIRE(r.ok());
    CHECK(r->data[0] == id);
    dev->ReleaseRead(*r);
    auto h = dev->PrefetchObject(id, 0, 1);
    REQUIRE(h.ok());
    auto p = dev->PrefetchWait(*h, absl::InfiniteFuture());
    REQUIRE(p.ok());
    CHECK((*p)[0] == id);
    dev->PrefetchRelease(*h);
    CHECK(dev->AcquireRead(id, caps[i], 1).status().code() ==
          absl::StatusCode::kOutOfRange);
    CHECK(dev->BeginWrite(id, caps[i] - 1, 2, /*tag=*/1).status().code() ==
          absl::StatusCode::kOutOfRange);
  }
  CHECK(dev->AcquireRead(2, 0, 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(dev->AcquireRead(6, 0, 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(dev->PrefetchObject(6, 0, 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  PrefetchHandle forged{99, 6, 0, 1};
  CHECK(dev->PrefetchWait(forged, absl::InfiniteFuture()).status().code() ==
        absl::StatusCode::kInvalidArgument);

  // Region 4's memfd holds region 4's bytes from offset 0.
  const std::string path = "/proc/self/fd/" + std::to_string(areas[1].fd);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  void* m = mmap(nullptr, caps[1], PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(m != MAP_FAILED);
  CHECK(static_cast<uint8_t*>(m)[0] == 4);
  CHECK(static_cast<uint8_t*>(m)[caps[1] - 1] == 4);
  munmap(m, caps[1]);
  close(fd);

  MemoryDeviceStats s = dev->Stats();
  CHECK(s.writes == 6);
  CHECK(s.outstanding_reads == 0);
  CHECK(s.outstanding_writes == 0);
}

TEST_CASE("DramDevice keeps one region when the capacity fits") {
  DramDeviceOptions o;
  o.capacity_bytes = kCap;
  o.max_region_bytes = kCap;
  auto dev = DramDevice::Create(o);
  REQUIRE(dev.ok());
  CHECK((*dev)->Regions().size() == 1);
  CHECK((*dev)->Areas().size() == 1);
}

TEST_CASE("DramDevice rejects bad options") {
  DramDeviceOptions o;
  o.capacity_bytes = 0;
  CHECK(DramDevice::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.capacity_bytes = 4096;
  o.alignment = 3;
  CHECK(DramDevice::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.alignment = 4096;
  o.numa_node = -2;
  CHECK(DramDevice::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.numa_node = -1;
  o.max_region_bytes = 4095;  // below the alignment
  CHECK(DramDevice::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.capacity_bytes = (DramDeviceOptions::kMaxRegions + 1) * 4096;
  o.max_region_bytes = 4096;  // too many regions
  CHECK(DramDevice::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.capacity_bytes = 2 * 4096;
  o.region_id = std::numeric_limits<uint32_t>::max();  // ids overflow
  CHECK(DramDevice::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.capacity_bytes = 4096;  // one region: the last id is fine
  CHECK(DramDevice::Create(o).ok());
}

}  // namespace
}  // namespace hymcache::storage
