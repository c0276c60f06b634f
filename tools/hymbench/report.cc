#include "tools/hymbench/report.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hymcache::hymbench {
namespace {

using ojson = nlohmann::ordered_json;

// Accumulates records into one row.
class GroupBuilder {
 public:
  void Add(const RequestRecord& r) {
    GroupStats& g = stats_;
    ++g.requests;
    g.blocks += r.blocks;
    g.ceiling_hits += r.ceiling_hits;
    g.hit_prefix += r.hit_prefix;
    g.loaded += r.loaded;
    g.loaded_bytes += r.loaded_bytes;
    if (r.load_called && r.load_error.empty()) {
      g.load_seconds += r.load_ms / 1e3;
      latencies_ms_.push_back(r.load_ms);
    }
    if (!r.load_error.empty()) ++g.load_errors;
    if (r.loaded < r.hit_prefix) ++g.short_loads;
    g.corrupt_blocks += r.corrupt_blocks;
    g.stored += r.stored;
    g.skipped += r.skipped;
    g.refused += r.refused;
    g.store_failed += r.store_failed;
    g.store_dropped += r.store_dropped;
    if (!r.store_error.empty()) ++g.store_errors;
    for (int k = 0; k < kLossReasons; ++k) g.lost[k] += r.lost[k];
  }

  GroupStats Finish(std::string label, double key) {
    stats_.label = std::move(label);
    stats_.key = key;
    stats_.p50_load_ms = Percentile(latencies_ms_, 50);
    stats_.p99_load_ms = Percentile(latencies_ms_, 99);
    return stats_;
  }

 private:
  GroupStats stats_;
  std::vector<double> latencies_ms_;
};

size_t Sum(const LossCounts& c) {
  size_t n = 0;
  for (size_t v : c) n += v;
  return n;
}

// {"in_flight": n, ...}: every reason, or only the non-zero ones.
ojson LossJson(const LossCounts& c, bool all) {
  ojson j = ojson::object();
  for (int k = 0; k < kLossReasons; ++k) {
    if (all || c[k] > 0) j[LossReasonName(static_cast<LossReason>(k))] = c[k];
  }
  return j;
}

ojson GroupJson(const GroupStats& g) {
  ojson j;
  j["label"] = g.label;
  j["key"] = g.key;
  j["requests"] = g.requests;
  j["blocks"] = g.blocks;
  j["ceiling_hits"] = g.ceiling_hits;
  j["hit_prefix"] = g.hit_prefix;
  j["loaded"] = g.loaded;
  j["prefix_hit_ratio"] = g.hit_ratio();
  j["ceiling_hit_ratio"] = g.ceiling_ratio();
  j["lookup_hit_ratio"] = g.lookup_hit_ratio();
  j["loaded_bytes"] = g.loaded_bytes;
  j["load_seconds"] = g.load_seconds;
  j["load_gbps"] = g.load_gbps();
  j["p50_load_ms"] = g.p50_load_ms;
  j["p99_load_ms"] = g.p99_load_ms;
  j["stored"] = g.stored;
  j["skipped"] = g.skipped;
  j["refused"] = g.refused;
  j["store_failed"] = g.store_failed;
  j["store_dropped"] = g.store_dropped;
  j["store_errors"] = g.store_errors;
  j["load_errors"] = g.load_errors;
  j["short_loads"] = g.short_loads;
  j["corrupt_blocks"] = g.corrupt_blocks;
  j["lost_blocks"] = Sum(g.lost);
  j["lost"] = LossJson(g.lost, /*all=*/true);
  return j;
}

ojson RecordJson(const RequestRecord& r) {
  ojson j;
  j["index"] = r.index;
  j["conversation"] = r.conversation;
  j["turn"] = r.turn;
  j["timestamp_ms"] = r.timestamp_ms;
  j["blocks"] = r.blocks;
  j["ceiling_hits"] = r.ceiling_hits;
  j["hit_prefix"] = r.hit_prefix;
  j["loaded"] = r.loaded;
  j["loaded_bytes"] = r.loaded_bytes;
  j["load_ms"] = r.load_ms;
  j["start_delay_ms"] = r.start_delay_ms;
  j["store_keys"] = r.store_keys;
  j["stored"] = r.stored;
  j["skipped"] = r.skipped;
  j["refused"] = r.refused;
  j["store_failed"] = r.store_failed;
  j["store_dropped"] = r.store_dropped;
  j["corrupt_blocks"] = r.corrupt_blocks;
  if (!r.load_error.empty()) j["load_error"] = r.load_error;
  if (!r.load_stop.empty()) j["load_stop"] = r.load_stop;
  if (!r.store_error.empty()) j["store_error"] = r.store_error;
  if (Sum(r.lost) > 0) j["lost"] = LossJson(r.lost, /*all=*/false);
  return j;
}

std::string TableRow(const GroupStats& g) {
  return absl::StrFormat(
      "%-12s %6d %8d %7.4f %7.4f %8d %7.3f %8.2f %8.2f %8d %8d %8d\n", g.label,
      g.requests, g.blocks, g.hit_ratio(), g.ceiling_ratio(), g.loaded,
      g.load_gbps(), g.p50_load_ms, g.p99_load_ms, g.stored, g.skipped, g.refused);
}

}  // namespace

