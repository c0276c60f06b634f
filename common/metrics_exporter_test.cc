#include "common/metrics_exporter.h"

#include <sys/socket.h>

#include <atomic>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/net.h"

namespace hymcache {
namespace {

#define EXPORTER_TEST_STATS(COUNTER, GAUGE, DGAUGE) \
  COUNTER(read_bytes, "Object bytes sent to readers") \
  GAUGE(open_connections, "Connections open now")
HYM_DECLARE_STATS(ExporterTestStats, ExporterTestCounters,
                  EXPORTER_TEST_STATS);

// GET path over plain HTTP/1.0; the whole response.
std::string HttpGet(const std::string& address, const std::string& path) {
  auto s = ConnectTcp(address, absl::Now() + absl::Seconds(5));
  REQUIRE(s.ok());
  const std::string req =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: x\r\n\r\n");
  REQUIRE(SendAll(s->fd(), req.data(), req.size(),
                  absl::Now() + absl::Seconds(5)).ok());
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = recv(s->fd(), buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

TEST_CASE("the exporter serves the stats collected at each scrape") {
  ExporterTestCounters counters;
  LatencyHistogram wait;
  std::atomic<int> scrapes{0};
  MetricsExporterOptions o;
  o.listen_address = "127.0.0.1:0";
  o.prefix = "hymcache_test_";
  o.collect = [&](StatsVisitor* v) {
    scrapes.fetch_add(1);
    ExporterTestStats s = counters.Load();
    s.open_connections = 2;
    s.Visit(v);
    for (const char* plane : {"tcp", "shm"}) {
      StatLabel l{"plane", plane};
      v->Counter("plane_bytes", "Bytes by plane",
                 std::string(plane) == "tcp" ? 5 : 6, {&l, 1});
    }
    v->Histogram("wait_seconds", "Waits", wait.Snapshot());
  };
  auto e = MetricsExporter::Create(o);
  REQUIRE(e.ok());
  REQUIRE((*e)->port() > 0);
  CHECK((*e)->address() == absl::StrCat("127.0.0.1:", (*e)->port()));

  Add(counters.read_bytes, 4096);
  wait.Observe(absl::Milliseconds(2));
  std::string body = HttpGet((*e)->address(), "/metrics");
  INFO(body);
  CHECK(absl::StrContains(body, "200 OK"));
  CHECK(absl::StrContains(body, "# TYPE hymcache_test_read_bytes_total counter"));
  CHECK(absl::StrContains(body, "hymcache_test_read_bytes_total 4096"));
  CHECK(absl::StrContains(body, "# TYPE hymcache_test_open_connections gauge"));
  CHECK(absl::StrContains(body, "hymcache_test_open_connections 2"));
  CHECK(absl::StrContains(body, "hymcache_test_plane_bytes_total{plane=\"tcp\"} 5"));
  CHECK(absl::StrContains(body, "hymcache_test_plane_bytes_total{plane=\"shm\"} 6"));
  CHECK(absl::StrContains(body, "# TYPE hymcache_test_wait_seconds histogram"));
  CHECK(absl::StrContains(body, "hymcache_test_wait_seconds_count 1"));
  CHECK(absl::StrContains(body, "hymcache_test_wait_seconds_bucket{le=\"0.00256\"} 1"));
  CHECK(absl::StrContains(body, "hymcache_test_wait_seconds_bucket{le=\"0.00128\"} 0"));
  CHECK(absl::StrContains(body, "hymcache_test_wait_seconds_bucket{le=\"+Inf\"} 1"));
  CHECK(scrapes.load() >= 1);

  Add(counters.read_bytes, 1);
  body = HttpGet((*e)->address(), "/metrics");
  CHECK(absl::StrContains(body, "hymcache_test_read_bytes_total 4097"));
}

TEST_CASE("garbage on the metrics port does not stop the exporter") {
  MetricsExporterOptions o;
  o.listen_address = "127.0.0.1:0";
  o.collect = [](StatsVisitor* v) { v->Gauge("alive", "1", 1); };
  auto e = MetricsExporter::Create(o);
  REQUIRE(e.ok());
  const std::vector<std::string> junk = {
      std::string("\x00\x01\x02\xff\r\n\r\n", 8),
      "GET /metrics HTTP/1.1\r\nHost: " + std::string(100000, 'h') + "\r\n\r\n",
      "POST /metrics HTTP/1.1\r\nContent-Length: 99999999\r\n\r\nabc",
      "GET /../../etc/passwd HTTP/1.0\r\n\r\n",
      "GET /metrics",  // then the connection closes half-way
  };
  for (const std::string& j : junk) {
    auto s = ConnectTcp((*e)->address(), absl::Now() + absl::Seconds(5));
    REQUIRE(s.ok());
    SendAll(s->fd(), j.data(), j.size(), absl::Now() + absl::Seconds(5))
        .IgnoreError();  // the server may close first
  }
  const std::string body = HttpGet((*e)->address(), "/metrics");
  CHECK(absl::StrContains(body, "200 OK"));
  CHECK(absl::StrContains(body, "\nalive 1"));
  CHECK(absl::StrContains(HttpGet((*e)->address(), "/other"), "404"));
}

TEST_CASE("a name reported with two types keeps the first; bad characters become _") {
  const std::string text = RenderPrometheusText("p_", [](StatsVisitor* v) {
    v->Counter("x", "first", 1);
    v->Gauge("x_total", "second, as a gauge", 2);
    v->Gauge("a.b-c", "dots", 3);
  });
  INFO(text);
  CHECK(absl::StrContains(text, "p_x_total 1"));
  CHECK(!absl::StrContains(text, "p_x_total 2"));
  CHECK(absl::StrContains(text, "p_a_b_c 3"));
}

TEST_CASE("exporter options are checked; a taken port is Unavailable") {
  MetricsExporterOptions o;
  o.listen_address = "nonsense";
  o.collect = [](StatsVisitor*) {};
  CHECK(MetricsExporter::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.listen_address = "127.0.0.1:0";
  o.collect = nullptr;
  CHECK(MetricsExporter::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.collect = [](StatsVisitor*) {};
  auto first = MetricsExporter::Create(o);
  REQUIRE(first.ok());
  o.listen_address = (*first)->address();
  CHECK(MetricsExporter::Create(o).status().code() ==
        absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace hymcache
