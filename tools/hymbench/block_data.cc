#include "tools/hymbench/block_data.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/base/internal/endian.h"
#include "tools/common/block_stream.h"

namespace hymcache::hymbench {
namespace {

constexpr absl::string_view kDomain = "hymbench.block.v1";

void AppendField(std::string* out, const void* data, size_t len) {
  char n[8];
  absl::little_endian::Store64(n, len);
  out->append(n, sizeof(n));
  out->append(static_cast<const char*>(data), len);
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
  tools::FillStream(tools::KeyHash(key), 0, size, static_cast<uint8_t*>(data));
}

size_t BlockCodec::FirstMismatch(absl::string_view key, const void* data,
                                 size_t size) {
  return tools::FirstStreamMismatch(tools::KeyHash(key), 0, size,
                                    static_cast<const uint8_t*>(data));
}

}  // namespace hymcache::hymbench
