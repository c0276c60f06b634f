// Stats declared once.
//
// A component lists its stats in one X-macro table, one line each (Envoy's
// ALL_*_STATS style):
//
//   #define HYM_FOO_STATS(COUNTER, GAUGE, DGAUGE)  (one line each,
//     COUNTER(reads, "Reads served")              ending in a
//     GAUGE(open_files, "Files open now")         backslash)
//     DGAUGE(hit_ratio, "Hits over lookups since start")
//   HYM_DECLARE_STATS(FooStats, FooCounters, HYM_FOO_STATS);
//
// which generates
//   * FooStats: the snapshot, a plain struct with one field per line
//     (uint64_t for COUNTER and GAUGE, double for DGAUGE) and
//     Visit(StatsVisitor*) that reports every field under its name;
//   * FooCounters: the live counters, one std::atomic<uint64_t> per COUNTER
//     line (gauges are the component's current state: it fills them into the
//     snapshot itself), with Load() returning a snapshot whose counters are
//     set. Increment with Add(counters.reads), a relaxed atomic add.
//
// A visitor turns the same snapshot into the `hymctl stats` map
// (StorageStatsResponse.device_stats) and, at scrape time, into Prometheus
// series (common/metrics_exporter.h): adding a stat is one line.
// HYM_DECLARE_STATS_STRUCT declares only the snapshot (for counters kept
// under a component's own lock).
//
// Names are snake_case, unique within the component, without unit suffixes
// that the exporter adds (a counter's "_total"). Help strings are one line.
//
// LatencyHistogram is a lock-free histogram of durations in exponential
// buckets (10 us .. ~10 s), reported as Prometheus `_seconds` histograms.
//
// Thread safety: FooCounters, LatencyHistogram: safe for concurrent use.
// Snapshots are values. Visitors are used by one thread at a time.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace hymcache {

struct StatLabel {
  std::string name;
  std::string value;
};

// A histogram's contents: bucket upper bounds in seconds (ascending; the
// +Inf bucket is implied by `count`) and cumulative counts per bound.
struct HistogramSnapshot {
  std::vector<double> upper_bounds;
  std::vector<uint64_t> cumulative_counts;
  uint64_t count = 0;
  double sum = 0;  // seconds
};

// Receives a component's stats, one call per value.
class StatsVisitor {
 public:
  virtual ~StatsVisitor() = default;
  // A monotonic count since start.
  virtual void Counter(absl::string_view name, absl::string_view help,
                       double value, absl::Span<const StatLabel> labels) = 0;
  // A current value.
  virtual void Gauge(absl::string_view name, absl::string_view help,
                     double value, absl::Span<const StatLabel> labels) = 0;
  // Durations; `name` ends in "_seconds".
  virtual void Histogram(absl::string_view name, absl::string_view help,
                         const HistogramSnapshot& h,
                         absl::Span<const StatLabel> labels) = 0;

  // Shorthands without labels.
  void Counter(absl::string_view name, absl::string_view help, double value) {
    Counter(name, help, value, {});
  }
  void Gauge(absl::string_view name, absl::string_view help, double value) {
    Gauge(name, help, value, {});
  }
  void Histogram(absl::string_view name, absl::string_view help,
                 const HistogramSnapshot& h) {
    Histogram(name, help, h, {});
  }
};

// Forwards to another visitor with `prefix` before every name.
class PrefixedStatsVisitor final : public StatsVisitor {
 public:
  // `inner` is not owned and must outlive this visitor.
  PrefixedStatsVisitor(StatsVisitor* inner, std::string prefix)
      : inner_(inner), prefix_(std::move(prefix)) {}
  using StatsVisitor::Counter;
  using StatsVisitor::Gauge;
  using StatsVisitor::Histogram;
  void Counter(absl::string_view name, absl::string_view help, double value,
               absl::Span<const StatLabel> labels) override;
  void Gauge(absl::string_view name, absl::string_view help, double value,
             absl::Span<const StatLabel> labels) override;
  void Histogram(absl::string_view name, absl::string_view help,
                 const HistogramSnapshot& h,
                 absl::Span<const StatLabel> labels) override;

