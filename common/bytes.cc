#include "common/bytes.h"

#include <cctype>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"

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

}  // namespace hymcache
