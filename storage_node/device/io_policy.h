// IoPolicy: which of the hybrid device's queued I/Os are issued now. The
// device queues foreground reads (staging refills and staging misses, in
// one FIFO: a refill's chunks in order, objects in the order they were
// admitted to the window) and flush writes (in batch order); whenever
// something changes (a prefetch starts, a batch is queued, an I/O
// completes) it asks the policy how many of each queue's heads to issue.
// A pure function of a snapshot of the queues, so that it is unit-tested
// without threads or I/O (io_policy_test.cc); HybridDevice evaluates it
// under its lock, like FlushPolicy.
//
// The rule:
//   * At most queue_depth I/Os in flight in all.
//   * Reads go first, but while writes are queued they leave the writes
//     their slots: min(write_slots, queue_depth - 1) minus the writes in
//     flight stay free for writes. A steady read load (always more refills
//     queued than the queue holds) would otherwise starve the flusher, the
//     write buffer would stay full and every new write would be refused.
//     Reads always keep at least one slot.
//   * Writes fill what is left, up to write_slots in flight (FlushPolicy's
//     WriteSlots: it grows with the buffer's fill).
//
// Thread safety: stateless; safe from any thread.
#pragma once

namespace hymcache::storage {

// The device's I/O queues now.
struct IoQueueState {
  int reads_queued = 0;      // foreground reads waiting to be issued
  int writes_queued = 0;     // flush writes waiting to be issued
  int reads_in_flight = 0;
  int writes_in_flight = 0;
  int write_slots = 1;       // flush writes allowed in flight now
};

// How many of each queue's heads to issue now.
struct IoIssue {
  int reads = 0;
  int writes = 0;
  bool operator==(const IoIssue& o) const {
    return reads == o.reads && writes == o.writes;
  }
};

class IoPolicy {
 public:
  // `queue_depth` >= 1: most I/Os in flight (HybridDeviceOptions::
  // io_queue_depth).
  explicit IoPolicy(int queue_depth) : depth_(queue_depth < 1 ? 1 : queue_depth) {}

  IoIssue Next(const IoQueueState& s) const;

  // Slots kept free for queued writes while reads are queued.
  int ReservedForWrites(const IoQueueState& s) const;

  int queue_depth() const { return depth_; }

 private:
  const int depth_;
};

}  // namespace hymcache::storage
