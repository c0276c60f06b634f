#include "tools/hymbench/block_data.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <set>
#include <string>
#include <vector>

namespace hymcache::hymbench {
namespace {

TEST_CASE("keys are 32 bytes, deterministic, and separate namespaces and sizes") {
  BlockCodec a("run-a", 256 << 10);
  CHECK(a.Key(7).size() == 32);
  CHECK(a.Key(7) == BlockCodec("run-a", 256 << 10).Key(7));
  std::set<std::string> keys;
  for (uint64_t id = 0; id < 1000; ++id) keys.insert(a.Key(id));
  CHECK(keys.size() == 1000);
  CHECK(a.Key(7) != BlockCodec("run-b", 256 << 10).Key(7));
  CHECK(a.Key(7) != BlockCodec("run-a", 1 << 20).Key(7));
  // Length-prefixed fields: no ambiguity between namespace and id bytes.
  CHECK(BlockCodec("", 1).Key(0) != BlockCodec(std::string(1, '\0'), 1).Key(0));
}

TEST_CASE("contents are deterministic per key and checked byte for byte") {
  BlockCodec c("ns", 1000);
  const std::string k1 = c.Key(1), k2 = c.Key(2);
  for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{1000}, size_t{4099}}) {
    std::vector<unsigned char> a(size), b(size);
    BlockCodec::Fill(k1, a.data(), size);
    BlockCodec::Fill(k1, b.data(), size);
    CHECK(a == b);
    CHECK(BlockCodec::FirstMismatch(k1, a.data(), size) == size);
    if (size == 0) continue;
    // Every position is checked, the tail included.
    for (size_t at : {size_t{0}, size / 2, size - 1}) {
      std::vector<unsigned char> bad = a;
      bad[at] ^= 0x40;
      CHECK(BlockCodec::FirstMismatch(k1, bad.data(), size) == at);
    }
  }
  std::vector<unsigned char> a(4096), b(4096);
  BlockCodec::Fill(k1, a.data(), a.size());
  BlockCodec::Fill(k2, b.data(), b.size());
  CHECK(a != b);
  CHECK(BlockCodec::FirstMismatch(k2, a.data(), a.size()) < 8);
  // A prefix of a longer block is the shorter block.
  std::vector<unsigned char> shorter(100);
  BlockCodec::Fill(k1, shorter.data(), shorter.size());
  CHECK(std::equal(shorter.begin(), shorter.end(), a.begin()));
}

}  // namespace
}  // namespace hymcache::hymbench
