#include "tools/hymbench/trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace hymcache::hymbench {
namespace {

using nlohmann::json;

absl::Status LineError(const std::string& source, size_t line_number,
                       absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ":", line_number, ": ", message));
}

// Reads a non-negative integer that fits int64. `what` names it in errors.
absl::Status NonNegativeInt(const json& v, absl::string_view what,
                            int64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is too large"));
    }
    *out = static_cast<int64_t>(u);
    return absl::OkStatus();
  }
  if (v.is_number_integer()) {  // signed: only negative values land here
    int64_t s = v.get<int64_t>();
    if (s < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " must be >= 0, got ", s));
    }
    *out = s;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be a non-negative integer, got ", v.dump()));
}

// Trace time as written: an integer when it is one.
std::string FormatTimestamp(double ms) {
  if (std::floor(ms) == ms && std::fabs(ms) < 9e15) {
    return absl::StrCat(static_cast<int64_t>(ms));
  }
  return absl::StrFormat("%.17g", ms);
}

}  // namespace

absl::StatusOr<Request> ParseTraceLine(const std::string& line,
                                       size_t line_number,
                                       const TraceOptions& options,
                                       const std::string& source) {
  // nlohmann reports the byte offset and what it expected; keep its text.
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {
    return LineError(source, line_number, absl::StrCat("malformed JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return LineError(source, line_number,
                     absl::StrCat("expected a JSON object, got ", j.type_name()));
  }
  Request r;
  auto wrap = [&](const absl::Status& s) {
    return LineError(source, line_number, s.message());
  };

  auto ts = j.find("timestamp");
  if (ts == j.end()) return LineError(source, line_number, "missing \"timestamp\"");
  if (!ts->is_number() || !std::isfinite(ts->get<double>()) ||
      ts->get<double>() < 0) {
    return LineError(source, line_number,
                     absl::StrCat("timestamp must be a non-negative number (ms), got ",
                                  ts->dump()));
  }
  r.timestamp_ms = ts->get<double>();

  auto in = j.find("input_length");
  if (in == j.end()) return LineError(source, line_number, "missing \"input_length\"");
  if (auto s = NonNegativeInt(*in, "input_length", &r.input_length); !s.ok()) {
    return wrap(s);
  }
  // output_length is informative only; tolerate its absence.
  if (auto out = j.find("output_length"); out != j.end()) {
    if (auto s = NonNegativeInt(*out, "output_length", &r.output_length); !s.ok()) {
      return wrap(s);
    }
  }

  auto ids = j.find("hash_ids");
  if (ids == j.end()) return LineError(source, line_number, "missing \"hash_ids\"");
  if (!ids->is_array()) {
    return LineError(source, line_number,
                     absl::StrCat("hash_ids must be an array, got ", ids->type_name()));
  }
  r.hash_ids.reserve(ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    const json& id = (*ids)[i];
    if (!id.is_number_integer() || (!id.is_number_unsigned() && id.get<int64_t>() < 0)) {
      return LineError(source, line_number,
                       absl::StrCat("hash_ids[", i,
                                    "] must be a non-negative integer, got ", id.dump()));
    }
    r.hash_ids.push_back(id.is_number_unsigned()
                             ? id.get<uint64_t>()
                             : static_cast<uint64_t>(id.get<int64_t>()));
  }
  if (options.check_block_count && options.block_tokens > 0) {
    int64_t want = (r.input_length + options.block_tokens - 1) / options.block_tokens;
    if (static_cast<int64_t>(r.hash_ids.size()) != want) {
      return LineError(
          source, line_number,
          absl::StrCat("hash_ids has ", r.hash_ids.size(), " entries but input_length ",
                       r.input_length, " needs ceil(", r.input_length, "/",
                       options.block_tokens, ") = ", want));
    }
  }

  if (auto c = j.find("conversation"); c != j.end()) {
    if (auto s = NonNegativeInt(*c, "conversation", &r.conversation); !s.ok()) {
      return wrap(s);
    }
  }
  if (auto t = j.find("turn"); t != j.end()) {
    if (auto s = NonNegativeInt(*t, "turn", &r.turn); !s.ok()) return wrap(s);
  }
  return r;
}

absl::StatusOr<std::vector<Request>> ParseTrace(std::istream& in,
                                                const TraceOptions& options,
                                                const std::string& source) {
  std::vector<Request> out;
  std::string line;
  size_t line_number = 0;
  while ((options.max_requests == 0 || out.size() < options.max_requests) &&
         std::getline(in, line)) {
    ++line_number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    auto r = ParseTraceLine(line, line_number, options, source);
    if (!r.ok()) return r.status();
    out.push_back(std::move(*r));
  }
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat(source, ": read error after line ", line_number));
  }
  return out;
}

