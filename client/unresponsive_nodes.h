// UnresponsiveNodes: the storage nodes that did not answer this client,
// skipped for a while (ClientOptions::unresponsive_node_period).
//
// A node that is lost without a refusal (its host down, a link cut) answers
// nothing: each read from it waits for the whole deadline of its load, and
// the master goes on listing its blocks until it declares the node dead
// (node_timeout, 10 s by default). Without this, every request whose
// prefix has a block there would pay its full load deadline in that window.
// With it, the first call that waits for such a node marks it, and until
// the period passes the client's later calls treat its blocks as misses at
// once (a Load stops before them: the engine recomputes them), send it no
// hints, and skip it for stores (opportunistic: those blocks are not
// stored). After the period one call tries the node again. Any answer from
// the node clears the mark.
//
// What marks a node: the first op of a call to it ends DeadlineExceeded
// after the call waited at least kMinWait (a call that had less time says
// nothing about the node). A refusal does not (Unavailable: the connection
// refused or reset, e.g. a node process that died on a live host): it
// costs the caller no wait, and the node may be back in a moment.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"

namespace hymcache {

class UnresponsiveNodes {
 public:
  // A call that waited less than this before its deadline does not mark
  // its node: a healthy node answers the first op of a call well within it
  // (a hybrid node's read waits for its staging, behind the prefetches
  // queued before it), and a deadline that left less time says nothing.
  static constexpr absl::Duration kMinWait = absl::Seconds(1);

  // `period` zero: nothing is ever marked. `clock` is not owned.
  UnresponsiveNodes(Clock* clock, absl::Duration period)
      : clock_(clock), period_(period) {}

  // A call to `node` that started at `started` ended; `first` is the status
  // of its first op. Marks the node (see the file comment) or clears it.
  void Observe(uint32_t node, absl::Time started, const absl::Status& first);

  // Whether calls should skip `node` now. Counts the skip.
  bool Skip(uint32_t node);

  // Calls skipped so far, and nodes marked so far (for tests and stats).
  uint64_t skipped() const;
  uint64_t marked() const;

 private:
  Clock* const clock_;
  const absl::Duration period_;

  mutable Mutex mu_;
  // node -> until when it is skipped.
  absl::flat_hash_map<uint32_t, absl::Time> until_ ABSL_GUARDED_BY(mu_);
  uint64_t skipped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t marked_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hymcache
