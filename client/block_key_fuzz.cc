// Fuzzes the block-key builder with namespaces, block sizes and token ids
// from the input. Checks the properties the key scheme promises:
//   - Keys() gives one 32-byte key per full block and none for a trailing
//     partial block; each key is NextKey of the one before;
//   - the keys of a prefix of the tokens are a prefix of the keys;
//   - two different namespaces (any field, including length shifts between
//     fields: "ab"+"c" vs "a"+"bc") or block sizes never give the same key,
//     and changing any token changes the key of its block and every key
//     after it;
//   - KeyToHex is 2 lower-case hex characters per byte.
#include <string>
#include <vector>

#include "client/block_key.h"
#include "fuzz/fuzz_input.h"

namespace hymcache {
namespace {

KeyNamespace Namespace(fuzz::FuzzInput& in) {
  KeyNamespace ns;
  ns.model = in.String(24);
  ns.dtype = in.String(8);
  ns.layout = in.String(16);
  ns.tp_rank = static_cast<int32_t>(in.U8()) - 4;
  ns.tp_size = static_cast<int32_t>(in.U8()) - 4;
  ns.salt = in.String(8);
  return ns;
}

bool SameNamespace(const KeyNamespace& a, const KeyNamespace& b) {
  return a.model == b.model && a.dtype == b.dtype && a.layout == b.layout &&
         a.tp_rank == b.tp_rank && a.tp_size == b.tp_size && a.salt == b.salt;
}

}  // namespace
}  // namespace hymcache

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hymcache;  // NOLINT
  fuzz::FuzzInput in(data, size);
  const KeyNamespace ns1 = Namespace(in);
  KeyNamespace ns2 = ns1;
  if (in.Bool()) ns2 = Namespace(in);
  const size_t bt1 = in.Range(0, 16);  // 0 is clamped to 1 by the builder
  const size_t bt2 = in.Bool() ? bt1 : in.Range(1, 16);
  std::vector<int32_t> tokens;
  while (in.remaining() >= 4 && tokens.size() < 4096) {
    tokens.push_back(static_cast<int32_t>(in.U32()));
  }
  const BlockKeyBuilder b1(ns1, bt1);
  const BlockKeyBuilder b2(ns2, bt2);
  const size_t bt = b1.block_tokens();
  FUZZ_CHECK(bt >= 1);
  const std::vector<std::string> k1 = b1.Keys(tokens);
  FUZZ_CHECK(k1.size() == tokens.size() / bt);
  std::string parent;
  for (size_t i = 0; i < k1.size(); ++i) {
    FUZZ_CHECK(k1[i].size() == 32);
    const absl::Span<const int32_t> block(tokens.data() + i * bt, bt);
    FUZZ_CHECK(b1.NextKey(parent, block) == k1[i]) << "block " << i;
    parent = k1[i];
    const std::string hex = KeyToHex(k1[i]);
    FUZZ_CHECK(hex.size() == 64 &&
               hex.find_first_not_of("0123456789abcdef") == std::string::npos)
        << hex;
  }
  // A prefix of the tokens: a prefix of the keys.
  if (!tokens.empty()) {
    const size_t cut = tokens.size() / 2;
    const std::vector<std::string> kp =
        b1.Keys(absl::Span<const int32_t>(tokens.data(), cut));
    FUZZ_CHECK(kp.size() <= k1.size());
    for (size_t i = 0; i < kp.size(); ++i) FUZZ_CHECK(kp[i] == k1[i]);
  }
  // Another namespace or block size: no common key for these tokens.
  const bool same = SameNamespace(ns1, ns2) && b2.block_tokens() == bt;
  const std::vector<std::string> k2 = b2.Keys(tokens);
  if (same) {
    FUZZ_CHECK(k1 == k2);
  } else {
    for (const std::string& a : k1) {
      for (const std::string& b : k2) {
        FUZZ_CHECK(a != b) << "two namespaces share a key";
      }
    }
  }
  // A changed token changes its block's key and every later one.
  if (!k1.empty()) {
    std::vector<int32_t> changed = tokens;
    const size_t at = in.Range(0, k1.size() * bt - 1);
    changed[at] ^= 1;
    const std::vector<std::string> kc = b1.Keys(changed);
    for (size_t i = 0; i < k1.size(); ++i) {
      if (i < at / bt) {
        FUZZ_CHECK(kc[i] == k1[i]);
      } else {
        FUZZ_CHECK(kc[i] != k1[i]) << "token " << at << " left block " << i
                                   << "'s key unchanged";
      }
    }
  }
  return 0;
}
