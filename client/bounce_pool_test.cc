#include "client/bounce_pool.h"

#include <catch2/catch.hpp>
#include <memory>

#include "client/testing/fake_device_memory.h"
#include "client/testing/fake_transport.h"
#include "common/thread.h"

namespace hymcache {
namespace {

DeviceOptions TwoChunks() {
  DeviceOptions o;
  o.bounce_chunks = 2;
  o.bounce_chunk_bytes = 4096;
  return o;
}

TEST_CASE("The bounce pool hands out at most its chunks, disjoint, from one registered region") {
  FakeDeviceMemory device;
  FakeTransport transport;
  auto pool = BouncePool::Create(TwoChunks(), &device, &transport);
  REQUIRE(pool.ok());
  CHECK(transport.registrations() == 1);
  REQUIRE(transport.registered().size() == 1);
  const uint8_t* base =
      static_cast<const uint8_t*>(transport.registered().begin()->first);
  CHECK(transport.registered().begin()->second == 2 * 4096);

  BouncePool::Chunk a = (*pool)->TryAcquire();
  BouncePool::Chunk b = (*pool)->TryAcquire();
  REQUIRE(a.index >= 0);
  REQUIRE(b.index >= 0);
  CHECK(a.index != b.index);
  CHECK(a.size == 4096);
  for (const auto& c : {a, b}) {
    CHECK(c.data >= base);
    CHECK(c.data + c.size <= base + 2 * 4096);
  }
  CHECK((a.data + a.size <= b.data || b.data + b.size <= a.data));
  CHECK((*pool)->free_chunks() == 0);

  // Exhausted: no chunk now, and none within a short wait.
  CHECK((*pool)->TryAcquire().index == -1);
  auto c = (*pool)->Acquire(absl::Milliseconds(1));
  CHECK(absl::IsDeadlineExceeded(c.status()));

  (*pool)->Release(a);
  CHECK((*pool)->free_chunks() == 1);
  auto d = (*pool)->Acquire(absl::ZeroDuration());
  REQUIRE(d.ok());
  CHECK(d->index == a.index);
  (*pool)->Release(*d);
  (*pool)->Release(b);
  pool->reset();
  CHECK(transport.registered().empty());
  CHECK(device.live_pinned() == 0);
}

TEST_CASE("A caller waiting for a chunk gets the one another releases") {
  FakeDeviceMemory device;
  FakeTransport transport;
  DeviceOptions o = TwoChunks();
  o.bounce_chunks = 1;
  auto pool = BouncePool::Create(o, &device, &transport);
  REQUIRE(pool.ok());
  BouncePool::Chunk held = (*pool)->TryAcquire();
  REQUIRE(held.index == 0);
  absl::StatusOr<BouncePool::Chunk> got = absl::UnknownError("not yet");
  {
    auto waiter = Thread::Start("waiter", [&] {
      got = (*pool)->Acquire(absl::Hours(1));
    });
    REQUIRE(waiter.ok());
    (*pool)->Release(held);
  }  // joins
  REQUIRE(got.ok());
  CHECK(got->index == 0);
  (*pool)->Release(*got);
}

TEST_CASE("Without device support the pool is not created and nothing is registered") {
  std::unique_ptr<DeviceMemory> none = NewNoDeviceMemory();
  FakeTransport transport;
  auto pool = BouncePool::Create(TwoChunks(), none.get(), &transport);
  CHECK(absl::IsFailedPrecondition(pool.status()));
  CHECK(transport.registrations() == 0);
}

}  // namespace
}  // namespace hymcache
