// Fuzzes hymbench's trace parser (ParseTrace over a JSON-lines stream, with
// options taken from the input's first bytes). For every trace it accepts,
// checks that the requests are what the format promises (non-negative
// lengths, block counts matching input_length when checked), that writing
// the trace and parsing it again gives the same requests, and that the
// infinite-cache ceiling never counts more hits than blocks.
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "tools/hymbench/trace.h"

namespace hymcache::hymbench {
namespace {

bool Same(const Request& a, const Request& b) {
  return a.timestamp_ms == b.timestamp_ms && a.input_length == b.input_length &&
         a.output_length == b.output_length && a.hash_ids == b.hash_ids &&
         a.conversation == b.conversation && a.turn == b.turn;
}

}  // namespace
}  // namespace hymcache::hymbench

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hymcache::hymbench;  // NOLINT
  hymcache::fuzz::FuzzInput in(data, size);
  TraceOptions o;
  o.check_block_count = in.Bool();
  o.block_tokens = 1 + in.Range(0, 1023);
  o.max_requests = in.Range(0, 3) == 0 ? in.Range(1, 8) : 0;
  std::istringstream text(in.Rest());
  absl::StatusOr<std::vector<Request>> trace = ParseTrace(text, o, "fuzz");
  if (!trace.ok()) {
    FUZZ_CHECK(trace.status().code() == absl::StatusCode::kInvalidArgument)
        << trace.status();
    return 0;
  }
  if (o.max_requests > 0) FUZZ_CHECK(trace->size() <= o.max_requests);
  for (const Request& r : *trace) {
    FUZZ_CHECK(r.input_length >= 0 && r.output_length >= 0);
    if (o.check_block_count) {
      const uint64_t blocks =
          (static_cast<uint64_t>(r.input_length) + o.block_tokens - 1) /
          o.block_tokens;
      FUZZ_CHECK(r.hash_ids.size() == blocks)
          << r.hash_ids.size() << " ids for " << r.input_length << " tokens";
    }
  }
  // Written and read back: the same requests.
  std::ostringstream out;
  WriteTrace(*trace, out);
  std::istringstream again_text(out.str());
  TraceOptions lax = o;
  lax.max_requests = 0;
  absl::StatusOr<std::vector<Request>> again =
      ParseTrace(again_text, lax, "rewritten");
  FUZZ_CHECK(again.ok()) << "a written trace does not parse: "
                         << again.status() << "\n" << out.str();
  FUZZ_CHECK(again->size() == trace->size());
  for (size_t i = 0; i < trace->size(); ++i) {
    FUZZ_CHECK(Same((*trace)[i], (*again)[i]))
        << "request " << i << " changed when written and read back:\n"
        << out.str();
  }
  const std::vector<size_t> hits = CeilingHits(*trace);
  FUZZ_CHECK(hits.size() == trace->size());
  for (size_t i = 0; i < hits.size(); ++i) {
    FUZZ_CHECK(hits[i] <= (*trace)[i].hash_ids.size());
  }
  const CeilingSummary c = ComputeCeiling(*trace);
  FUZZ_CHECK(c.hits <= c.blocks && c.requests == trace->size());
  // Inferred turns: every request gets one; a turn > 0 continues an earlier
  // request of its conversation at the turn before.
  std::vector<Request> turned = *trace;
  InferTurns(&turned, o.block_tokens);
  for (size_t i = 0; i < turned.size(); ++i) {
    const Request& r = turned[i];
    FUZZ_CHECK(r.turn >= 0);
    if ((*trace)[i].turn >= 0) {
      FUZZ_CHECK(r.turn == (*trace)[i].turn && r.conversation == (*trace)[i].conversation);
      continue;
    }
    bool parent = r.turn == 0 && r.conversation >= 0;
    for (size_t k = 0; k < i && !parent; ++k) {
      parent = turned[k].conversation == r.conversation &&
               (turned[k].turn == r.turn - 1 ||
                (r.turn == std::numeric_limits<int64_t>::max() && turned[k].turn == r.turn)) &&
               turned[k].input_length < r.input_length;
    }
    FUZZ_CHECK(parent) << "request " << i << " has turn " << r.turn << " and no parent";
  }
  return 0;
}
