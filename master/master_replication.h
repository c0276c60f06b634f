// MasterReplication: the leader's side of standby replication as the
// master daemon runs it (docs/ha.md, "Standby replication"). It owns the
// ReplicationSource over the master's store (served on the master's own
// gRPC port, beside MasterService), decides when a PutCommit is answered
// (asynchronous: at once; synchronous: once a standby holds the commit, or
// at the sync timeout, whichever comes first), and reports the standbys'
// lag as master stats (hymcache_master_replication_*).
//
// Thread safety: safe for concurrent use without external synchronization.
// REQUIRES: the store outlives this; Shutdown() before the gRPC server that
// serves service() shuts down.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "common/stats.h"
#include "master/metadata_store.h"
#include "master/replication_source.h"
#include "proto/master.pb.h"

namespace hymcache {
namespace master {

// How a leader replicates its store to standby masters.
enum class ReplicationMode {
  // No replication service: standbys cannot follow (a new leader starts
  // from its own store, or shares the old leader's directory).
  kOff,
  // Standbys follow; commits are answered without waiting for them. A
  // leader's crash loses what the standby had not yet applied (the lag,
  // replication_lag_seconds).
  kAsync,
  // A PutCommit is answered once a standby holds it, or at sync_timeout
  // (counted in replication_sync_timeouts: that commit may be lost with the
  // leader), or at once while no standby follows past its full copy
  // (counted in replication_sync_no_standby, equally at risk: waiting then
  // only makes every commit slower, e.g. all through the time a killed
  // leader takes to come back as a standby). Costs each commit a round
  // trip to the standby.
  kSync,
  // The stream runs as kSync's (no batch delay) but a PutCommit is answered
  // at once, naming the store sequence it reached and the standbys past
  // their full copy; the client acknowledges the put once each of them
  // says it holds that sequence (StandbyConfirm.WaitApplied,
  // client/standby_confirmer.h). So nothing acknowledged is lost, as with
  // kSync, while the wait costs the standbys and the client, not the
  // leader. With no standby past its copy the answer names none (counted
  // in replication_sync_no_standby, as kSync counts it).
  kConfirm,
};

// "off", "async", "sync", "confirm".
absl::StatusOr<ReplicationMode> ParseReplicationMode(absl::string_view s);
const char* ReplicationModeName(ReplicationMode mode);

// Counters of the synchronous commits and of the stream.
#define HYM_MASTER_REPLICATION_STATS(COUNTER, GAUGE, DGAUGE)                \
  COUNTER(replication_sync_commits,                                         \
          "Commits answered once a standby held them (sync replication)")   \
  COUNTER(replication_sync_timeouts,                                        \
          "Commits answered at the sync timeout without a standby holding " \
          "them (sync replication; lost if the leader dies now)")           \
  COUNTER(replication_sync_no_standby,                                      \
          "Commits answered at once because no standby was following past " \
          "its full copy (sync or confirm replication; lost if the leader " \
          "dies now)")                                                      \
  COUNTER(replication_confirm_commits,                                      \
          "Commits answered with the standbys the client confirms them "    \
          "with (confirm replication)")                                     \
  COUNTER(replication_messages_sent,                                        \
          "Log messages sent to standbys (each carries the write batches "  \
          "gathered since the one before)")                                 \
  COUNTER(replication_batches_sent,                                         \
          "Write batches sent to standbys (the leader's store writes)")     \
  GAUGE(replication_followers,                                              \
        "Standbys following this leader past their full copy")              \
  GAUGE(replication_copying, "Standbys in a full copy of the store")        \
  GAUGE(replication_latest_sequence, "The store's latest write sequence")
HYM_DECLARE_STATS(MasterReplicationStats, MasterReplicationCounters,
                  HYM_MASTER_REPLICATION_STATS);

struct MasterReplicationOptions {
  // kAsync or kSync (kOff needs no MasterReplication). Default: kAsync.
  ReplicationMode mode = ReplicationMode::kAsync;
  // kSync: the longest a commit waits for a standby before it is answered
  // anyway. Default: 500 ms.
  absl::Duration sync_timeout = absl::Milliseconds(500);
  // kAsync: how long a stream gathers writes before it sends them as one
  // message (ReplicationSourceOptions::batch_delay): adds up to this much
  // to the lag (what a leader crash may lose), and saves the leader a send
  // and an acknowledgement per message; kSync sends at once. Measured with
  // tools/bench/ha_bench (docs/ha.md), the leader's CPU per put, against no
  // replication: +18% at 2 ms, +10% at 5 ms, +7% at 10 ms, +6% at 20 ms.
  // [0, 1 s]. Default: 10 ms.
  absl::Duration async_batch_delay = absl::Milliseconds(10);
  // kConfirm: the same for its stream. A client waits for the standby, so
  // it adds up to this much to each put (a writer with one put at a time is
  // paced by it: 3 ms per put at 2 ms); at saturation the messages gather
  // anyway. ha_bench, leader CPU per put against off with 512 puts in
  // flight: 0.97x at 0, 0.99x at 2 ms (docs/ha.md). [0, 1 s]. Default: 0.
  absl::Duration confirm_batch_delay = absl::ZeroDuration();
  // The leader's store (its write log kept: keep_wal_seconds > 0).
  // Required; not owned.
  RocksDbMetadataStore* store = nullptr;
  // Followers must be admins of it; nullptr: authentication off. Not owned.
  const Authenticator* authenticator = nullptr;

  absl::Status Validate() const;
};

class MasterReplication {
 public:
  // Errors: InvalidArgument (Validate); ReplicationSource::Create's.
  static absl::StatusOr<std::unique_ptr<MasterReplication>> Create(
      const MasterReplicationOptions& options);
  ~MasterReplication();

  // The gRPC service to register on the master's server: the standbys'
  // streams run on its completion-queue pollers (StartOn, once per poller
  // after the server is built), on the thread that serves PutCommit.
  grpc::Service* service() { return source_->async_service(); }
  void StartOn(CqPoller* poller) { source_->StartOn(poller); }

  // After a commit's store write, before its answer (MasterRpcHooks::
  // after_commit; the write itself woke the streams, through the store's
  // write listener): kAsync answers at once; kSync
  // answers when a standby holds the store's latest sequence, or at the
  // timeout, or at Shutdown; kConfirm adds to `resp` what the client
  // confirms and answers at once. Never blocks.
  void AfterCommit(hymcache::v1::PutCommitResponse* resp,
                   std::function<void()> answer);

  // The replication_* stats: the counters above, and per standby (label
  // "follower") and for the best one (no label) the lag in sequences and
  // seconds. With no standby past its copy, replication_lag_sequences is
  // the latest sequence (nothing is replicated) and no _seconds is given.
  void VisitStats(StatsVisitor* v) const;

  // Ends the standbys' streams and answers held commits. Idempotent.
  void Shutdown();

  ReplicationSource* source() { return source_.get(); }

 private:
  MasterReplication(const MasterReplicationOptions& options,
                    std::unique_ptr<ReplicationSource> source);

  const MasterReplicationOptions options_;
  const std::unique_ptr<ReplicationSource> source_;
  MasterReplicationCounters counters_;
};

}  // namespace master
}  // namespace hymcache
