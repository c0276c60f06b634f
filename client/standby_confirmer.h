// StandbyConfirmer: the client's side of commits the client confirms
// (a leader with --replication=confirm; docs/ha.md "Commits the client
// confirms"). Such a leader answers a PutCommit at once, naming the store
// sequence the commit reached, its database and the standbys past their
// full copy (PutCommitResponse); the put is acknowledged to the caller
// only once each of those standbys says that it holds the sequence
// (StandbyConfirm.WaitApplied, proto/replication.proto). So a leader crash
// loses no acknowledged put, as with --replication=sync, while the waiting
// costs the standbys and the client, not the leader.
//
// Per standby and leader database, at most one WaitApplied is in flight:
// it asks for the highest sequence waited for when it is sent, and answers
// every commit up to it; commits that arrive meanwhile wait for the next.
//
// What counts as confirmed, as a sync leader counts it: a standby that
// answers that it holds the sequence; and, counted in Stats (timeouts,
// unreachable), one that does not answer by the deadline or cannot be
// reached (a sync leader answers at its timeout, and a standby that leaves
// stops counting). A standby that answers that it follows another leader
// database, or no longer stands by (it may have been elected without the
// commit), does not confirm: the put fails with Unavailable, reason
// commit_not_confirmed (store it again).
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace grpc {
class Channel;
class Status;
}  // namespace grpc

namespace hymcache {
namespace v1 {
class PutCommitResponse;
}

struct StandbyConfirmerOptions {
  // A channel to a standby master at `address` (host:port, as the leader
  // names it), with the security of the master channels. Required.
  std::function<absl::StatusOr<std::shared_ptr<grpc::Channel>>(
      const std::string& address)>
      dial;
  absl::Status Validate() const;
};

class StandbyConfirmer {
 public:
  // Errors: InvalidArgument (Validate).
  static absl::StatusOr<std::shared_ptr<StandbyConfirmer>> Create(
      const StandbyConfirmerOptions& options);
  // Waits for the calls in flight (each ends by the latest deadline of the
  // commits it answers); commits waiting behind them are answered as with
  // an unreachable standby.
  ~StandbyConfirmer();
  StandbyConfirmer(const StandbyConfirmer&) = delete;
  StandbyConfirmer& operator=(const StandbyConfirmer&) = delete;

  // Whether `resp` names standbys to confirm with.
  static bool NeedsConfirm(const v1::PutCommitResponse& resp);

  // Confirms the commit `resp` answered (see the file comment): `done`
  // runs once, with OK, or Unavailable (reason commit_not_confirmed). At
  // `deadline` a standby not yet answered counts as timed out. `done` runs
  // on the caller's thread when nothing is to wait for, else on a gRPC
  // thread: keep it short and non-blocking.
  void ConfirmAsync(const v1::PutCommitResponse& resp, absl::Time deadline,
                    std::function<void(absl::Status)> done);
  // The same, blocking.
  absl::Status Confirm(const v1::PutCommitResponse& resp, absl::Time deadline);

  struct Stats {
    uint64_t commits_confirmed = 0;  // OK to the caller
    uint64_t commits_not_confirmed = 0;
    uint64_t waits_sent = 0;  // WaitApplied calls
    // Per standby and commit: no answer by the deadline; unreachable (or
    // another refusal that says nothing of the commit).
    uint64_t timeouts = 0;
    uint64_t unreachable = 0;
  };
  Stats GetStats() const;

 private:
  struct Join;
  struct Target;
  struct Call;
  explicit StandbyConfirmer(const StandbyConfirmerOptions& options);
  // The target for (address, db_id); created (and dialled) if new.
  Target* TargetLocked(const std::string& address, const std::string& db_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A call for the highest sequence `t` waits for, if none is in flight
  // (sent by the caller after unlocking); null otherwise.
  Call* NextCallLocked(Target* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Send(Call* call);
  void OnDone(Call* call, const grpc::Status& status);
  // One standby's answer for one commit.
  void Answer(const std::shared_ptr<Join>& join, const absl::Status& status);

  // Constant after construction.
  const StandbyConfirmerOptions options_;
  mutable Mutex mu_;
  CondVar idle_;  // no call in flight
  absl::flat_hash_map<std::string, std::unique_ptr<Target>> targets_
      ABSL_GUARDED_BY(mu_);
  // Calls sent and not yet through OnDone.
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hymcache
