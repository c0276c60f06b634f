#include "storage_node/dataplane/kv_manager.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <string>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "common/fake_clock.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/device/fake_memory_device.h"

namespace hymcache::storage {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// A device of `objects` 1 MiB objects, each written through the extent
// table with generation i + 1 and filled with byte i.
struct Rig {
  explicit Rig(int objects, KvManagerOptions o = {}) : dev(objects * kMiB) {
    ExtentTableOptions eo;
    eo.regions = dev.Regions();
    eo.drain_timeout = absl::Milliseconds(100);
    extents = std::move(*ExtentTable::Create(eo));
    for (int i = 0; i < objects; ++i) {
      ExtentKey k{0, i * kMiB, kMiB, static_cast<uint64_t>(i + 1)};
      auto t = extents->BeginWrite(k);
      REQUIRE(t.ok());
      std::memset(dev.DataForTest() + k.addr, i, kMiB);
      REQUIRE(t->Commit().ok());
      keys.push_back(k);
    }
    o.device = &dev;
    o.extents = extents.get();
    o.clock = &clock;
    auto m = KvManager::Create(o);
    REQUIRE(m.ok());
    kv = std::move(*m);
  }
  std::vector<ExtentKey> Keys(int from, int to) const {
    return std::vector<ExtentKey>(keys.begin() + from, keys.begin() + to);
  }
  // Reads object i through `session` and checks its bytes.
  void Read(uint64_t session, int i) {
    auto r = kv->AcquireRead(session, keys[i], Soon());
    REQUIRE(r.ok());
    REQUIRE(r->length() == kMiB);
    CHECK(r->data()[0] == static_cast<uint8_t>(i));
    CHECK(r->data()[kMiB - 1] == static_cast<uint8_t>(i));
    kv->FinishRead(std::move(*r));
  }

  FakeClock clock;
  FakeMemoryDevice dev;
  std::unique_ptr<ExtentTable> extents;
  std::vector<ExtentKey> keys;
  std::unique_ptr<KvManager> kv;
};

bool AllOk(const std::vector<absl::Status>& v) {
  for (const auto& s : v) {
    if (!s.ok()) return false;
  }
  return true;
}

TEST_CASE("a session stages at most its window ahead of its reads") {
  KvManagerOptions o;
  o.window_bytes = 4 * kMiB;
  Rig rig(20, o);
  REQUIRE(AllOk(rig.kv->Prefetch(7, rig.Keys(0, 20))));
  KvManagerStats st = rig.kv->Stats();
  CHECK(st.sessions == 1);
  CHECK(st.staging_objects == 4);
  CHECK(st.queued_objects == 16);
  CHECK(st.staged_ahead_bytes == 4 * kMiB);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 4);

  for (int i = 0; i < 20; ++i) {
    rig.Read(7, i);
    // Each read releases its object and issues the next one.
    CHECK(rig.dev.OutstandingPrefetchBytesForTest() <=
          static_cast<int64_t>(4 * kMiB));
  }
  st = rig.kv->Stats();
  CHECK(st.sessions == 0);  // fully read: the session is gone
  CHECK(st.staged_reads == 20);
  CHECK(st.ready_reads == 20);  // the fake device stages at once
  CHECK(st.waited_reads == 0);
  CHECK(st.released_unread == 0);
  CHECK(rig.dev.PrefetchesForTest() == 20);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 0);
}

TEST_CASE("a read that finds its object still staging counts as waited") {
  Rig rig(3);
  REQUIRE(AllOk(rig.kv->Prefetch(5, rig.Keys(0, 3))));
  rig.Read(5, 0);
  rig.dev.SetNotReadyProbesForTest(1);
  rig.Read(5, 1);
  rig.Read(5, 2);
  const KvManagerStats st = rig.kv->Stats();
  CHECK(st.staged_reads == 3);
  CHECK(st.ready_reads == 2);
  CHECK(st.waited_reads == 1);
  // Exported with the wait histogram, one observation.
  FlatStatsVisitor flat;
  rig.kv->VisitStats(&flat);
  std::map<std::string, double> m(flat.values().begin(), flat.values().end());
  CHECK(m.at("waited_reads") == 1);
  CHECK(m.at("ready_reads") == 2);
  CHECK(m.at("wait_seconds_count") == 1);
  CHECK(m.at("sessions") == 0);
}

