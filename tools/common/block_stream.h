// The block contents the tools generate and check: a pseudo-random byte
// stream seeded by a block's key, the same for every tool that stores
// checkable blocks (hymbench's BlockCodec, the crash test's self-describing
// blocks), so a load is checked byte for byte without remembering what was
// stored.
//
// Byte i of the stream of `seed` is byte i % 8 (little-endian) of word
// i / 8, and word w is SplitMix64 of seed + (w + 1) * golden ratio: any
// range of the stream is written or checked without generating what comes
// before it, and a prefix of a longer block's stream is the shorter block's.
//
// Thread safety: stateless functions, safe from any thread.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace hymcache::tools {

// A 64-bit hash of `key` (FNV-1a, then a SplitMix64 finalizer): the seed of
// the key's stream.
uint64_t KeyHash(absl::string_view key);

// Word `w` of the stream of `seed`.
uint64_t StreamWord(uint64_t seed, uint64_t w);

// Writes bytes [from, to) of the stream of `seed` to out[from, to).
void FillStream(uint64_t seed, uint64_t from, uint64_t to, uint8_t* out);

// The offset of the first byte of data[from, to) that differs from the
// stream of `seed`, or `to` when all match.
uint64_t FirstStreamMismatch(uint64_t seed, uint64_t from, uint64_t to,
                             const uint8_t* data);

}  // namespace hymcache::tools
