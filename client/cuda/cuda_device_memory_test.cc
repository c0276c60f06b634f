// The real CUDA path of device-memory Loads and Stores, on a GPU machine:
//   bazel test --config=cuda //client/cuda:cuda_device_memory_test
// (tagged manual: it needs a GPU). The storage side is the client's fakes
// (no daemons); the device side is CUDA: cudaMalloc'ed buffers, the pinned
// pool from cudaHostAlloc, copies with cudaMemcpyAsync.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "client/cuda/cuda_device_memory.h"
#include "client/testing/fake_master_client.h"
#include "client/testing/fake_transport.h"

namespace hymcache {
namespace {

constexpr size_t kLen = 64 << 10;
constexpr size_t kBlocks = 40;

std::vector<uint8_t> Bytes(size_t i) {
  std::vector<uint8_t> b(kLen);
  for (size_t j = 0; j < kLen; ++j) b[j] = static_cast<uint8_t>(i * 31 + j * 7 + 1);
  return b;
}

struct DeviceBuffers {
  explicit DeviceBuffers(size_t n) {
    for (size_t i = 0; i < n; ++i) {
      void* p = nullptr;
      REQUIRE(cudaMalloc(&p, kLen) == cudaSuccess);
      REQUIRE(cudaMemset(p, 0, kLen) == cudaSuccess);
      ptrs.push_back(p);
    }
  }
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
  std::vector<uint8_t> Read(size_t i) const {
    std::vector<uint8_t> b(kLen);
    REQUIRE(cudaMemcpy(b.data(), ptrs[i], kLen, cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    return b;
  }
  std::vector<void*> ptrs;
};

TEST_CASE("CUDA: a device Store then a device Load round-trip the bytes through the pinned pool") {
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  REQUIRE(count > 0);

  ClientOptions o;
  o.master_address = "fake-master:1";
  o.device.bounce_chunk_bytes = 8 * kLen;  // several groups per call
  o.device.bounce_chunks = 2;
  FakeClock clock;
  auto master = std::make_shared<FakeMasterClient>();
  auto transport = std::make_shared<FakeTransport>(&clock);
  master->AddNode({1, "node-1:1", {}});
  auto client = NewClientImpl(o, master, transport, &clock,
                              std::shared_ptr<DeviceMemory>(NewCudaDeviceMemory()));
  REQUIRE(client.ok());

  std::vector<std::string> keys;
  for (size_t i = 0; i < kBlocks; ++i) keys.push_back(absl::StrCat("k", i));
  DeviceBuffers src(kBlocks);
  std::vector<ConstBuffer> in;
  for (size_t i = 0; i < kBlocks; ++i) {
    REQUIRE(cudaMemcpy(src.ptrs[i], Bytes(i).data(), kLen,
                       cudaMemcpyHostToDevice) == cudaSuccess);
    in.push_back({src.ptrs[i], kLen});
  }
  StoreOptions so;
  so.deadline = clock.Now() + absl::Minutes(1);
  so.memory = {MemoryKind::kCudaDevice, 0};
  auto w = (*client)->Store(keys, in, so)->Wait();
  REQUIRE(w.ok());
  CHECK(w->stored == kBlocks);

  DeviceBuffers dst(kBlocks);
  std::vector<MutableBuffer> out;
  for (void* p : dst.ptrs) out.push_back({p, kLen});
  LoadOptions lo;
  lo.deadline = clock.Now() + absl::Minutes(1);
  lo.memory = {MemoryKind::kCudaDevice, 0};
  auto r = (*client)->Load(keys, out, lo);
  REQUIRE(r.ok());
  CHECK(r->stop_reason.ok());
  REQUIRE(r->loaded == kBlocks);
  for (size_t i = 0; i < kBlocks; ++i) {
    INFO("block " << i);
    CHECK(dst.Read(i) == Bytes(i));
  }

  // A host buffer passed as device memory is refused, not copied.
  std::vector<uint8_t> host(kLen);
  std::vector<MutableBuffer> wrong{{host.data(), kLen}};
  auto bad = (*client)->Load(std::vector<std::string>{"k0"}, wrong, lo);
  REQUIRE(bad.ok());
  CHECK(bad->loaded == 0);
  CHECK(absl::IsInvalidArgument(bad->stop_reason));

  // A device that does not exist.
  lo.memory.device = count;
  auto none = (*client)->Load(keys, out, lo);
  CHECK(absl::IsInvalidArgument(none.status()));
}

}  // namespace
}  // namespace hymcache
