#include "common/stats.h"

#include <map>
#include <string>

#include <catch2/catch.hpp>

namespace hymcache {
namespace {

#define TEST_STATS(COUNTER, GAUGE, DGAUGE)      \
  COUNTER(reads, "Reads served")                \
  COUNTER(read_bytes, "Bytes read")             \
  GAUGE(open_files, "Files open now")           \
  DGAUGE(hit_ratio, "Hits over lookups")
HYM_DECLARE_STATS(TestStats, TestCounters, TEST_STATS);

std::map<std::string, double> Flat(const TestStats& s,
                                   const std::string& prefix = "") {
  FlatStatsVisitor flat;
  PrefixedStatsVisitor v(&flat, prefix);
  s.Visit(&v);
  return {flat.values().begin(), flat.values().end()};
}

TEST_CASE("one declaration gives the counters, the snapshot and the names") {
  TestCounters c;
  Add(c.reads);
  Add(c.reads);
  Add(c.read_bytes, 4096);
  TestStats s = c.Load();
  CHECK(s.reads == 2);
  CHECK(s.read_bytes == 4096);
  CHECK(s.open_files == 0);  // a gauge: the owner fills it
  s.open_files = 3;
  s.hit_ratio = 0.5;
  const auto m = Flat(s, "dev_");
  CHECK(m.size() == 4);
  CHECK(m.at("dev_reads") == 2);
  CHECK(m.at("dev_read_bytes") == 4096);
  CHECK(m.at("dev_open_files") == 3);
  CHECK(m.at("dev_hit_ratio") == 0.5);
}

// Records which kind each name was reported as.
class KindVisitor final : public StatsVisitor {
 public:
  using StatsVisitor::Counter;
  using StatsVisitor::Gauge;
  using StatsVisitor::Histogram;
  void Counter(absl::string_view name, absl::string_view help, double,
               absl::Span<const StatLabel>) override {
    kinds[std::string(name)] = "counter";
    CHECK(!help.empty());
  }
  void Gauge(absl::string_view name, absl::string_view help, double,
             absl::Span<const StatLabel>) override {
    kinds[std::string(name)] = "gauge";
    CHECK(!help.empty());
  }
  void Histogram(absl::string_view name, absl::string_view,
                 const HistogramSnapshot&,
                 absl::Span<const StatLabel>) override {
    kinds[std::string(name)] = "histogram";
  }
  std::map<std::string, std::string> kinds;
};

TEST_CASE("counters and gauges are reported as such") {
  KindVisitor v;
  TestStats().Visit(&v);
  CHECK(v.kinds == std::map<std::string, std::string>{
                       {"reads", "counter"},
                       {"read_bytes", "counter"},
                       {"open_files", "gauge"},
                       {"hit_ratio", "gauge"}});
}

TEST_CASE("labelled values and histograms flatten to distinct keys") {
  FlatStatsVisitor flat;
  StatLabel tcp{"plane", "tcp"};
  flat.Counter("bytes", "b", 7, {&tcp, 1});
  LatencyHistogram h;
  h.Observe(absl::Milliseconds(3));
  flat.Histogram("wait_seconds", "w", h.Snapshot());
  std::map<std::string, double> m(flat.values().begin(), flat.values().end());
  CHECK(m.at("bytes{plane=\"tcp\"}") == 7);
  CHECK(m.at("wait_seconds_count") == 1);
  CHECK(m.at("wait_seconds_sum") == Approx(0.003));
}

TEST_CASE("latency histogram buckets are cumulative with upper bounds") {
  LatencyHistogram h;
  h.Observe(absl::ZeroDuration());          // first bucket (<= 10 us)
  h.Observe(absl::Microseconds(10));        // first bucket (on the bound)
  h.Observe(absl::Microseconds(11));        // second (<= 20 us)
  h.Observe(absl::Milliseconds(1));         // <= 1.28 ms: bucket 7
  h.Observe(absl::Seconds(100));            // beyond the last bound: +Inf
  h.Observe(absl::Microseconds(-5));        // clock step back: first bucket
  HistogramSnapshot s = h.Snapshot();
  REQUIRE(s.upper_bounds.size() == LatencyHistogram::kBuckets);
  REQUIRE(s.cumulative_counts.size() == LatencyHistogram::kBuckets);
  CHECK(s.upper_bounds[0] == Approx(10e-6));
  CHECK(s.upper_bounds[1] == Approx(20e-6));
  CHECK(s.upper_bounds[7] == Approx(1.28e-3));
  CHECK(s.cumulative_counts[0] == 3);
  CHECK(s.cumulative_counts[1] == 4);
  CHECK(s.cumulative_counts[6] == 4);   // 640 us: the 1 ms one is not in yet
  CHECK(s.cumulative_counts[7] == 5);
  CHECK(s.cumulative_counts.back() == 5);
  CHECK(s.count == 6);
  CHECK(s.sum == Approx(100.001021));
}

}  // namespace
}  // namespace hymcache
