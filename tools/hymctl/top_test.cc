#include "tools/hymctl/top.h"

#include <catch2/catch.hpp>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace hymcache::hymctl {
namespace {

NodeSample Hybrid(uint32_t id, double staging_hits, double buffer_hits,
                  double misses, double flushed) {
  NodeSample n;
  n.node_id = id;
  n.name = "hybrid-node-with-a-long-name";
  n.state = "alive";
  n.reachable = true;
  n.device = {{"staging_hits", staging_hits},
              {"buffer_hits", buffer_hits},
              {"staging_misses", misses},
              {"flushed_bytes", flushed},
              {"staged_bytes", 64},
              {"staging_capacity_bytes", 256},
              {"buffered_bytes", 0},
              {"write_buffer_capacity_bytes", 128},
              {"flush_lag_seconds", 0.5}};
  return n;
}

TEST_CASE("top's rates are deltas over the interval") {
  TopSample a, b;
  a.at = absl::FromUnixSeconds(100);
  b.at = a.at + absl::Seconds(2);
  a.evicted_objects = 10;
  b.evicted_objects = 30;
  NodeSample d;
  d.node_id = 1;
  d.name = "dram";
  d.state = "alive";
  d.reachable = true;
  d.read_ops = 100;
  d.bytes_read = 1000;
  NodeSample d2 = d;
  d2.read_ops = 300;
  d2.bytes_read = 5000;
  d2.write_ops = 8;  // from 0
  a.nodes = {d, Hybrid(2, 10, 0, 10, 1000)};
  b.nodes = {d2, Hybrid(2, 40, 20, 30, 5000)};
  NodeSample fresh = d;
  fresh.node_id = 3;
  b.nodes.push_back(fresh);
  NodeSample down;
  down.node_id = 4;
  down.state = "DEAD";
  down.error = "not alive";
  b.nodes.push_back(down);

  const TopView v = ComputeTop(a, b);
  CHECK(v.interval_seconds == 2);
  CHECK(v.evictions_per_s == 10);
  REQUIRE(v.rows.size() == 4);
  const TopRow& r = v.rows[0];
  CHECK(*r.reads_per_s == 100);
  CHECK(*r.read_bytes_per_s == 2000);
  CHECK(*r.writes_per_s == 4);
  CHECK_FALSE(r.hit_ratio);  // DRAM: no tiers
  CHECK_FALSE(r.staging_occupancy);
  const TopRow& h = v.rows[1];
  // 30 + 20 served from DRAM, 20 through the tier.
  CHECK(*h.hit_ratio == Approx(50.0 / 70.0));
  CHECK(*h.staging_occupancy == 0.25);
  CHECK(*h.write_buffer_occupancy == 0);
  CHECK(*h.flush_bytes_per_s == 2000);
  CHECK(*h.flush_lag_seconds == 0.5);
  CHECK_FALSE(v.rows[2].reads_per_s);  // no earlier sample
  CHECK(v.rows[3].error == "not alive");

  // A counter that went down (the node restarted) counts from zero.
  std::swap(a.nodes, b.nodes);
  a.nodes.resize(2);
  b.nodes.resize(2);
  const TopView back = ComputeTop(a, b);
  CHECK(*back.rows[0].reads_per_s == 50);

  // JSON: one line, nulls where a value does not apply.
  const std::string line = TopJson(v);
  CHECK(line.find('\n') == std::string::npos);
  auto j = nlohmann::json::parse(line);
  CHECK(j["nodes"][0]["hit_ratio"].is_null());
  CHECK(j["nodes"][1]["flush_bytes_per_s"] == 2000.0);
  CHECK(j["nodes"][3]["error"] == "not alive");

  // The table fits 80 columns.
  std::ostringstream os;
  PrintTop(os, v);
  std::istringstream lines(os.str());
  std::string l;
  int n = 0;
  while (std::getline(lines, l)) {
    INFO(l);
    CHECK(l.size() <= 80);
    ++n;
  }
  CHECK(n >= 7);
  CHECK(os.str().find("hybrid-no~") != std::string::npos);
  CHECK(os.str().find("DEAD         not alive") != std::string::npos);
}

TEST_CASE("ShortNumber fits 5 characters") {
  CHECK(ShortNumber(0) == "0");
  CHECK(ShortNumber(999) == "999");
  CHECK(ShortNumber(999.6) == "1.0k");
  CHECK(ShortNumber(1234) == "1.2k");
  CHECK(ShortNumber(12345) == "12k");
  CHECK(ShortNumber(123456789) == "123M");
  CHECK(ShortNumber(1e20) == "100000P");  // beyond P: longer, never wrong
  for (double v = 1; v < 1e18; v *= 3.7) {
    INFO(v);
    CHECK(ShortNumber(v).size() <= 5);
  }
}

}  // namespace
}  // namespace hymcache::hymctl
