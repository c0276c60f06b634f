// LeaderElection: one candidate (a master) campaigning to lead through etcd;
// LeaderObserver and ReadLeader: who leads, and at which epoch, for anyone
// else (standbys, clients, storage nodes, hymctl). docs/ha.md explains the
// design and what is not built yet.
//
// Campaign. The candidate grants itself a lease of lease_ttl and runs one
// Txn: "if `key` does not exist (create_revision == 0), put `key` =
// candidate under the lease; else read `key`". The Txn that creates the key
// wins. The winner keeps its lease alive (a renewal every lease_ttl / 3 on
// the election thread) and steps down at once, calling on_lost, when
//   - a renewal answers that the lease is gone (expired, revoked);
//   - the key is deleted or recreated (watched; also re-read each renewal);
//   - no renewal succeeded for a lease's worth of time: IsLeader() turns
//     false at the local deadline even if the election thread is stuck.
// The local deadline is the time the last successful renewal was *sent*
// plus 80% of the granted TTL: etcd starts its TTL later (when it receives
// the renewal), so the leader always stops before etcd can expire the lease
// and let someone else win, as long as the two clocks run at nearly the
// same rate (20% of the TTL is the margin for rate error and for callers
// acting on a just-checked IsLeader()). That covers every lease that
// expires; a lease revoked or a key deleted by someone else ends the term
// in etcd at once and the leader hears of it a watch event later (a new
// leader may be elected in between): the epoch fences that window.
// A revocation etcd did not answer (no quorum) is retried before the
// next campaign. Standbys watch the key and campaign
// again as soon as it is deleted (plus a re-read every half TTL, in case
// the watch is stuck on a frozen etcd member). Resign() (and the
// destructor) steps down and revokes the lease, so a standby takes over at
// once instead of after the TTL.
//
// Epoch. A leader's epoch is the create_revision of the leader key it
// created (the etcd revision of the winning Txn) plus an epoch base. etcd's
// revision is a cluster-wide counter that only grows (it survives member
// restarts, leader changes and snapshot restores, and compaction keeps
// create_revision), and every election creates the key anew in a later
// revision. Only an etcd cluster recreated empty starts revisions over, and
// the base is for that case: it lives in EpochBaseKey(key) (absent: 0),
// and a candidate campaigns with base = max(that key's value, floor - R),
// where floor is the highest epoch it knows was used (every epoch it saw,
// and options.epoch_floor: a master's store remembers the epochs its
// generations came from) and R the etcd revision its read of the base was
// answered at. The winning Txn needs the base key unchanged since that
// read, and writes the raised base with the leader key, whose value
// carries it ("<candidate>\nepoch_base=<base>"; just the candidate while
// the base is 0), so that every observer computes the same epoch. So every
// leader's epoch is larger than every earlier leader's of the same etcd
// cluster (its base is no smaller, its revision larger), and larger than
// every epoch its candidate knew of before etcd was recreated. With etcd
// never recreated the base stays 0 (floor - R <= 0: the revision has passed
// every epoch used). The epoch fences:
//   - in etcd, a leader's writes carry FenceCompare(epoch) and apply only
//     while its key is still the one it created;
//   - elsewhere, nodes and clients remember the highest epoch seen and
//     refuse a master with a smaller one, and whatever a master issues
//     (allocation ids, generations, capabilities) carries its epoch so that
//     nothing from an old leader collides with the new one's (docs/ha.md:
//     wired into the master in a later change).
//
// Ranking (options.standing). With asynchronous replication, or a standby
// still copying, the standbys are not equally up to date, and whichever
// wins loses what it lacks. So every standby keeps an entry under
// StandingPrefix(key) + candidate (under a lease of its own, TTL
// lease_ttl, renewed every TTL/3 while it stands by: its presence), and
// one that sees the key go does not campaign at once: it writes its
// standing and the vacated term's epoch into its entry, then reads the
// others' until every present candidate has ranked this vacancy too or
// ranking_window has passed, and campaigns at once when no candidate of
// its group stands higher (equal positions: the smaller candidate value
// first). An outranked candidate waits up to ranking_patience for a new
// leader key (the better one's), then campaigns anyway: the better one may
// have died meanwhile. A lone standby campaigns at once (an etcd Put and
// Range later); the window is waited out only for a present candidate that
// does not rank (a frozen or dying process, until its lease expires).
// Ranking is advice, never a condition to lead: an etcd error skips it,
// and candidates of different groups do not wait for each other. The
// first election at start is not ranked; a leader withdraws its entry.
//
// Thread safety: LeaderElection and LeaderObserver are safe for concurrent
// use without external synchronization. Callbacks run on the election's (or
// observer's) own thread, one at a time; they must not destroy the object
// that calls them, and should return quickly (the election does not renew
// its lease while a callback runs).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/etcd_client.h"
#include "common/mutex.h"
#include "common/thread.h"

