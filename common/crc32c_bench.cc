// crc32c_bench: CRC32C throughput of the hardware (SSE4.2) and table paths,
// over a buffer that fits in the L2 cache and one far larger than the last
// level cache (what checksumming a write buffer or a refilled object costs).
//
//   bazel run -c opt //common:crc32c_bench
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/crc32c.h"

namespace {

using Fn = uint32_t (*)(uint32_t, const void*, size_t);

// Best of a few passes, in GB/s (10^9 bytes per second).
double Measure(Fn fn, const std::vector<uint8_t>& buf, uint64_t total_bytes,
               uint32_t* sink) {
  const int passes_per_round =
      static_cast<int>(std::max<uint64_t>(1, total_bytes / buf.size()));
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    uint32_t c = 0;
    for (int i = 0; i < passes_per_round; ++i) c ^= fn(c, buf.data(), buf.size());
    const auto t1 = std::chrono::steady_clock::now();
    *sink ^= c;
    const double s = std::chrono::duration<double>(t1 - t0).count();
    const double gbps = static_cast<double>(passes_per_round) *
                        static_cast<double>(buf.size()) / s / 1e9;
    if (gbps > best) best = gbps;
  }
  return best;
}

}  // namespace

int main() {
  using hymcache::crc32c::ExtendHardware;
  using hymcache::crc32c::ExtendPortable;
  uint32_t sink = 0;
  std::printf("crc32c: dispatch uses %s\n",
              hymcache::crc32c::Implementation());
  for (size_t size : {size_t{256} << 10, size_t{256} << 20}) {
    std::vector<uint8_t> buf(size);
    for (size_t i = 0; i < size; ++i) buf[i] = static_cast<uint8_t>(i * 131 + 7);
    const uint64_t total = uint64_t{2} << 30;
    if (hymcache::crc32c::HardwareAvailable()) {
      std::printf("  %-7s %9zu KiB buffer: %6.2f GB/s\n", "sse4.2", size >> 10,
                  Measure(&ExtendHardware, buf, total, &sink));
    }
    std::printf("  %-7s %9zu KiB buffer: %6.2f GB/s\n", "table", size >> 10,
                Measure(&ExtendPortable, buf, total / 4, &sink));
  }
  std::printf("  (xor of all CRCs %08x)\n", sink);  // keeps the work observable
  return 0;
}
