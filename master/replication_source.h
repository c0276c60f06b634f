// ReplicationSource: the leader's side of standby replication (docs/ha.md,
// "Standby replication"). A gRPC service (proto/replication.proto) that
// streams the leader's metadata store to standby masters: each committed
// RocksDB write batch with its leader sequence number, preceded by a
// consistent full copy when the follower is new, belongs to another
// database, or is further behind than the leader's kept write log. Each
// follower acknowledges the last sequence it holds; WaitReplicated lets the
// leader acknowledge a commit only once every standby past its full copy
// holds it (synchronous replication: with two standbys, either may win the
// next election), and GetStats reports each follower's lag.
//
// Two ways to serve it, with the same streams:
//  - as a synchronous gRPC service (this object: one handler thread per
//    follower, plus a named thread reading its acknowledgements), on a
//    server of its own or beside completion-queue services;
//  - on the master's completion-queue pollers (async_service() and
//    StartOn: master/cq_server.h): every event of a follower's stream (its
//    acknowledgements, the next message, the wait for writes) runs on the
//    poller's thread, the thread that serves PutCommit, so a synchronous
//    commit is answered from the acknowledgement's event with no hand-off
//    between threads (docs/ha.md, "Serving the stream on the poller").
//
// Thread safety: safe for concurrent use without external synchronization.
// REQUIRES: the store outlives the source's first Shutdown() (or its
// destruction), which takes its write listener off the store; Shutdown()
// before the grpc::Server serving it is shut down, so streams end at once.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/security.h"
#include "common/thread.h"
#include "master/metadata_store.h"
#include "proto/replication.grpc.pb.h"

namespace hymcache {
namespace master {

class CqPoller;  // master/cq_server.h

struct ReplicationSourceOptions {
  // The leader's store. Its write log is what followers replay: give it
  // keep_wal_seconds > 0 (e.g. 3600) so a follower that reconnects after
  // a pause resumes from the log instead of taking a full copy. Required;
  // not owned.
  RocksDbMetadataStore* store = nullptr;
  // Checks each follower's credentials: followers must be admins of the
  // cluster (the identity the masters use for one another). nullptr:
  // authentication off, as for the master's other services. Not owned.
  // Default: nullptr.
  const Authenticator* authenticator = nullptr;
  // Records per full-copy message (also bounded by copy_chunk_bytes).
  // Default: 4096.
  size_t copy_chunk_records = 4096;
  // Bytes of keys and values per full-copy message. Default: 1 MiB.
  size_t copy_chunk_bytes = size_t{1} << 20;
  // Most bytes of write batches per log message: the batches already
  // written when a stream wakes go out together (one message, one write
  // and one acknowledgement on the follower). Default: 1 MiB.
  size_t log_message_bytes = size_t{1} << 20;
  // How soon a stream reads the log again when a write was not readable
  // yet, and how often a stream served on its handler's thread (the
  // synchronous service) looks for writes it was not told about.
  // Default: 5 ms.
  absl::Duration poll_interval = absl::Milliseconds(5);
  // How often an idle stream on a poller looks for writes it was not told
  // about. Every write through the store's Write tells it (the store's
  // write listener, NotifyWrite), so this is a safety net; it bounds the
  // replication delay of a write that somehow was not. At 5 ms (the
  // earlier poll_interval) an idle leader with one standby spent about 3%
  // of a core on these wakeups (docs/ha.md). Default: 100 ms.
  absl::Duration idle_poll_interval = absl::Milliseconds(100);
  // An idle stream sends a HEARTBEAT this often. Default: 1 s.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // The least time between a stream's log messages: a stream that found
  // new writes less than this after its last message waits until then
  // before it reads the log, so that the writes of that time go out as one
  // message (one send, one follower write, one acknowledgement) instead of
  // one each; after a quiet spell it sends at once. It adds up to this
  // much to the replication lag and nothing while a commit waits for a
  // follower (WaitReplicated, OnReplicated: those are sent at once).
  // Asynchronous replication sets it (MasterReplication: 10 ms); with one
  // message per write the stream and acknowledgement threads cost the
  // leader twice its own work per put (docs/ha.md). Zero: no wait; at
  // most kMaxReplicationBatchDelay. Default: zero.
  absl::Duration batch_delay = absl::ZeroDuration();
  // How long a stream waits for the follower to acknowledge its last log
  // message before it sends the next: at most one message is unacknowledged
  // at a time, so under load each message carries every write of a round
  // trip (one send, one follower write, one acknowledgement) and at a
  // trickle each write still goes out at once. Unlike batch_delay, a commit
  // waiting for the followers does not cut it short (it waits for that
  // acknowledgement either way). Measured (docs/ha.md, "One message in
  // flight"): with sync or confirm commits the messages per commit fell
  // from 0.14 to 0.013-0.036, and the standby's CPU per put from about 17
  // to 10 us. Zero: send at once; at most kMaxReplicationBatchDelay.
  // Default: 5 ms.
  absl::Duration ack_wait = absl::Milliseconds(5);
  // Lag times. nullptr: Clock::Real(). Not owned. Default: nullptr.
  Clock* clock = nullptr;