namespace hymcache {

// Who leads: the leader key's value and its epoch.
struct LeaderInfo {
  // The value the leader campaigned with (its address).
  std::string candidate;
  // The leader key's create_revision plus its epoch base (see the file
  // comment).
  int64_t epoch = 0;
  // The leader key's create_revision: what FenceCompare compares.
  int64_t revision = 0;
  // The leader's etcd lease.
  int64_t lease = 0;

  bool operator==(const LeaderInfo& o) const {
    return candidate == o.candidate && epoch == o.epoch &&
           revision == o.revision && lease == o.lease;
  }
};

// How up to date a candidate is: positions compare only within one group
// (a standby master: the leader database it follows, and the sequence of it
// applied). An empty group ranks below every other (it knows nothing).
struct CandidateStanding {
  std::string group;
  uint64_t position = 0;
};

struct LeaderElectionOptions {
  // The etcd cluster. Required; not owned; must outlive the election.
  EtcdClient* etcd = nullptr;
  // The leader key, e.g. "/hymcache/<cluster>/master/leader". Required.
  std::string key;
  // This candidate's identity, stored as the key's value while it leads
  // (how others reach it, e.g. its gRPC address). Required; no newline.
  std::string candidate;
  // The lease's TTL, whole seconds (etcd's unit), at least 1 s; etcd may
  // grant more (its minimum is 1.5 election timeouts). How long the cluster
  // is leaderless when a leader dies without resigning. Default: 5 s.
  absl::Duration lease_ttl = absl::Seconds(5);
  // Pause after a failed etcd call before the next try (campaign, renewal).
  // Default: 100 ms.
  absl::Duration retry_interval = absl::Milliseconds(100);
  // Time for the lease's local deadline. Default (nullptr): Clock::Real().
  Clock* clock = nullptr;
  // Called once per term when this candidate becomes leader, with its epoch.
  std::function<void(int64_t epoch)> on_elected;
  // Called once per term when it stops leading (IsLeader() is already false):
  // the epoch, and why (CANCELLED for Resign).
  std::function<void(int64_t epoch, const absl::Status& why)> on_lost;
  // The election thread's name. Default: "hym-election".
  std::string thread_name = "hym-election";
  // How up to date this candidate is (a standby master: the leader's
  // sequence it has applied). Unset: when the leader key goes, every
  // standby campaigns at once and the first Txn wins. Set: a vacancy is
  // ranked first (see "Ranking" in the file comment); called on the
  // election thread.
  std::function<CandidateStanding()> standing;
  // The highest epoch this candidate knows was used besides those it saw in
  // etcd (a master: the epoch its store's generations reached), so that it
  // never leads with a smaller or equal one even after etcd was recreated
  // empty (see "Epoch"). Called on the election thread before each
  // campaign; its value must be below 2^31. Unset: 0.
  std::function<int64_t()> epoch_floor;
  // Ranking: how long a candidate waits for the others' standings after
  // publishing its own, and how long an outranked one then waits for the
  // better one to win before campaigning itself. Default: 100 ms, 500 ms.
  absl::Duration ranking_window = absl::Milliseconds(100);
  absl::Duration ranking_patience = absl::Milliseconds(500);

  // InvalidArgument naming the field that is wrong.
  absl::Status Validate() const;
};

// Counters since Create (tests, metrics).
struct LeaderElectionStats {
  uint64_t terms_won = 0;
  uint64_t terms_lost = 0;
  uint64_t renewals = 0;
  uint64_t renewal_failures = 0;
  uint64_t campaigns = 0;
  // Vacancies ranked, and those where a better candidate was waited for.
  uint64_t rankings = 0;
  uint64_t yielded = 0;
  // Renewals of the candidate's entry while standing by (ranking).
  uint64_t presence_renewals = 0;
  // Other candidates' terms ended by RevokeLeaderLease.
  uint64_t leaders_revoked = 0;
  // Campaigns won with a base raised past etcd's (etcd recreated).
  uint64_t epoch_base_raises = 0;
};

class LeaderElection {
 public:
  // Validates, starts the election thread and campaigns at once.
  // Errors: InvalidArgument (Validate), ResourceExhausted (no thread).
  static absl::StatusOr<std::unique_ptr<LeaderElection>> Create(
      const LeaderElectionOptions& options);
  // Resign().
  ~LeaderElection();
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // Stops campaigning; a leader steps down (on_lost with CANCELLED) and
  // revokes its lease so that a standby takes over at once. Waits for the
  // election thread (at most about one etcd call_timeout when etcd does not
  // answer). Idempotent.
  void Resign();

