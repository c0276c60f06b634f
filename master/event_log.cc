#include "master/event_log.h"

#include <algorithm>
#include <random>
#include <utility>

namespace hymcache {
namespace master {

namespace {

uint64_t NewStreamId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) ^ rd();
  return id;
}

}  // namespace

EventLog::EventLog(size_t capacity)
    : capacity_(capacity), stream_id_(NewStreamId()) {}

void EventLog::Append(hymcache::v1::KvEvent event) {
  MutexLock l(&mu_);
  event.set_sequence(next_sequence_++);
  if (capacity_ == 0) return;
  if (events_.size() == capacity_) events_.pop_front();
  events_.push_back(std::move(event));
}

uint64_t EventLog::latest() const {
  MutexLock l(&mu_);
  return next_sequence_ - 1;
}

void EventLog::Read(uint64_t stream_id, uint64_t after_sequence,
                    size_t max_events,
                    hymcache::v1::WatchEventsResponse* out) const {
  out->set_stream_id(stream_id_);
  MutexLock l(&mu_);
  const uint64_t latest = next_sequence_ - 1;
  out->set_latest_sequence(latest);
  // Another stream's position means nothing here: from our first event.
  uint64_t after = stream_id == stream_id_ ? after_sequence : 0;
  if (after > latest) after = latest;  // ahead of us: nothing to send
  const uint64_t oldest =
      events_.empty() ? latest + 1 : events_.front().sequence();
  if (after + 1 < oldest) {
    out->set_missed_from(after + 1);
    out->set_missed_to(oldest - 1);
    after = oldest - 1;
  }
  if (events_.empty()) return;
  const size_t first = static_cast<size_t>(after + 1 - oldest);
  const size_t n = std::min(max_events, events_.size() - std::min(first, events_.size()));
  for (size_t i = 0; i < n; ++i) *out->add_events() = events_[first + i];
}

}  // namespace master
}  // namespace hymcache