 private:
  std::string Name(absl::string_view name) const;
  StatsVisitor* const inner_;
  const std::string prefix_;
};

// Flattens stats into name -> value (the `hymctl stats` map). A labelled
// value is keyed `name{label="value",...}`; a histogram adds `name_count`
// and `name_sum`. A later value of the same key replaces the earlier one.
class FlatStatsVisitor final : public StatsVisitor {
 public:
  using StatsVisitor::Counter;
  using StatsVisitor::Gauge;
  using StatsVisitor::Histogram;
  void Counter(absl::string_view name, absl::string_view help, double value,
               absl::Span<const StatLabel> labels) override;
  void Gauge(absl::string_view name, absl::string_view help, double value,
             absl::Span<const StatLabel> labels) override;
  void Histogram(absl::string_view name, absl::string_view help,
                 const HistogramSnapshot& h,
                 absl::Span<const StatLabel> labels) override;

  const std::vector<std::pair<std::string, double>>& values() const {
    return values_;
  }

 private:
  std::vector<std::pair<std::string, double>> values_;
};

// Relaxed increment of a live counter (no ordering: counters are read
// only for export).
inline void Add(std::atomic<uint64_t>& counter, uint64_t n = 1) {
  counter.fetch_add(n, std::memory_order_relaxed);
}

// Durations in buckets with upper bounds 10 us * 2^i, i = 0..kBuckets-1
// (10 us .. ~10.5 s), plus +Inf. Observe is a few relaxed atomic adds.
class LatencyHistogram {
 public:
  static constexpr int kBuckets = 21;

  void Observe(absl::Duration d);
  HistogramSnapshot Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kBuckets + 1> buckets_{};  // last: +Inf
  std::atomic<uint64_t> sum_ns_{0};
};

}  // namespace hymcache

// ---- X-macro generators (see the file comment) ----

#define HYM_STATS_FIELD_U64_(name, help) uint64_t name = 0;
#define HYM_STATS_FIELD_DOUBLE_(name, help) double name = 0;
#define HYM_STATS_VISIT_COUNTER_(name, help) \
  v->Counter(#name, help, static_cast<double>(name));
#define HYM_STATS_VISIT_GAUGE_(name, help) \
  v->Gauge(#name, help, static_cast<double>(name));
#define HYM_STATS_ATOMIC_(name, help) std::atomic<uint64_t> name{0};
#define HYM_STATS_LOAD_(name, help) \
  s.name = name.load(std::memory_order_relaxed);
#define HYM_STATS_NONE_(name, help)

// The snapshot struct only.
#define HYM_DECLARE_STATS_STRUCT(Snapshot, ALL)                            \
  struct Snapshot {                                                        \
    ALL(HYM_STATS_FIELD_U64_, HYM_STATS_FIELD_U64_,                        \
        HYM_STATS_FIELD_DOUBLE_)                                           \
    /* Reports every field under its name. */                              \
    void Visit(::hymcache::StatsVisitor* v) const {                        \
      ALL(HYM_STATS_VISIT_COUNTER_, HYM_STATS_VISIT_GAUGE_,                \
          HYM_STATS_VISIT_GAUGE_)                                          \
    }                                                                      \
  }

// The snapshot struct and the live counters.
#define HYM_DECLARE_STATS(Snapshot, Live, ALL)                             \
  HYM_DECLARE_STATS_STRUCT(Snapshot, ALL);                                 \
  struct Live {                                                            \
    ALL(HYM_STATS_ATOMIC_, HYM_STATS_NONE_, HYM_STATS_NONE_)               \
    /* The counters now; gauges are left 0 for the owner to fill. */       \
    Snapshot Load() const {                                                \
      Snapshot s;                                                          \
      ALL(HYM_STATS_LOAD_, HYM_STATS_NONE_, HYM_STATS_NONE_)               \
      return s;                                                            \
    }                                                                      \
  }