const char* LossReasonName(LossReason reason) {
  switch (reason) {
    case LossReason::kInFlight:
      return "in_flight";
    case LossReason::kRefusedNoRoom:
      return "refused_no_room";
    case LossReason::kRefusedWriteBuffer:
      return "refused_write_buffer";
    case LossReason::kRefusedStoreQueue:
      return "refused_store_queue";
    case LossReason::kDropped:
      return "dropped";
    case LossReason::kDeadline:
      return "deadline";
    case LossReason::kNodeError:
      return "node_error";
    case LossReason::kNotFound:
      return "not_found";
    case LossReason::kOther:
      return "other";
  }
  return "other";
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double n = static_cast<double>(values.size());
  size_t rank = static_cast<size_t>(std::ceil(std::clamp(p, 0.0, 100.0) / 100.0 * n));
  rank = std::clamp<size_t>(rank, 1, values.size());
  return values[rank - 1];
}

absl::StatusOr<Report> BuildReport(absl::Span<const RequestRecord> records,
                                   const ReportOptions& options) {
  bool all_turns = !records.empty();
  for (const RequestRecord& r : records) all_turns = all_turns && r.turn >= 0;
  bool by_turn = false;
  switch (options.group_by) {
    case GroupBy::kAuto:
      by_turn = all_turns;
      break;
    case GroupBy::kTurn:
      if (!all_turns && !records.empty()) {
        return absl::InvalidArgumentError(
            "grouping by turn needs a turn on every request (a synthetic "
            "workload or a trace written by `hymbench gen`)");
      }
      by_turn = true;
      break;
    case GroupBy::kWindow:
      by_turn = false;
      break;
  }
  if (!by_turn && !(options.window_s > 0)) {
    return absl::InvalidArgumentError("ReportOptions.window_s must be > 0");
  }

  Report report;
  report.group_by = by_turn ? "turn" : "window";
  double t0 = 0;
  if (!records.empty()) {
    t0 = records[0].timestamp_ms;
    for (const RequestRecord& r : records) t0 = std::min(t0, r.timestamp_ms);
  }
  std::map<int64_t, GroupBuilder> groups;
  GroupBuilder overall;
  for (const RequestRecord& r : records) {
    int64_t key = by_turn ? r.turn
                          : static_cast<int64_t>(std::floor(
                                (r.timestamp_ms - t0) / (options.window_s * 1e3)));
    groups[key].Add(r);
    overall.Add(r);
  }
  for (auto& [key, builder] : groups) {
    if (by_turn) {
      report.groups.push_back(builder.Finish(absl::StrCat("turn ", key), key));
    } else {
      const double start = key * options.window_s;
      report.groups.push_back(builder.Finish(
          absl::StrCat(start, "-", start + options.window_s, "s"), start));
    }
  }
  report.overall = overall.Finish("all", -1);
  return report;
}