TEST_CASE("hints for objects already in the session cost nothing") {
  Rig rig(4);
  REQUIRE(AllOk(rig.kv->Prefetch(1, rig.Keys(0, 4))));
  REQUIRE(AllOk(rig.kv->Prefetch(1, rig.Keys(0, 4))));
  CHECK(rig.kv->Stats().duplicate_hints == 4);
  CHECK(rig.dev.PrefetchesForTest() == 4);
  for (int i = 0; i < 4; ++i) rig.Read(1, i);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 0);
}

TEST_CASE("the staging window is shared fairly between sessions") {
  KvManagerOptions o;
  o.window_bytes = 8 * kMiB;
  o.staging_capacity = 8 * kMiB;
  Rig rig(20, o);
  REQUIRE(AllOk(rig.kv->Prefetch(1, rig.Keys(0, 10))));
  CHECK(rig.kv->Stats().staging_objects == 8);  // alone: the whole window
  REQUIRE(AllOk(rig.kv->Prefetch(2, rig.Keys(10, 20))));
  // The newcomer gets its share (half) at once; the first session keeps
  // what it staged but issues nothing more until it is under its share.
  CHECK(rig.kv->Stats().staging_objects == 12);
  for (int i = 0; i < 5; ++i) rig.Read(1, i);
  // Session 1 has 5 objects left, at most its 4 MiB share staged.
  KvManagerStats st = rig.kv->Stats();
  CHECK(st.staged_ahead_bytes == 8 * kMiB);
  // Session 2 is cancelled: session 1 may use the whole window again.
  REQUIRE(AllOk(rig.kv->Release(2, {})));
  st = rig.kv->Stats();
  CHECK(st.sessions == 1);
  CHECK(st.staging_objects == 5);
  CHECK(st.queued_objects == 0);
  for (int i = 5; i < 10; ++i) rig.Read(1, i);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 0);
  CHECK(rig.kv->Stats().released_unread == 10);
}

TEST_CASE("a session that stops reading is released after its timeout") {
  KvManagerOptions o;
  o.session_timeout = absl::Seconds(5);
  o.window_bytes = 2 * kMiB;
  Rig rig(6, o);
  REQUIRE(AllOk(rig.kv->Prefetch(1, rig.Keys(0, 3))));
  REQUIRE(AllOk(rig.kv->Prefetch(2, rig.Keys(3, 6))));
  rig.clock.Advance(absl::Seconds(3));
  rig.Read(2, 3);  // session 2 is active
  CHECK(rig.kv->ReapExpired() == 0);
  rig.clock.Advance(absl::Seconds(3));
  CHECK(rig.kv->ReapExpired() == 1);  // session 1 idle for 6 s
  KvManagerStats st = rig.kv->Stats();
  CHECK(st.sessions == 1);
  CHECK(st.expired_sessions == 1);
  CHECK(st.released_unread == 3);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 2);  // session 2's
  // The expired session's objects are read the ordinary way from now on.
  CHECK(rig.kv->AcquireRead(1, rig.keys[0], Soon()).status().code() ==
        absl::StatusCode::kNotFound);

  // An object being read keeps its session alive past the timeout.
  auto r = rig.kv->AcquireRead(2, rig.keys[4], Soon());
  REQUIRE(r.ok());
  rig.clock.Advance(absl::Seconds(10));
  CHECK(rig.kv->ReapExpired() == 0);
  rig.kv->FinishRead(std::move(*r));
  rig.clock.Advance(absl::Seconds(10));
  CHECK(rig.kv->ReapExpired() == 1);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 0);
}

