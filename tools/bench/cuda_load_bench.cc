// cuda_load_bench: the C++ SDK's CUDA path end to end, on a GPU machine. A
// master and a DRAM storage node run in this process on 127.0.0.1; the
// client stores blocks from cudaMalloc'ed buffers and loads them back into
// cudaMalloc'ed buffers (through its pinned bounce pool), checks every byte,
// then times, side by side in alternating trials:
//   device  Load into device buffers (MemoryKind::kCudaDevice);
//   host    Load into pageable host buffers (the same keys; no device);
//   naive   Load into host buffers, then one cudaMemcpy per block to the
//           device (what an engine without the SDK's device path does);
//   h2d     cudaMemcpy of the same bytes from pinned host memory to the
//           device alone (the PCIe / copy-engine limit).
// and the same for Store (device vs host buffers).
//
//   bazel build -c opt --config=cuda //tools/bench:cuda_load_bench
//   bazel-bin/tools/bench/cuda_load_bench --block_mib=2 --blocks=64
//       [--transport=tcp|shm] [--bounce_chunk_mib=16 --bounce_chunks=4]
//
// Tagged manual: it needs --config=cuda and a GPU. Prints one table and a
// last line
//   cuda_load_bench: device_vs_host=X.XX device_vs_naive=X.XX
//   store_device_vs_host=X.XX identical=yes
// Exit status 0, or 1 (and why on stderr) on wrong bytes, a short load or
// store, or no GPU.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/cli.h"
#include "master/master_server.h"
#include "storage_node/storage_node.h"

DEFINE_uint64(block_mib, 2, "block size in MiB");
DEFINE_int32(blocks, 64, "blocks per Load or Store call");
DEFINE_int32(rounds, 8, "timed calls per trial");
DEFINE_int32(trials, 3, "alternating trials of each measurement (best kept)");
DEFINE_string(transport, "tcp", "client transport: tcp, shm or auto");
DEFINE_uint64(bounce_chunk_mib, 16,
              "ClientOptions::device.bounce_chunk_bytes in MiB");
DEFINE_int32(bounce_chunks, 4, "ClientOptions::device.bounce_chunks");
DEFINE_int32(device, 0, "CUDA device ordinal");

namespace hymcache {
namespace {

int Fail(const std::string& why) {
  std::fprintf(stderr, "cuda_load_bench: %s\n", why.c_str());
  return 1;
}

uint8_t Pattern(size_t block, size_t j) {
  return static_cast<uint8_t>((block * 131 + j) % 251);
}

// cudaMalloc'ed blocks, freed on destruction.
struct DeviceBlocks {
  ~DeviceBlocks() {
    for (void* p : ptrs) cudaFree(p);
  }
  absl::Status Allocate(size_t n, size_t len) {
    for (size_t i = 0; i < n; ++i) {
      void* p = nullptr;
      cudaError_t e = cudaMalloc(&p, len);
      if (e != cudaSuccess) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cudaMalloc: ", cudaGetErrorString(e)));
      }
      ptrs.push_back(p);
    }
    return absl::OkStatus();
  }
  std::vector<void*> ptrs;
};

struct Cluster {
  ~Cluster() {
    if (node != nullptr) node->Shutdown();
    if (master != nullptr) master->Shutdown();
  }
  std::unique_ptr<MasterServer> master;
  std::unique_ptr<StorageNode> node;
};

absl::Status Start(uint64_t dram_bytes, Cluster* c) {
  MasterOptions mo;
  mo.db_path = absl::StrCat("/tmp/hymcache-cuda-load-bench-", getpid());
  mo.service.max_pending_share_per_caller = 1.0;
  auto master = MasterServer::Create(mo);
  if (!master.ok()) return master.status();
  c->master = std::move(*master);
  StorageNodeOptions so;
  so.master_address = c->master->address();
  so.dram()->capacity_bytes = dram_bytes;
  auto node = StorageNode::Create(so);
  if (!node.ok()) return node.status();
  c->node = std::move(*node);
  if (!c->node->WaitRegistered(absl::Now() + absl::Seconds(10))) {
    return absl::DeadlineExceededError("storage node did not register");
  }
  return absl::OkStatus();
}

// GB/s of `rounds` calls of `fn` (which returns false on a short or failed
// call; then *ok becomes false).
template <typename Fn>
double Time(uint64_t bytes_per_call, Fn&& fn, bool* ok) {
  absl::Time start = absl::Now();
  for (int r = 0; r < FLAGS_rounds; ++r) {
    if (!fn()) {
      *ok = false;
      return 0;
    }
  }
  double s = absl::ToDoubleSeconds(absl::Now() - start);
  return bytes_per_call * FLAGS_rounds / s / 1e9;
}

int Run() {
  const size_t len = FLAGS_block_mib << 20;
  const size_t n = static_cast<size_t>(FLAGS_blocks);
  if (len == 0 || n == 0 || FLAGS_rounds < 1 || FLAGS_trials < 1) {
    return Fail("--block_mib, --blocks, --rounds, --trials must be >= 1");
  }
  int count = 0;
  cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess || count <= FLAGS_device) {
    return Fail(absl::StrCat("no CUDA device ", FLAGS_device, ": ",
                             cudaGetErrorString(ce), " (", count, " devices)"));
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, FLAGS_device);
  cudaSetDevice(FLAGS_device);
  auto kind = ParseTransportKind(FLAGS_transport);
  if (!kind.ok()) return Fail(kind.status().ToString());