absl::StatusOr<std::vector<Request>> LoadTrace(const std::string& path,
                                               const TraceOptions& options) {
  std::ifstream in(path);
  if (!in.is_open()) {
    return absl::NotFoundError(
        absl::StrCat("cannot open trace '", path, "': ", std::strerror(errno)));
  }
  return ParseTrace(in, options, path);
}

absl::StatusOr<std::vector<Request>> LoadTrace(const std::string& path,
                                               size_t max_requests) {
  TraceOptions options;
  options.max_requests = max_requests;
  return LoadTrace(path, options);
}

void WriteTrace(absl::Span<const Request> requests, std::ostream& out) {
  std::string line;
  for (const Request& r : requests) {
    // The spacing of Python's json.dumps, as in the Mooncake traces.
    line = absl::StrCat("{\"timestamp\": ", FormatTimestamp(r.timestamp_ms),
                        ", \"input_length\": ", r.input_length,
                        ", \"output_length\": ", r.output_length, ", \"hash_ids\": [");
    for (size_t i = 0; i < r.hash_ids.size(); ++i) {
      absl::StrAppend(&line, i == 0 ? "" : ", ", r.hash_ids[i]);
    }
    line += "]";
    if (r.conversation >= 0) absl::StrAppend(&line, ", \"conversation\": ", r.conversation);
    if (r.turn >= 0) absl::StrAppend(&line, ", \"turn\": ", r.turn);
    line += "}\n";
    out << line;
  }
}

absl::Status SyntheticOptions::Validate() const {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("SyntheticOptions.", what));
  };
  if (conversations < 1) return bad("conversations must be >= 1");
  if (turns < 1) return bad("turns must be >= 1");
  if (system_prompt_tokens < 0) return bad("system_prompt_tokens must be >= 0");
  if (user_tokens < 0) return bad("user_tokens must be >= 0");
  if (output_tokens < 0) return bad("output_tokens must be >= 0");
  if (system_prompt_tokens + user_tokens == 0) {
    return bad("system_prompt_tokens + user_tokens must be > 0 (turn 0 would be empty)");
  }
  if (!(turn_gap_ms >= 0) || !std::isfinite(turn_gap_ms)) {
    return bad("turn_gap_ms must be >= 0");
  }
  if (block_tokens < 1) return bad("block_tokens must be >= 1");
  // Keep every length comfortably inside int64 and the output finite.
  const double last_input = static_cast<double>(system_prompt_tokens) +
                            static_cast<double>(turns) * user_tokens +
                            static_cast<double>(turns) * output_tokens;
  if (last_input > 1e12) return bad("conversations grow beyond 10^12 tokens");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Request>> GenerateSynthetic(const SyntheticOptions& o) {
  if (auto s = o.Validate(); !s.ok()) return s;
  const int64_t B = o.block_tokens;
  const int64_t S = o.system_prompt_tokens;
  // A block's tokens are fixed by who owns them (the shared system prompt,
  // -1, or conversation c: a conversation only ever appends), its index and
  // how many tokens it holds; with the parent id, which stands for every
  // token before it, that names the block: (parent, owner, index, fill).
  using BlockIdentity = std::tuple<int64_t, int64_t, int64_t, int64_t>;
  absl::flat_hash_map<BlockIdentity, uint64_t> ids;
  uint64_t next_id = 0;

  std::vector<Request> out;
  out.reserve(static_cast<size_t>(o.conversations) * o.turns);
  for (int t = 0; t < o.turns; ++t) {
    for (int c = 0; c < o.conversations; ++c) {
      Request r;
      r.conversation = c;
      r.turn = t;
      r.timestamp_ms = t * o.turn_gap_ms + c * o.turn_gap_ms / o.conversations;
      r.input_length = S + (t + 1) * o.user_tokens + t * o.output_tokens;
      r.output_length = o.output_tokens;
      const int64_t blocks = (r.input_length + B - 1) / B;
      r.hash_ids.reserve(blocks);
      int64_t parent = -1;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t fill = std::min(B, r.input_length - b * B);
        const bool shared = o.shared_system_prompt && b * B + fill <= S;
        const int64_t owner = shared ? -1 : c;
        auto [it, inserted] = ids.try_emplace(BlockIdentity{parent, owner, b, fill}, next_id);
        if (inserted) ++next_id;
        r.hash_ids.push_back(it->second);
        parent = static_cast<int64_t>(it->second);
      }
      out.push_back(std::move(r));
    }
  }
  return out;
}

