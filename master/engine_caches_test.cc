#include "master/engine_caches.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/status_reason.h"

namespace hymcache {
namespace master {
namespace {

using Keys = google::protobuf::RepeatedPtrField<std::string>;

Keys K(std::vector<std::string> v) {
  Keys out;
  for (auto& s : v) *out.Add() = s;
  return out;
}

absl::StatusOr<uint64_t> Store(EngineCaches& c, const std::string& engine,
                               const Keys& keys, absl::Time now,
                               const std::string& tenant = "default") {
  EngineCaches::Report r;
  r.stored = &keys;
  return c.Apply(tenant, engine, r, now);
}

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST_CASE(
    "Each engine's longest prefix is the leading keys its cache holds, "
    "longest first, and a removal or a clear shortens it") {
  EngineCaches c(EngineCachesOptions{});
  REQUIRE(*Store(c, "e1", K({"a", "b", "c"}), kT0) == 3);
  REQUIRE(*Store(c, "e2", K({"a", "b", "x"}), kT0) == 3);
  REQUIRE(*Store(c, "e3", K({"b", "c"}), kT0) == 2);  // no head: no prefix
  auto p = c.LongestPrefixes("default", K({"a", "b", "c", "d"}), kT0);
  REQUIRE(p.size() == 2);
  CHECK(p[0] == std::make_pair(std::string("e1"), 3u));
  CHECK(p[1] == std::make_pair(std::string("e2"), 2u));

  Keys removed = K({"b"});
  EngineCaches::Report r;
  r.removed = &removed;
  REQUIRE(*c.Apply("default", "e1", r, kT0) == 2);
  p = c.LongestPrefixes("default", K({"a", "b", "c"}), kT0);
  REQUIRE(p.size() == 2);
  CHECK(p[0] == std::make_pair(std::string("e2"), 2u));
  CHECK(p[1] == std::make_pair(std::string("e1"), 1u));

  // A clear applies before the same report's stores.
  Keys stored = K({"z"});
  EngineCaches::Report clear;
  clear.cleared = true;
  clear.stored = &stored;
  REQUIRE(*c.Apply("default", "e2", clear, kT0) == 1);
  p = c.LongestPrefixes("default", K({"a", "b"}), kT0);
  REQUIRE(p.size() == 1);
  CHECK(p[0].first == "e1");
  CHECK(c.blocks() == 2 + 1 + 2);
  CHECK(c.LongestPrefixes("default", Keys(), kT0).empty());
}

TEST_CASE(
    "Engines are per tenant: another tenant's engine of the same id "
    "is another engine, and its keys answer only its tenant") {
  EngineCaches c(EngineCachesOptions{});
  REQUIRE(*Store(c, "e", K({"a"}), kT0, "t1") == 1);
  REQUIRE(*Store(c, "e", K({"a", "b"}), kT0, "t2") == 2);
  auto p1 = c.LongestPrefixes("t1", K({"a", "b"}), kT0);
  REQUIRE(p1.size() == 1);
  CHECK(p1[0].second == 1);
  auto p2 = c.LongestPrefixes("t2", K({"a", "b"}), kT0);
  REQUIRE(p2.size() == 1);
  CHECK(p2[0].second == 2);
  CHECK(c.LongestPrefixes("default", K({"a"}), kT0).empty());
}

TEST_CASE(
    "An engine keeps at most max_blocks_per_engine keys: the ones "
    "reported longest ago go first, and a key reported again is new") {
  EngineCachesOptions o;
  o.max_blocks_per_engine = 3;
  EngineCaches c(o);
  REQUIRE(*Store(c, "e", K({"a", "b", "c"}), kT0) == 3);
  REQUIRE(*Store(c, "e", K({"a"}), kT0) == 3);  // a is the newest now
  REQUIRE(*Store(c, "e", K({"d"}), kT0) == 3);  // b goes
  auto p = c.LongestPrefixes("default", K({"a", "b"}), kT0);
  REQUIRE(p.size() == 1);
  CHECK(p[0].second == 1);
  p = c.LongestPrefixes("default", K({"c", "a", "d"}), kT0);
  REQUIRE(p.size() == 1);
  CHECK(p[0].second == 3);
  CHECK(c.blocks() == 3);
}

TEST_CASE(
    "Beyond max_blocks in all, each engine keeps its share: its "
    "oldest keys go at its next report") {
  EngineCachesOptions o;
  o.max_blocks = 8;
  REQUIRE(o.Validate().ok());
  EngineCaches c(o);
  REQUIRE(*Store(c, "a", K({"a0", "a1", "a2", "a3", "a4", "a5"}), kT0) == 6);
  // b's 4 keys make 10 > 8: b keeps its share of 4.
  REQUIRE(*Store(c, "b", K({"b0", "b1", "b2", "b3"}), kT0) == 4);
  CHECK(c.blocks() == 10);
  // a reports again (nothing new): trimmed to its share, oldest first.
  REQUIRE(*Store(c, "a", Keys(), kT0) == 4);
  CHECK(c.blocks() == 8);
  auto p = c.LongestPrefixes("default", K({"a2", "a3", "a4", "a5"}), kT0);
  REQUIRE(p.size() == 1);
  CHECK(p[0].second == 4);
  CHECK(c.LongestPrefixes("default", K({"a0"}), kT0).empty());
  // Within max_blocks the per-engine cap alone applies.
  Keys removed = K({"b0", "b1", "b2", "b3"});
  EngineCaches::Report r;
  r.removed = &removed;
  REQUIRE(*c.Apply("default", "b", r, kT0) == 0);
  REQUIRE(*Store(c, "a", K({"a6", "a7", "a8"}), kT0) == 7);
}

TEST_CASE(
    "An engine not reported for the TTL is forgotten, and a new "
    "engine beyond max_engines is refused until one is") {
  EngineCachesOptions o;
  o.max_engines = 2;
  o.ttl = absl::Seconds(10);
  REQUIRE(o.Validate().ok());
  EngineCaches c(o);
  REQUIRE(Store(c, "e1", K({"a"}), kT0).ok());
  REQUIRE(Store(c, "e2", K({"a"}), kT0 + absl::Seconds(5)).ok());
  auto full = Store(c, "e3", K({"a"}), kT0 + absl::Seconds(9));
  REQUIRE(full.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(ReasonOf(full.status()) == StatusReason::kEnginesFull);
  // e1 expires at +10 s: it no longer answers, and e3 takes its place.
  CHECK(c.engines(kT0 + absl::Seconds(10)) == 1);
  auto p = c.LongestPrefixes("default", K({"a"}), kT0 + absl::Seconds(10));
  REQUIRE(p.size() == 1);
  CHECK(p[0].first == "e2");
  REQUIRE(*Store(c, "e3", K({"a"}), kT0 + absl::Seconds(10)) == 1);
  CHECK(c.blocks() == 2);
  // A report keeps an engine known.
  REQUIRE(Store(c, "e2", K({"b"}), kT0 + absl::Seconds(14)).ok());
  CHECK(c.engines(kT0 + absl::Seconds(19)) == 2);
}

TEST_CASE(
    "Bad engine ids and options are refused, and with max_engines 0 "
    "every report is refused with engine_reports_off") {
  EngineCaches c(EngineCachesOptions{});
  CHECK(Store(c, "", K({"a"}), kT0).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Store(c, std::string(kMaxEngineIdBytes + 1, 'e'), K({"a"}), kT0)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK(Store(c, std::string(kMaxEngineIdBytes, 'e'), K({"a"}), kT0).ok());

  EngineCachesOptions off;
  off.max_engines = 0;
  REQUIRE(off.Validate().ok());
  EngineCaches none(off);
  auto s = Store(none, "e", K({"a"}), kT0);
  CHECK(s.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(ReasonOf(s.status()) == StatusReason::kEngineReportsOff);

  EngineCachesOptions bad;
  bad.max_blocks_per_engine = 0;
  CHECK(!bad.Validate().ok());
  bad = EngineCachesOptions{};
  bad.ttl = absl::Milliseconds(10);
  CHECK(!bad.Validate().ok());
  bad = EngineCachesOptions{};
  bad.max_engines = 65537;
  CHECK(!bad.Validate().ok());
  bad = EngineCachesOptions{};
  bad.max_blocks = 0;
  CHECK(!bad.Validate().ok());
}

}  // namespace
}  // namespace master
}  // namespace hymcache
