#include "tools/common/block_stream.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace hymcache::tools {
namespace {

std::vector<uint8_t> Stream(uint64_t seed, uint64_t len) {
  std::vector<uint8_t> b(len);
  FillStream(seed, 0, len, b.data());
  return b;
}

TEST_CASE("the stream is little-endian words of SplitMix64") {
  const std::vector<uint8_t> b = Stream(42, 16);
  for (uint64_t i = 0; i < 16; ++i) {
    CHECK(b[i] == static_cast<uint8_t>(StreamWord(42, i / 8) >> (8 * (i % 8))));
  }
  // SplitMix64's first output for state 0 (its reference value).
  CHECK(StreamWord(0, 0) == 0xe220a8397b1dcdafULL);
}

TEST_CASE("any range of the stream is the same bytes as the whole") {
  const std::vector<uint8_t> whole = Stream(7, 100);
  for (uint64_t from : {0, 1, 7, 8, 13}) {
    for (uint64_t to :
         {from, from + 1, uint64_t{64}, uint64_t{99}, uint64_t{100}}) {
      if (to < from) continue;
      std::vector<uint8_t> part(100, 0xAA);
      FillStream(7, from, to, part.data());
      for (uint64_t i = 0; i < 100; ++i) {
        CHECK(part[i] == (i >= from && i < to ? whole[i] : 0xAA));
      }
      CHECK(FirstStreamMismatch(7, from, to, whole.data()) == to);
    }
  }
}

TEST_CASE("the first differing byte is found, at either end of a range") {
  std::vector<uint8_t> b = Stream(9, 4099);
  for (uint64_t at :
       {uint64_t{0}, uint64_t{5}, uint64_t{2048}, uint64_t{4098}}) {
    std::vector<uint8_t> bad = b;
    bad[at] ^= 0x40;
    CHECK(FirstStreamMismatch(9, 0, bad.size(), bad.data()) == at);
    CHECK(FirstStreamMismatch(9, at + 1, bad.size(), bad.data()) == bad.size());
  }
  // Another seed differs within the first word.
  CHECK(FirstStreamMismatch(10, 0, b.size(), b.data()) < 8);
}

TEST_CASE("key hashes differ by key and stay the same per key") {
  CHECK(KeyHash("a") == KeyHash("a"));
  CHECK(KeyHash("a") != KeyHash("b"));
  CHECK(KeyHash("") != KeyHash(std::string(1, '\0')));
}

}  // namespace
}  // namespace hymcache::tools
