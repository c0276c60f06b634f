#include "tools/crashtest/block_data.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/string_view.h"
#include "tools/common/block_stream.h"

namespace hymcache::crashtest {
namespace {

constexpr char kMagic[8] = {'H', 'Y', 'M', 'C', 'R', 'T', '0', '1'};

void PutLe(uint64_t v, size_t bytes, uint8_t* out) {
  for (size_t i = 0; i < bytes; ++i)
    out[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t GetLe(const uint8_t* in, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= uint64_t{in[i]} << (8 * i);
  return v;
}

}  // namespace

uint64_t KeyHash(absl::string_view key) {
  return tools::KeyHash(absl::string_view(key.data(), key.size()));
}

uint64_t BlockLength(absl::string_view key, uint64_t min_bytes,
                     uint64_t max_bytes) {
  const uint64_t span = max_bytes - min_bytes + 1;
  return min_bytes + (KeyHash(key) >> 7) % span;
}

void FillBlock(absl::string_view key, uint64_t len, uint8_t* out) {
  const uint64_t header = kBlockHeaderBytes + key.size();
  std::memcpy(out, kMagic, sizeof(kMagic));
  PutLe(len, 8, out + 8);
  PutLe(key.size(), 2, out + 16);
  std::memcpy(out + kBlockHeaderBytes, key.data(), key.size());
  tools::FillStream(KeyHash(key), header, len, out);
}

BlockCheck CheckBlock(absl::string_view key, uint64_t expected_len,
                      const uint8_t* data, uint64_t len) {
  BlockCheck out;
  // Regenerated in pieces would be faster; blocks are small (KiB to MiB) and
  // a whole copy keeps the comparison obvious.
  std::string expected(expected_len, '\0');
  FillBlock(key, expected_len, reinterpret_cast<uint8_t*>(expected.data()));
  const uint64_t common = std::min(expected_len, len);
  if (std::memcmp(expected.data(), data, common) != 0) {
    for (uint64_t i = 0; i < common; ++i) {
      if (static_cast<uint8_t>(expected[i]) != data[i]) ++out.wrong_bytes;
    }
  }
  out.wrong_bytes += std::max(expected_len, len) - common;
  if (out.wrong_bytes == 0) return out;
  // Someone else's block?
  if (len >= kBlockHeaderBytes && std::memcmp(data, kMagic, 8) == 0) {
    const uint64_t klen = GetLe(data + 16, 2);
    if (kBlockHeaderBytes + klen <= len) {
      absl::string_view other(
          reinterpret_cast<const char*>(data) + kBlockHeaderBytes, klen);
      if (other != key) out.other_key = std::string(other);
    }
  }
  return out;
}

}  // namespace hymcache::crashtest