TEST_CASE("release of a cancelled load frees its staging") {
  KvManagerOptions o;
  o.window_bytes = 3 * kMiB;
  Rig rig(8, o);
  REQUIRE(AllOk(rig.kv->Prefetch(9, rig.Keys(0, 8))));
  rig.Read(9, 0);
  auto r = rig.kv->AcquireRead(9, rig.keys[1], Soon());
  REQUIRE(r.ok());
  // Releasing one object, then all: the one being read stays valid until
  // its read finishes.
  std::vector<absl::Status> one = rig.kv->Release(9, rig.Keys(5, 6));
  CHECK(one[0].ok());
  CHECK(rig.kv->Release(9, rig.Keys(5, 6))[0].code() ==
        absl::StatusCode::kNotFound);
  REQUIRE(AllOk(rig.kv->Release(9, {})));
  CHECK(r->data()[0] == 1);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 1);
  CHECK(rig.kv->Stats().sessions == 1);
  rig.kv->FinishRead(std::move(*r));
  CHECK(rig.kv->Stats().sessions == 0);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 0);
  CHECK(rig.kv->AcquireRead(9, rig.keys[2], Soon()).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(rig.kv->Release(9, {}).empty());
}

TEST_CASE("stale and unknown objects are never staged") {
  Rig rig(4);
  ExtentKey stale = rig.keys[1];
  stale.generation = 99;  // not what is stored there
  ExtentKey outside{0, 100 * kMiB, kMiB, 1};
  std::vector<absl::Status> st =
      rig.kv->Prefetch(3, {rig.keys[0], stale, outside});
  CHECK(st[0].ok());
  CHECK(st[1].code() == absl::StatusCode::kNotFound);
  CHECK(st[2].code() == absl::StatusCode::kNotFound);
  CHECK(rig.kv->Stats().dropped_stale == 2);
  CHECK(rig.kv->AcquireRead(3, stale, Soon()).status().code() ==
        absl::StatusCode::kNotFound);
  rig.Read(3, 0);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 0);
}

TEST_CASE("an object overwritten while queued is dropped, not staged") {
  KvManagerOptions o;
  o.window_bytes = kMiB;
  Rig rig(3, o);
  REQUIRE(AllOk(rig.kv->Prefetch(5, rig.Keys(0, 3))));
  // Object 2 is still queued; its space is reused by a newer allocation.
  ExtentKey newer = rig.keys[2];
  newer.generation = 50;
  auto t = rig.extents->BeginWrite(newer);
  REQUIRE(t.ok());
  REQUIRE(t->Commit().ok());
  rig.Read(5, 0);
  rig.Read(5, 1);
  CHECK(rig.kv->AcquireRead(5, rig.keys[2], Soon()).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(rig.kv->Stats().sessions == 0);
}

TEST_CASE("a staged object pins its space against overwrites") {
  Rig rig(2);
  REQUIRE(AllOk(rig.kv->Prefetch(5, rig.Keys(0, 1))));
  ExtentKey newer = rig.keys[0];
  newer.generation = 50;
  // The writer waits for the staged copy (drain_timeout 100 ms), then fails.
  CHECK(rig.extents->BeginWrite(newer).status().code() ==
        absl::StatusCode::kUnavailable);
  REQUIRE(AllOk(rig.kv->Release(5, {})));
  CHECK(rig.extents->BeginWrite(newer).ok());
}

TEST_CASE("session limits refuse hints with ResourceExhausted") {
  KvManagerOptions o;
  o.max_sessions = 1;
  o.max_objects_per_session = 2;
  Rig rig(4, o);
  std::vector<absl::Status> st = rig.kv->Prefetch(1, rig.Keys(0, 3));
  CHECK(st[0].ok());
  CHECK(st[1].ok());
  CHECK(st[2].code() == absl::StatusCode::kResourceExhausted);
  st = rig.kv->Prefetch(2, rig.Keys(3, 4));
  CHECK(st[0].code() == absl::StatusCode::kResourceExhausted);
  CHECK(rig.kv->Stats().refused_hints == 2);
}

// Think-time hints (kv_manager_hints.cc). A window of 8 objects; hints may
// hold half of it unless a case says otherwise.
KvManagerOptions HintOptions(double share = 0.5) {
  KvManagerOptions o;
  o.window_bytes = 4 * kMiB;
  o.staging_capacity = 8 * kMiB;
  o.hint_share = share;
  return o;
}

TEST_CASE("think-time hints stage within their share of the window") {
  Rig rig(12, HintOptions());
  REQUIRE(AllOk(
      rig.kv->HintTurn(rig.Keys(0, 10), absl::Seconds(5), absl::Seconds(30))));
  KvManagerStats st = rig.kv->Stats();
  CHECK(st.turn_hints == 10);
  CHECK(st.turn_hints_held == 10);
  CHECK(st.turn_hints_staged == 4);
  CHECK(st.turn_hint_bytes == 4 * kMiB);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 4);
}

