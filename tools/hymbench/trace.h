// Request traces for hymbench: the Mooncake JSON-lines trace format, a
// synthetic multi-turn generator that emits the same requests, and the
// infinite-cache hit ceiling of a trace.
//
// Trace format (one JSON object per line, blank lines ignored):
//   {"timestamp": 27482, "input_length": 6955, "output_length": 52,
//    "hash_ids": [46, 47, 2396, 2397, 2398, 2399, 2400, 2401, 2402, 2403,
//                 2404, 2405, 2406, 2407]}
// timestamp: arrival time in ms (trace time); input_length and
// output_length: tokens; hash_ids: one id per block of `block_tokens` (512)
// input tokens, prefix-chained (an id names the block AND every token before
// it, so two requests share an id only if they share the whole prefix up to
// the end of that block). A trailing partial block has an id too:
// hash_ids.size() == ceil(input_length / 512).
// hymbench's generator adds two optional fields, "conversation" and "turn"
// (0-based), which the reports use to group by turn; other fields are
// ignored.
//
// Thread safety: free functions on values; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace hymcache::hymbench {

// Tokens per KV block in the Mooncake trace format.
inline constexpr int64_t kDefaultBlockTokens = 512;

// One request of a trace.
struct Request {
  // Arrival time in trace milliseconds.
  double timestamp_ms = 0;
  // Prompt tokens (the prefix whose KV blocks are loaded or stored).
  int64_t input_length = 0;
  // Generated tokens (not cached by hymbench; kept for the trace).
  int64_t output_length = 0;
  // One id per block of the prompt, in order; see the format above.
  std::vector<uint64_t> hash_ids;
  // Conversation and turn (0-based) when known (synthetic workloads), else
  // -1.
  int64_t conversation = -1;
  int64_t turn = -1;
};

struct TraceOptions {
  // Stop after this many requests; 0 reads the whole trace. Default: 0.
  size_t max_requests = 0;
  // Tokens per block, used to check hash_ids.size() against input_length.
  // Default: 512.
  int64_t block_tokens = kDefaultBlockTokens;
  // Reject a line whose hash_ids.size() != ceil(input_length /
  // block_tokens). Default: true.
  bool check_block_count = true;
};

// Parses one trace line. `line_number` (1-based) and `source` only label
// errors. InvalidArgument on malformed JSON, a missing or mistyped field, a
// negative length or id, or (check_block_count) a block count that does not
// match input_length.
absl::StatusOr<Request> ParseTraceLine(const std::string& line,
                                       size_t line_number,
                                       const TraceOptions& options = {},
                                       const std::string& source = "trace");

// Parses a whole JSONL stream. Errors name `source` and the line number.
absl::StatusOr<std::vector<Request>> ParseTrace(std::istream& in,
                                                const TraceOptions& options = {},
                                                const std::string& source = "trace");

// Reads a JSONL trace file. NotFound if it cannot be opened; otherwise as
// ParseTrace.
absl::StatusOr<std::vector<Request>> LoadTrace(const std::string& path,
                                               const TraceOptions& options = {});
// As above with only a request limit (0: all).
absl::StatusOr<std::vector<Request>> LoadTrace(const std::string& path,
                                               size_t max_requests);

// Writes `requests` as JSONL, one line per request, in the format above
// ("conversation" and "turn" only when >= 0). Integral timestamps are
// written as integers.
void WriteTrace(absl::Span<const Request> requests, std::ostream& out);

