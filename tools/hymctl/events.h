// hymctl events: follows the master's KV events (WatchEvents, docs/
// deployment.md "KV events"), one line per event (JSON lines with --json),
// resuming where the stream broke; and the key spelling every hymctl JSON
// output shares.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "proto/master.grpc.pb.h"

namespace hymcache::hymctl {

// `key` as text, or as hex if it has bytes outside printable ASCII.
std::string Printable(const std::string& key);
// Sets j[field] to Printable(key) and j[field + "_encoding"] to "text" or
// "hex".
void PutKey(nlohmann::json& j, const std::string& field,
            const std::string& key);

struct EventsOptions {
  // Resume after this event of this stream (0, 0: every event held).
  uint64_t stream_id = 0;
  uint64_t after_sequence = 0;
  // Stop after this many events (0: follow until interrupted).
  int count = 0;
  bool json = false;
};

// Prints events from `stub` (the leader). A broken stream is reopened
// after the last event printed, for as long as the master answers within
// `timeout_seconds`. Returns the exit code: 0 (count reached), 1 (the
// master stopped answering).
int FollowEvents(hymcache::v1::MasterService::Stub* stub,
                 const EventsOptions& options, double timeout_seconds,
                 std::ostream& out, std::ostream& err);

}  // namespace hymcache::hymctl
