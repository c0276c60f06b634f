#include "common/bytes.h"

#include <cctype>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hymcache {

bool ParseBytes(absl::string_view s, uint64_t* out) {
  s = absl::StripAsciiWhitespace(s);
  size_t digits = 0;
  while (digits < s.size() &&
         std::isdigit(static_cast<unsigned char>(s[digits]))) {
    ++digits;
  }
  if (digits == 0) return false;
  uint64_t n = 0;
  if (!absl::SimpleAtoi(s.substr(0, digits), &n)) return false;
  const std::string unit = absl::AsciiStrToUpper(s.substr(digits));
  int shift = 0;
  if (unit.empty() || unit == "B") {
    shift = 0;
  } else if (unit == "K" || unit == "KB" || unit == "KIB") {
    shift = 10;
  } else if (unit == "M" || unit == "MB" || unit == "MIB") {
    shift = 20;
  } else if (unit == "G" || unit == "GB" || unit == "GIB") {
    shift = 30;
  } else if (unit == "T" || unit == "TB" || unit == "TIB") {
    shift = 40;
  } else {
    return false;
  }
  if (shift > 0 && n > (UINT64_MAX >> shift)) return false;
  *out = n << shift;
  return true;
}

std::string FormatBytes(uint64_t n) {
  if (n == 0) return "0";
  static constexpr std::pair<int, char> kUnits[] = {
      {40, 'T'}, {30, 'G'}, {20, 'M'}, {10, 'K'}};
  for (const auto& [shift, unit] : kUnits) {
    if (n % (uint64_t{1} << shift) == 0) {
      return absl::StrCat(n >> shift, std::string(1, unit));
    }
  }
  return absl::StrCat(n);
}

}  // namespace hymcache
