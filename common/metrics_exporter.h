// MetricsExporter: serves a daemon's stats as Prometheus text exposition on
// GET /metrics (prometheus-cpp's Exposer, an embedded civetweb server).
//
// Nothing is recorded in prometheus-cpp's own metric objects: at every
// scrape the exporter calls `collect`, which reports the component's
// current stats (common/stats.h) to a visitor that builds the series.
// Counters stay relaxed atomics or fields under the component's own lock;
// the hot paths never touch the exporter.
//
// Series names: options.prefix + the stat's name, counters with "_total";
// histograms as given (their names end in "_seconds").
//
// Thread safety: safe for concurrent use without external synchronization.
// `collect` runs on the exporter's HTTP threads, possibly two at once.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/stats.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace hymcache {

struct MetricsExporterOptions {
  // HOST:PORT to serve on (IPv4, "localhost", or "[v6]"); port 0 picks a
  // free port (see address()). Required. The caller applies its protected
  // mode (CheckProtectedMode) before.
  std::string listen_address;
  // Before every series name, e.g. "hymcache_master_". Default: "".
  std::string prefix;
  // Reports the current stats; called at each scrape. Required; must stay
  // callable until the exporter is destroyed.
  std::function<void(StatsVisitor*)> collect;
  // HTTP threads. 1..16. Default: 2.
  int threads = 2;

  // InvalidArgument for a bad address, missing collect or thread count.
  absl::Status Validate() const;
};

class MetricsExporter {
 public:
  // Binds and starts serving.
  // Errors: InvalidArgument (bad options), Unavailable (cannot bind).
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Create(
      const MetricsExporterOptions& options);
  // Stops serving; `collect` is not called after it returns.
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // The bound port.
  int port() const { return port_; }
  // "host:port" to scrape: the listen host (127.0.0.1 for 0.0.0.0, [::1]
  // for [::]) and the bound port.
  const std::string& address() const { return address_; }

 private:
  class Collector;
  MetricsExporter() = default;

  std::shared_ptr<Collector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::string address_;
};

// The exposition text of what `collect` reports now (as a scrape would
// return it), without serving it; for tests and tools.
std::string RenderPrometheusText(
    const std::string& prefix,
    const std::function<void(StatsVisitor*)>& collect);

}  // namespace hymcache
