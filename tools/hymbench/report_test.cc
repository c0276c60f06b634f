#include "tools/hymbench/report.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hymcache::hymbench {
namespace {

RequestRecord Rec(int64_t turn, double ts_ms, size_t blocks, size_t ceiling, size_t loaded,
                  double load_ms) {
  RequestRecord r;
  r.turn = turn;
  r.timestamp_ms = ts_ms;
  r.blocks = blocks;
  r.ceiling_hits = ceiling;
  r.hit_prefix = loaded;
  r.loaded = loaded;
  r.loaded_bytes = loaded * 1000000;
  r.load_called = blocks > 0;
  r.load_ms = load_ms;
  return r;
}

TEST_CASE("nearest-rank percentiles") {
  CHECK(Percentile({}, 50) == 0);
  CHECK(Percentile({5}, 0) == 5);
  CHECK(Percentile({5}, 99) == 5);
  CHECK(Percentile({4, 1, 3, 2}, 50) == 2);
  CHECK(Percentile({4, 1, 3, 2}, 75) == 3);
  CHECK(Percentile({4, 1, 3, 2}, 99) == 4);
  CHECK(Percentile({4, 1, 3, 2}, 100) == 4);
  CHECK(Percentile({4, 1, 3, 2}, 0) == 1);
  std::vector<double> hundred;
  for (int i = 100; i >= 1; --i) hundred.push_back(i);
  CHECK(Percentile(hundred, 50) == 50);
  CHECK(Percentile(hundred, 99) == 99);
  CHECK(Percentile(hundred, 99.5) == 100);
}

TEST_CASE("per-turn aggregation") {
  std::vector<RequestRecord> recs = {
      Rec(0, 0, 4, 0, 0, 1.0),     Rec(0, 10, 4, 2, 2, 2.0),  Rec(1, 20, 6, 4, 3, 4.0),
      Rec(1, 30, 6, 4, 4, 8.0),    Rec(2, 40, 0, 0, 0, 0.0),
  };
  recs[3].stored = 2;
  recs[3].skipped = 1;
  recs[3].refused = 3;
  recs[3].store_failed = 1;
  recs[3].store_dropped = 5;
  recs[1].load_error = "UNAVAILABLE: x";  // not a latency sample, counted
  recs[1].loaded = 0;
  recs[1].hit_prefix = 0;
  recs[1].loaded_bytes = 0;
  recs[2].hit_prefix = 4;  // loaded 3 of 4 reported stored
  recs[2].corrupt_blocks = 1;
  auto rep = BuildReport(recs);
  REQUIRE(rep.ok());
  CHECK(rep->group_by == "turn");
  REQUIRE(rep->groups.size() == 3);
  const GroupStats& t0 = rep->groups[0];
  CHECK(t0.label == "turn 0");
  CHECK(t0.key == 0);
  CHECK(t0.requests == 2);
  CHECK(t0.blocks == 8);
  CHECK(t0.ceiling_hits == 2);
  CHECK(t0.loaded == 0);
  CHECK(t0.load_errors == 1);
  CHECK(t0.p50_load_ms == 1.0);  // the failed call is no sample
  CHECK(t0.ceiling_ratio() == Approx(0.25));

  const GroupStats& t1 = rep->groups[1];
  CHECK(t1.label == "turn 1");
  CHECK(t1.loaded == 7);
  CHECK(t1.hit_ratio() == Approx(7.0 / 12));
  CHECK(t1.ceiling_ratio() == Approx(8.0 / 12));
  CHECK(t1.lookup_hit_ratio() == Approx(8.0 / 12));
  CHECK(t1.loaded_bytes == 7000000);
  CHECK(t1.load_seconds == Approx(0.012));
  CHECK(t1.load_gbps() == Approx(7e6 / 0.012 / 1e9));
  CHECK(t1.p50_load_ms == 4.0);
  CHECK(t1.p99_load_ms == 8.0);
  CHECK(t1.short_loads == 1);
  CHECK(t1.corrupt_blocks == 1);
  CHECK(t1.stored == 2);
  CHECK(t1.skipped == 1);
  CHECK(t1.refused == 3);
  CHECK(t1.store_failed == 1);
  CHECK(t1.store_dropped == 5);

  const GroupStats& t2 = rep->groups[2];
  CHECK(t2.requests == 1);
  CHECK(t2.hit_ratio() == 0);  // no blocks: no division by zero
  CHECK(t2.load_gbps() == 0);

  const GroupStats& all = rep->overall;
  CHECK(all.label == "all");
  CHECK(all.requests == 5);
  CHECK(all.blocks == 20);
  CHECK(all.loaded == 7);
  CHECK(all.ceiling_hits == 10);
  CHECK(all.p50_load_ms == 4.0);  // samples 1, 4, 8
  CHECK(all.p99_load_ms == 8.0);
}

TEST_CASE("per-window aggregation of trace time") {
  std::vector<RequestRecord> recs = {Rec(-1, 1000, 2, 0, 0, 1), Rec(-1, 60999, 2, 1, 1, 1),
                                     Rec(-1, 61000, 2, 2, 2, 1), Rec(-1, 200000, 2, 2, 1, 1)};
  auto rep = BuildReport(recs);  // auto: no turns -> windows
  REQUIRE(rep.ok());
  CHECK(rep->group_by == "window");
  REQUIRE(rep->groups.size() == 3);  // [0,60) [60,120) [180,240) from the first request
  CHECK(rep->groups[0].requests == 2);
  CHECK(rep->groups[0].label == "0-60s");
  CHECK(rep->groups[1].requests == 1);
  CHECK(rep->groups[1].key == 60);
  CHECK(rep->groups[2].key == 180);
  CHECK(rep->groups[2].label == "180-240s");

  ReportOptions o;
  o.group_by = GroupBy::kWindow;
  o.window_s = 100;
  rep = BuildReport(recs, o);
  REQUIRE(rep.ok());
  REQUIRE(rep->groups.size() == 2);
  CHECK(rep->groups[0].requests == 3);

  o.window_s = 0;
  CHECK_FALSE(BuildReport(recs, o).ok());
  o.group_by = GroupBy::kTurn;
  CHECK_FALSE(BuildReport(recs, o).ok());  // no turns

  // Windows also for turned records when asked.
  std::vector<RequestRecord> turned = {Rec(0, 0, 1, 0, 0, 1), Rec(1, 0, 1, 1, 1, 1)};
  o.group_by = GroupBy::kWindow;
  o.window_s = 60;
  rep = BuildReport(turned, o);
  REQUIRE(rep.ok());
  CHECK(rep->groups.size() == 1);
  CHECK(BuildReport({}).ok());
}

TEST_CASE("table, CSV and JSON outputs") {
  std::vector<RequestRecord> recs = {Rec(0, 0, 4, 0, 0, 1.0), Rec(1, 10, 6, 4, 4, 2.0)};
  recs[1].load_stop = "DEADLINE_EXCEEDED: x";
  auto rep = BuildReport(recs);
  REQUIRE(rep.ok());
  rep->wall_seconds = 2;
  rep->config = {{"master", "h:1"}, {"concurrency", "1"}};

  std::ostringstream table;
  WriteTable(*rep, table);
  CHECK(table.str().find("turn 0") != std::string::npos);
  CHECK(table.str().find("all") != std::string::npos);
  CHECK(table.str().find("wall 2.00 s") != std::string::npos);

  std::ostringstream csv;
  WriteCsv(*rep, csv);
  std::istringstream lines(csv.str());
  std::string header, line;
  std::getline(lines, header);
  CHECK(header.rfind("group_by,label,key,requests,blocks,ceiling_hits,hit_prefix,loaded,"
                     "prefix_hit_ratio,ceiling_hit_ratio,",
                     0) == 0);
  int rows = 0;
  std::string last;
  while (std::getline(lines, line)) {
    ++rows;
    last = line;
    CHECK(std::count(line.begin(), line.end(), ',') ==
          std::count(header.begin(), header.end(), ','));
  }
  CHECK(rows == 3);
  CHECK(last.rfind("turn,all,-1,2,10,4,4,4,0.400000,0.400000,", 0) == 0);

  std::ostringstream js;
  WriteJson(*rep, recs, js);
  auto j = nlohmann::json::parse(js.str());
  CHECK(j["config"]["master"] == "h:1");
  CHECK(j["group_by"] == "turn");
  CHECK(j["wall_seconds"] == 2.0);
  REQUIRE(j["groups"].size() == 2);
  CHECK(j["groups"][1]["prefix_hit_ratio"] == Approx(4.0 / 6));
  CHECK(j["overall"]["loaded"] == 4);
  CHECK(j["overall"]["ceiling_hit_ratio"] == Approx(0.4));
  REQUIRE(j["requests"].size() == 2);
  CHECK(j["requests"][1]["turn"] == 1);
  CHECK(j["requests"][1]["load_stop"] == "DEADLINE_EXCEEDED: x");
  CHECK_FALSE(j["requests"][0].contains("load_error"));

  std::ostringstream no_records;
  WriteJson(*rep, {}, no_records);
  CHECK_FALSE(nlohmann::json::parse(no_records.str()).contains("requests"));
}

TEST_CASE("lost blocks by reason in every output") {
  std::vector<RequestRecord> recs = {Rec(0, 0, 4, 0, 0, 1.0), Rec(1, 10, 6, 4, 1, 2.0),
                                     Rec(1, 20, 6, 5, 2, 2.0)};
  recs[1].lost[static_cast<int>(LossReason::kRefusedWriteBuffer)] = 3;
  recs[2].lost[static_cast<int>(LossReason::kRefusedWriteBuffer)] = 1;
  recs[2].lost[static_cast<int>(LossReason::kDeadline)] = 2;
  auto rep = BuildReport(recs);
  REQUIRE(rep.ok());
  const GroupStats& all = rep->overall;
  CHECK(all.lost[static_cast<int>(LossReason::kRefusedWriteBuffer)] == 4);
  CHECK(all.lost[static_cast<int>(LossReason::kDeadline)] == 2);
  CHECK(all.lost[static_cast<int>(LossReason::kNodeError)] == 0);

  std::ostringstream table;
  WriteTable(*rep, table);
  INFO(table.str());
  CHECK(table.str().find("lost blocks by reason") != std::string::npos);
  CHECK(table.str().find("refused_write_buffer") != std::string::npos);
  CHECK(table.str().find("deadline") != std::string::npos);
  CHECK(table.str().find("node_error") == std::string::npos);  // only reasons that occurred

  std::ostringstream js;
  WriteJson(*rep, recs, js);
  auto j = nlohmann::json::parse(js.str());
  CHECK(j["overall"]["lost_blocks"] == 6);
  CHECK(j["overall"]["lost"]["refused_write_buffer"] == 4);
  CHECK(j["overall"]["lost"]["deadline"] == 2);
  CHECK(j["overall"]["lost"]["node_error"] == 0);
  CHECK(j["overall"]["lost"].size() == kLossReasons);
  CHECK(j["groups"][1]["lost"]["deadline"] == 2);
  CHECK_FALSE(j["requests"][0].contains("lost"));
  CHECK(j["requests"][2]["lost"] == nlohmann::json{{"refused_write_buffer", 1}, {"deadline", 2}});

  std::ostringstream csv;
  WriteCsv(*rep, csv);
  CHECK(csv.str().find(",lost_blocks,lost_in_flight,lost_refused_no_room,") != std::string::npos);
  CHECK(csv.str().find(",6,0,0,4,0,0,2,0,0,0\n") != std::string::npos);  // the "all" row

  // Nothing lost: the table says so.
  auto clean = BuildReport({Rec(0, 0, 4, 0, 0, 1.0)});
  REQUIRE(clean.ok());
  std::ostringstream t2;
  WriteTable(*clean, t2);
  CHECK(t2.str().find("lost blocks (ceiling hits not loaded): none") != std::string::npos);
}

}  // namespace
}  // namespace hymcache::hymbench
