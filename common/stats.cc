#include "common/stats.h"

#include "absl/strings/str_cat.h"

namespace hymcache {

std::string PrefixedStatsVisitor::Name(absl::string_view name) const {
  return absl::StrCat(prefix_, name);
}

void PrefixedStatsVisitor::Counter(absl::string_view name,
                                   absl::string_view help, double value,
                                   absl::Span<const StatLabel> labels) {
  inner_->Counter(Name(name), help, value, labels);
}

void PrefixedStatsVisitor::Gauge(absl::string_view name,
                                 absl::string_view help, double value,
                                 absl::Span<const StatLabel> labels) {
  inner_->Gauge(Name(name), help, value, labels);
}

void PrefixedStatsVisitor::Histogram(absl::string_view name,
                                     absl::string_view help,
                                     const HistogramSnapshot& h,
                                     absl::Span<const StatLabel> labels) {
  inner_->Histogram(Name(name), help, h, labels);
}

namespace {

std::string FlatKey(absl::string_view name,
                    absl::Span<const StatLabel> labels) {
  if (labels.empty()) return std::string(name);
  std::string key = absl::StrCat(name, "{");
  for (size_t i = 0; i < labels.size(); ++i) {
    absl::StrAppend(&key, i == 0 ? "" : ",", labels[i].name, "=\"",
                    labels[i].value, "\"");
  }
  key += "}";
  return key;
}

}  // namespace

void FlatStatsVisitor::Counter(absl::string_view name, absl::string_view,
                               double value,
                               absl::Span<const StatLabel> labels) {
  values_.emplace_back(FlatKey(name, labels), value);
}

void FlatStatsVisitor::Gauge(absl::string_view name, absl::string_view,
                             double value,
                             absl::Span<const StatLabel> labels) {
  values_.emplace_back(FlatKey(name, labels), value);
}

void FlatStatsVisitor::Histogram(absl::string_view name, absl::string_view,
                                 const HistogramSnapshot& h,
                                 absl::Span<const StatLabel> labels) {
  values_.emplace_back(FlatKey(absl::StrCat(name, "_count"), labels),
                       static_cast<double>(h.count));
  values_.emplace_back(FlatKey(absl::StrCat(name, "_sum"), labels), h.sum);
}

void LatencyHistogram::Observe(absl::Duration d) {
  const int64_t ns = absl::ToInt64Nanoseconds(d);
  // Units of 10 us, rounded up: bucket i holds (2^(i-1), 2^i] units.
  const uint64_t units = ns <= 0 ? 0 : (static_cast<uint64_t>(ns) + 9999) / 10000;
  int bucket = 0;
  if (units > 1) {
    bucket = 64 - __builtin_clzll(units - 1);  // smallest i: 2^i >= units
  }
  if (bucket > kBuckets) bucket = kBuckets;
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(ns <= 0 ? 0 : static_cast<uint64_t>(ns),
                    std::memory_order_relaxed);
}

HistogramSnapshot LatencyHistogram::Snapshot() const {
  HistogramSnapshot s;
  s.upper_bounds.reserve(kBuckets);
  s.cumulative_counts.reserve(kBuckets);
  uint64_t total = 0;
  double bound = 10e-6;
  for (int i = 0; i < kBuckets; ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.upper_bounds.push_back(bound);
    s.cumulative_counts.push_back(total);
    bound *= 2;
  }
  total += buckets_[kBuckets].load(std::memory_order_relaxed);
  s.count = total;
  s.sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

}  // namespace hymcache
