#include "tools/hymbench/trace.h"

#include <catch2/catch.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace hymcache::hymbench {
namespace {

Request Req(std::vector<uint64_t> ids) {
  Request r;
  r.input_length = static_cast<int64_t>(ids.size()) * 512;
  r.hash_ids = std::move(ids);
  return r;
}

std::string ErrorOf(const std::string& line, TraceOptions o = {}) {
  auto r = ParseTraceLine(line, 7, o, "t.jsonl");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST_CASE("parses a Mooncake trace line") {
  auto r = ParseTraceLine(
      R"({"timestamp": 27482, "input_length": 6955, "output_length": 52, )"
      R"("hash_ids": [46, 47, 2396, 2397, 2398, 2399, 2400, 2401, 2402, 2403, 2404, 2405, 2406, 2407]})",
      1);
  REQUIRE(r.ok());
  CHECK(r->timestamp_ms == 27482);
  CHECK(r->input_length == 6955);
  CHECK(r->output_length == 52);
  REQUIRE(r->hash_ids.size() == 14);  // ceil(6955 / 512)
  CHECK(r->hash_ids[0] == 46);
  CHECK(r->hash_ids[13] == 2407);
  CHECK(r->conversation == -1);
  CHECK(r->turn == -1);
}

TEST_CASE("optional fields: conversation, turn, output_length; others ignored") {
  auto r = ParseTraceLine(
      R"({"timestamp": 1.5, "input_length": 513, "hash_ids": [1, 2], "conversation": 3, )"
      R"("turn": 4, "model": "x", "extra": {"a": [1]}})",
      1);
  REQUIRE(r.ok());
  CHECK(r->timestamp_ms == 1.5);
  CHECK(r->output_length == 0);
  CHECK(r->conversation == 3);
  CHECK(r->turn == 4);
  // Empty prompt, no blocks.
  auto e = ParseTraceLine(R"({"timestamp": 0, "input_length": 0, "hash_ids": []})", 1);
  REQUIRE(e.ok());
  CHECK(e->hash_ids.empty());
}

TEST_CASE("malformed lines are rejected with source and line number") {
  std::string m = ErrorOf(R"({"timestamp": 0, "input_length": 10, "hash_ids": [1)");
  CHECK(m.rfind("t.jsonl:7: malformed JSON", 0) == 0);
  CHECK(ErrorOf("[1, 2]").find("expected a JSON object, got array") != std::string::npos);
  CHECK(ErrorOf(R"({"input_length": 10, "hash_ids": [1]})").find("missing \"timestamp\"") !=
        std::string::npos);
  CHECK(ErrorOf(R"({"timestamp": 0, "hash_ids": [1]})").find("missing \"input_length\"") !=
        std::string::npos);
  CHECK(ErrorOf(R"({"timestamp": 0, "input_length": 10})").find("missing \"hash_ids\"") !=
        std::string::npos);
  CHECK(ErrorOf(R"({"timestamp": "0", "input_length": 10, "hash_ids": [1]})")
            .find("timestamp must be a non-negative number") != std::string::npos);
  CHECK(ErrorOf(R"({"timestamp": -1, "input_length": 10, "hash_ids": [1]})")
            .find("timestamp") != std::string::npos);
  CHECK(ErrorOf(R"({"timestamp": 0, "input_length": -10, "hash_ids": [1]})")
            .find("input_length must be >= 0") != std::string::npos);
  CHECK(ErrorOf(R"({"timestamp": 0, "input_length": 1.5, "hash_ids": [1]})")
            .find("input_length must be a non-negative integer") != std::string::npos);
  CHECK(ErrorOf(R"({"timestamp": 0, "input_length": 10, "output_length": "x", "hash_ids": [1]})")
            .find("output_length") != std::string::npos);
  CHECK(ErrorOf(R"({"timestamp": 0, "input_length": 10, "hash_ids": 1})")
            .find("hash_ids must be an array") != std::string::npos);
  CHECK(ErrorOf(R"({"timestamp": 0, "input_length": 1000, "hash_ids": [1, "2"]})")
            .find("hash_ids[1] must be a non-negative integer") != std::string::npos);
  CHECK(ErrorOf(R"({"timestamp": 0, "input_length": 1000, "hash_ids": [1, -2]})")
            .find("hash_ids[1]") != std::string::npos);
  CHECK(ErrorOf(R"({"timestamp": 0, "input_length": 1000, "hash_ids": [1.0, 2]})")
            .find("hash_ids[0]") != std::string::npos);
  CHECK(ErrorOf(R"({"timestamp": 0, "input_length": 10, "hash_ids": [1], "turn": -1})")
            .find("turn must be >= 0") != std::string::npos);
}

TEST_CASE("the block count must match ceil(input_length / block_tokens)") {
  const std::string line = R"({"timestamp": 0, "input_length": 1025, "hash_ids": [1, 2]})";
  CHECK(ErrorOf(line).find("hash_ids has 2 entries but input_length 1025 needs "
                           "ceil(1025/512) = 3") != std::string::npos);
  CHECK(ParseTraceLine(R"({"timestamp": 0, "input_length": 1024, "hash_ids": [1, 2]})", 1).ok());
  TraceOptions lax;
  lax.check_block_count = false;
  CHECK(ParseTraceLine(line, 1, lax).ok());
  TraceOptions small;
  small.block_tokens = 256;
  CHECK(ParseTraceLine(R"({"timestamp": 0, "input_length": 513, "hash_ids": [1, 2, 3]})", 1,
                       small)
            .ok());
}

TEST_CASE("ParseTrace skips blank lines, counts lines, honours max_requests") {
  std::istringstream in(
      "{\"timestamp\": 0, \"input_length\": 512, \"hash_ids\": [0]}\n"
      "\n"
      "   \r\n"
      "{\"timestamp\": 5, \"input_length\": 1024, \"hash_ids\": [0, 1]}\r\n"
      "{\"timestamp\": 9, \"input_length\": 10, \"hash_ids\": [2]}\n");
  auto all = ParseTrace(in);
  REQUIRE(all.ok());
  REQUIRE(all->size() == 3);
  CHECK((*all)[1].hash_ids == std::vector<uint64_t>{0, 1});
  CHECK((*all)[2].timestamp_ms == 9);

  std::istringstream bad(
      "{\"timestamp\": 0, \"input_length\": 512, \"hash_ids\": [0]}\n"
      "\n"
      "{\"timestamp\": 0, \"input_length\": 512, \"hash_ids\": [0]\n");
  auto e = ParseTrace(bad, {}, "x.jsonl");
  REQUIRE_FALSE(e.ok());
  CHECK(std::string(e.status().message()).rfind("x.jsonl:3: ", 0) == 0);

  // A malformed line past the limit is never read.
  std::istringstream limited(
      "{\"timestamp\": 0, \"input_length\": 512, \"hash_ids\": [0]}\n"
      "garbage\n");
  TraceOptions o;
  o.max_requests = 1;
  auto one = ParseTrace(limited, o);
  REQUIRE(one.ok());
  CHECK(one->size() == 1);
}

TEST_CASE("LoadTrace reports a missing file") {
  auto r = LoadTrace("/nonexistent/trace.jsonl", 0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(r.status().message()).find("/nonexistent/trace.jsonl") != std::string::npos);
}

TEST_CASE("WriteTrace writes what ParseTrace reads") {
  SyntheticOptions o;
  o.conversations = 3;
  o.turns = 4;
  o.turn_gap_ms = 1000;  // 1000/3: non-integral timestamps too
  auto reqs = GenerateSynthetic(o);
  REQUIRE(reqs.ok());
  std::ostringstream out;
  WriteTrace(*reqs, out);
  const std::string text = out.str();
  CHECK(text.rfind("{\"timestamp\": 0, \"input_length\": 2048, \"output_length\": 256, "
                   "\"hash_ids\": [0, 1, 2, 3], \"conversation\": 0, \"turn\": 0}\n",
                   0) == 0);
  std::istringstream in(text);
  auto back = ParseTrace(in);
  REQUIRE(back.ok());
  REQUIRE(back->size() == reqs->size());
  for (size_t i = 0; i < reqs->size(); ++i) {
    CHECK((*back)[i].timestamp_ms == (*reqs)[i].timestamp_ms);
    CHECK((*back)[i].input_length == (*reqs)[i].input_length);
    CHECK((*back)[i].output_length == (*reqs)[i].output_length);
    CHECK((*back)[i].hash_ids == (*reqs)[i].hash_ids);
    CHECK((*back)[i].conversation == (*reqs)[i].conversation);
    CHECK((*back)[i].turn == (*reqs)[i].turn);
  }
  // Without conversation / turn the line is plain Mooncake.
  std::ostringstream plain;
  WriteTrace({Req({5, 6})}, plain);
  CHECK(plain.str() ==
        "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 0, \"hash_ids\": [5, 6]}\n");
}

TEST_CASE("synthetic workload: order, lengths, block counts") {
  SyntheticOptions o;
  o.conversations = 3;
  o.turns = 4;
  o.system_prompt_tokens = 700;
  o.user_tokens = 300;
  o.output_tokens = 100;
  o.turn_gap_ms = 900;
  auto reqs = GenerateSynthetic(o);
  REQUIRE(reqs.ok());
  REQUIRE(reqs->size() == 12);
  for (size_t i = 0; i < reqs->size(); ++i) {
    const Request& r = (*reqs)[i];
    // Round-robin by turn.
    CHECK(r.turn == static_cast<int64_t>(i / 3));
    CHECK(r.conversation == static_cast<int64_t>(i % 3));
    CHECK(r.timestamp_ms == r.turn * 900 + r.conversation * 300);
    // Each turn: previous input + previous output + new user tokens.
    CHECK(r.input_length == 700 + (r.turn + 1) * 300 + r.turn * 100);
    CHECK(r.output_length == 100);
    CHECK(static_cast<int64_t>(r.hash_ids.size()) == (r.input_length + 511) / 512);
  }
}

TEST_CASE("synthetic workload: turn t+1 reuses turn t's full blocks only") {
  SyntheticOptions o;
  o.conversations = 2;
  o.turns = 6;
  o.system_prompt_tokens = 100;
  o.user_tokens = 400;
  o.output_tokens = 50;
  auto reqs = GenerateSynthetic(o);
  REQUIRE(reqs.ok());
  for (size_t i = 2; i < reqs->size(); ++i) {
    const Request& prev = (*reqs)[i - 2];  // same conversation, previous turn
    const Request& cur = (*reqs)[i];
    REQUIRE(prev.conversation == cur.conversation);
    const size_t full = static_cast<size_t>(prev.input_length / 512);
    for (size_t b = 0; b < full; ++b) CHECK(cur.hash_ids[b] == prev.hash_ids[b]);
    if (prev.input_length % 512 != 0) {
      // The partial last block grew: a new id, never seen before.
      const uint64_t grown = cur.hash_ids[full];
      CHECK(grown != prev.hash_ids[full]);
      for (size_t j = 0; j < i; ++j) {
        for (uint64_t id : (*reqs)[j].hash_ids) CHECK(id != grown);
      }
    }
  }
  // Ids are numbered from 0 in order of first appearance.
  uint64_t next = 0;
  for (const Request& r : *reqs) {
    for (uint64_t id : r.hash_ids) {
      CHECK(id <= next);
      if (id == next) ++next;
    }
  }
}

TEST_CASE("synthetic workload: system prompt blocks shared or not") {
  SyntheticOptions o;
  o.conversations = 3;
  o.turns = 1;
  o.system_prompt_tokens = 1100;  // 2 full blocks + 76 tokens
  o.user_tokens = 100;
  auto shared = GenerateSynthetic(o);
  REQUIRE(shared.ok());
  for (const Request& r : *shared) {
    REQUIRE(r.hash_ids.size() == 3);
    CHECK(r.hash_ids[0] == 0);
    CHECK(r.hash_ids[1] == 1);  // the prompt's full blocks are shared
  }
  CHECK((*shared)[0].hash_ids[2] != (*shared)[1].hash_ids[2]);  // mixed block: own
  CHECK(ComputeCeiling(*shared).hits == 4);

  o.shared_system_prompt = false;
  auto own = GenerateSynthetic(o);
  REQUIRE(own.ok());
  CHECK((*own)[0].hash_ids[0] != (*own)[1].hash_ids[0]);
  CHECK(ComputeCeiling(*own).hits == 0);
}

TEST_CASE("synthetic options are validated") {
  auto bad = [](auto mutate) {
    SyntheticOptions o;
    mutate(o);
    return !GenerateSynthetic(o).ok() && !o.Validate().ok();
  };
  CHECK(bad([](SyntheticOptions& o) { o.conversations = 0; }));
  CHECK(bad([](SyntheticOptions& o) { o.turns = 0; }));
  CHECK(bad([](SyntheticOptions& o) { o.user_tokens = -1; }));
  CHECK(bad([](SyntheticOptions& o) { o.output_tokens = -1; }));
  CHECK(bad([](SyntheticOptions& o) { o.system_prompt_tokens = -1; }));
  CHECK(bad([](SyntheticOptions& o) {
    o.system_prompt_tokens = 0;
    o.user_tokens = 0;
  }));
  CHECK(bad([](SyntheticOptions& o) { o.turn_gap_ms = -1; }));
  CHECK(bad([](SyntheticOptions& o) { o.block_tokens = 0; }));
  CHECK(SyntheticOptions().Validate().ok());
}

TEST_CASE("ceiling on hand-made traces") {
  std::vector<Request> t = {Req({1, 2, 3}), Req({1, 2, 4}), Req({5, 1, 2}),
                            Req({1, 2, 3, 4}), Req({7, 7}), Req({7, 8})};
  CHECK(CeilingHits(t) == std::vector<size_t>{0, 2, 0, 4, 0, 1});
  CeilingSummary c = ComputeCeiling(t);
  CHECK(c.requests == 6);
  CHECK(c.blocks == 17);
  CHECK(c.hits == 7);
  CHECK(c.hit_ratio() == Approx(7.0 / 17));
  CHECK(ComputeCeiling({}).hit_ratio() == 0);
  CHECK(CeilingHits({Req({})}) == std::vector<size_t>{0});
}

TEST_CASE("ceiling of the synthetic workload: every earlier full block") {
  SyntheticOptions o;
  o.conversations = 4;
  o.turns = 5;
  o.system_prompt_tokens = 1024;
  o.user_tokens = 700;
  o.output_tokens = 300;
  auto reqs = GenerateSynthetic(o);
  REQUIRE(reqs.ok());
  std::vector<size_t> hits = CeilingHits(*reqs);
  for (size_t i = 0; i < reqs->size(); ++i) {
    const Request& r = (*reqs)[i];
    size_t want;
    if (r.turn == 0) {
      want = r.conversation == 0 ? 0 : 2;  // the shared 1024-token prompt
    } else {
      want = static_cast<size_t>((r.input_length - 1000) / 512);  // previous input's full blocks
    }
    CHECK(hits[i] == want);
  }
}

// A request of `tokens` tokens (512 per block) with these hash_ids.
Request Chain(std::vector<uint64_t> ids, int64_t tokens) {
  Request r;
  r.input_length = tokens;
  r.hash_ids = std::move(ids);
  return r;
}

std::vector<std::pair<int64_t, int64_t>> Turns(const std::vector<Request>& reqs) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Request& r : reqs) out.push_back({r.conversation, r.turn});
  return out;
}

