// Device-memory Loads and Stores (device_io.cc) on fakes of the client's
// seams: FakeDeviceMemory's "device" buffers are opaque addresses no
// process maps, so reading one as host memory would crash the test.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "client/testing/fake_device_memory.h"
#include "client/testing/fake_master_client.h"
#include "client/testing/fake_transport.h"

namespace hymcache {
namespace {

constexpr size_t kLen = 1000;
constexpr MemorySpace kDevice{MemoryKind::kCudaDevice, 0};

// Three blocks per chunk, two chunks, unless a test says otherwise.
ClientOptions TestOptions(int chunks = 2, uint64_t chunk_bytes = 3 * kLen) {
  ClientOptions o;
  o.master_address = "fake-master:1";
  o.lookup_batch_keys = 4;
  o.read_batch_bytes = 4 * kLen;
  o.device.bounce_chunks = chunks;
  o.device.bounce_chunk_bytes = chunk_bytes;
  return o;
}

struct Rig {
  explicit Rig(ClientOptions o = TestOptions(), bool with_device = true) {
    REQUIRE(o.Validate().ok());
    master = std::make_shared<FakeMasterClient>();
    transport = std::make_shared<FakeTransport>(&clock);
    master->AddNode({1, "node-1:1", {}});
    if (with_device) device = std::make_shared<FakeDeviceMemory>();
    auto c = NewClientImpl(o, master, transport, &clock, device);
    REQUIRE(c.ok());
    client = std::move(*c);
  }
  absl::Time Later() { return clock.Now() + absl::Hours(1); }

