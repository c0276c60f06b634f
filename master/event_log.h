// EventLog: the master's KV events (proto KvEvent: blocks stored and
// removed, nodes up and down) in a bounded buffer with sequence numbers,
// read by WatchEvents subscribers (routers, hymctl events) from where they
// left off.
//
// Sequences start at 1 in each master process, whose stream_id (random,
// non-zero) a subscriber sends back to resume; a subscriber of another
// stream (a restarted master, a new leader) starts from the oldest event
// held and is told what it missed. The buffer keeps the last `capacity`
// events: a subscriber that falls further behind is told the range it
// missed (WatchEventsResponse.missed_from/to) and rebuilds its view.
//
// Thread safety: safe for concurrent use; Append is called under
// MasterService's lock (EventLog's own mutex is a leaf).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "common/mutex.h"
#include "proto/master.pb.h"

namespace hymcache {
namespace master {

class EventLog {
 public:
  // capacity 0: no events are kept (every one is missed; MasterService
  // then makes none).
  explicit EventLog(size_t capacity);

  uint64_t stream_id() const { return stream_id_; }
  size_t capacity() const { return capacity_; }

  // Gives `event` the next sequence number and keeps it (dropping the
  // oldest beyond capacity).
  void Append(hymcache::v1::KvEvent event);

  // Up to `max_events` events after `after_sequence` of stream `stream_id`
  // (see the file comment), with the missed range and the latest sequence.
  void Read(uint64_t stream_id, uint64_t after_sequence, size_t max_events,
            hymcache::v1::WatchEventsResponse* out) const;

  // The last sequence issued (0: none yet).
  uint64_t latest() const;

 private:
  const size_t capacity_;
  const uint64_t stream_id_;
  mutable Mutex mu_;
  std::deque<hymcache::v1::KvEvent> events_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace master
}  // namespace hymcache
