// The hymbench replay driver: plays a request trace against a live HyMCache
// cluster through hymcache::Client, the way a serving engine would.
//
// Each worker reads into and stores from one KV pool of block-sized slots,
// allocated, faulted in (every page touched) and registered with
// Client::RegisterMemory once, before the clock starts, as a serving engine
// preallocates its KV cache: no allocation or page fault lands inside a
// timed Load. A request takes a slot per block; the slots of blocks it
// stores stay taken until the store is Done(), the others go back after the
// Load.
//
// For each request (hash_ids = its blocks, keys from BlockCodec):
//   1. Load(keys, buffers, {prefetch}): the leading run of cached blocks.
//      Records hits (hit_prefix), loaded blocks and bytes, load latency; with
//      `verify`, checks every loaded byte against the block's deterministic
//      contents.
//   2. "Computes" blocks [loaded, n) (fills their deterministic bytes) and
//      hands them to Store asynchronously, with parent_key = keys[loaded-1].
//      The request path never waits for a store (unless wait_stores); the
//      worker polls its stores between requests and keeps each one's buffers
//      alive until Done(), then records stored / skipped / refused / failed.
//   3. With hint_next_turn, once the request's store is done (at once when
//      it stored nothing): Client::HintNextTurn(keys), as an engine does
//      when a turn is answered, so that the nodes stage the conversation's
//      blocks during the think time before its next turn. With
//      hint_conversation_end, a conversation's last request sends
//      Client::HintConversationEnded(keys) instead.
//
// `concurrency` workers take requests in trace order. With time_scale > 0 a
// request does not start before (timestamp - first timestamp) / time_scale
// after the start of the run; with 0 they run back to back.
//
// Thread safety: Replay may be called from any thread; it starts and joins
// its own named threads ("hymbench-w<i>", "hymbench-prog") and uses `client`
// concurrently (hymcache::Client is thread-safe).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "tools/hymbench/report.h"
#include "tools/hymbench/trace.h"

namespace hymcache::hymbench {

struct ReplayOptions {
  // Namespace of the block keys: runs with different namespaces share
  // nothing. Default: "hymbench".
  std::string key_namespace = "hymbench";
  // Bytes of KV per block (a 512-token block of a real model is 256 KiB ..
  // several MiB). > 0. Default: 256 KiB.
  uint64_t block_bytes = 256 << 10;
  // Worker threads, each running one request at a time. 1..1024. Default: 1.
  int concurrency = 1;
  // Trace time divided by this is replay time; 0 replays as fast as
  // possible. >= 0. Default: 0.
  double time_scale = 0;
  // LoadOptions::prefetch. Default: true.
  bool prefetch = true;
  // Check every loaded block's length and bytes. Default: false.
  bool verify = false;
  // Wait for each request's Store to finish before the worker takes its next
  // request (with concurrency 1: every store is visible to the next
  // request, so hits reach the ceiling when the cluster has room). Not what
  // an engine does; for deterministic tests. Default: false.
  bool wait_stores = false;
  // Store each request's missing blocks after it (as an engine does). false:
  // read-only replay of what the cluster holds (to compare read paths on
  // the same contents). Default: true.
  bool store = true;
  // Deadline of each Load from its start; zero uses the client's default
  // deadline. Default: zero.
  absl::Duration load_timeout = absl::ZeroDuration();
  // Each Store's StoreOptions::deadline, from its start. > 0. Default: 2 s.
  absl::Duration store_timeout = absl::Seconds(2);
  // Most bytes of request buffers held by unfinished stores; a request whose
  // store would exceed it (while other stores are in flight) skips its store
  // and counts its blocks as dropped, as an engine short of staging memory
  // would. 0: no limit. Default: 2 GiB.
  uint64_t max_store_bytes_in_flight = uint64_t{2} << 30;
  // Bytes of each worker's KV pool (rounded down to whole blocks); 0: twice
  // the largest request, so that a request's stores can run while the next
  // request loads. A request with more blocks than the pool holds is
  // reported (Replay fails with InvalidArgument naming it), never truncated.
  // Default: 0.
  uint64_t pool_bytes = 0;
  // Register each worker's pool with Client::RegisterMemory (direct
  // transfers into it with RDMA). A refusal is reported in the result and
  // the run goes on unregistered. Default: true.
  bool register_pool = true;
  // How long a store the client refuses because its store queue is full
  // ("N stores already pending") is retried (every millisecond, reaping the
  // worker's own finished stores meanwhile) before it is given up and its
  // blocks counted as refused_store_queue; zero: give up at once. Waiting
  // delays the worker's next request, as backpressure in an engine would.
  // >= 0. Default: 1 s.
  absl::Duration store_queue_wait = absl::Seconds(1);
  // Send a think-time hint for each request's blocks (step 3 above).
  // Default: false.
  bool hint_next_turn = false;
  // TurnHintOptions::hold of those hints. > 0. Default: 60 s.
  absl::Duration hint_hold = absl::Seconds(60);
  // After the last request of each conversation (the highest turn the
  // trace has for it; requests without a conversation have none), once its
  // store is done: Client::HintConversationEnded(keys) instead of a
  // next-turn hint, as an engine does when a session closes. The trace's
  // end of a conversation stands for the engine knowing it (a closed chat,
  // a finished agent task). Default: false.
  bool hint_conversation_end = false;
  // Non-empty: the hints name the request's blocks in this namespace
  // instead (blocks a run in that namespace stored, never read by this
  // one): every hint is wrong, to measure what wasted staging costs the
  // requests. Default: "".
  std::string hint_namespace;
  // Interval of the progress lines; zero prints none. Default: 1 s.
  absl::Duration progress_interval = absl::Seconds(1);