TEST_CASE("the next turn's request finds its hinted blocks staged") {
  Rig rig(12, HintOptions());
  REQUIRE(AllOk(
      rig.kv->HintTurn(rig.Keys(0, 4), absl::Seconds(5), absl::Seconds(30))));
  REQUIRE(rig.kv->Stats().turn_hints_staged == 4);
  const int64_t prefetches = rig.dev.PrefetchesForTest();
  // The request's session joins the staged copies and the hints end.
  REQUIRE(AllOk(rig.kv->Prefetch(7, rig.Keys(0, 4))));
  KvManagerStats st = rig.kv->Stats();
  CHECK(st.turn_hint_hits == 4);
  CHECK(st.turn_hint_late == 0);
  CHECK(st.turn_hints_held == 0);
  CHECK(st.turn_hint_bytes == 0);
  CHECK(rig.dev.PrefetchesForTest() == prefetches + 4);  // handles, shared
  for (int i = 0; i < 4; ++i) rig.Read(7, i);            // the right bytes
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 0);
}

TEST_CASE("hints wait while a request waits and give their space back") {
  Rig rig(20, HintOptions(/*share=*/1.0));
  // Objects 0-3 expected in 1 s, 4-7 in 10 s: the whole window.
  REQUIRE(AllOk(
      rig.kv->HintTurn(rig.Keys(0, 4), absl::Seconds(1), absl::Seconds(30))));
  REQUIRE(AllOk(
      rig.kv->HintTurn(rig.Keys(4, 8), absl::Seconds(10), absl::Seconds(30))));
  REQUIRE(rig.kv->Stats().turn_hint_bytes == 8 * kMiB);
  // A request of other blocks takes its 4 objects of window from the hints
  // expected last; its other objects wait in its queue, and no hint is
  // staged meanwhile.
  REQUIRE(AllOk(rig.kv->Prefetch(1, rig.Keys(10, 16))));
  KvManagerStats st = rig.kv->Stats();
  CHECK(st.turn_hints_yielded == 4);
  CHECK(st.turn_hint_bytes == 4 * kMiB);
  CHECK(st.staged_ahead_bytes == 4 * kMiB);
  CHECK(st.turn_hints_held == 8);
  // The hints expected soonest are the ones still staged.
  REQUIRE(AllOk(rig.kv->Prefetch(2, rig.Keys(0, 1))));
  CHECK(rig.kv->Stats().turn_hint_hits == 1);
  REQUIRE(AllOk(rig.kv->Release(2, {})));
  for (int i = 10; i < 16; ++i) {
    rig.Read(1, i);
    CHECK(rig.dev.OutstandingPrefetchBytesForTest() <=
          static_cast<int64_t>(8 * kMiB));
  }
  // The window is idle again: the yielded hints are staged once more.
  st = rig.kv->Stats();
  CHECK(st.sessions == 0);
  CHECK(st.turn_hints_held == 7);
  CHECK(st.turn_hint_bytes == 7 * kMiB);
  REQUIRE(AllOk(rig.kv->Prefetch(3, rig.Keys(4, 8))));
  CHECK(rig.kv->Stats().turn_hint_hits == 5);
  CHECK(rig.kv->Stats().turn_hint_late == 0);
}

