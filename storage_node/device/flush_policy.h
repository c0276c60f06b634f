// FlushPolicy: when the hybrid device's write buffer is flushed to the
// capacity tier, and how many of the device's I/O slots the flush may use.
// Pure functions of a snapshot of the device's state, so that the policy is
// unit-tested without threads or I/O (flush_policy_test.cc); HybridDevice
// evaluates it under its lock.
//
// The write buffer must drain at the rate it fills, or new writes are
// refused; the reads must keep the rest of the device. So:
//
//   * A batch is due when reads are idle, or a whole batch's worth
//     (flush_batch_bytes) is unflushed (the buffer drains continuously in
//     large writes instead of waiting for a high watermark while it refuses
//     writes), or the buffer is at the high watermark, or the oldest waiting
//     commit is flush_max_delay old, or the device is stopping or forced.
//   * Write slots grow with the buffer's fill: ceil(queue_depth x fill),
//     at least depth_under_pressure (depth_idle while reads are idle), at
//     most three quarters of the queue (the reads keep a quarter however
//     full the buffer is). It is a proportional controller: when reads keep
//     the queue full, the flush gets about a `fill` share of the device, so
//     the buffer settles at the fill where that share equals the incoming
//     write rate (5% for a writer at 5% of the device), instead of either
//     starving (one slot: the writer lost half its writes at 8.7 GB/s) or
//     taking bandwidth the reads need.
//
// Thread safety: stateless; the functions are safe from any thread.
#pragma once

#include <cstdint>

#include "absl/time/time.h"

namespace hymcache::storage {

struct FlushPolicyOptions {
  uint64_t flush_batch_bytes = uint64_t{8} << 20;
  double high_watermark = 0.75;
  absl::Duration max_delay = absl::Seconds(1);
  int depth_idle = 4;
  int depth_under_pressure = 1;
  int queue_depth = 64;
};

// A snapshot of the device's write side.
struct FlushPolicyState {
  uint64_t buffer_bytes = 0;   // capacity of the write buffer
  uint64_t buffer_used = 0;    // space in use (admitted, not yet freed)
  // Committed and not yet on the tier (being written included); callers
  // may stop counting at flush_batch_bytes.
  uint64_t unflushed_bytes = 0;
  // Whether a committed object is not being written yet (a batch could
  // start).
  bool any_waiting = false;
  bool reads_busy = false;     // foreground reads queued or in flight
  // Age of the oldest committed object not yet being written (zero if none).
  absl::Duration oldest_waiting_age;
  bool forced = false;  // stopping, or a caller waits for durability
};

class FlushPolicy {
 public:
  explicit FlushPolicy(const FlushPolicyOptions& options) : o_(options) {}

  // Whether a new batch should start now. When it should not only because
  // the oldest commit is not old enough yet, *recheck_after says when it
  // will be (else InfiniteDuration).
  bool Due(const FlushPolicyState& s, absl::Duration* recheck_after) const;

  // Flush writes that may be in flight now. Reads only buffer_bytes,
  // buffer_used and reads_busy.
  int WriteSlots(const FlushPolicyState& s) const;

  // Fill of the buffer in [0, 1].
  static double Fill(const FlushPolicyState& s);

  const FlushPolicyOptions& options() const { return o_; }

 private:
  const FlushPolicyOptions o_;
};

}  // namespace hymcache::storage
