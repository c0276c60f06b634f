// ReplicaFollower: a standby master's side of standby replication
// (docs/ha.md, "Standby replication"). Keeps the standby's metadata-store
// directory in step with the leader's: it follows the leader's
// ReplicationSource (master/replication_source.h), applies each of the
// leader's write batches to its own RocksDB together with the leader
// sequence it came from, in one write batch, and acknowledges it. So the
// directory always holds a prefix of the leader's committed writes, and
// after Stop() the master opens it with its normal restart path
// (RocksDbMetadataStore + MasterService's recovery) when elected.
//
// The position (the leader database's identity, the last leader sequence
// applied, and the local sequence that write left the directory at) is kept
// under kReplicaPositionKey. A restarted follower resumes from it; one whose
// directory was written by anything else since (it was a leader) finds the
// local sequence moved and takes a full copy, as does one the leader's
// write log no longer covers. A full copy is applied in place: one write
// removes everything (a range delete, which also stops the master's restart
// from trusting an older index snapshot of this directory) and marks the
// position "copying", chunks follow, and the position is set when the copy
// ends; a follower stopped in between copies again.
//
// One named thread ("repl-follow") runs the stream and reconnects with
// backoff.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/security.h"
#include "common/thread.h"
#include "master/metadata_store.h"

namespace grpc {
class ClientContext;
}
namespace hymcache::v1 {
class FollowResponse;
}
namespace rocksdb {
class DB;
class WriteBatch;
}

namespace hymcache {
namespace master {

struct ReplicaFollowerOptions {
  // The leader's address (its ReplicationSource), host:port. "" waits for
  // SetLeader. Default: "".
  std::string leader;
  // TLS and token presented to the leader: an admin identity of the
  // cluster (the masters' own). Default: insecure, no token.
  ChannelSecurity security;
  // The standby's store directory and options, as the master opens it when
  // elected (path required; keep_wal_seconds also matters here: it lets a
  // master elected from this directory restart from its index snapshot).
  // sync_writes: fsync each applied batch before acknowledging it, so an
  // acknowledged commit survives the standby's machine crash, not only its
  // process's. Default: RocksDbMetadataStoreOptions's defaults.
  RocksDbMetadataStoreOptions store;
  // This standby's name in the leader's lag reports. Default: "standby".
  std::string name = "standby";
  // Reconnect backoff: first wait, doubled per failure up to the max.
  // Defaults: 50 ms, 2 s.
  absl::Duration min_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);

  absl::Status Validate() const;
};

class ReplicaFollower {
 public:
  // Opens the directory (created if missing) and starts following.
  // Errors: InvalidArgument for bad options; the store's open errors
  // (Unavailable / Internal if another process holds the directory);
  // DataLoss if the position record is corrupt; ResourceExhausted if the
  // thread cannot start.
  static absl::StatusOr<std::unique_ptr<ReplicaFollower>> Create(
      const ReplicaFollowerOptions& options);
  // Stop().
  ~ReplicaFollower();
  ReplicaFollower(const ReplicaFollower&) = delete;
  ReplicaFollower& operator=(const ReplicaFollower&) = delete;

  // Follows `leader` from now on (the current stream, if any, ends at
  // once). "" stops following until the next SetLeader.
  void SetLeader(const std::string& leader);

  // Ends the stream, joins the thread and closes the database, so that the
  // master can open the directory. Returns the close's error, if any.
  // Idempotent; the follower does nothing after it.
  absl::Status Stop();

  struct Stats {
    std::string leader;
    // Following the log (connected, past any full copy).
    bool streaming = false;
    // In a full copy: the directory is not a usable state until it ends.
    bool copying = false;
    // The last leader sequence applied, and the leader database's identity
    // ("" before the first copy).
    uint64_t applied_sequence = 0;
    std::string leader_db_id;
    // The leader whose stream last confirmed or changed the store ("" until
    // one has since this follower started): the store holds that leader's
    // data; a standby following another leader it has not heard from yet
    // knows nothing of that one's commits.
    std::string data_leader;
    // The leader's latest sequence as last heard, minus applied_sequence.
    uint64_t lag_sequences = 0;
    uint64_t batches_applied = 0;  // the leader's write batches
    uint64_t full_copies = 0;  // completed
    uint64_t connects = 0;     // streams opened
    std::string last_error;
  };
  Stats GetStats() const;

  // Waits until applied_sequence >= `seq` of the current leader database
  // (tests, tools). DeadlineExceeded at `deadline`.
  absl::Status WaitApplied(uint64_t seq, absl::Time deadline) const;

 private:
  explicit ReplicaFollower(const ReplicaFollowerOptions& options);

  void Run();
  // One stream to `leader`, until it fails or is cancelled. Whether it
  // applied anything (resets the backoff).
  absl::Status FollowOnce(const std::string& leader, bool* progressed);
  struct StreamState;
  // Applies one message of the leader's; *ack: acknowledge st->applied.
  absl::Status Handle(const hymcache::v1::FollowResponse& m, StreamState* st,
                      bool* ack);
  // START with a copy: empties the directory, position "copying".
  absl::Status BeginCopy(const std::string& db_id, StreamState* st);
  // Publishes the stream's state to GetStats / WaitApplied.
  void Publish(const StreamState& st, uint64_t batches);
  // Writes `batch` plus the position (db_id, leader_seq) in one write;
  // `copying` marks a full copy in progress.
  absl::Status ApplyWithPosition(rocksdb::WriteBatch* batch, const std::string& db_id,
                                 uint64_t leader_seq, bool copying);

  // Constant after construction.
  const ReplicaFollowerOptions options_;

  // Opened by Create, closed by Stop; used by the follow thread only
  // (Stop joins it first).
  std::unique_ptr<rocksdb::DB> db_;
  Thread thread_;

  // Serializes Stop (which joins thread_ and closes db_).
  Mutex stop_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable Mutex mu_;
  mutable CondVar changed_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  uint64_t leader_changes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // The stream in flight (cancelled by SetLeader / Stop).
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace master
}  // namespace hymcache
