// Keys and contents of hymbench's blocks.
//
// A trace block id (hash_ids entry) already stands for its whole prefix, so
// its store key need not be chained again: key = SHA-256("hymbench.block.v1"
// | namespace | block bytes | hash id), every field length-prefixed; 32 raw
// bytes. The namespace separates runs (and tools) sharing a cluster; the
// block size is part of the key so that a run with another --block_bytes
// never loads blocks of the wrong size.
//
// A block's bytes are its key's stream (tools/common/block_stream.h, shared
// with the crash test), so any block can be regenerated to check a load byte
// for byte, and blocks of different namespaces never look alike.
//
// Thread safety: BlockCodec is immutable after construction and safe for
// concurrent use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace hymcache::hymbench {

class BlockCodec {
 public:
  BlockCodec(std::string key_namespace, uint64_t block_bytes);

  const std::string& key_namespace() const { return namespace_; }
  uint64_t block_bytes() const { return block_bytes_; }

  // The 32-byte store key of trace block `hash_id`.
  std::string Key(uint64_t hash_id) const;

  // Fills `size` bytes at `data` with the contents of the block stored under
  // `key`.
  static void Fill(absl::string_view key, void* data, size_t size);

  // Offset of the first byte of `data[0, size)` that differs from Fill(key),
  // or `size` when all match.
  static size_t FirstMismatch(absl::string_view key, const void* data, size_t size);

 private:
  std::string namespace_;
  uint64_t block_bytes_;
};

}  // namespace hymcache::hymbench