  Cluster cluster;
  absl::Status up = Start(2 * n * len + (64 << 20), &cluster);
  if (!up.ok()) return Fail(absl::StrCat("cluster: ", up.ToString()));
  ClientOptions co;
  co.master_address = cluster.master->address();
  co.transport = *kind;
  co.device.bounce_chunk_bytes = FLAGS_bounce_chunk_mib << 20;
  co.device.bounce_chunks = FLAGS_bounce_chunks;
  auto client = Client::Create(co);
  if (!client.ok()) return Fail(client.status().ToString());

  // Source blocks: the pattern in host memory and on the device.
  std::vector<std::vector<uint8_t>> host_src(n, std::vector<uint8_t>(len));
  DeviceBlocks dev_src, dev_dst;
  if (auto s = dev_src.Allocate(n, len); !s.ok()) return Fail(s.ToString());
  if (auto s = dev_dst.Allocate(n, len); !s.ok()) return Fail(s.ToString());
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < len; ++j) host_src[i][j] = Pattern(i, j);
    cudaMemcpy(dev_src.ptrs[i], host_src[i].data(), len,
               cudaMemcpyHostToDevice);
    cudaMemset(dev_dst.ptrs[i], 0, len);
  }
  std::vector<std::string> dev_keys, host_keys;
  std::vector<ConstBuffer> dev_in, host_in;
  std::vector<MutableBuffer> dev_out, host_out;
  std::vector<std::vector<uint8_t>> host_dst(n, std::vector<uint8_t>(len));
  for (size_t i = 0; i < n; ++i) {
    dev_keys.push_back(absl::StrCat("cuda-bench/dev/", i));
    host_keys.push_back(absl::StrCat("cuda-bench/host/", i));
    dev_in.push_back({dev_src.ptrs[i], len});
    host_in.push_back({host_src[i].data(), len});
    dev_out.push_back({dev_dst.ptrs[i], len});
    host_out.push_back({host_dst[i].data(), len});
  }
  const MemorySpace device_space{MemoryKind::kCudaDevice, FLAGS_device};

  // Store from the device, then from host memory: every block stored.
  StoreOptions so;
  so.deadline = absl::Now() + absl::Seconds(60);
  so.memory = device_space;
  auto stored = (*client)->Store(dev_keys, dev_in, so)->Wait();
  if (!stored.ok() || stored->stored != n) {
    return Fail(absl::StrCat(
        "device store: ", stored.ok() ? absl::StrCat(stored->stored, " of ", n)
                                      : stored.status().ToString()));
  }
  auto hstored = (*client)->Put(host_keys, host_in);
  if (!hstored.ok() || hstored->stored != n) return Fail("host store failed");

  // Load into the device: every byte as stored.
  LoadOptions lo;
  lo.memory = device_space;
  auto loaded = (*client)->Load(dev_keys, dev_out, lo);
  if (!loaded.ok() || loaded->loaded != n) {
    return Fail(absl::StrCat("device load: ",
                             loaded.ok() ? loaded->stop_reason.ToString()
                                         : loaded.status().ToString()));
  }
  std::vector<uint8_t> check(len);
  for (size_t i = 0; i < n; ++i) {
    cudaMemcpy(check.data(), dev_dst.ptrs[i], len, cudaMemcpyDeviceToHost);
    if (std::memcmp(check.data(), host_src[i].data(), len) != 0) {
      return Fail(
          absl::StrCat("block ", i, " differs after a device round trip"));
    }
  }

  // A host pointer passed as device memory is refused, never read.
  LoadOptions wrong = lo;
  auto refused =
      (*client)->Load(std::vector<std::string>{dev_keys[0]},
                      std::vector<MutableBuffer>{host_out[0]}, wrong);
  if (!refused.ok() || refused->loaded != 0) {
    return Fail("a host buffer passed as device memory was not refused");
  }

  void* pinned = nullptr;
  if (cudaHostAlloc(&pinned, len, cudaHostAllocDefault) != cudaSuccess) {
    return Fail("cudaHostAlloc");
  }
  std::memcpy(pinned, host_src[0].data(), len);
  const uint64_t call_bytes = n * len;
  bool ok = true;
  double device = 0, host = 0, naive = 0, h2d = 0, st_dev = 0, st_host = 0;
  int gen = 0;
  for (int t = 0; t < FLAGS_trials && ok; ++t) {
    device = std::max(device, Time(
                                  call_bytes,
                                  [&] {
                                    auto r =
                                        (*client)->Load(dev_keys, dev_out, lo);
                                    return r.ok() && r->loaded == n;
                                  },
                                  &ok));
    host = std::max(host, Time(
                              call_bytes,
                              [&] {
                                auto r = (*client)->Load(dev_keys, host_out);
                                return r.ok() && r->loaded == n;
                              },
                              &ok));
    naive = std::max(
        naive, Time(
                   call_bytes,
                   [&] {
                     auto r = (*client)->Load(dev_keys, host_out);
                     if (!r.ok() || r->loaded != n) return false;
                     for (size_t i = 0; i < n; ++i) {
                       if (cudaMemcpy(dev_dst.ptrs[i], host_dst[i].data(), len,
                                      cudaMemcpyHostToDevice) != cudaSuccess) {
                         return false;
                       }
                     }
                     return true;
                   },
                   &ok));
    h2d = std::max(h2d, Time(
                            call_bytes,
                            [&] {
                              for (size_t i = 0; i < n; ++i) {
                                cudaMemcpyAsync(dev_dst.ptrs[i], pinned, len,
                                                cudaMemcpyHostToDevice);
                              }
                              return cudaDeviceSynchronize() == cudaSuccess;
                            },
                            &ok));
    // Stores of fresh keys (a stored key is skipped, not rewritten); the
    // node has room for two calls' blocks, so each round's keys are removed
    // after it.
    auto store_round = [&](const std::vector<ConstBuffer>& in,
                           const MemorySpace& space) {
      std::vector<std::string> keys;
      for (size_t i = 0; i < n; ++i)
        keys.push_back(absl::StrCat("cuda-bench/s", gen, "/", i));
      ++gen;
      StoreOptions o;
      o.deadline = absl::Now() + absl::Seconds(60);
      o.memory = space;
      auto w = (*client)->Store(keys, in, o)->Wait();
      bool good = w.ok() && w->stored == n;
      (*client)->Remove(keys).IgnoreError();
      return good;
    };
    st_dev = std::max(
        st_dev, Time(
                    call_bytes,
                    [&] { return store_round(dev_in, device_space); }, &ok));
    st_host = std::max(
        st_host, Time(
                     call_bytes,
                     [&] { return store_round(host_in, MemorySpace{}); }, &ok));
  }
  cudaFreeHost(pinned);
  if (!ok) return Fail("a timed call loaded or stored short");
  std::printf(
      "cuda_load_bench: GPU %s, transport %s, %d x %zu MiB per call, "
      "pool %d x %zu MiB, best of %d trials x %d calls (GB/s)\n",
      prop.name, FLAGS_transport.c_str(), FLAGS_blocks,
      static_cast<size_t>(FLAGS_block_mib), FLAGS_bounce_chunks,
      static_cast<size_t>(FLAGS_bounce_chunk_mib), FLAGS_trials, FLAGS_rounds);
  std::printf(
      "  load  device %6.2f | host %6.2f | naive (host load + cudaMemcpy) "
      "%6.2f | "
      "pinned H2D alone %6.2f\n",
      device, host, naive, h2d);
  std::printf("  store device %6.2f | host %6.2f\n", st_dev, st_host);
  std::printf(
      "cuda_load_bench: device_vs_host=%.2f device_vs_naive=%.2f "
      "store_device_vs_host=%.2f identical=yes\n",
      device / host, device / naive, st_dev / st_host);
  return 0;
}

}  // namespace
}  // namespace hymcache

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "cuda_load_bench",
       .usage = "cuda_load_bench: the SDK's CUDA Load/Store path against "
                "host buffers and a host load plus cudaMemcpy",
       .main_file = __FILE__},
      &argc, &argv);
  return hymcache::Run();
}
