#include "client/block_key.h"

#include <openssl/evp.h>

#include <cstring>

#include "absl/base/internal/endian.h"
#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"

namespace hymcache {
namespace {

constexpr absl::string_view kDomain = "hymcache.block.v1";

// Incremental SHA-256 over length-prefixed fields.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr);
  }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Field(const void* data, size_t len) {
    uint8_t n[8];
    absl::little_endian::Store64(n, len);
    EVP_DigestUpdate(ctx_, n, sizeof(n));
    if (len > 0) EVP_DigestUpdate(ctx_, data, len);
  }
  void Field(absl::string_view s) { Field(s.data(), s.size()); }
  void Int(int64_t v) {
    uint8_t b[8];
    absl::little_endian::Store64(b, static_cast<uint64_t>(v));
    Field(b, sizeof(b));
  }
  std::string Finish() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_, out, &len);
    return std::string(reinterpret_cast<char*>(out), len);
  }

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace

BlockKeyBuilder::BlockKeyBuilder(const KeyNamespace& ns, size_t block_tokens)
    : block_tokens_(block_tokens == 0 ? 1 : block_tokens) {
  Sha256 h;
  h.Field(absl::string_view("hymcache.namespace.v1"));
  h.Field(ns.model);
  h.Field(ns.dtype);
  h.Field(ns.layout);
  h.Int(ns.tp_rank);
  h.Int(ns.tp_size);
  h.Field(ns.salt);
  h.Int(static_cast<int64_t>(block_tokens_));
  ns_digest_ = h.Finish();
}

std::string BlockKeyBuilder::NextKey(absl::string_view parent,
                                     absl::Span<const int32_t> block) const {
  Sha256 h;
  h.Field(kDomain);
  h.Field(ns_digest_);
  h.Field(parent);
  std::string tokens(block.size() * 4, '\0');
  for (size_t i = 0; i < block.size(); ++i) {
    absl::little_endian::Store32(&tokens[i * 4],
                                 static_cast<uint32_t>(block[i]));
  }
  h.Field(tokens);
  return h.Finish();
}

std::vector<std::string> BlockKeyBuilder::Keys(
    absl::Span<const int32_t> tokens) const {
  std::vector<std::string> keys;
  keys.reserve(tokens.size() / block_tokens_);
  std::string parent;
  for (size_t off = 0; off + block_tokens_ <= tokens.size();
       off += block_tokens_) {
    parent = NextKey(parent, tokens.subspan(off, block_tokens_));
    keys.push_back(parent);
  }
  return keys;
}

std::string KeyToHex(absl::string_view key) {
  return absl::BytesToHexString(absl::string_view(key.data(), key.size()));
}

}  // namespace hymcache
