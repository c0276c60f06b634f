// FuzzInput: reads typed values off the front of a fuzzer's input, so that a
// target can build structured requests (protos, frames, operation sequences)
// from the bytes libFuzzer mutates. Past the end every read returns zeros
// (or empty strings): any input is a valid program.
//
// Fuzz checks: FUZZ_CHECK(cond) << ... aborts with a message when a property
// the target asserts does not hold (libFuzzer then saves the input).
//
// Thread safety: a FuzzInput is used by one thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

namespace hymcache::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t remaining() const { return size_ - pos_; }
  bool empty() const { return pos_ >= size_; }

  uint8_t U8() {
    if (pos_ >= size_) return 0;
    return data_[pos_++];
  }
  uint16_t U16() { return static_cast<uint16_t>(Le(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Le(4)); }
  uint64_t U64() { return Le(8); }
  bool Bool() { return (U8() & 1) != 0; }

  // A value in [lo, hi] (one byte of input when the range is small).
  uint64_t Range(uint64_t lo, uint64_t hi) {
    if (hi <= lo) return lo;
    const uint64_t span = hi - lo;
    uint64_t v;
    if (span < 0xff) {
      v = U8();
    } else if (span < 0xffff) {
      v = U16();
    } else if (span < 0xffffffffu) {
      v = U32();
    } else {
      v = U64();
    }
    return span == UINT64_MAX ? v : lo + v % (span + 1);
  }

  // Up to `n` bytes (fewer at the end of the input).
  std::string Bytes(size_t n) {
    n = std::min(n, remaining());
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  // A string whose length (0..max) is read first.
  std::string String(size_t max) { return Bytes(Range(0, max)); }
  // Everything left.
  std::string Rest() { return Bytes(remaining()); }

 private:
  uint64_t Le(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{U8()} << (8 * i);
    return v;
  }

  const uint8_t* const data_;
  const size_t size_;
  size_t pos_ = 0;
};

// Aborts with the streamed message when it is destroyed.
class FuzzFailure {
 public:
  FuzzFailure(const char* file, int line, const char* cond) {
    os_ << file << ":" << line << ": fuzz check failed: " << cond << ": ";
  }
  [[noreturn]] ~FuzzFailure() {
    std::fprintf(stderr, "%s\n", os_.str().c_str());
    std::abort();
  }
  template <typename T>
  FuzzFailure& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::ostringstream os_;
};

}  // namespace hymcache::fuzz

// A while, not an if/else, so that it nests under an unbraced if; the body
// never returns.
#define FUZZ_CHECK(cond) \
  while (!(cond)) ::hymcache::fuzz::FuzzFailure(__FILE__, __LINE__, #cond)