void WriteTable(const Report& report, std::ostream& out) {
  out << absl::StrFormat("%-12s %6s %8s %7s %7s %8s %7s %8s %8s %8s %8s %8s\n",
                         report.group_by, "reqs", "blocks", "hit", "ceiling",
                         "loaded", "GB/s", "p50 ms", "p99 ms", "stored", "skipped",
                         "refused");
  for (const GroupStats& g : report.groups) out << TableRow(g);
  out << TableRow(report.overall);
  const GroupStats& o = report.overall;
  if (report.wall_seconds > 0) {
    out << absl::StrFormat(
        "wall %.2f s, %.1f requests/s, %.3f GB/s loaded over the run\n",
        report.wall_seconds, o.requests / report.wall_seconds,
        o.loaded_bytes / report.wall_seconds / 1e9);
  }
  out << absl::StrFormat(
      "lookup hits %d (%.4f), stores: %d stored %d skipped %d refused %d failed "
      "%d dropped (%d store errors)\n",
      o.hit_prefix, o.lookup_hit_ratio(), o.stored, o.skipped, o.refused,
      o.store_failed, o.store_dropped, o.store_errors);
  if (o.load_errors > 0 || o.short_loads > 0 || o.corrupt_blocks > 0) {
    out << absl::StrFormat("load errors %d, short loads %d, corrupt blocks %d\n",
                           o.load_errors, o.short_loads, o.corrupt_blocks);
  }
  // Why ceiling hits were lost: one column per reason that occurred.
  if (Sum(o.lost) == 0) {
    out << "lost blocks (ceiling hits not loaded): none\n";
    return;
  }
  std::vector<int> reasons;
  for (int k = 0; k < kLossReasons; ++k) {
    if (o.lost[k] > 0) reasons.push_back(k);
  }
  std::string header = absl::StrFormat("lost blocks by reason\n%-12s %8s", report.group_by, "lost");
  for (int k : reasons) {
    absl::StrAppend(&header, absl::StrFormat(" %20s", LossReasonName(static_cast<LossReason>(k))));
  }
  out << header << "\n";
  auto row = [&](const GroupStats& g) {
    std::string line = absl::StrFormat("%-12s %8d", g.label, Sum(g.lost));
    for (int k : reasons) absl::StrAppend(&line, absl::StrFormat(" %20d", g.lost[k]));
    out << line << "\n";
  };
  for (const GroupStats& g : report.groups) row(g);
  row(o);
}

void WriteCsv(const Report& report, std::ostream& out) {
  out << "group_by,label,key,requests,blocks,ceiling_hits,hit_prefix,loaded,"
         "prefix_hit_ratio,ceiling_hit_ratio,loaded_bytes,load_seconds,load_gbps,"
         "p50_load_ms,p99_load_ms,stored,skipped,refused,store_failed,"
         "store_dropped,store_errors,load_errors,short_loads,corrupt_blocks,"
         "lost_blocks";
  for (int k = 0; k < kLossReasons; ++k) {
    out << ",lost_" << LossReasonName(static_cast<LossReason>(k));
  }
  out << "\n";
  auto row = [&](const GroupStats& g) {
    out << absl::StrFormat(
        "%s,%s,%g,%d,%d,%d,%d,%d,%.6f,%.6f,%d,%.6f,%.6f,%.4f,%.4f,%d,%d,%d,%d,%d,%d,"
        "%d,%d,%d,%d",
        report.group_by, g.label, g.key, g.requests, g.blocks, g.ceiling_hits,
        g.hit_prefix, g.loaded, g.hit_ratio(), g.ceiling_ratio(), g.loaded_bytes,
        g.load_seconds, g.load_gbps(), g.p50_load_ms, g.p99_load_ms, g.stored,
        g.skipped, g.refused, g.store_failed, g.store_dropped, g.store_errors,
        g.load_errors, g.short_loads, g.corrupt_blocks, Sum(g.lost));
    for (size_t v : g.lost) out << "," << v;
    out << "\n";
  };
  for (const GroupStats& g : report.groups) row(g);
  row(report.overall);
}

void WriteJson(const Report& report, absl::Span<const RequestRecord> records,
               std::ostream& out) {
  ojson j;
  ojson config = ojson::object();
  for (const auto& [k, v] : report.config) config[k] = v;
  j["config"] = config;
  j["group_by"] = report.group_by;
  j["wall_seconds"] = report.wall_seconds;
  ojson groups = ojson::array();
  for (const GroupStats& g : report.groups) groups.push_back(GroupJson(g));
  j["groups"] = groups;
  j["overall"] = GroupJson(report.overall);
  if (!records.empty()) {
    ojson rs = ojson::array();
    for (const RequestRecord& r : records) rs.push_back(RecordJson(r));
    j["requests"] = rs;
  }
  out << j.dump(1) << "\n";
}

}  // namespace hymcache::hymbench