  FakeClock clock;
  std::shared_ptr<FakeMasterClient> master;
  std::shared_ptr<FakeTransport> transport;
  std::shared_ptr<FakeDeviceMemory> device;
  std::unique_ptr<Client> client;
};

std::vector<uint8_t> Bytes(size_t i) {
  std::vector<uint8_t> b(kLen);
  for (size_t j = 0; j < kLen; ++j) b[j] = static_cast<uint8_t>(i * 31 + j * 7 + 1);
  return b;
}

std::vector<std::string> Keys(size_t n) {
  std::vector<std::string> k;
  for (size_t i = 0; i < n; ++i) k.push_back(absl::StrCat("k", i));
  return k;
}

// Stores blocks [0, n) from host memory.
void StoreHost(Rig& rig, size_t n) {
  std::vector<std::vector<uint8_t>> data;
  std::vector<ConstBuffer> in;
  for (size_t i = 0; i < n; ++i) data.push_back(Bytes(i));
  for (const auto& d : data) in.push_back({d.data(), d.size()});
  StoreOptions so;
  so.deadline = rig.Later();
  auto r = rig.client->Store(Keys(n), in, so)->Wait();
  REQUIRE(r.ok());
  REQUIRE(r->stored == n);
}

// `n` device buffers of `len` bytes (zeroed).
std::vector<MutableBuffer> DeviceBuffers(FakeDeviceMemory& d, size_t n,
                                         size_t len = kLen) {
  std::vector<MutableBuffer> b;
  for (size_t i = 0; i < n; ++i) b.push_back({d.AllocateDeviceForTest(len), len});
  return b;
}

// Device blocks [0, loaded) hold block i's bytes; the others are zero.
void CheckDevice(const FakeDeviceMemory& d, const std::vector<MutableBuffer>& b,
                 size_t loaded) {
  for (size_t i = 0; i < b.size(); ++i) {
    INFO("block " << i);
    const std::vector<uint8_t> got = d.ReadDeviceForTest(b[i].data, b[i].size);
    if (i < loaded) {
      REQUIRE(got == Bytes(i));
    } else {
      REQUIRE(got == std::vector<uint8_t>(b[i].size, 0));
    }
  }
}

LoadOptions DeviceLoad(Rig& rig) {
  LoadOptions lo;
  lo.deadline = rig.Later();
  lo.memory = kDevice;
  return lo;
}

TEST_CASE("Device options: bounce chunks and chunk bytes must be positive") {
  ClientOptions o = TestOptions();
  CHECK(o.Validate().ok());
  o.device.bounce_chunks = 0;
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o = TestOptions();
  o.device.bounce_chunk_bytes = 0;
  CHECK(absl::IsInvalidArgument(o.Validate()));
}

TEST_CASE("A client built without CUDA refuses device buffers and reads none") {
  Rig rig(TestOptions(), /*with_device=*/false);
  StoreHost(rig, 3);
  // Addresses no process maps: reading them as host memory would crash.
  std::vector<MutableBuffer> out;
  for (uint64_t i = 0; i < 3; ++i) {
    out.push_back({reinterpret_cast<void*>(0xdead00000000ull + i * 4096), kLen});
  }
  auto r = rig.client->Load(Keys(3), out, DeviceLoad(rig));
  REQUIRE(absl::IsFailedPrecondition(r.status()));
  CHECK(r.status().message().find("built without CUDA") !=
        absl::string_view::npos);

  std::vector<ConstBuffer> in;
  for (const auto& b : out) in.push_back({b.data, b.size});
  StoreOptions so;
  so.deadline = rig.Later();
  so.memory = kDevice;
  auto w = rig.client->Store(Keys(3), in, so)->Wait();
  CHECK(absl::IsFailedPrecondition(w.status()));
  CHECK(rig.transport->registrations() == 0);
}

TEST_CASE("Device Load copies every block to the device through the registered bounce pool, pipelined") {
  Rig rig;
  StoreHost(rig, 10);
  std::vector<MutableBuffer> out = DeviceBuffers(*rig.device, 10);
  auto r = rig.client->Load(Keys(10), out, DeviceLoad(rig));
  REQUIRE(r.ok());
  CHECK(r->stop_reason.ok());
  CHECK(r->loaded == 10);
  CHECK(r->hit_prefix == 10);
  CHECK(r->bytes == 10 * kLen);
  CHECK(r->lengths == std::vector<uint64_t>(10, kLen));
  CheckDevice(*rig.device, out, 10);
  CHECK(rig.device->copies_to_device() == 10);
  // One pinned region, registered with the transport once.
  CHECK(rig.device->pinned_allocations() == 1);
  CHECK(rig.transport->registrations() == 1);
  REQUIRE(rig.transport->registered().size() == 1);
  CHECK(rig.transport->registered().begin()->second == 2 * 3 * kLen);
  // A group's copy was still queued while the next group was read: two
  // groups of three blocks unsynchronized at once.
  CHECK(rig.device->max_unsynchronized() == 6);
  CHECK(rig.device->live_streams() == 0);

  // A second load reuses the pool.
  std::vector<MutableBuffer> again = DeviceBuffers(*rig.device, 10);
  auto r2 = rig.client->Load(Keys(10), again, DeviceLoad(rig));
  REQUIRE(r2.ok());
  CHECK(r2->loaded == 10);
  CheckDevice(*rig.device, again, 10);
  CHECK(rig.device->pinned_allocations() == 1);
  CHECK(rig.transport->registrations() == 1);
}

TEST_CASE("Device Load with a one-chunk pool loads everything, one group at a time") {
  Rig rig(TestOptions(/*chunks=*/1));
  StoreHost(rig, 8);
  std::vector<MutableBuffer> out = DeviceBuffers(*rig.device, 8);
  auto r = rig.client->Load(Keys(8), out, DeviceLoad(rig));
  REQUIRE(r.ok());
  CHECK(r->stop_reason.ok());
  CHECK(r->loaded == 8);
  CheckDevice(*rig.device, out, 8);
  CHECK(rig.device->max_unsynchronized() == 3);
}

TEST_CASE("Device Load copies only the loaded prefix when a block is missing") {
  Rig rig;
  StoreHost(rig, 5);
  std::vector<MutableBuffer> out = DeviceBuffers(*rig.device, 10);
  auto r = rig.client->Load(Keys(10), out, DeviceLoad(rig));
  REQUIRE(r.ok());
  CHECK(absl::IsNotFound(r->stop_reason));
  CHECK(r->loaded == 5);
  CHECK(r->hit_prefix == 5);
  CHECK(r->bytes == 5 * kLen);
  CheckDevice(*rig.device, out, 5);
  CHECK(rig.device->copies_to_device() == 5);
}

TEST_CASE("Device Load: a failed copy synchronization leaves its group not loaded") {
  Rig rig;
  StoreHost(rig, 10);
  std::vector<MutableBuffer> out = DeviceBuffers(*rig.device, 10);
  // The first synchronization is the first group's (after the second group
  // was read): no block counts as loaded, the engine recomputes them all.
  rig.device->FailNextSync(absl::InternalError("cudaErrorIllegalAddress"));
  auto r = rig.client->Load(Keys(10), out, DeviceLoad(rig));
  REQUIRE(r.ok());
  CHECK(r->loaded == 0);
  CHECK(r->bytes == 0);
  CHECK(r->lengths.empty());
  CHECK(absl::IsInternal(r->stop_reason));
  CHECK(r->stop_reason.message().find("copy to device") != absl::string_view::npos);
  // The second group's copies were waited for before Load returned.
  CHECK(rig.device->live_streams() == 0);
}

TEST_CASE("Device Load: a copy that cannot be queued ends the prefix before its block") {
  Rig rig;
  StoreHost(rig, 10);
  std::vector<MutableBuffer> out = DeviceBuffers(*rig.device, 10);
  rig.device->FailCopyEnqueue(4, absl::InvalidArgumentError("bad pointer"));
  auto r = rig.client->Load(Keys(10), out, DeviceLoad(rig));
  REQUIRE(r.ok());
  CHECK(r->loaded == 4);
  CHECK(r->bytes == 4 * kLen);
  CHECK(absl::IsInvalidArgument(r->stop_reason));
  CheckDevice(*rig.device, out, 4);
}

TEST_CASE("Device Load: a block larger than a bounce chunk is not loaded") {
  Rig rig(TestOptions(2, /*chunk_bytes=*/kLen / 2));
  StoreHost(rig, 2);
  std::vector<MutableBuffer> out = DeviceBuffers(*rig.device, 2);
  auto r = rig.client->Load(Keys(2), out, DeviceLoad(rig));
  REQUIRE(r.ok());
  CHECK(r->loaded == 0);
  CHECK(absl::IsOutOfRange(r->stop_reason));
  CheckDevice(*rig.device, out, 0);
}

TEST_CASE("Device Store copies device memory to the host before writing it, as one chain") {
  Rig rig;
  std::vector<MutableBuffer> dev = DeviceBuffers(*rig.device, 10);
  std::vector<ConstBuffer> in;
  for (size_t i = 0; i < 10; ++i) {
    rig.device->WriteDeviceForTest(dev[i].data, Bytes(i).data(), kLen);
    in.push_back({dev[i].data, dev[i].size});
  }
  StoreOptions so;
  so.deadline = rig.Later();
  so.memory = kDevice;
  auto w = rig.client->Store(Keys(10), in, so)->Wait();
  REQUIRE(w.ok());
  CHECK(w->stored == 10);
  CHECK(w->failed == 0);
  CHECK(w->outcomes == std::vector<PutOutcome>(10, PutOutcome::kStored));
  CHECK(rig.device->copies_to_host() == 10);
  // Groups of three after the first ask for the previous group's last key
  // as their parent: one chain.
  std::vector<std::string> parents;
  for (const auto& a : rig.master->put_starts()) parents.push_back(a.parent_key);
  CHECK(parents == std::vector<std::string>{"", "k2", "k5", "k8"});

  // What was written is the device's bytes.
  std::vector<std::vector<uint8_t>> host(10, std::vector<uint8_t>(kLen));
  std::vector<MutableBuffer> hb;
  for (auto& h : host) hb.push_back({h.data(), h.size()});
  LoadOptions lo;
  lo.deadline = rig.Later();
  auto r = rig.client->Load(Keys(10), hb, lo);
  REQUIRE(r.ok());
  REQUIRE(r->loaded == 10);
  for (size_t i = 0; i < 10; ++i) CHECK(host[i] == Bytes(i));
}

TEST_CASE("Device Store: a failed copy fails its keys and the rest of the chain, writing none of them") {
  Rig rig;
  std::vector<MutableBuffer> dev = DeviceBuffers(*rig.device, 8);
  std::vector<ConstBuffer> in;
  for (const auto& b : dev) in.push_back({b.data, b.size});
  StoreOptions so;
  so.deadline = rig.Later();
  so.memory = kDevice;

  SECTION("in the first group") {
    rig.device->FailNextSync(absl::InternalError("cudaErrorLaunchFailure"));
    auto w = rig.client->Store(Keys(8), in, so)->Wait();
    REQUIRE(w.ok());
    CHECK(w->stored == 0);
    CHECK(w->failed == 8);
    CHECK(absl::IsInternal(w->errors[0]));
    CHECK(rig.transport->writes().empty());
  }
  SECTION("in the second group") {
    rig.device->FailCopyEnqueue(3, absl::InternalError("queue"));
    auto w = rig.client->Store(Keys(8), in, so)->Wait();
    REQUIRE(w.ok());
    CHECK(w->stored == 3);
    CHECK(w->failed == 5);
    CHECK(w->outcomes[2] == PutOutcome::kStored);
    CHECK(w->outcomes[3] == PutOutcome::kFailed);
    CHECK(w->errors.size() == 8);
    CHECK(rig.transport->writes() == std::vector<size_t>{3});
  }
  CHECK(rig.device->live_streams() == 0);
}

TEST_CASE("The bounce pool is freed and unregistered with its client") {
  auto device = std::make_shared<FakeDeviceMemory>();
  std::shared_ptr<FakeTransport> transport;
  {
    Rig rig;
    transport = rig.transport;
    device = rig.device;
    StoreHost(rig, 4);
    std::vector<MutableBuffer> out = DeviceBuffers(*rig.device, 4);
    auto r = rig.client->Load(Keys(4), out, DeviceLoad(rig));
    REQUIRE(r.ok());
    CHECK(r->loaded == 4);
    CHECK(device->live_pinned() == 1);
    CHECK(transport->registered().size() == 1);
  }
  CHECK(device->live_pinned() == 0);
  CHECK(transport->registered().empty());
  CHECK(device->live_streams() == 0);
}

}  // namespace
}  // namespace hymcache