TEST_CASE("a prefix hinted by several conversations stays staged for each") {
  Rig rig(12, HintOptions());
  // Two conversations share objects 0 and 1 (a system prompt).
  const std::vector<ExtentKey> first = rig.Keys(0, 4);
  const std::vector<ExtentKey> second = {rig.keys[0], rig.keys[1], rig.keys[4],
                                         rig.keys[5]};
  REQUIRE(AllOk(rig.kv->HintTurn(first, absl::Seconds(5), absl::Seconds(30))));
  REQUIRE(AllOk(rig.kv->HintTurn(second, absl::Seconds(9), absl::Seconds(30))));
  CHECK(rig.kv->Stats().turn_hints_held == 6);
  // A new conversation reading the system prompt ends nobody's turn.
  REQUIRE(AllOk(rig.kv->Prefetch(9, rig.Keys(0, 2))));
  rig.Read(9, 0);
  rig.Read(9, 1);
  rig.clock.Advance(absl::Seconds(2));  // hint_turn_grace
  rig.kv->ReapExpired();
  CHECK(rig.kv->Stats().turn_hints_held == 6);
  // The first's turn: 2 and 3 end with its read, 0 and 1 wait for the
  // second conversation.
  REQUIRE(AllOk(rig.kv->Prefetch(1, first)));
  for (int i = 0; i < 4; ++i) rig.Read(1, i);
  rig.clock.Advance(absl::Seconds(2));
  rig.kv->ReapExpired();
  KvManagerStats st = rig.kv->Stats();
  CHECK(st.turn_hints_held == 4);
  CHECK(st.turn_hint_bytes == 4 * kMiB);
  REQUIRE(AllOk(rig.kv->Prefetch(2, second)));
  st = rig.kv->Stats();
  CHECK(st.turn_hint_hits == 2 + 4 + 4);
  CHECK(st.turn_hint_late == 0);
  CHECK(st.turn_hints_held == 0);
  CHECK(st.turn_hints_unused == 0);
}

TEST_CASE("queued hints are staged soonest expected first") {
  Rig rig(12, HintOptions(/*share=*/0.25));  // 2 objects
  REQUIRE(AllOk(rig.kv->HintTurn(rig.Keys(0, 2), absl::Seconds(30),
                                 absl::Seconds(30))));  // staged
  REQUIRE(AllOk(rig.kv->HintTurn(rig.Keys(2, 4), absl::Seconds(30),
                                 absl::Seconds(30))));  // queued
  REQUIRE(AllOk(rig.kv->HintTurn(rig.Keys(4, 6), absl::Seconds(1),
                                 absl::Seconds(30))));  // queued
  REQUIRE(AllOk(rig.kv->Prefetch(1, rig.Keys(0, 2))));  // claims 0, 1
  rig.Read(1, 0);
  rig.Read(1, 1);
  // 4 and 5 (expected in 1 s) went ahead of 2 and 3 (in 30 s).
  REQUIRE(AllOk(rig.kv->Prefetch(2, rig.Keys(2, 6))));
  const KvManagerStats st = rig.kv->Stats();
  CHECK(st.turn_hint_hits == 4);  // 0, 1, 4, 5
  CHECK(st.turn_hint_late == 2);  // 2, 3
}

