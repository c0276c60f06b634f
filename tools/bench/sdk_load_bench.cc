// sdk_load_bench: the C++ side of tools/bench/python_load_bench.py. Loads
// blocks that the Python package stored, with the C++ SDK, and prints the
// time per Load call, so that the Python driver can set it beside its own
// `hymcache.Client.load` of the same blocks into the same kind of pool.
//
//   sdk_load_bench --master=HOST:PORT --blocks=16 --block_bytes=16777216
//       --iterations=8 [--model=... --dtype=... --layout=... --tp_rank=...
//       --tp_size=... --salt=... --block_tokens=...] [--transport=auto]
//
// Keys: BlockKeyBuilder over the namespace flags and the token ids
// 1..blocks*block_tokens, the same as the Python driver's KeyBuilder; a
// Python/C++ key mismatch loads nothing and fails the run. Every block must
// load in full and hold the driver's pattern (byte j of block i is
// (i * 131 + j) % 251), checked after the timed calls. Prints one line:
//   sdk_load_bench loaded=N calls=C us_per_call_median=M us_per_call_min=X gib_per_s=G
// Exit status 0, or 1 (and why on stderr) on a short load or wrong bytes.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/block_key.h"
#include "client/client.h"
#include "common/cli.h"

DEFINE_string(master, "", "master address HOST:PORT (required)");
DEFINE_string(transport, "auto", "tcp, shm, rdma or auto");
DEFINE_int32(blocks, 16, "blocks per Load");
DEFINE_uint64(block_bytes, 16 << 20, "bytes per block");
DEFINE_int32(iterations, 8, "timed Load calls (after one warm-up)");
DEFINE_string(model, "bench", "key namespace: model");
DEFINE_string(dtype, "", "key namespace: dtype");
DEFINE_string(layout, "", "key namespace: layout");
DEFINE_int32(tp_rank, 0, "key namespace: tensor-parallel rank");
DEFINE_int32(tp_size, 1, "key namespace: tensor-parallel size");
DEFINE_string(salt, "", "key namespace: salt");
DEFINE_uint64(block_tokens, 16, "tokens per block");

namespace hymcache {
namespace {

int Fail(const std::string& why) {
  std::fprintf(stderr, "sdk_load_bench: %s\n", why.c_str());
  return 1;
}

int Run() {
  if (FLAGS_master.empty()) return Fail("--master is required");
  if (FLAGS_blocks < 1 || FLAGS_iterations < 1 || FLAGS_block_bytes == 0 ||
      FLAGS_block_tokens == 0) {
    return Fail("--blocks, --iterations, --block_bytes, --block_tokens > 0");
  }
  ClientOptions options;
  options.master_address = FLAGS_master;
  auto transport = ParseTransportKind(FLAGS_transport);
  if (!transport.ok()) return Fail(transport.status().ToString());
  options.transport = *transport;
  auto client = Client::Create(options);
  if (!client.ok()) return Fail(client.status().ToString());

  KeyNamespace ns;
  ns.model = FLAGS_model;
  ns.dtype = FLAGS_dtype;
  ns.layout = FLAGS_layout;
  ns.tp_rank = FLAGS_tp_rank;
  ns.tp_size = FLAGS_tp_size;
  ns.salt = FLAGS_salt;
  BlockKeyBuilder builder(ns, FLAGS_block_tokens);
  std::vector<int32_t> tokens(FLAGS_blocks * FLAGS_block_tokens);
  std::iota(tokens.begin(), tokens.end(), 1);
  const std::vector<std::string> keys = builder.Keys(tokens);

  // One pool, one block per key (as an engine's preallocated KV pool).
  const size_t n = keys.size();
  std::vector<uint8_t> pool(n * FLAGS_block_bytes);
  std::vector<MutableBuffer> buffers;
  for (size_t i = 0; i < n; ++i) {
    buffers.push_back({pool.data() + i * FLAGS_block_bytes, FLAGS_block_bytes});
  }
  std::vector<double> us;
  for (int it = 0; it <= FLAGS_iterations; ++it) {
    const absl::Time start = absl::Now();
    auto got = (*client)->Load(keys, buffers);
    const absl::Duration took = absl::Now() - start;
    if (!got.ok()) return Fail(got.status().ToString());
    if (got->loaded != n) {
      return Fail("loaded " + std::to_string(got->loaded) + " of " +
                  std::to_string(n) + ": " + got->stop_reason.ToString());
    }
    if (it > 0) us.push_back(absl::ToDoubleMicroseconds(took));  // 0: warm-up
  }
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < FLAGS_block_bytes; ++j) {
      if (pool[i * FLAGS_block_bytes + j] != (i * 131 + j) % 251) {
        return Fail("block " + std::to_string(i) + " byte " +
                    std::to_string(j) + " differs from the pattern");
      }
    }
  }
  std::sort(us.begin(), us.end());
  const double median = us[us.size() / 2];
  const double gib = static_cast<double>(n * FLAGS_block_bytes) / (1 << 30);
  std::printf(
      "sdk_load_bench loaded=%zu calls=%zu us_per_call_median=%.1f "
      "us_per_call_min=%.1f gib_per_s=%.2f\n",
      n, us.size(), median, us.front(), gib / (median / 1e6));
  return 0;
}

}  // namespace
}  // namespace hymcache

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "sdk_load_bench",
       .usage = "sdk_load_bench: the C++ side of python_load_bench.py: Loads "
                "of blocks the Python package stored",
       .main_file = __FILE__},
      &argc, &argv);
  return hymcache::Run();
}
