#include "storage_node/device/flush_policy.h"

#include <catch2/catch.hpp>

namespace hymcache::storage {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

FlushPolicyOptions Opts() {
  FlushPolicyOptions o;
  o.flush_batch_bytes = 8 * kMiB;
  o.high_watermark = 0.75;
  o.max_delay = absl::Seconds(1);
  o.depth_idle = 4;
  o.depth_under_pressure = 1;
  o.queue_depth = 64;
  return o;
}

FlushPolicyState Busy(uint64_t used_mib, uint64_t unflushed_mib) {
  FlushPolicyState s;
  s.buffer_bytes = 32 * kMiB;
  s.buffer_used = used_mib * kMiB;
  s.unflushed_bytes = unflushed_mib * kMiB;
  s.any_waiting = unflushed_mib > 0;
  s.reads_busy = true;
  return s;
}

TEST_CASE("nothing waiting is never due") {
  FlushPolicy p(Opts());
  FlushPolicyState s = Busy(30, 0);
  s.forced = true;
  absl::Duration again;
  CHECK_FALSE(p.Due(s, &again));
  CHECK(again == absl::InfiniteDuration());
}

TEST_CASE("reads idle, forced or stopping: due at once") {
  FlushPolicy p(Opts());
  absl::Duration again;
  FlushPolicyState s = Busy(1, 1);
  s.reads_busy = false;
  CHECK(p.Due(s, &again));
  s = Busy(1, 1);
  s.forced = true;
  CHECK(p.Due(s, &again));
}

TEST_CASE("under reads: a whole batch unflushed is due at once") {
  // The old policy waited for the 75% watermark or a 1 s old commit while
  // reads kept the device busy: a writer at 5% of a fast device filled the
  // buffer and lost half its writes.
  FlushPolicy p(Opts());
  absl::Duration again;
  CHECK(p.Due(Busy(8, 8), &again));
  CHECK(p.Due(Busy(9, 9), &again));
  CHECK_FALSE(p.Due(Busy(7, 7), &again));
  // Everything committed is being written already: nothing to start.
  FlushPolicyState all_in_flight = Busy(9, 9);
  all_in_flight.any_waiting = false;
  CHECK_FALSE(p.Due(all_in_flight, &again));
}

TEST_CASE("under reads: the watermark or the oldest commit's age") {
  FlushPolicy p(Opts());
  absl::Duration again;
  // 24 of 32 MiB = 75%: due, even with little waiting (most is in flight).
  CHECK(p.Due(Busy(24, 1), &again));
  FlushPolicyState young = Busy(2, 2);
  young.oldest_waiting_age = absl::Milliseconds(300);
  CHECK_FALSE(p.Due(young, &again));
  CHECK(again == absl::Milliseconds(700));
  FlushPolicyState old = young;
  old.oldest_waiting_age = absl::Seconds(1);
  CHECK(p.Due(old, &again));
}

TEST_CASE("max_delay infinite: only the batch size or the watermark") {
  FlushPolicyOptions o = Opts();
  o.max_delay = absl::InfiniteDuration();
  FlushPolicy p(o);
  absl::Duration again;
  FlushPolicyState s = Busy(2, 2);
  s.oldest_waiting_age = absl::Hours(1);
  CHECK_FALSE(p.Due(s, &again));
  CHECK(again == absl::InfiniteDuration());
}

TEST_CASE("write slots grow with the fill, floors and cap") {
  FlushPolicy p(Opts());
  // Nearly empty: the floor under reads.
  CHECK(p.WriteSlots(Busy(0, 0)) == 1);
  // 1 MiB of 32 (3.1%): ceil(64 * 0.031) = 2.
  CHECK(p.WriteSlots(Busy(1, 1)) == 2);
  // 8 of 32 = 25%: 16 slots.
  CHECK(p.WriteSlots(Busy(8, 8)) == 16);
  // Full: capped at 3/4 of the queue, the reads keep the rest.
  CHECK(p.WriteSlots(Busy(32, 32)) == 48);
  // Idle reads: at least depth_idle.
  FlushPolicyState idle = Busy(1, 1);
  idle.reads_busy = false;
  CHECK(p.WriteSlots(idle) == 4);
  idle.buffer_used = 16 * kMiB;
  CHECK(p.WriteSlots(idle) == 32);
}

TEST_CASE("equilibrium: the write share matches a 5% writer at a small fill") {
  // With reads filling the rest of the queue, the flush's share of the
  // device is about slots / queue_depth. The smallest fill whose share
  // covers a writer at 5% of the device is ~5%: far below the watermark, so
  // nothing is refused.
  FlushPolicy p(Opts());
  double fill_needed = 1;
  for (uint64_t used_kib = 0; used_kib <= 32 * 1024; used_kib += 64) {
    FlushPolicyState s = Busy(0, 1);
    s.buffer_used = used_kib * 1024;
    if (p.WriteSlots(s) / 64.0 >= 0.05) {
      fill_needed = FlushPolicy::Fill(s);
      break;
    }
  }
  CHECK(fill_needed <= 0.06);
  CHECK(fill_needed < Opts().high_watermark);
}

TEST_CASE("tiny queues still get a slot for reads and for writes") {
  FlushPolicyOptions o = Opts();
  o.queue_depth = 1;
  o.depth_idle = 1;
  FlushPolicy p(o);
  CHECK(p.WriteSlots(Busy(32, 32)) == 1);
  CHECK(p.WriteSlots(Busy(0, 0)) == 1);
}

}  // namespace
}  // namespace hymcache::storage