  // InvalidArgument naming the bad field.
  absl::Status Validate() const;
};

struct ReplayResult {
  // One per request, in trace order.
  std::vector<RequestRecord> records;
  // Wall time of the replay (first request to last store finished).
  double wall_seconds = 0;
  // Load calls made and how many of them failed as a whole.
  size_t load_calls = 0;
  size_t load_errors = 0;
  // The first whole-call Load error (OK if none).
  absl::Status first_load_error;
  // The first Store error (OK if none).
  absl::Status first_store_error;
  // Blocks that failed verification, and a description of the first.
  size_t corrupt_blocks = 0;
  std::string first_corruption;
  // Bytes of each worker's KV pool, and the pools allocated (one per
  // worker, before the run: requests never allocate).
  uint64_t pool_bytes = 0;
  size_t pools_allocated = 0;
  // Pools registered with Client::RegisterMemory, and the first refusal.
  size_t pools_registered = 0;
  absl::Status pool_registration_error;
  // Stores retried because the client's store queue was full, and the
  // total time the workers spent retrying.
  size_t store_queue_retries = 0;
  double store_queue_wait_seconds = 0;
  // Times a worker waited for its own stores to free pool slots.
  size_t pool_waits = 0;
  // Think-time hints sent (hint_next_turn), and those the client dropped
  // (its max_pending_hints) or refused.
  size_t hints_sent = 0;
  size_t hints_dropped = 0;
  // Conversation-ended hints sent (hint_conversation_end).
  size_t ended_hints_sent = 0;
};

// Replays `requests`. `progress` (may be null) receives a progress line every
// progress_interval and a last one, marked "(done)", at the end. Errors:
// InvalidArgument (bad options, a request larger than the pool),
// ResourceExhausted (the pools cannot be allocated). Failures of individual
// calls are recorded, not returned.
// REQUIRES: client != nullptr.
absl::StatusOr<ReplayResult> Replay(Client* client, absl::Span<const Request> requests,
                                    const ReplayOptions& options,
                                    std::ostream* progress = nullptr);

// Checks that the master answers (Unavailable otherwise, naming it) and has
// at least one live storage node (FailedPrecondition otherwise).
absl::Status CheckCluster(Client* client, absl::Duration timeout = absl::Seconds(10));

}  // namespace hymcache::hymbench