  // Whether this candidate leads now: it won, has not stepped down, its key
  // is not known to be gone (deleted by EndTermAbove, or seen deleted or
  // replaced by the watch), and the lease's local deadline has not passed
  // on the clock.
  bool IsLeader() const;
  // This candidate's epoch while IsLeader(), else nullopt.
  std::optional<int64_t> LeaderEpoch() const;
  // The epoch of the term this candidate won and has not yet stepped down
  // from (on_lost not returned yet: during on_lost too), even past the
  // lease's local deadline; nullopt otherwise. Not a licence to write
  // (IsLeader is): it bridges the moment between the local deadline and
  // the end of on_lost for a master that goes on serving reads
  // (master/master_ha.h: its on_lost decides whether it does).
  std::optional<int64_t> UnendedTermEpoch() const;
  // The leader as this candidate last saw it (itself while leading);
  // nullopt while none is known.
  std::optional<LeaderInfo> ObservedLeader() const;
  LeaderElectionStats stats() const;

  // Ends another candidate's term now rather than when its lease runs out:
  // revokes `leader`'s lease (its key goes with it, and the standbys
  // campaign) if `leader` is still the leader observed (same epoch and
  // lease). For a leader known to be dead (its address refuses
  // connections: its process is gone); a live leader revoked loses its
  // term, fenced by its epoch like any deposed one. `leader` may name this
  // candidate under a lease it never campaigned with: an earlier process
  // of it (a master restarted on its address), whose term is over. OK when
  // revoked or already gone (NotFound from etcd); FailedPrecondition when
  // `leader` is not the leader observed now, or is this candidate's own
  // (won or campaigning) term; etcd's error otherwise.
  absl::Status RevokeLeaderLease(const LeaderInfo& leader);

  // A Txn compare that holds only while the leader key is the one created
  // at `revision` (LeaderInfo::revision): put it in every Txn a leader
  // makes so that a deposed leader's late writes fail.
  static etcdserverpb::Compare FenceCompare(const std::string& key,
                                            int64_t revision);

  // Ends this candidate's term so that the next leader's epoch, whoever it
  // is, is above `epoch`: an epoch a storage node has accepted that etcd
  // knows nothing of (etcd recreated empty, every store that knew it lost).
  // One Txn, fenced by this term's revision: raises the epoch base as a
  // campaign would (see "Epoch") and deletes the leader key; the watch
  // then ends the term (on_lost, ABORTED). OK at once when `epoch` is not
  // above this term's. Errors: FailedPrecondition (not leading),
  // InvalidArgument (`epoch` of 2^31 or more), Aborted (the term ended or
  // the base moved meanwhile: nothing written), etcd's error.
  absl::Status EndTermAbove(int64_t epoch);

  // Stops this candidate's renewals, campaigns and lease revocation, as if
  // its process were frozen or cut off from etcd; the local deadline still
  // ends its leadership. (Its watch keeps running: that can only end a
  // term sooner.) Not undone.
  void FreezeForTest();