  absl::Status Validate() const;
};

// The longest batch delay a stream takes (ReplicationSourceOptions,
// MasterReplicationOptions::async_batch_delay, --replication_async_delay_ms).
inline constexpr absl::Duration kMaxReplicationBatchDelay = absl::Seconds(1);

// OK for a batch delay in [0, kMaxReplicationBatchDelay]; else
// InvalidArgument naming `what` (the option or flag).
absl::Status ValidateReplicationBatchDelay(absl::Duration delay,
                                           absl::string_view what);

class ReplicationSource final : public hymcache::v1::Replication::Service {
 public:
  // Errors: InvalidArgument for bad options; Internal if the store's
  // database has no identity.
  static absl::StatusOr<std::unique_ptr<ReplicationSource>> Create(
      const ReplicationSourceOptions& options);
  ~ReplicationSource() override;

  // A write was committed: idle streams send it now instead of at their
  // next poll. Cheap; safe from any thread.
  void NotifyWrite();

  // Waits until every follower past its full copy (and at least one) has
  // acknowledged holding every change up to leader sequence `seq` (e.g. the
  // store's LatestSequence() after a commit's write), then returns OK. A
  // follower that leaves stops counting. Wakes the streams first
  // (NotifyWrite). DeadlineExceeded at `deadline` (real time) if they have
  // not, e.g. with no follower connected or one that does not acknowledge;
  // Unavailable once shut down.
  absl::Status WaitReplicated(uint64_t seq, absl::Time deadline);

  // The same without blocking, for a completion-queue or callback server:
  // `done` runs once, with OK when the followers hold `seq`, DeadlineExceeded
  // at `deadline`, or Unavailable at Shutdown. It runs on the caller's
  // thread when the followers already hold `seq` (or after Shutdown), else
  // on the thread of the acknowledgement ("repl-acks"), of the stream that
  // left, or of the deadline ("repl-deadline"): keep it short and
  // non-blocking.
  void OnReplicated(uint64_t seq, absl::Time deadline,
                    std::function<void(absl::Status)> done);

  // Followers past their full copy (those whose acknowledgements count).
  size_t FollowersPastCopy() const;
  // Their names (FollowRequest.follower: a standby master's advertise
  // address), each once.
  std::vector<std::string> FollowerNamesPastCopy() const;

  // Ends every stream (CANCELLED to the followers) and refuses new ones;
  // WaitReplicated returns Unavailable. Idempotent; blocks until the
  // handlers have left.
  void Shutdown();

  struct FollowerStats {
    std::string name;
    std::string peer;
    // The last leader sequence the follower acknowledged.
    uint64_t acked_sequence = 0;
    // The leader's latest sequence minus acked_sequence.
    uint64_t lag_sequences = 0;
    // How long the oldest change not yet acknowledged has been sent
    // (zero when caught up).
    absl::Duration lag_time;
    // Still in its full copy (acked_sequence means nothing yet).
    bool copying = false;
  };
  struct Stats {
    uint64_t latest_sequence = 0;
    // Over the source's life.
    uint64_t streams_started = 0;
    uint64_t full_copies = 0;  // started
    uint64_t batches_sent = 0;   // the leader's write batches
    uint64_t messages_sent = 0;  // log messages (several batches each)
    uint64_t copy_records_sent = 0;
    uint64_t streams_refused = 0;  // credentials
    std::vector<FollowerStats> followers;
  };
  Stats GetStats() const;

  // The identity of the leader's database, as followers record it.
  const std::string& db_id() const { return db_id_; }

  // Serving on completion-queue pollers: register async_service() on the
  // server instead of this object, then call StartOn for each poller once
  // the server is built (a Follow call is requested on each). Shutdown()
  // ends those streams too; call it before the server shuts down, and keep
  // the source alive until the pollers have drained.
  grpc::Service* async_service() { return &async_service_; }
  void StartOn(CqPoller* poller);

  // gRPC entry point (the RPC adapter).
  grpc::Status Follow(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<hymcache::v1::FollowResponse,
                               hymcache::v1::FollowRequest>* stream) override;