// A synthetic multi-turn chat workload, as AIPerf's multi-turn mode:
// `conversations` conversations of `turns` turns each. Turn t of a
// conversation sends the previous turn's input + the previous turn's output
// + `user_tokens` new user tokens (turn 0: system prompt + user tokens).
struct SyntheticOptions {
  // Conversations. >= 1. Default: 8.
  int conversations = 8;
  // Turns per conversation. >= 1. Default: 5.
  int turns = 5;
  // System prompt tokens at the start of every conversation. Default: 1024.
  int64_t system_prompt_tokens = 1024;
  // Whether every conversation has the same system prompt (its full blocks
  // are then shared across conversations); false: each its own.
  // Default: true.
  bool shared_system_prompt = true;
  // New user tokens per turn. Default: 1024.
  int64_t user_tokens = 1024;
  // Model output tokens per turn (part of the next turn's input).
  // Default: 256.
  int64_t output_tokens = 256;
  // Trace time between two consecutive turns of one conversation. The
  // conversations of one round are spread evenly over the gap. Default:
  // 1000 ms.
  double turn_gap_ms = 1000;
  // Tokens per block. Default: 512.
  int64_t block_tokens = kDefaultBlockTokens;

  // InvalidArgument naming the bad field.
  absl::Status Validate() const;
};

// Generates the workload: requests ordered round-robin by turn (turn 0 of
// every conversation, then turn 1, ...), conversation c's turn t at
// t * turn_gap_ms + c * turn_gap_ms / conversations. Block ids are
// prefix-chained and numbered from 0 in order of first appearance: a block
// id is determined by the block's tokens and every token before it, so turn
// t+1 reuses turn t's full blocks, while turn t's partial last block gets a
// new id once it grows. hash_ids.size() == ceil(input_length /
// block_tokens).
absl::StatusOr<std::vector<Request>> GenerateSynthetic(
    const SyntheticOptions& options);

// The infinite-cache ceiling: per request, the number of leading hash_ids
// that appeared in any earlier request (a cache that never evicts and holds
// every block of every request once it is served).
std::vector<size_t> CeilingHits(absl::Span<const Request> requests);

// Infers conversations and turns from prefix chains, for traces without
// "turn" fields (the Mooncake format). Requests are taken in trace order;
// for each request r without a turn:
//   full(p) = min(|p.hash_ids|, floor(p.input_length / block_tokens)), the
//             blocks of p that are full (a trailing partial block gets a new
//             id once it grows, so a next turn cannot share it);
//   r continues an earlier request p iff full(p) >= 1, r's first full(p)
//   hash_ids are p's first full(p) hash_ids, and r.input_length >
//   p.input_length (a next turn adds at least the previous answer; an
//   identical prompt is a repeat, not a turn).
//   p can be a parent only if p's last full block first came in p's own
//   conversation (a request whose full blocks are only a prefix another
//   conversation brought, such as a system prompt every conversation
//   shares with the request's own text in its partial last block, is
//   nobody's parent: hashes cannot tell its next turn from any other
//   conversation's on that prompt; Mooncake's conversation trace is made
//   of such requests). Only the first conversation on such a prompt, if
//   its first request has no full block of its own, keeps the ambiguity.
//   r's parent is the p it continues with the most full blocks (the
//   longest chain r extends); among those, the earliest one no request has
//   continued yet, or the latest one if all have been (conversations
//   usually take turns in order of arrival). r is then the parent's
//   conversation, turn parent.turn + 1. With no parent r starts a new
//   conversation at turn 0.
// Two requests may continue the same parent (a conversation that branches,
// or a retry): both get its turn + 1. A first turn shorter than one block
// has no full block, so nothing continues it. Requests that already have a
// turn keep their conversation and turn (and may be parents). New
// conversations are numbered after the largest existing one, in order of
// first appearance.
// REQUIRES: block_tokens >= 1.
void InferTurns(std::vector<Request>* requests,
                int64_t block_tokens = kDefaultBlockTokens);

struct CeilingSummary {
  size_t requests = 0;
  size_t blocks = 0;
  size_t hits = 0;
  // hits / blocks (0 for an empty trace).
  double hit_ratio() const {
    return blocks == 0 ? 0.0 : static_cast<double>(hits) / blocks;
  }
};
CeilingSummary ComputeCeiling(absl::Span<const Request> requests);

}  // namespace hymcache::hymbench
