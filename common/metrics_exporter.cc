#include "common/metrics_exporter.h"

#include <atomic>
#include <exception>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/net.h"
#include "common/thread.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace hymcache {
namespace {

bool ValidMetricChar(char c, bool first) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' ||
         c == ':' || (!first && absl::ascii_isdigit(static_cast<unsigned char>(c)));
}

// Replaces characters Prometheus does not allow in names with '_'.
std::string SanitizeName(std::string name) {
  for (size_t i = 0; i < name.size(); ++i) {
    if (!ValidMetricChar(name[i], i == 0)) name[i] = '_';
  }
  return name;
}

// Builds metric families from visited stats; samples of one name (differing
// in labels) share a family. A name reported again with another type is
// dropped (the first type wins).
class PrometheusVisitor final : public StatsVisitor {
 public:
  explicit PrometheusVisitor(std::string prefix) : prefix_(std::move(prefix)) {}
  using StatsVisitor::Counter;
  using StatsVisitor::Gauge;
  using StatsVisitor::Histogram;

  void Counter(absl::string_view name, absl::string_view help, double value,
               absl::Span<const StatLabel> labels) override {
    std::string full = absl::StrCat(prefix_, name);
    if (!absl::EndsWith(full, "_total")) full += "_total";
    prometheus::ClientMetric* m =
        Add(std::move(full), help, prometheus::MetricType::Counter, labels);
    if (m != nullptr) m->counter.value = value;
  }
  void Gauge(absl::string_view name, absl::string_view help, double value,
             absl::Span<const StatLabel> labels) override {
    prometheus::ClientMetric* m = Add(absl::StrCat(prefix_, name), help,
                                      prometheus::MetricType::Gauge, labels);
    if (m != nullptr) m->gauge.value = value;
  }
  void Histogram(absl::string_view name, absl::string_view help,
                 const HistogramSnapshot& h,
                 absl::Span<const StatLabel> labels) override {
    prometheus::ClientMetric* m = Add(absl::StrCat(prefix_, name), help,
                                      prometheus::MetricType::Histogram, labels);
    if (m == nullptr) return;
    m->histogram.sample_count = h.count;
    m->histogram.sample_sum = h.sum;
    for (size_t i = 0; i < h.upper_bounds.size(); ++i) {
      m->histogram.bucket.push_back({h.cumulative_counts[i], h.upper_bounds[i]});
    }
    // The serializer writes +Inf from the last bucket it is given.
    m->histogram.bucket.push_back(
        {h.count, std::numeric_limits<double>::infinity()});
  }

  std::vector<prometheus::MetricFamily> Take() { return std::move(families_); }

 private:
  prometheus::ClientMetric* Add(std::string name, absl::string_view help,
                                prometheus::MetricType type,
                                absl::Span<const StatLabel> labels) {
    name = SanitizeName(std::move(name));
    auto [it, inserted] = index_.try_emplace(name, families_.size());
    if (inserted) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = std::string(help);
      f.type = type;
      families_.push_back(std::move(f));
    }
    prometheus::MetricFamily& f = families_[it->second];
    if (f.type != type) return nullptr;
    prometheus::ClientMetric& m = f.metric.emplace_back();
    for (const StatLabel& l : labels) {
      m.label.push_back({SanitizeName(l.name), l.value});
    }
    return &m;
  }

  const std::string prefix_;
  std::vector<prometheus::MetricFamily> families_;
  absl::flat_hash_map<std::string, size_t> index_;
};

std::vector<prometheus::MetricFamily> CollectFamilies(
    const std::string& prefix,
    const std::function<void(StatsVisitor*)>& collect) {
  PrometheusVisitor v(prefix);
  collect(&v);
  return v.Take();
}

}  // namespace

class MetricsExporter::Collector final : public prometheus::Collectable {
 public:
  Collector(std::string prefix, std::function<void(StatsVisitor*)> collect)
      : prefix_(std::move(prefix)), collect_(std::move(collect)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    return CollectFamilies(prefix_, collect_);
  }

 private:
  const std::string prefix_;
  const std::function<void(StatsVisitor*)> collect_;
};

absl::Status MetricsExporterOptions::Validate() const {
  absl::StatusOr<std::pair<std::string, int>> hp =
      SplitHostPort(listen_address);
  if (!hp.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics exporter: ", hp.status().message()));
  }
  if (!collect) {
    return absl::InvalidArgumentError("metrics exporter: collect is required");
  }
  if (threads < 1 || threads > 16) {
    return absl::InvalidArgumentError("metrics exporter: threads must be 1..16");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Create(
    const MetricsExporterOptions& options) {
  absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;
  auto [host, port] = *SplitHostPort(options.listen_address);
  // civetweb takes numeric addresses only.
  if (absl::AsciiStrToLower(host) == "localhost") host = "127.0.0.1";
  const bool v6 = absl::StrContains(host, ':');
  const std::string bind =
      v6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);

  std::unique_ptr<MetricsExporter> e(new MetricsExporter());
  e->collector_ = std::make_shared<Collector>(options.prefix, options.collect);
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(
        bind, static_cast<size_t>(options.threads));
  } catch (const std::exception& ex) {
    return absl::UnavailableError(absl::StrCat(
        "metrics exporter: cannot listen on ", options.listen_address, ": ",
        ex.what()));
  }
  e->exposer_->RegisterCollectable(e->collector_);
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "metrics exporter: no port bound for ", options.listen_address));
  }
  e->port_ = ports[0];
  std::string shown = host;
  if (host == "0.0.0.0") shown = "127.0.0.1";
  if (host == "::") shown = "::1";
  e->address_ = absl::StrContains(shown, ':')
                    ? absl::StrCat("[", shown, "]:", e->port_)
                    : absl::StrCat(shown, ":", e->port_);
  return e;
}

MetricsExporter::~MetricsExporter() {
  if (exposer_ == nullptr) return;
  // civetweb's listener thread notices its stop flag only when its poll
  // returns, which without a connection takes its 2 s timeout: connect
  // until the exposer is gone, so that stopping takes milliseconds.
  std::atomic<bool> stopped{false};
  Thread waker("metrics-stop", [this, &stopped] {
    while (!stopped.load(std::memory_order_acquire)) {
      ConnectTcp(address_, absl::Now() + absl::Milliseconds(100))
          .status()
          .IgnoreError();
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  exposer_.reset();  // joins the HTTP threads
  stopped.store(true, std::memory_order_release);
  waker.Join();
}

std::string RenderPrometheusText(
    const std::string& prefix,
    const std::function<void(StatsVisitor*)>& collect) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, CollectFamilies(prefix, collect));
  return out.str();
}

}  // namespace hymcache
