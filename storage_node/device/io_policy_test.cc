#include "storage_node/device/io_policy.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <random>

#include "storage_node/device/flush_policy.h"

namespace hymcache::storage {
namespace {

IoQueueState Queues(int rq, int wq, int rif, int wif, int slots) {
  IoQueueState s;
  s.reads_queued = rq;
  s.writes_queued = wq;
  s.reads_in_flight = rif;
  s.writes_in_flight = wif;
  s.write_slots = slots;
  return s;
}

TEST_CASE("IoPolicy: nothing queued issues nothing") {
  IoPolicy p(8);
  CHECK(p.Next(Queues(0, 0, 0, 0, 4)) == IoIssue{0, 0});
  CHECK(p.Next(Queues(0, 0, 5, 3, 4)) == IoIssue{0, 0});
}

TEST_CASE("IoPolicy: reads alone fill the queue, no further") {
  IoPolicy p(8);
  CHECK(p.Next(Queues(3, 0, 0, 0, 4)) == IoIssue{3, 0});
  CHECK(p.Next(Queues(20, 0, 0, 0, 4)) == IoIssue{8, 0});
  CHECK(p.Next(Queues(20, 0, 6, 0, 4)) == IoIssue{2, 0});
  CHECK(p.Next(Queues(20, 0, 8, 0, 4)) == IoIssue{0, 0});
  // Writes in flight count against the depth too.
  CHECK(p.Next(Queues(20, 0, 2, 4, 4)) == IoIssue{2, 0});
}

TEST_CASE("IoPolicy: writes alone are capped by their slots") {
  IoPolicy p(8);
  CHECK(p.Next(Queues(0, 10, 0, 0, 3)) == IoIssue{0, 3});
  CHECK(p.Next(Queues(0, 10, 0, 2, 3)) == IoIssue{0, 1});
  CHECK(p.Next(Queues(0, 10, 0, 3, 3)) == IoIssue{0, 0});
  CHECK(p.Next(Queues(0, 2, 0, 0, 6)) == IoIssue{0, 2});
  // Reads in flight leave what the queue has left.
  CHECK(p.Next(Queues(0, 10, 7, 0, 6)) == IoIssue{0, 1});
}

TEST_CASE("IoPolicy: queued writes keep their slots from a read flood") {
  IoPolicy p(8);
  // 20 reads queued, 10 writes queued, 4 write slots: reads take 4, the
  // writes the other 4.
  CHECK(p.ReservedForWrites(Queues(20, 10, 0, 0, 4)) == 4);
  CHECK(p.Next(Queues(20, 10, 0, 0, 4)) == IoIssue{4, 4});
  // Writes already in flight use up their reservation.
  CHECK(p.ReservedForWrites(Queues(20, 10, 0, 3, 4)) == 1);
  CHECK(p.Next(Queues(20, 10, 0, 3, 4)) == IoIssue{4, 1});
  // No write queued: no reservation, even with slots to spare.
  CHECK(p.ReservedForWrites(Queues(20, 0, 0, 0, 4)) == 0);
  // Reads always keep one slot, however many the writes may have.
  CHECK(p.ReservedForWrites(Queues(20, 10, 0, 0, 64)) == 7);
  CHECK(p.Next(Queues(20, 10, 0, 0, 64)) == IoIssue{1, 7});
}

TEST_CASE("IoPolicy: a depth below 1 acts as 1") {
  IoPolicy p(0);
  CHECK(p.queue_depth() == 1);
  CHECK(p.Next(Queues(5, 5, 0, 0, 1)) == IoIssue{1, 0});
  CHECK(p.Next(Queues(0, 5, 0, 0, 1)) == IoIssue{0, 1});
}

// The device's loop without threads: each step issues what the policy
// says, then one random I/O in flight completes. Invariants hold at every
// step, and under a read flood the writes get their slots.
TEST_CASE("IoPolicy: a simulated read flood never starves the writes") {
  const int depth = 16;
  IoPolicy p(depth);
  std::mt19937 rng(7);
  int rif = 0, wif = 0;
  int writes_done = 0, reads_done = 0;
  int max_wif_seen = 0;
  for (int step = 0; step < 5000; ++step) {
    const int slots = 1 + static_cast<int>(rng() % 12);
    IoQueueState s = Queues(1000, 1000, rif, wif, slots);  // always backlogged
    const IoIssue n = p.Next(s);
    REQUIRE(n.reads >= 0);
    REQUIRE(n.writes >= 0);
    rif += n.reads;
    wif += n.writes;
    REQUIRE(rif + wif <= depth);
    // Writes never exceed their slots through the policy's own issues.
    if (n.writes > 0) REQUIRE(wif <= slots);
    // A backlog of both never leaves a slot idle that either may use.
    if (rif + wif < depth) REQUIRE(wif >= std::min(slots, depth - 1));
    max_wif_seen = std::max(max_wif_seen, wif);
    // Complete one I/O, a read or a write in proportion to what flies.
    if (rif + wif > 0) {
      if (static_cast<int>(rng() % (rif + wif)) < rif) {
        --rif;
        ++reads_done;
      } else {
        --wif;
        ++writes_done;
      }
    }
  }
  CHECK(writes_done > 1000);
  CHECK(reads_done > 1000);
  CHECK(max_wif_seen >= depth - 5);  // up to min(12, depth - 1) = 12
}

// With FlushPolicy's slots: the write share grows with the buffer's fill.
TEST_CASE("IoPolicy with FlushPolicy: write share follows the buffer fill") {
  FlushPolicyOptions fo;
  fo.queue_depth = 64;
  FlushPolicy flush(fo);
  IoPolicy io(64);
  auto writes_at = [&](uint64_t used_pct) {
    FlushPolicyState fs;
    fs.buffer_bytes = 100;
    fs.buffer_used = used_pct;
    fs.reads_busy = true;
    return io.Next(Queues(1000, 1000, 0, 0, flush.WriteSlots(fs))).writes;
  };
  CHECK(writes_at(0) == 1);     // depth_under_pressure
  CHECK(writes_at(10) == 7);    // ceil(64 x 0.10)
  CHECK(writes_at(50) == 32);
  CHECK(writes_at(100) == 48);  // three quarters at most
  CHECK(io.Next(Queues(1000, 1000, 0, 0, 48)).reads == 16);
}

}  // namespace
}  // namespace hymcache::storage
