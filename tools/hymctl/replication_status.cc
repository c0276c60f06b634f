#include "tools/hymctl/replication_status.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace hymcache::hymctl {
namespace {

// The label value of `key` if it is `metric{label="VALUE"}`.
std::optional<std::string> LabelOf(absl::string_view key,
                                   absl::string_view metric,
                                   absl::string_view label) {
  if (!absl::ConsumePrefix(&key, metric) || !absl::ConsumePrefix(&key, "{") ||
      !absl::ConsumePrefix(&key, label) || !absl::ConsumePrefix(&key, "=\"") ||
      !absl::ConsumeSuffix(&key, "\"}")) {
    return std::nullopt;
  }
  return std::string(key);
}

std::string Lag(double sequences, const std::optional<double>& seconds) {
  std::string out = absl::StrFormat("%.0f writes", sequences);
  if (seconds.has_value()) absl::StrAppendFormat(&out, ", %.3f s", *seconds);
  return out;
}

}  // namespace

std::optional<ReplicationStatus> ParseReplicationStatus(
    const std::map<std::string, double>& stats) {
  ReplicationStatus r;
  std::map<std::string, StandbyLag> standbys;
  for (const auto& [key, value] : stats) {
    if (auto mode = LabelOf(key, "replication_mode", "mode");
        mode.has_value() && value != 0) {
      r.mode = *mode;
    } else if (auto name =
                   LabelOf(key, "replication_lag_sequences", "follower")) {
      standbys[*name].name = *name;
      standbys[*name].lag_sequences = value;
    } else if (auto name =
                   LabelOf(key, "replication_lag_seconds", "follower")) {
      standbys[*name].name = *name;
      standbys[*name].lag_seconds = value;
    }
  }
  if (r.mode.empty()) return std::nullopt;
  auto get = [&stats](const char* name) -> std::optional<double> {
    auto it = stats.find(name);
    if (it == stats.end()) return std::nullopt;
    return it->second;
  };
  r.followers = static_cast<int>(get("replication_followers").value_or(0));
  r.copying = static_cast<int>(get("replication_copying").value_or(0));
  r.lag_sequences = get("replication_lag_sequences").value_or(0);
  r.lag_seconds = get("replication_lag_seconds");
  for (auto& [name, s] : standbys) r.standbys.push_back(std::move(s));
  return r;
}

std::string FormatReplicationStatus(const ReplicationStatus& r) {
  std::string out =
      absl::StrCat("replication: ", r.mode, ", ", r.followers,
                   r.followers == 1 ? " standby" : " standbys", " following");
  if (!r.standbys.empty()) {
    out += " (";
    for (size_t i = 0; i < r.standbys.size(); ++i) {
      const StandbyLag& s = r.standbys[i];
      absl::StrAppend(&out, i > 0 ? ", " : "", s.name, " ",
                      absl::StrFormat("%.0f", s.lag_sequences),
                      " writes behind");
    }
    out += ")";
  }
  absl::StrAppend(&out, ", ", r.copying, " copying; lag ",
                  Lag(r.lag_sequences, r.lag_seconds));
  return out;
}

}  // namespace hymcache::hymctl
