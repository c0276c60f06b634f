// The demo workload: a few multi-turn conversations against a live cluster,
// the way a serving engine uses HyMCache. Each turn the conversation's
// prompt is the previous prompt + the model's answer + new user tokens; the
// engine loads the cached prefix, "computes" the KV of the blocks it did not
// get (deterministic bytes derived from each key, so every load is checked
// byte for byte) and stores them for the next turn.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace hymcache::demo {

struct DemoOptions {
  // Master gRPC address. Default: 127.0.0.1:50051.
  std::string master_address = "127.0.0.1:50051";
  // Bearer token (role engine) and the master's CA (enables TLS).
  // Default: none, plaintext.
  std::string token;
  std::string tls_ca_file;
  // Concurrent conversations (run one after another per turn). Default: 4.
  int conversations = 4;
  // Turns per conversation. Default: 5.
  int turns = 5;
  // Tokens per KV block. Default: 512.
  int block_tokens = 512;
  // Bytes of KV per block (scaled down from real sizes). Default: 1 MiB.
  uint64_t block_bytes = 1 << 20;
  // New user tokens per turn; the answer adds as many again. Default: 1024.
  int tokens_per_turn = 1024;
};

// Runs the workload and prints a per-turn table. Fails if any loaded byte
// differs from what was stored.
absl::Status Run(const DemoOptions& options, std::ostream& out);

}  // namespace hymcache::demo
