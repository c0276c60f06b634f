#include "tools/crashtest/block_data.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace hymcache::crashtest {
namespace {

std::vector<uint8_t> Block(const std::string& key, uint64_t len) {
  std::vector<uint8_t> b(len);
  FillBlock(key, len, b.data());
  return b;
}

TEST_CASE("a block checks against its own key and length") {
  const std::string key(32, 'k');
  for (uint64_t len : {uint64_t{50}, uint64_t{4095}, uint64_t{65536}}) {
    auto b = Block(key, len);
    BlockCheck c = CheckBlock(key, len, b.data(), b.size());
    CHECK(c.wrong_bytes == 0);
    CHECK(c.other_key.empty());
  }
  // Deterministic: the same key gives the same bytes.
  CHECK(Block(key, 9000) == Block(key, 9000));
}

TEST_CASE("one flipped byte, a torn tail and a short block are caught") {
  const std::string key = "key-one-0123456789abcdef0123456789";
  auto b = Block(key, 20000);
  b[12345] ^= 0x01;
  CHECK(CheckBlock(key, 20000, b.data(), b.size()).wrong_bytes == 1);

  auto torn = Block(key, 20000);
  std::fill(torn.begin() + 16384, torn.end(), 0);
  CHECK(CheckBlock(key, 20000, torn.data(), torn.size()).wrong_bytes > 3000);

  auto whole = Block(key, 20000);
  CHECK(CheckBlock(key, 20000, whole.data(), 19000).wrong_bytes == 1000);
}

TEST_CASE("another key's block is named") {
  const std::string mine = "key-mine-0123456789abcdef01234567";
  const std::string other = "key-other-0123456789abcdef0123456";
  auto b = Block(other, 30000);
  BlockCheck c = CheckBlock(mine, 30000, b.data(), b.size());
  CHECK(c.wrong_bytes > 0);
  CHECK(c.other_key == other);
}

TEST_CASE("block lengths come from the key and stay in range") {
  uint64_t lo = UINT64_MAX, hi = 0;
  for (int i = 0; i < 1000; ++i) {
    const std::string key = "k" + std::to_string(i);
    const uint64_t len = BlockLength(key, 1000, 2000);
    CHECK(len == BlockLength(key, 1000, 2000));
    lo = std::min(lo, len);
    hi = std::max(hi, len);
  }
  CHECK(lo >= 1000);
  CHECK(hi <= 2000);
  CHECK(hi - lo > 900);  // spread over the range
}

}  // namespace
}  // namespace hymcache::crashtest