 private:
  explicit LeaderElection(const LeaderElectionOptions& options);
  void Run();
  // One campaign: grant a lease, run the Txn. Leader (and its term's
  // state) on success; standby when someone else leads.
  absl::Status Campaign();
  // Revokes the lease of a term whose revocation etcd did not answer
  // (StepDown); OK when there is none left to revoke, the error while etcd
  // still does not answer.
  absl::Status RevokeEndedLease();
  // While leading: renew, check the key, step down when it must.
  void Lead();
  // While standing by: wait until the key is vacant (or a re-read is due).
  void StandBy();
  // After a vacancy, with options.standing: publishes this candidate's
  // standing and returns when it should campaign (true; also on etcd
  // errors, stopping or frozen), or false when a leader appeared
  // meanwhile (stand by again). See "Ranking".
  bool Rank();
  // With options.standing, while standing by: keeps this candidate's entry
  // under StandingPrefix (granted, then renewed every TTL/3).
  void KeepPresence();
  // Puts this candidate's entry (under standing_lease_, granted if none);
  // false on an etcd error.
  bool PutStanding(const std::string& value);
  // Revokes the entry's lease (the entry goes with it).
  void WithdrawStanding();
  // Sets observed_ (and last_leader_epoch_) to what etcd said at
  // `revision`, unless a later revision was observed already.
  void ObserveLocked(std::optional<LeaderInfo> leader, int64_t revision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration EtcdCallTimeout() const;
  // Ends the term: IsLeader() false, on_lost(why), lease revoked.
  void StepDown(const absl::Status& why);
  void OnWatch(absl::StatusOr<EtcdWatchBatch> batch);
  // Real time at which `clock_` will read `t` (for waits).
  absl::Time RealDeadline(absl::Time t) const;

  const LeaderElectionOptions options_;
  Clock* const clock_;
  std::unique_ptr<EtcdWatcher> watcher_;
  Thread thread_;

  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool frozen_ ABSL_GUARDED_BY(mu_) = false;
  bool leader_ ABSL_GUARDED_BY(mu_) = false;
  // StepDown is calling on_lost for epoch_ (UnendedTermEpoch).
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // The term's leader key's create_revision (LeaderInfo::revision).
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  // The lease of this candidate's latest campaign, won or not (0: none).
  int64_t campaign_lease_ ABSL_GUARDED_BY(mu_) = 0;
  // An ended term's lease that StepDown could not revoke (0: none).
  int64_t unrevoked_lease_ ABSL_GUARDED_BY(mu_) = 0;
  // The lease's local deadline on clock_ (see the file comment).
  absl::Time valid_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // When the term's first renewal is due (set by Campaign).
  absl::Time renew_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The watch saw the key deleted / changed since the flag was cleared.
  bool key_changed_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<LeaderInfo> observed_ ABSL_GUARDED_BY(mu_);
  LeaderElectionStats stats_ ABSL_GUARDED_BY(mu_);
  // The epoch of the last leader observed (the vacancy Rank ranks), and
  // the etcd revision of the last observation (ObserveLocked).
  int64_t last_leader_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t observed_revision_ ABSL_GUARDED_BY(mu_) = 0;
  // The highest epoch observed or won (the campaign's floor, "Epoch").
  int64_t highest_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // The lease of this candidate's entry under StandingPrefix (0: none),
  // and when it is next renewed; election thread.
  int64_t standing_lease_ = 0;
  absl::Time presence_renew_at_ = absl::InfinitePast();
};

// Where candidates publish their standings while a vacancy is ranked:
// `key` + "/standing/" (a prefix; each candidate's key is the prefix plus
// its candidate value).
inline std::string StandingPrefix(const std::string& key) {
  return key + "/standing/";
}

// Where the epoch base of the election at `key` lives (see "Epoch"): a
// decimal integer, absent while 0.
inline std::string EpochBaseKey(const std::string& key) {
  return key + "/epoch_base";
}

// The leader key of a HyMCache cluster's masters:
// "/hymcache/<cluster>/master/leader" (docs/ha.md).
inline std::string MasterLeaderKey(const std::string& cluster) {
  return "/hymcache/" + cluster + "/master/leader";
}

// The current leader (a linearizable read), or nullopt when none.
absl::StatusOr<std::optional<LeaderInfo>> ReadLeader(
    EtcdClient* etcd, const std::string& key,
    absl::Time deadline = EtcdClient::kDefaultDeadline);

// Follows the leader key: reads it, then watches it; calls on_change with
// each new leader (nullopt: none) in the order etcd applied them.
class LeaderObserver {
 public:
  using Callback = std::function<void(const std::optional<LeaderInfo>&)>;
  // Reads the key (calls `on_change` once with the answer before
  // returning), then watches it. Errors: as ReadLeader; InvalidArgument for
  // an empty key.
  static absl::StatusOr<std::unique_ptr<LeaderObserver>> Create(
      EtcdClient* etcd, const std::string& key, Callback on_change);
  ~LeaderObserver();

  std::optional<LeaderInfo> current() const;
  // The highest epoch seen so far (0: none): what a node or client fences
  // with.
  int64_t highest_epoch() const;

 private:
  LeaderObserver(EtcdClient* etcd, std::string key, Callback on_change)
      : etcd_(etcd), key_(std::move(key)), on_change_(std::move(on_change)) {}
  void Update(const std::optional<LeaderInfo>& leader);
  void OnWatch(absl::StatusOr<EtcdWatchBatch> batch);

  EtcdClient* const etcd_;
  const std::string key_;
  const Callback on_change_;
  std::unique_ptr<EtcdWatcher> watcher_;

  mutable Mutex mu_;
  std::optional<LeaderInfo> current_ ABSL_GUARDED_BY(mu_);
  int64_t highest_epoch_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hymcache