TEST_CASE("a turn's read releases the objects of its hint it did not read") {
  Rig rig(12, HintOptions());
  REQUIRE(AllOk(
      rig.kv->HintTurn(rig.Keys(0, 4), absl::Seconds(1), absl::Seconds(60))));
  // The next turn reads 0-2 (block 3 was a partial block, recomputed).
  REQUIRE(AllOk(rig.kv->Prefetch(1, rig.Keys(0, 3))));
  for (int i = 0; i < 3; ++i) rig.Read(1, i);
  // Block 3 stays for the rest of the turn's load (more prefetch lists and
  // reads may follow), then goes.
  rig.clock.Advance(absl::Milliseconds(1999));
  rig.kv->ReapExpired();
  CHECK(rig.kv->Stats().turn_hints_held == 1);
  rig.clock.Advance(absl::Milliseconds(1));
  rig.kv->ReapExpired();
  KvManagerStats st = rig.kv->Stats();
  CHECK(st.turn_hint_hits == 3);
  CHECK(st.turn_hints_unused == 1);
  CHECK(st.turn_hints_held == 0);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 0);
  // Plain reads (no session) claim and release the same way.
  REQUIRE(AllOk(
      rig.kv->HintTurn(rig.Keys(4, 7), absl::Seconds(1), absl::Seconds(60))));
  rig.kv->EndHintsOfReads(rig.Keys(4, 6));
  rig.clock.Advance(absl::Seconds(2));
  rig.kv->ReapExpired();
  st = rig.kv->Stats();
  CHECK(st.turn_hint_hits == 5);
  CHECK(st.turn_hints_unused == 2);
  CHECK(st.turn_hints_held == 0);
}

TEST_CASE("an unclaimed hint is released when its hold runs out") {
  Rig rig(12, HintOptions());
  REQUIRE(AllOk(
      rig.kv->HintTurn(rig.Keys(0, 6), absl::Seconds(1), absl::Seconds(2))));
  rig.clock.Advance(absl::Seconds(2));
  rig.kv->ReapExpired();
  CHECK(rig.kv->Stats().turn_hints_held == 6);  // 3 s not over
  rig.clock.Advance(absl::Seconds(1));
  rig.kv->ReapExpired();
  const KvManagerStats st = rig.kv->Stats();
  CHECK(st.turn_hints_held == 0);
  CHECK(st.turn_hints_wasted == 4);   // staged, never read
  CHECK(st.turn_hints_expired == 2);  // never staged
  CHECK(st.turn_hint_bytes == 0);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 0);
}

TEST_CASE("hinting again extends the hold and each hint must end") {
  Rig rig(12, HintOptions());
  REQUIRE(AllOk(
      rig.kv->HintTurn(rig.Keys(0, 2), absl::Seconds(1), absl::Seconds(1))));
  rig.clock.Advance(absl::Seconds(1));
  REQUIRE(AllOk(
      rig.kv->HintTurn(rig.Keys(0, 2), absl::Seconds(1), absl::Seconds(5))));
  rig.clock.Advance(absl::Seconds(3));
  rig.kv->ReapExpired();
  CHECK(rig.kv->Stats().turn_hints_held == 2);
  std::vector<absl::Status> st = rig.kv->HintTurn(
      rig.Keys(0, 3), absl::ZeroDuration(), absl::ZeroDuration());
  CHECK(st[0].ok());
  CHECK(st[1].ok());
  CHECK(st[2].code() == absl::StatusCode::kNotFound);
  CHECK(rig.kv->Stats().turn_hints_cancelled == 2);
  CHECK(rig.kv->Stats().turn_hints_held == 2);  // hinted twice: one left
  REQUIRE(AllOk(rig.kv->HintTurn(rig.Keys(0, 2), absl::ZeroDuration(),
                                 absl::ZeroDuration())));
  CHECK(rig.kv->Stats().turn_hints_held == 0);
  CHECK(rig.dev.OutstandingPrefetchesForTest() == 0);
}

TEST_CASE("hints beyond max_hints are refused and stale ones never staged") {
  KvManagerOptions o = HintOptions();
  o.max_hints = 3;
  Rig rig(12, o);
  ExtentKey stale = rig.keys[1];
  stale.generation = 99;
  std::vector<absl::Status> st =
      rig.kv->HintTurn({rig.keys[0], stale, rig.keys[2], rig.keys[3]},
                       absl::Seconds(1), absl::Seconds(10));
  CHECK(st[0].ok());
  CHECK(st[1].ok());  // advice: found out when staged
  CHECK(st[2].ok());
  CHECK(st[3].code() == absl::StatusCode::kResourceExhausted);
  const KvManagerStats s = rig.kv->Stats();
  CHECK(s.turn_hints_refused == 1);
  CHECK(s.dropped_stale == 1);
  CHECK(s.turn_hints_held == 2);
  CHECK(s.turn_hints_staged == 2);
}