TEST_CASE("turn inference on hand-made chains") {
  using P = std::vector<std::pair<int64_t, int64_t>>;
  SECTION("a next turn extends the full blocks; the partial last block may change") {
    std::vector<Request> reqs = {
        Chain({1, 2, 3}, 1300),          // 2 full blocks + a partial (3)
        Chain({1, 2, 4, 5}, 1800),       // keeps 1 2, its partial 3 grew into 4
        Chain({1, 2, 4, 5, 6, 7}, 3000),  // extends all of the previous one
    };
    InferTurns(&reqs);
    CHECK(Turns(reqs) == P{{0, 0}, {0, 1}, {0, 2}});
  }
  SECTION("sharing only a system prompt is a new conversation") {
    std::vector<Request> reqs = {
        Chain({1, 2, 3, 4}, 2048),  // system prompt 1 2, user 3 4 (all full)
        Chain({1, 2, 5, 6}, 2048),  // same system prompt, other user text
        Chain({1, 2, 3, 4, 7}, 2300),
        Chain({1, 2, 5, 6, 8}, 2300),
    };
    InferTurns(&reqs);
    CHECK(Turns(reqs) == P{{0, 0}, {1, 0}, {0, 1}, {1, 1}});
  }
  SECTION(
      "a request whose only full blocks are another conversation's prompt is "
      "no parent") {
    std::vector<Request> reqs = {
        // System prompt 1 2, user text 3 4.
        Chain({1, 2, 3, 4}, 2048),
        // The prompt, with its own text in a partial block.
        Chain({1, 2, 5}, 1100),
        // A third conversation, not the second one's next turn.
        Chain({1, 2, 6, 7}, 2048),
        Chain({1, 2, 3, 4, 8}, 2300),
    };
    InferTurns(&reqs);
    CHECK(Turns(reqs) == P{{0, 0}, {1, 0}, {2, 0}, {0, 1}});
  }
  SECTION("a missing full block breaks the chain") {
    std::vector<Request> reqs = {Chain({1, 2, 3}, 1536), Chain({1, 2, 9, 10}, 2048)};
    InferTurns(&reqs);
    CHECK(Turns(reqs) == P{{0, 0}, {1, 0}});
  }
  SECTION("the longest chain wins, then the latest request") {
    std::vector<Request> reqs = {
        Chain({1, 2}, 1024),           // conversation 0
        Chain({1, 2, 3, 4}, 2048),     // its turn 1
        Chain({1, 2, 5}, 1536),        // turn 1 of conversation 0 (branch)
        Chain({1, 2, 3, 4, 6}, 2600),  // extends request 1 (4 blocks) over 0 (2)
        Chain({1, 2, 5, 7}, 2048),     // extends request 2
    };
    InferTurns(&reqs);
    CHECK(Turns(reqs) == P{{0, 0}, {0, 1}, {0, 1}, {0, 2}, {0, 2}});
    // Two requests with the same chain: the latest is the parent.
    std::vector<Request> tie = {Chain({1, 2}, 1024), Chain({3, 4}, 1024),
                                Chain({1, 2, 5}, 1100), Chain({1, 2, 5}, 1200),
                                Chain({1, 2, 5, 6}, 2048)};
    InferTurns(&tie);
    // 2 continues 0; 3 continues 2 (same chain, longer prompt); 4: parents
    // 0 (2 full blocks) vs 2 and 3 (2 full blocks each): the latest, 3.
    CHECK(Turns(tie) == P{{0, 0}, {1, 0}, {0, 1}, {0, 2}, {0, 3}});
  }
  SECTION("a repeat of the same prompt is not a next turn; tiny first turns have no chain") {
    std::vector<Request> reqs = {Chain({1, 2}, 1024), Chain({1, 2}, 1024),
                                 Chain({7}, 100), Chain({8, 9}, 700)};
    InferTurns(&reqs);
    CHECK(Turns(reqs) == P{{0, 0}, {1, 0}, {2, 0}, {3, 0}});
  }
  SECTION("known turns are kept and numbering continues after them") {
    std::vector<Request> reqs = {Chain({1, 2}, 1024), Chain({1, 2, 3}, 1500),
                                 Chain({5, 6}, 1024)};
    reqs[0].conversation = 4;
    reqs[0].turn = 2;
    InferTurns(&reqs);
    CHECK(Turns(reqs) == P{{4, 2}, {4, 3}, {5, 0}});
  }
  SECTION("empty requests start conversations of their own") {
    std::vector<Request> reqs = {Chain({}, 0), Chain({1}, 512), Chain({1, 2}, 1024)};
    InferTurns(&reqs);
    CHECK(Turns(reqs) == P{{0, 0}, {1, 0}, {1, 1}});
  }
}

TEST_CASE("turn inference recovers the synthetic workload's turns") {
  for (bool shared : {true, false}) {
    // (Each first turn holds at least one full block of its own.)
    for (int64_t system : {0, 1024, 4000}) {
      SyntheticOptions o;
      o.conversations = 5;
      o.turns = 6;
      o.shared_system_prompt = shared;
      o.system_prompt_tokens = system;
      o.user_tokens = 600;
      o.output_tokens = 150;
      auto want = GenerateSynthetic(o);
      REQUIRE(want.ok());
      std::vector<Request> got = *want;
      for (Request& r : got) r.conversation = r.turn = -1;
      InferTurns(&got);
      INFO("shared " << shared << " system " << system);
      CHECK(Turns(got) == Turns(*want));
    }
  }
}

}  // namespace
}  // namespace hymcache::hymbench
