#include "client/block_key.h"

#include <catch2/catch.hpp>
#include <numeric>
#include <set>
#include <vector>

namespace hymcache {
namespace {

std::vector<int32_t> Tokens(size_t n, int32_t start = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

KeyNamespace Ns(std::string model = "llama-8b") {
  KeyNamespace ns;
  ns.model = std::move(model);
  ns.dtype = "bf16";
  ns.layout = "NHD";
  return ns;
}

TEST_CASE("only full blocks get keys; keys are 32 bytes and deterministic") {
  BlockKeyBuilder b(Ns(), 4);
  auto k = b.Keys(Tokens(10));
  REQUIRE(k.size() == 2);
  CHECK(k[0].size() == 32);
  CHECK(k != std::vector<std::string>{});
  CHECK(b.Keys(Tokens(10)) == k);
  CHECK(BlockKeyBuilder(Ns(), 4).Keys(Tokens(8)) == k);
  CHECK(KeyToHex(k[0]).size() == 64);
}

TEST_CASE("keys chain: a shared prefix shares keys, a divergence changes all later keys") {
  BlockKeyBuilder b(Ns(), 4);
  auto a = Tokens(16);
  auto c = a;
  c[5] = 999;  // second block differs
  auto ka = b.Keys(a);
  auto kc = b.Keys(c);
  REQUIRE(ka.size() == 4);
  CHECK(ka[0] == kc[0]);
  for (size_t i = 1; i < 4; ++i) CHECK(ka[i] != kc[i]);
  // The same block contents at a different position get a different key.
  auto d = Tokens(8);
  std::copy(a.begin() + 4, a.begin() + 8, d.begin());
  CHECK(b.Keys(d)[0] != ka[1]);
  // NextKey continues the chain.
  CHECK(b.NextKey(ka[0], absl::MakeConstSpan(a).subspan(4, 4)) == ka[1]);
}

TEST_CASE("every namespace field separates keys") {
  auto t = Tokens(8);
  std::set<std::string> seen;
  std::vector<KeyNamespace> variants;
  variants.push_back(Ns());
  variants.push_back(Ns("llama-70b"));
  KeyNamespace v = Ns();
  v.dtype = "fp8";
  variants.push_back(v);
  v = Ns();
  v.layout = "HND";
  variants.push_back(v);
  v = Ns();
  v.tp_rank = 1;
  variants.push_back(v);
  v = Ns();
  v.tp_size = 2;
  variants.push_back(v);
  v = Ns();
  v.salt = "tenant-a";
  variants.push_back(v);
  // Field boundaries matter: ("ab", "c") differs from ("a", "bc").
  v = Ns("llama-8bb");
  v.dtype = "f16";
  variants.push_back(v);
  for (const auto& ns : variants) seen.insert(BlockKeyBuilder(ns, 4).Keys(t)[0]);
  CHECK(seen.size() == variants.size());
  // Block size is part of the namespace too.
  CHECK(BlockKeyBuilder(Ns(), 8).Keys(t)[0] != BlockKeyBuilder(Ns(), 4).Keys(t)[0]);
}

}  // namespace
}  // namespace hymcache
