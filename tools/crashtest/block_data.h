// The crash test's block contents: a pure function of the block's key, so
// that every byte a Load returns can be checked without remembering what
// was stored.
//
// Layout of a block of length L (L >= kBlockHeaderBytes + key size):
//   [0, 8)    magic "HYMCRT01"
//   [8, 16)   L, little-endian u64
//   [16, 18)  key length, little-endian u16
//   [18, 18 + key length)  the key itself
//   rest      the key's stream (tools/common/block_stream.h, shared with
//             hymbench) at the same offsets
// A block returned for the wrong key therefore names the key it belongs to
// (CheckBlock reports it), and a torn or shifted block fails the comparison.
//
// Thread safety: stateless functions, safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace hymcache::crashtest {

inline constexpr size_t kBlockHeaderBytes = 18;

// A 64-bit hash of `key` (tools::KeyHash: FNV-1a, then a SplitMix64
// finalizer).
uint64_t KeyHash(absl::string_view key);

// The length of `key`'s block: derived from the key's hash, uniform in
// [min_bytes, max_bytes]. REQUIRES: min_bytes <= max_bytes and min_bytes >=
// kBlockHeaderBytes + key.size().
uint64_t BlockLength(absl::string_view key, uint64_t min_bytes,
                     uint64_t max_bytes);

// Writes the block of `key` with `len` bytes into `out`.
// REQUIRES: len >= kBlockHeaderBytes + key.size().
void FillBlock(absl::string_view key, uint64_t len, uint8_t* out);

struct BlockCheck {
  // Bytes of `data` that differ from the block of `key` (0: correct). A
  // length that differs counts every byte of the longer one past the
  // shorter as wrong.
  uint64_t wrong_bytes = 0;
  // When the data is a well-formed block of another key: that key.
  std::string other_key;
};

// Compares `data` (`len` bytes, as returned for `key`) with the block of
// `key` of length `expected_len`.
BlockCheck CheckBlock(absl::string_view key, uint64_t expected_len,
                      const uint8_t* data, uint64_t len);

}  // namespace hymcache::crashtest
