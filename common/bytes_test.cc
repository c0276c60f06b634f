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

TEST_CASE("byte counts are formatted in the largest exact unit") {
  CHECK(FormatBytes(0) == "0");
  CHECK(FormatBytes(4095) == "4095");
  CHECK(FormatBytes(1536) == "1536");
  CHECK(FormatBytes(uint64_t{1536} << 10) == "1536K");
  CHECK(FormatBytes(uint64_t{256} << 20) == "256M");
  CHECK(FormatBytes(uint64_t{1} << 30) == "1G");
  CHECK(FormatBytes(uint64_t{3} << 40) == "3T");
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{12345} << 10,
                     uint64_t{64} << 30, UINT64_MAX}) {
    uint64_t back = 1;
    REQUIRE(ParseBytes(FormatBytes(n), &back));
    CHECK(back == n);
  }
}

}  // namespace
}  // namespace hymcache
