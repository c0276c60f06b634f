// hymbench results: what happened to each request of a replay, aggregated per
// turn (multi-turn workloads) or per window of trace time, and overall.
// Printed as a table for people and as CSV / JSON for plotting.
//
// Definitions (per group):
//   prefix hit ratio   = loaded blocks / blocks
//   ceiling hit ratio  = infinite-cache hits / blocks (see trace.h)
//   load bandwidth     = loaded bytes / summed wall time of the Load calls,
//                        in GB/s (1e9 bytes/s): what one request sees, not
//                        the aggregate of concurrent requests (the overall
//                        line also gives loaded bytes / run wall time)
//   p50 / p99 load ms  = nearest-rank percentiles of the wall time of the
//                        successful Load calls
//   stored / skipped / refused / failed = blocks the asynchronous Stores
//                        wrote, found already stored, were refused (no room,
//                        write buffer or store queue full) and lost to other
//                        errors; dropped = blocks hymbench did not hand to
//                        Store because its in-flight store budget was full.
//   lost by reason     = ceiling hits that were not loaded, by LossReason.
//
// Thread safety: free functions on values; no shared state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace hymcache::hymbench {

// Why a block the infinite cache would have served (a ceiling hit) was not
// loaded. For a request, the blocks in [hit_prefix, ceiling_hits) are lost
// to what had become of the first of them (block hit_prefix) when the
// request's Load started, and the blocks in [loaded, hit_prefix) to why the
// Load stopped (LoadResult::stop_reason; a whole-call Load error loses
// every ceiling hit to its code).
enum class LossReason {
  // Its store had not finished (or not started: the request that computes
  // it was still running) when the request came.
  kInFlight,
  // Refused by admission (ResourceExhausted): the master found no node
  // with room (or a quota / caller limit), ...
  kRefusedNoRoom,
  // ... the node's write buffer was full, ...
  kRefusedWriteBuffer,
  // ... or the client's store queue was full ("N stores already pending").
  kRefusedStoreQueue,
  // hymbench did not hand it to Store: its in-flight store budget
  // (max_store_bytes_in_flight) or its wait for a store slot ran out.
  kDropped,
  // The store's or the Load's deadline passed.
  kDeadline,
  // A node or the master failed the store or the read (Unavailable and
  // other errors).
  kNodeError,
  // It was stored but the lookup or the read no longer found it (evicted,
  // or the object vanished).
  kNotFound,
  // Anything else (e.g. a buffer too small).
  kOther,
};
inline constexpr int kLossReasons = 9;
// "in_flight", "refused_no_room", "refused_write_buffer",
// "refused_store_queue", "dropped", "deadline", "node_error", "not_found",
// "other": the names in the outputs.
const char* LossReasonName(LossReason reason);
using LossCounts = std::array<size_t, kLossReasons>;

// What happened to one request.
struct RequestRecord {
  // Position in the trace (0-based).
  size_t index = 0;
  // From the trace; -1 when unknown.
  int64_t conversation = -1;
  int64_t turn = -1;
  // Arrival time in trace ms.
  double timestamp_ms = 0;

  // Blocks of the request (hash_ids.size()).
  size_t blocks = 0;
  // Leading blocks an infinite cache would have held.
  size_t ceiling_hits = 0;
  // Leading blocks the master reported stored (LoadResult::hit_prefix).
  size_t hit_prefix = 0;
  // Leading blocks loaded into the request's buffers.
  size_t loaded = 0;
  uint64_t loaded_bytes = 0;
  // Whether Load was called (not for a request without blocks).
  bool load_called = false;
  // Wall time of the Load call.
  double load_ms = 0;
  // How late the request started relative to its scheduled arrival (only
  // with a time scale; 0 when replaying as fast as possible).
  double start_delay_ms = 0;
  // Whole-call error of Load; "" if it returned a result.
  std::string load_error;
  // Why loading stopped short of hit_prefix ("" when it did not).
  std::string load_stop;
  // Loaded blocks whose bytes (or length) differed from what was stored
  // (--verify only).
  size_t corrupt_blocks = 0;