TEST_CASE("hint refills are paced: at most max_hint_refills in flight") {
  KvManagerOptions o = HintOptions();
  o.max_hint_refills = 2;
  Rig rig(12, o);
  rig.dev.SetNotReadyProbesForTest(1 << 30);  // every refill still running
  REQUIRE(AllOk(
      rig.kv->HintTurn(rig.Keys(0, 4), absl::Seconds(1), absl::Seconds(60))));
  CHECK(rig.kv->Stats().turn_hints_staged == 2);
  rig.kv->ReapExpired();  // a pump: the refills are still running
  CHECK(rig.kv->Stats().turn_hints_staged == 2);
  CHECK(rig.kv->Stats().turn_hint_refills == 2);
  // The refills finish: the next pump (the reaper's here, "kv-hints"' in
  // a node) notices and stages the other two.
  rig.dev.SetNotReadyProbesForTest(0);
  rig.kv->ReapExpired();
  CHECK(rig.kv->Stats().turn_hints_staged == 4);
}

TEST_CASE("hint refills start only while no request loads (hints_when_idle)") {
  for (const bool idle_only : {true, false}) {
    CAPTURE(idle_only);
    KvManagerOptions o = HintOptions();
    o.hints_when_idle = idle_only;
    Rig rig(12, o);
    // A request whose 2 objects are all issued (nothing waits for window
    // space), still reading.
    REQUIRE(AllOk(rig.kv->Prefetch(7, rig.Keys(8, 10))));
    REQUIRE(rig.kv->Stats().queued_objects == 0);
    REQUIRE(AllOk(
        rig.kv->HintTurn(rig.Keys(0, 3), absl::Seconds(1), absl::Seconds(60))));
    rig.kv->ReapExpired();  // a pump
    CHECK(rig.kv->Stats().turn_hints_staged == (idle_only ? 0 : 3));
    CHECK(rig.kv->Stats().turn_hints_held == 3);
    rig.Read(7, 8);
    CHECK(rig.kv->Stats().turn_hints_staged == (idle_only ? 0 : 3));
    // The request's last read ends its session: the device is idle.
    rig.Read(7, 9);
    CHECK(rig.kv->Stats().sessions == 0);
    CHECK(rig.kv->Stats().turn_hints_staged == 3);
    REQUIRE(AllOk(rig.kv->Prefetch(8, rig.Keys(0, 3))));
    CHECK(rig.kv->Stats().turn_hint_hits == 3);
    for (int i = 0; i < 3; ++i) rig.Read(8, i);
  }
}

TEST_CASE("without a staging window hints are accepted and stage nothing") {
  Rig rig(4);  // staging_capacity 0: a DRAM device
  REQUIRE(AllOk(
      rig.kv->HintTurn(rig.Keys(0, 4), absl::Seconds(1), absl::Seconds(10))));
  const KvManagerStats st = rig.kv->Stats();
  CHECK(st.turn_hints == 4);
  CHECK(st.turn_hints_held == 0);
  CHECK(rig.dev.PrefetchesForTest() == 0);
}

TEST_CASE("bad options are refused") {
  FakeMemoryDevice dev(kMiB);
  KvManagerOptions o;
  CHECK(KvManager::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.device = &dev;
  ExtentTableOptions eo;
  eo.regions = dev.Regions();
  auto extents = std::move(*ExtentTable::Create(eo));
  o.extents = extents.get();
  o.window_bytes = 0;
  CHECK_FALSE(KvManager::Create(o).ok());
  o.window_bytes = kMiB;
  CHECK(KvManager::Create(o).ok());
  o.hint_share = 1.5;
  CHECK_FALSE(KvManager::Create(o).ok());
  o.hint_share = 0.5;
  o.max_hints = 0;
  CHECK_FALSE(KvManager::Create(o).ok());
  o.max_hints = 1;
  o.max_hint_refills = 0;
  CHECK_FALSE(KvManager::Create(o).ok());
}

}  // namespace
}  // namespace hymcache::storage
