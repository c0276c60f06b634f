#include "tools/hymbench/block_data.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/base/internal/endian.h"

namespace hymcache::hymbench {
namespace {

constexpr absl::string_view kDomain = "hymbench.block.v1";

void AppendField(std::string* out, const void* data, size_t len) {
  char n[8];
  absl::little_endian::Store64(n, len);
  out->append(n, sizeof(n));
  out->append(static_cast<const char*>(data), len);
}

// SplitMix64: word `i` of the stream seeded by `seed`. Position-addressable,
// so Fill and FirstMismatch need no state.
inline uint64_t Word(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Seed(absl::string_view key) {
  char b[8] = {};
  std::memcpy(b, key.data(), std::min<size_t>(sizeof(b), key.size()));
  uint64_t seed = absl::little_endian::Load64(b);
  // Short keys (only in tests) still differ by length.
  return seed ^ (static_cast<uint64_t>(key.size()) << 56);
}

}  // namespace

BlockCodec::BlockCodec(std::string key_namespace, uint64_t block_bytes)
    : namespace_(std::move(key_namespace)), block_bytes_(block_bytes) {}

std::string BlockCodec::Key(uint64_t hash_id) const {
  std::string input;
  input.reserve(64 + namespace_.size());
  AppendField(&input, kDomain.data(), kDomain.size());
  AppendField(&input, namespace_.data(), namespace_.size());
  char size[8];
  absl::little_endian::Store64(size, block_bytes_);
  AppendField(&input, size, sizeof(size));
  char id[8];
  absl::little_endian::Store64(id, hash_id);
  AppendField(&input, id, sizeof(id));
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(input.data(), input.size(), md, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(md), len);
}

void BlockCodec::Fill(absl::string_view key, void* data, size_t size) {
  const uint64_t seed = Seed(key);
  auto* p = static_cast<unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    absl::little_endian::Store64(p + i, Word(seed, i / 8));
  }
  if (i < size) {
    char tail[8];
    absl::little_endian::Store64(tail, Word(seed, i / 8));
    std::memcpy(p + i, tail, size - i);
  }
}

size_t BlockCodec::FirstMismatch(absl::string_view key, const void* data, size_t size) {
  const uint64_t seed = Seed(key);
  const auto* p = static_cast<const unsigned char*>(data);
  char want[8];
  for (size_t i = 0; i < size; i += 8) {
    absl::little_endian::Store64(want, Word(seed, i / 8));
    const size_t n = std::min<size_t>(8, size - i);
    if (std::memcmp(p + i, want, n) != 0) {
      for (size_t k = 0; k < n; ++k) {
        if (p[i + k] != static_cast<unsigned char>(want[k])) return i + k;
      }
    }
  }
  return size;
}

}  // namespace hymcache::hymbench
