#include "tools/hymctl/top.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hymcache::hymctl {
namespace {

using nlohmann::json;

// after - before; a counter that went down restarted from zero.
double Delta(double before, double after) {
  return after >= before ? after - before : after;
}

std::optional<double> Device(const NodeSample& n, const char* name) {
  auto it = n.device.find(name);
  if (it == n.device.end()) return std::nullopt;
  return it->second;
}

std::optional<double> Ratio(std::optional<double> part,
                            std::optional<double> whole) {
  if (!part || !whole || *whole <= 0) return std::nullopt;
  return std::min(1.0, *part / *whole);
}

json Opt(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

std::string ShortOpt(const std::optional<double>& v) {
  return v ? ShortNumber(*v) : "-";
}

std::string Percent(const std::optional<double>& v) {
  return v ? absl::StrFormat("%.0f%%", *v * 100) : "-";
}

}  // namespace

std::string ShortNumber(double v) {
  const char* units[] = {"", "k", "M", "G", "T", "P"};
  int u = 0;
  while (v >= 999.5 && u < 5) {
    v /= 1000;
    ++u;
  }
  if (u == 0) return absl::StrFormat("%.0f", v);
  return v < 9.95 ? absl::StrFormat("%.1f%s", v, units[u])
                  : absl::StrFormat("%.0f%s", v, units[u]);
}

TopView ComputeTop(const TopSample& before, const TopSample& after) {
  TopView view;
  const double dt = absl::ToDoubleSeconds(after.at - before.at);
  view.interval_seconds = dt;
  view.unix_ms = absl::ToUnixMillis(after.at);
  view.objects = after.objects;
  view.pending_puts = after.pending_puts;
  if (dt > 0) {
    view.evictions_per_s =
        Delta(static_cast<double>(before.evicted_objects),
              static_cast<double>(after.evicted_objects)) / dt;
  }
  for (const NodeSample& a : after.nodes) {
    TopRow row;
    row.node_id = a.node_id;
    row.name = a.name;
    row.state = a.state;
    row.objects = a.objects;
    row.used_bytes = a.used_bytes;
    row.capacity_bytes = a.capacity_bytes;
    row.error = a.error;
    if (!a.reachable) {
      view.rows.push_back(std::move(row));
      continue;
    }
    // Gauges: now.
    row.staging_occupancy =
        Ratio(Device(a, "staged_bytes"), Device(a, "staging_capacity_bytes"));
    row.write_buffer_occupancy = Ratio(Device(a, "buffered_bytes"),
                                       Device(a, "write_buffer_capacity_bytes"));
    row.flush_lag_seconds = Device(a, "flush_lag_seconds");
    // Rates: against the same node in the earlier snapshot.
    auto b = std::find_if(
        before.nodes.begin(), before.nodes.end(),
        [&](const NodeSample& n) { return n.node_id == a.node_id; });
    if (b != before.nodes.end() && b->reachable && dt > 0) {
      auto rate = [&](uint64_t x, uint64_t y) {
        return Delta(static_cast<double>(x), static_cast<double>(y)) / dt;
      };
      row.reads_per_s = rate(b->read_ops, a.read_ops);
      row.writes_per_s = rate(b->write_ops, a.write_ops);
      row.read_bytes_per_s = rate(b->bytes_read, a.bytes_read);
      row.write_bytes_per_s = rate(b->bytes_written, a.bytes_written);
      auto device_delta = [&](const char* name) -> std::optional<double> {
        auto x = Device(*b, name);
        auto y = Device(a, name);
        if (!x || !y) return std::nullopt;
        return Delta(*x, *y);
      };
      auto staging_hits = device_delta("staging_hits");
      auto buffer_hits = device_delta("buffer_hits");
      auto misses = device_delta("staging_misses");
      if (staging_hits && buffer_hits && misses) {
        row.hit_ratio = Ratio(*staging_hits + *buffer_hits,
                              *staging_hits + *buffer_hits + *misses);
      }
      if (auto flushed = device_delta("flushed_bytes")) {
        row.flush_bytes_per_s = *flushed / dt;
      }
    }
    view.rows.push_back(std::move(row));
  }
  return view;
}

std::string TopJson(const TopView& view) {
  json nodes = json::array();
  for (const TopRow& r : view.rows) {
    json j{{"node_id", r.node_id},
           {"name", r.name},
           {"state", r.state},
           {"objects", r.objects},
           {"used_bytes", r.used_bytes},
           {"capacity_bytes", r.capacity_bytes},
           {"reads_per_s", Opt(r.reads_per_s)},
           {"writes_per_s", Opt(r.writes_per_s)},
           {"read_bytes_per_s", Opt(r.read_bytes_per_s)},
           {"write_bytes_per_s", Opt(r.write_bytes_per_s)},
           {"hit_ratio", Opt(r.hit_ratio)},
           {"staging_occupancy", Opt(r.staging_occupancy)},
           {"write_buffer_occupancy", Opt(r.write_buffer_occupancy)},
           {"flush_bytes_per_s", Opt(r.flush_bytes_per_s)},
           {"flush_lag_seconds", Opt(r.flush_lag_seconds)}};
    if (!r.error.empty()) j["error"] = r.error;
    nodes.push_back(std::move(j));
  }
  return json{{"unix_ms", view.unix_ms},
              {"interval_seconds", view.interval_seconds},
              {"objects", view.objects},
              {"pending_puts", view.pending_puts},
              {"evictions_per_s", view.evictions_per_s},
              {"nodes", nodes}}
      .dump();
}

void PrintTop(std::ostream& out, const TopView& view) {
  out << absl::StrFormat(
      "hymctl top: %d objects, %d puts pending, %.1f evictions/s (%.1fs)\n\n",
      view.objects, view.pending_puts, view.evictions_per_s,
      view.interval_seconds);
  // 4+10+11+5+5+5+5+4+4+5 characters and 9 gaps of 2: 76 columns.
  constexpr size_t kNameWidth = 10;
  out << absl::StrFormat("%-4s  %-10s  %-11s  %5s  %5s  %5s  %5s  %4s  %4s  %5s\n",
                         "NODE", "NAME", "STATE", "RD/s", "WR/s", "RDB/s",
                         "WRB/s", "HIT", "STG", "FLUSH");
  for (const TopRow& r : view.rows) {
    std::string name = r.name;
    if (name.size() > kNameWidth) name = name.substr(0, kNameWidth - 1) + "~";
    if (!r.error.empty()) {
      // The rest of the line (80 columns) says why there are no rates.
      out << absl::StrFormat("%-4d  %-10s  %-11s  %s\n", r.node_id, name,
                             r.state.substr(0, 11), r.error.substr(0, 49));
      continue;
    }
    out << absl::StrFormat(
        "%-4d  %-10s  %-11s  %5s  %5s  %5s  %5s  %4s  %4s  %5s\n", r.node_id,
        name, r.state.substr(0, 11), ShortOpt(r.reads_per_s),
        ShortOpt(r.writes_per_s), ShortOpt(r.read_bytes_per_s),
        ShortOpt(r.write_bytes_per_s), Percent(r.hit_ratio),
        Percent(r.staging_occupancy), ShortOpt(r.flush_bytes_per_s));
  }
  out << "\nHIT: reads served from DRAM (staging window or write buffer); "
         "STG: staging\nwindow in use; FLUSH: bytes/s to the capacity tier "
         "(hybrid nodes only).\n";
}

}  // namespace hymcache::hymctl
