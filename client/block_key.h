// Prefix-chained block keys for KV-cache blocks.
//
// A serving engine splits a request's token ids into fixed-size blocks; the
// key of block i depends on every token of blocks 0..i (through the parent
// key) and on a namespace naming everything that makes KV bytes differ:
// model, dtype, layout, tensor-parallel rank and size, and a salt (e.g. a
// tenant or LoRA adapter). Two models, or two TP ranks, never share a key.
//
// key_0 = SHA-256("hymcache.block.v1" | ns_digest | <no parent> | tokens_0)
// key_i = SHA-256("hymcache.block.v1" | ns_digest | key_{i-1}   | tokens_i)
// with every field length-prefixed, so no two inputs encode alike. Keys are
// 32 raw bytes; KeyToHex prints them.
//
// Thread safety: BlockKeyBuilder is immutable after construction and safe
// for concurrent use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace hymcache {

struct KeyNamespace {
  // Model name and revision, e.g. "meta-llama/Llama-3.1-8B@5206a32".
  std::string model;
  // KV element type, e.g. "bf16", "fp8_e4m3".
  std::string dtype;
  // Block layout, e.g. "NHD/layers=32/heads=8/dim=128".
  std::string layout;
  int32_t tp_rank = 0;
  int32_t tp_size = 1;
  // Anything else that must separate caches (tenant, adapter, cache salt).
  std::string salt;
};

class BlockKeyBuilder {
 public:
  // REQUIRES: block_tokens > 0. Default block size: 512 tokens.
  explicit BlockKeyBuilder(const KeyNamespace& ns, size_t block_tokens = 512);

  size_t block_tokens() const { return block_tokens_; }

  // Keys of every FULL block of `tokens`, in order. A trailing partial block
  // gets no key (its KV is not reusable until the block is complete).
  std::vector<std::string> Keys(absl::Span<const int32_t> tokens) const;

  // The key of `block` following `parent` ("" for the first block).
  std::string NextKey(absl::string_view parent,
                      absl::Span<const int32_t> block) const;

 private:
  std::string ns_digest_;
  size_t block_tokens_;
};

// Lower-case hex of a key (64 characters for block keys).
std::string KeyToHex(absl::string_view key);

}  // namespace hymcache
