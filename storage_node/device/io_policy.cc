#include "storage_node/device/io_policy.h"

#include <algorithm>

namespace hymcache::storage {

int IoPolicy::ReservedForWrites(const IoQueueState& s) const {
  if (s.writes_queued == 0) return 0;
  return std::max(0, std::min(s.write_slots, depth_ - 1) - s.writes_in_flight);
}

IoIssue IoPolicy::Next(const IoQueueState& s) const {
  IoIssue out;
  const int in_flight = s.reads_in_flight + s.writes_in_flight;
  const int read_room = depth_ - ReservedForWrites(s) - in_flight;
  out.reads = std::max(0, std::min(s.reads_queued, read_room));
  const int room = depth_ - in_flight - out.reads;
  const int write_room = s.write_slots - s.writes_in_flight;
  out.writes = std::max(0, std::min({s.writes_queued, write_room, room}));
  return out;
}

}  // namespace hymcache::storage
