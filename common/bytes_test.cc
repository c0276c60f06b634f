#include "common/bytes.h"

#include <catch2/catch.hpp>

namespace hymcache {
namespace {

TEST_CASE("byte counts with units") {
  uint64_t v = 0;
  CHECK(ParseBytes("1073741824", &v));
  CHECK(v == 1073741824);
  CHECK(ParseBytes(" 256M ", &v));
  CHECK(v == 256ull << 20);
  CHECK(ParseBytes("64KiB", &v));
  CHECK(v == 64ull << 10);
  CHECK(ParseBytes("2tb", &v));
  CHECK(v == 2ull << 40);
  CHECK(ParseBytes("0", &v));
  CHECK(v == 0);
}

TEST_CASE("malformed byte counts are refused") {
  uint64_t v = 7;
  CHECK_FALSE(ParseBytes("", &v));
  CHECK_FALSE(ParseBytes("G", &v));
  CHECK_FALSE(ParseBytes("12X", &v));
  CHECK_FALSE(ParseBytes("-1", &v));
  CHECK_FALSE(ParseBytes("1.5G", &v));
  CHECK_FALSE(ParseBytes("99999999999999999999", &v));
  CHECK_FALSE(ParseBytes("17179869184G", &v));  // 2^64 overflows
  CHECK(v == 7);
}

}  // namespace
}  // namespace hymcache