  // Blocks handed to Store: [loaded, blocks), without duplicates.
  size_t store_keys = 0;
  // Outcome of the Store, per block (see the definitions above).
  size_t stored = 0;
  size_t skipped = 0;
  size_t refused = 0;
  size_t store_failed = 0;
  size_t store_dropped = 0;
  // Whole-call error of the Store, or else its first per-block failure that
  // was not a refusal; "" if none.
  std::string store_error;

  // Ceiling hits not loaded (ceiling_hits - loaded when positive), by
  // reason (see LossReason).
  LossCounts lost{};
};

// One row of the report.
struct GroupStats {
  // "turn 3", "60-120s" or "all".
  std::string label;
  // The turn, or the window's start in seconds of trace time from the first
  // request; -1 for "all".
  double key = -1;

  size_t requests = 0;
  size_t blocks = 0;
  size_t ceiling_hits = 0;
  size_t hit_prefix = 0;
  size_t loaded = 0;
  uint64_t loaded_bytes = 0;
  // Summed wall time of the successful Load calls.
  double load_seconds = 0;
  double p50_load_ms = 0;
  double p99_load_ms = 0;
  size_t stored = 0;
  size_t skipped = 0;
  size_t refused = 0;
  size_t store_failed = 0;
  size_t store_dropped = 0;
  size_t store_errors = 0;
  size_t load_errors = 0;
  // Requests that loaded fewer blocks than the master reported stored.
  size_t short_loads = 0;
  size_t corrupt_blocks = 0;
  // Summed RequestRecord::lost.
  LossCounts lost{};

  double hit_ratio() const { return Ratio(loaded, blocks); }
  double ceiling_ratio() const { return Ratio(ceiling_hits, blocks); }
  double lookup_hit_ratio() const { return Ratio(hit_prefix, blocks); }
  // GB/s (1e9 bytes per second); 0 without load time.
  double load_gbps() const {
    return load_seconds > 0 ? loaded_bytes / load_seconds / 1e9 : 0.0;
  }

 private:
  static double Ratio(size_t a, size_t b) {
    return b == 0 ? 0.0 : static_cast<double>(a) / b;
  }
};

enum class GroupBy {
  // By turn when every request has one (synthetic workloads), else by window.
  kAuto,
  kTurn,
  kWindow,
};

struct ReportOptions {
  // Default: kAuto.
  GroupBy group_by = GroupBy::kAuto;
  // Window length in seconds of trace time (kWindow). > 0. Default: 60.
  double window_s = 60;
};

struct Report {
  // "turn" or "window".
  std::string group_by;
  // Rows in turn / window order; only non-empty groups.
  std::vector<GroupStats> groups;
  GroupStats overall;
  // Wall time of the whole replay (set by the caller; 0 if unknown).
  double wall_seconds = 0;
  // Settings of the run, echoed into the outputs (set by the caller).
  std::vector<std::pair<std::string, std::string>> config;
};

// Aggregates `records`. InvalidArgument if window_s <= 0 or group_by is
// kTurn and a record has no turn.
absl::StatusOr<Report> BuildReport(absl::Span<const RequestRecord> records,
                                   const ReportOptions& options = {});

// Nearest-rank percentile (p in [0, 100]) of `values`; 0 when empty.
double Percentile(std::vector<double> values, double p);

// Human-readable table with a summary line.
void WriteTable(const Report& report, std::ostream& out);
// One header line, then one line per group and a last "all" line.
void WriteCsv(const Report& report, std::ostream& out);
// {"config": {...}, "group_by": ..., "wall_seconds": ..., "groups": [...],
//  "overall": {...}, "requests": [...]} (requests omitted when empty).
void WriteJson(const Report& report, absl::Span<const RequestRecord> records,
               std::ostream& out);

}  // namespace hymcache::hymbench