void InferTurns(std::vector<Request>* requests, int64_t block_tokens) {
  std::vector<Request>& reqs = *requests;
  // Saturating: a trace may carry ids up to INT64_MAX.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  auto next = [](int64_t v) { return v < kMax ? v + 1 : kMax; };
  int64_t next_conversation = 0;
  for (const Request& r : reqs) {
    next_conversation = std::max(next_conversation, next(r.conversation));
  }
  // Earlier requests by (full(p), id of p's last full block), in trace
  // order: r can continue p only if r's block at index full(p) - 1 has that
  // id. `first_open` skips the leading candidates already continued.
  struct Candidates {
    std::vector<size_t> requests;
    size_t first_open = 0;
  };
  absl::flat_hash_map<std::pair<size_t, uint64_t>, Candidates> by_tail;
  // Each block id's first conversation: an inferred request is a candidate
  // parent only if its last full block first came in its own conversation.
  absl::flat_hash_map<uint64_t, int64_t> first_conversation;
  std::vector<bool> continued(reqs.size(), false);
  auto full_blocks = [&](const Request& p) {
    const int64_t full = std::max<int64_t>(p.input_length, 0) / block_tokens;
    return std::min<size_t>(p.hash_ids.size(), static_cast<size_t>(full));
  };
  auto continues = [&](size_t p_index, const Request& r, size_t full) {
    const Request& p = reqs[p_index];
    return p.input_length < r.input_length &&
           std::equal(p.hash_ids.begin(), p.hash_ids.begin() + full, r.hash_ids.begin());
  };
  for (size_t i = 0; i < reqs.size(); ++i) {
    Request& r = reqs[i];
    const bool inferred = r.turn < 0;
    if (inferred) {
      // The longest chain first: scanning j down from the end, the first
      // index with a valid candidate has the largest full(p).
      std::optional<size_t> parent;
      for (size_t j = r.hash_ids.size(); j-- > 0 && !parent.has_value();) {
        auto it = by_tail.find({j + 1, r.hash_ids[j]});
        if (it == by_tail.end()) continue;
        Candidates& c = it->second;
        while (c.first_open < c.requests.size() && continued[c.requests[c.first_open]]) {
          ++c.first_open;
        }
        for (size_t k = c.first_open; k < c.requests.size(); ++k) {
          if (!continued[c.requests[k]] && continues(c.requests[k], r, j + 1)) {
            parent = c.requests[k];
            break;
          }
        }
        for (size_t k = c.requests.size(); k-- > 0 && !parent.has_value();) {
          if (continues(c.requests[k], r, j + 1)) parent = c.requests[k];
        }
      }
      if (parent.has_value()) {
        continued[*parent] = true;
        r.conversation = reqs[*parent].conversation;
        r.turn = next(reqs[*parent].turn);
      } else {
        r.conversation = next_conversation;
        next_conversation = next(next_conversation);
        r.turn = 0;
      }
    }
    for (uint64_t id : r.hash_ids)
      first_conversation.try_emplace(id, r.conversation);
    if (const size_t full = full_blocks(r);
        full >= 1 && (!inferred || first_conversation[r.hash_ids[full - 1]] ==
                                       r.conversation)) {
      by_tail[{full, r.hash_ids[full - 1]}].requests.push_back(i);
    }
  }
}

std::vector<size_t> CeilingHits(absl::Span<const Request> requests) {
  std::vector<size_t> hits;
  hits.reserve(requests.size());
  absl::flat_hash_set<uint64_t> seen;
  for (const Request& r : requests) {
    size_t n = 0;
    while (n < r.hash_ids.size() && seen.contains(r.hash_ids[n])) ++n;
    hits.push_back(n);
    // Inserted after counting: a request never hits its own blocks.
    seen.insert(r.hash_ids.begin(), r.hash_ids.end());
  }
  return hits;
}

CeilingSummary ComputeCeiling(absl::Span<const Request> requests) {
  CeilingSummary s;
  std::vector<size_t> hits = CeilingHits(requests);
  s.requests = requests.size();
  for (size_t i = 0; i < requests.size(); ++i) {
    s.blocks += requests[i].hash_ids.size();
    s.hits += hits[i];
  }
  return s;
}

}  // namespace hymcache::hymbench
