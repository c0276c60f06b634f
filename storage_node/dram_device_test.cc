#include "storage_node/dram_device.h"

#include <cstdint>
#include <cstring>
#include <limits>

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
}

}  // namespace
}  // namespace hymcache::storage
