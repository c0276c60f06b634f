// hymctl status's replication line: the leader's --replication mode, its
// standbys and their lag, read from the leader's GetStats (the gauges of
// master/master_replication.cc: replication_mode{mode}, replication_
// followers, replication_copying, replication_lag_sequences and _seconds,
// overall and {follower} per standby). Apart from the RPC, so that tests
// drive it with made-up stats.
//
// Thread safety: pure functions and plain structs.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hymcache::hymctl {

struct StandbyLag {
  std::string name;  // the standby's advertise address
  double lag_sequences = 0;
  std::optional<double> lag_seconds;
};

struct ReplicationStatus {
  std::string mode;   // "off", "async", "sync" or "confirm"
  int followers = 0;  // standbys past their full copy
  int copying = 0;    // standbys in a full copy
  // Of the most up-to-date standby (every write without one).
  double lag_sequences = 0;
  std::optional<double> lag_seconds;
  std::vector<StandbyLag> standbys;  // by name
};

// Nothing when the stats have no replication mode (a master without
// --replication, or one older than the gauge).
std::optional<ReplicationStatus> ParseReplicationStatus(
    const std::map<std::string, double>& stats);

// One line, without its newline: "replication: confirm, 1 standby following
// (10.0.0.2:50051 0 writes behind), 0 copying; lag 0 writes, 0.000 s".
std::string FormatReplicationStatus(const ReplicationStatus& r);

}  // namespace hymcache::hymctl
