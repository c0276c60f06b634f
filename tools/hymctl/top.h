// hymctl top: per-node rates computed from two successive snapshots of the
// counters (the master's GetStats, each node's StorageControl.GetStats).
// The arithmetic is here, apart from the RPCs, so tests drive it with
// made-up samples.
//
// Thread safety: pure functions and plain structs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace hymcache::hymctl {

// One node's counters at one time.
struct NodeSample {
  uint32_t node_id = 0;
  std::string name;
  // "alive", "DRAINING", "RECONCILING", "DEAD" (see NodeState in hymctl.cc).
  std::string state;
  // From the master.
  uint64_t objects = 0;
  uint64_t used_bytes = 0;
  uint64_t capacity_bytes = 0;
  // From the node's control service; unset if it did not answer.
  bool reachable = false;
  std::string error;
  uint64_t read_ops = 0;
  uint64_t write_ops = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  // StorageStatsResponse.device_stats (which names appear depends on the
  // device kind; the hybrid device has the staging and flush counters).
  std::map<std::string, double> device;
};

// The cluster at one time.
struct TopSample {
  absl::Time at;
  uint64_t objects = 0;
  uint64_t pending_puts = 0;
  uint64_t evicted_objects = 0;
  std::vector<NodeSample> nodes;
};

// One node's line: rates over the interval (per second), occupancies now.
// An optional is empty when it does not apply (a DRAM node has no staging
// window), when the node did not answer in either snapshot, or when there
// is nothing to divide by (no reads: no hit ratio).
struct TopRow {
  uint32_t node_id = 0;
  std::string name;
  std::string state;
  uint64_t objects = 0;
  uint64_t used_bytes = 0;
  uint64_t capacity_bytes = 0;
  std::string error;  // the node did not answer now
  std::optional<double> reads_per_s;
  std::optional<double> writes_per_s;
  std::optional<double> read_bytes_per_s;
  std::optional<double> write_bytes_per_s;
  // Reads served from DRAM (staging window or write buffer) over all reads
  // in the interval; hybrid devices only.
  std::optional<double> hit_ratio;
  // staged_bytes / staging_capacity_bytes and buffered_bytes /
  // write_buffer_capacity_bytes now, 0..1; hybrid devices only.
  std::optional<double> staging_occupancy;
  std::optional<double> write_buffer_occupancy;
  // Bytes flushed to the capacity tier per second; age of the oldest
  // unflushed commit now; hybrid devices only.
  std::optional<double> flush_bytes_per_s;
  std::optional<double> flush_lag_seconds;
};

struct TopView {
  double interval_seconds = 0;
  int64_t unix_ms = 0;  // of the later snapshot
  uint64_t objects = 0;
  uint64_t pending_puts = 0;
  double evictions_per_s = 0;
  std::vector<TopRow> rows;
};

// A number in at most 5 characters, SI prefixes: 999, 1.2k, 12k, 123M.
std::string ShortNumber(double v);

// Rates between `before` and `after` (after.at later). A counter that went
// down (the node restarted) counts from zero; a node absent from `before`
// has no rates yet.
TopView ComputeTop(const TopSample& before, const TopSample& after);

// One line of JSON (hymctl top --json prints one per refresh).
std::string TopJson(const TopView& view);

// The table (fits 80 columns).
void PrintTop(std::ostream& out, const TopView& view);

}  // namespace hymcache::hymctl
