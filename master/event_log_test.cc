#include "master/event_log.h"

#include <catch2/catch.hpp>
#include <string>

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;

v1::KvEvent Stored(const std::string& key) {
  v1::KvEvent e;
  e.set_kind(v1::KvEvent::BLOCK_STORED);
  e.set_key(key);
  return e;
}

v1::WatchEventsResponse Read(const EventLog& log, uint64_t stream,
                             uint64_t after, size_t max = 100) {
  v1::WatchEventsResponse r;
  log.Read(stream, after, max, &r);
  return r;
}

TEST_CASE("Events are numbered from 1 and read back in order from any point "
          "of the same stream") {
  EventLog log(100);
  CHECK(log.stream_id() != 0);
  CHECK(log.latest() == 0);
  for (int i = 0; i < 10; ++i) log.Append(Stored("k" + std::to_string(i)));
  CHECK(log.latest() == 10);
  auto all = Read(log, log.stream_id(), 0);
  REQUIRE(all.events_size() == 10);
  CHECK(all.stream_id() == log.stream_id());
  CHECK(all.latest_sequence() == 10);
  CHECK(all.missed_from() == 0);
  for (int i = 0; i < 10; ++i) {
    CHECK(all.events(i).sequence() == static_cast<uint64_t>(i + 1));
    CHECK(all.events(i).key() == "k" + std::to_string(i));
  }
  // Resume after 7, 2 at a time.
  auto part = Read(log, log.stream_id(), 7, 2);
  REQUIRE(part.events_size() == 2);
  CHECK(part.events(0).sequence() == 8);
  CHECK(part.events(1).sequence() == 9);
  // Caught up; ahead of the stream (a bad position) is the same.
  CHECK(Read(log, log.stream_id(), 10).events_size() == 0);
  CHECK(Read(log, log.stream_id(), 99).events_size() == 0);
}

TEST_CASE("A subscriber that fell behind the buffer is told the range it "
          "missed, then gets what is held") {
  EventLog log(4);
  for (int i = 0; i < 10; ++i) log.Append(Stored("k" + std::to_string(i)));
  auto r = Read(log, log.stream_id(), 2);
  CHECK(r.missed_from() == 3);
  CHECK(r.missed_to() == 6);
  REQUIRE(r.events_size() == 4);
  CHECK(r.events(0).sequence() == 7);
  CHECK(r.events(3).sequence() == 10);
  // Exactly at the edge: nothing missed.
  auto edge = Read(log, log.stream_id(), 6);
  CHECK(edge.missed_from() == 0);
  CHECK(edge.events_size() == 4);
}

TEST_CASE("Another stream's position starts from the oldest event held, the "
          "earlier ones reported missed") {
  EventLog log(4);
  EventLog other(4);
  CHECK(log.stream_id() != other.stream_id());
  for (int i = 0; i < 3; ++i) log.Append(Stored("k" + std::to_string(i)));
  // Nothing dropped yet: everything, nothing missed.
  auto fresh = Read(log, other.stream_id(), 2);
  CHECK(fresh.missed_from() == 0);
  CHECK(fresh.events_size() == 3);
  for (int i = 3; i < 6; ++i) log.Append(Stored("k" + std::to_string(i)));
  auto later = Read(log, 0, 0);
  CHECK(later.missed_from() == 1);
  CHECK(later.missed_to() == 2);
  REQUIRE(later.events_size() == 4);
  CHECK(later.events(0).sequence() == 3);
}

TEST_CASE("A log that keeps nothing still numbers events and reports every "
          "one missed") {
  EventLog log(0);
  log.Append(Stored("a"));
  log.Append(Stored("b"));
  auto r = Read(log, log.stream_id(), 0);
  CHECK(r.latest_sequence() == 2);
  CHECK(r.missed_from() == 1);
  CHECK(r.missed_to() == 2);
  CHECK(r.events_size() == 0);
}

}  // namespace
}  // namespace master
}  // namespace hymcache