 private:
  // One follower's stream. Protected by mu_.
  struct Follower {
    std::string name;
    std::string peer;
    uint64_t acked = 0;
    bool copying = true;
    // Batches sent and not yet acknowledged: last sequence, when sent.
    std::deque<std::pair<uint64_t, absl::Time>> in_flight;
  };
  class Stream;
  friend class Stream;
  class FollowCall;  // a stream on a poller (replication_follow_call.cc)
  friend class FollowCall;

  ReplicationSource(const ReplicationSourceOptions& options,
                    std::string db_id);
  // Waits until the store's latest sequence reaches `next`, the stream is
  // cancelled, the source shuts down, or `until`; true unless the stream
  // should end.
  bool WaitForWrites(grpc::ServerContext* ctx, uint64_t next,
                     absl::Time until);
  uint64_t Latest() const;
  // batch_delay: waits until that long after the stream's last message
  // (`last_sent`), or less if a commit starts waiting for a follower, the
  // stream is cancelled or the source shuts down.
  void WaitToBatch(grpc::ServerContext* ctx, absl::Time last_sent);
  // ack_wait: waits until `f` has acknowledged `sent` (the last sequence
  // sent to it), ack_wait after `last_sent`, the stream is cancelled or the
  // source shuts down.
  void WaitForAck(grpc::ServerContext* ctx, const Follower* f, uint64_t sent,
                  absl::Time last_sent);
  // The highest sequence every follower past its copy has acknowledged (0
  // with none).
  uint64_t HeldLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the OnReplicated waiters up to `held` and returns their
  // callbacks.
  std::vector<std::function<void(absl::Status)>> TakeSatisfiedLocked(
      uint64_t held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The "repl-deadline" thread: expires OnReplicated waiters.
  void ExpireWaiters();

  // A follower's stream began: its id (for Leave), or Unavailable after
  // Shutdown. `ctx` is cancelled at Shutdown; `call`, when not null, is
  // woken by writes and waiters (FollowCall::Wake).
  absl::StatusOr<uint64_t> Join(Follower* f, grpc::ServerContext* ctx,
                                FollowCall* call);
  // The stream ended: it stops counting, and the waiters the others hold
  // are answered (on this thread).
  void Leave(uint64_t id);
  // The follower acknowledged holding `applied`: answers the waiters now
  // held, on this thread.
  void Acknowledge(Follower* f, uint64_t applied);
  // A log message of `batches` write batches up to `last` is about to be
  // sent: counted, and its lag clock started (the follower may apply and
  // acknowledge it before the sender runs again).
  void CountSent(Follower* f, int batches, uint64_t last);
  // Whether a commit waits for the followers (WaitReplicated or
  // OnReplicated): a stream then sends at once instead of batching.
  bool CommitWaitingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a stream on a poller is woken (FollowCall::Wake).
  enum class WakeReason {
    kWrite,          // ends an idle poll
    kCommitWaiting,  // ends a batch delay too
    kShutdown,       // ends any wait
  };
  // Wakes the streams on pollers.
  void WakeCallsLocked(WakeReason why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const ReplicationSourceOptions options_;
  Clock* const clock_;
  const std::string db_id_;

  Thread deadline_thread_;  // started by Create, joined by Shutdown
  // The store calls NotifyWrite after each write (Create), until the first
  // Shutdown removes it: a later one does not touch the store.
  std::atomic<bool> listening_{false};

  mutable Mutex mu_;
  CondVar changed_;  // writes notified, acks, shutdown
  CondVar deadlines_changed_;  // an earlier OnReplicated deadline, shutdown
  // A commit waits for a follower, shutdown: ends WaitToBatch (a
  // NotifyWrite per write does not).
  CondVar batch_cut_;
  struct Waiter {
    uint64_t seq;
    absl::Time deadline;
    std::function<void(absl::Status)> done;
  };
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);  // by id
  std::multimap<uint64_t, uint64_t> waiters_by_seq_ ABSL_GUARDED_BY(mu_);
  std::multimap<absl::Time, uint64_t> waiters_by_deadline_
      ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t notified_ ABSL_GUARDED_BY(mu_) = 0;  // NotifyWrite calls
  int sync_waiting_ ABSL_GUARDED_BY(mu_) = 0;   // in WaitReplicated
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Follower*> followers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, grpc::ServerContext*> contexts_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, FollowCall*> calls_ ABSL_GUARDED_BY(mu_);

  hymcache::v1::Replication::AsyncService async_service_;
  Stats counters_ ABSL_GUARDED_BY(mu_);  // followers unused
};

}  // namespace master
}  // namespace hymcache
