#include "tools/common/block_stream.h"

#include <algorithm>
#include <cstring>

#include "absl/base/internal/endian.h"

namespace hymcache::tools {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t KeyHash(absl::string_view key) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : key) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return Mix(h + kGolden);
}

uint64_t StreamWord(uint64_t seed, uint64_t w) {
  return Mix(seed + (w + 1) * kGolden);
}

void FillStream(uint64_t seed, uint64_t from, uint64_t to, uint8_t* out) {
  uint64_t i = from;
  // A partial first word, then whole words, then a partial last one.
  while (i < to && i % 8 != 0) {
    out[i] = static_cast<uint8_t>(StreamWord(seed, i / 8) >> (8 * (i % 8)));
    ++i;
  }
  for (; i + 8 <= to; i += 8) {
    absl::little_endian::Store64(out + i, StreamWord(seed, i / 8));
  }
  for (; i < to; ++i) {
    out[i] = static_cast<uint8_t>(StreamWord(seed, i / 8) >> (8 * (i % 8)));
  }
}

uint64_t FirstStreamMismatch(uint64_t seed, uint64_t from, uint64_t to,
                             const uint8_t* data) {
  uint8_t want[8];
  for (uint64_t w = from / 8; w * 8 < to; ++w) {
    absl::little_endian::Store64(want, StreamWord(seed, w));
    const uint64_t lo = std::max(from, w * 8);
    const uint64_t hi = std::min(to, w * 8 + 8);
    if (std::memcmp(data + lo, want + (lo - w * 8), hi - lo) == 0) continue;
    for (uint64_t i = lo; i < hi; ++i) {
      if (data[i] != want[i - w * 8]) return i;
    }
  }
  return to;
}

}  // namespace hymcache::tools
