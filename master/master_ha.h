// HaMaster: a master that leads only while etcd elects it (docs/ha.md).
// hymcache-master runs one when given --etcd; without it a plain
// MasterServer serves, as before.
//
// Life of an HaMaster:
//   1. Standing by. It binds its listen address at once and answers every
//      hymcache.v1.MasterService call with UNAVAILABLE, reason kNotLeader
//      and the leader it knows (common/status_reason.h: LeaderHintOf), and
//      grpc.health.v1 with NOT_SERVING. It does not open its store. It
//      campaigns (LeaderElection) with its client address under the key
//      /hymcache/<cluster>/master/leader.
//   2. Elected. It opens its store and serves on the same port
//      (MasterServer::Create: the ordinary start-up and recovery, binding
//      with SO_REUSEPORT beside the standby server), then closes the
//      standby server: the port is never closed. Every call passes a gate
//      that refuses writes (kNotLeader, or kReadOnly in 3') as soon as
//      LeaderElection::IsLeader() turns false, which happens at the
//      lease's local deadline even if the election thread is stuck: a
//      deposed leader writes nothing after its term. The generations it
//      hands out lie in [epoch << 32, (epoch + 1) << 32), above anything
//      an earlier term could have issued, whichever store that term used.
//   3. Deposed (lease lost, key deleted). It stops serving and finished()
//      turns true with the reason; hymcache-master then exits with status
//      3 and its supervisor (systemd Restart=on-failure, Kubernetes) starts
//      it again as a standby. A fresh process is the simplest way back to
//      standby: no state of the old term survives it.
//   3'. Read-only (serve_reads_without_etcd, the default): a term that
//      ended only because no renewal reached etcd within the lease (etcd
//      lost its quorum, or this master is cut off from it) keeps its
//      server, which answers calls that read (lookups, heartbeats, stats:
//      CallAccess::kRead) and refuses every write with UNAVAILABLE, reason
//      kReadOnly. The election keeps campaigning: once etcd answers again
//      this master either wins a new term (it serves again, read-write,
//      with the new epoch's generations, through the same handoff as in
//      2) or sees another master lead and is deposed (3). docs/ha.md
//      argues why reads under an ended term are safe.
//
// Standby replication (master.replication async or sync, docs/ha.md): a
// standing-by master runs a ReplicaFollower on its own db_path, following
// the leader the election observes (the leader key's address, where the
// leader serves hymcache.v1.Replication beside MasterService), so its
// directory holds a prefix of the leader's committed writes. Once elected
// it stops the follower and opens the directory with the ordinary restart
// path: it serves everything the old leader had replicated to it.
//
// With the store opened only once elected, two masters on one host may
// instead share a db_path (replication off): RocksDB's LOCK file keeps
// them from opening it at once, and a new leader retries its open
// (open_retry) while a deposed one (or a killed one, whose lock the kernel
// releases) lets go. A standby whose follower cannot open its directory
// (another master holds it) stands by without following.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/leader_election.h"
#include "common/mutex.h"
#include "common/security.h"
#include "common/stats.h"
#include "common/thread.h"
#include "master/master_server.h"
#include "master/standby_confirm_waits.h"
#include "master/standby_snapshots.h"

namespace hymcache {

class EtcdClient;
class LeaderElection;

namespace master {
class ReplicaFollower;
class StandbyConfirmWaits;
class StandbyServer;
}  // namespace master

struct HaMasterOptions {
  // The etcd cluster's client endpoints (host:port). Required.
  std::vector<std::string> etcd_endpoints;
  // The cluster's name: its keys live under /hymcache/<cluster>/.
  // Default: "default".
  std::string cluster = "default";
  // The address clients, nodes and other masters reach this master at,
  // published in the leader key. "" : the bound listen address
  // (MasterServer::address()). Default: "".
  std::string advertise_address;
  // The election's lease (LeaderElectionOptions::lease_ttl): how long the
  // cluster is without a leader after a leader dies without resigning.
  // Whole seconds, >= 1 s. Default: 5 s.
  absl::Duration lease_ttl = absl::Seconds(5);
  // How long an elected master keeps retrying to open its store (another
  // process may still hold its lock) before it gives up its term.
  // Default: 10 s.
  absl::Duration open_retry = absl::Seconds(10);
  // The server this master runs while it leads. Its gate and generation
  // range are set here (any given are replaced); its listen_address is
  // where the standby listens too. master.replication also says whether a
  // standby follows the leader (any mode but kOff).
  MasterOptions master;
  // What a standby's follower presents to the leader: an admin identity of
  // the cluster (token, TLS). Default: plaintext, no token.
  ChannelSecurity replication_security;
  // How often a standby re-reads which leader the election observes (and
  // points its follower there). Default: 50 ms.
  absl::Duration follow_interval = absl::Milliseconds(50);
  // Whether a leader whose term ended because etcd did not answer (no
  // quorum, or cut off) keeps answering lookups, read-only, until an
  // election decides again (see 3' above). false: it is deposed at once,
  // as when its lease is revoked. Default: true.
  bool serve_reads_without_etcd = true;
  // Whether a standby that follows the leader (replication on) loads its
  // index from its directory as soon as it starts (read-only, beside its
  // follower: MasterServer::PreloadIndex), so that if it is elected before
  // its follower applies anything (all masters restarted at once) it
  // serves without loading again. The loaded index is dropped as soon as
  // the follower applies a batch. Costs the index's memory and one load's
  // CPU at start. It loads again when the follower's stream from the
  // leader breaks (the leader died: the lease runs out before anyone is
  // elected), so that a failover does not load after the election either.
  // Default: true.
  bool preload_index = true;
  // With replication, standbys rank a vacancy before they campaign
  // (LeaderElectionOptions::standing: the leader sequence each follower
  // applied, within one leader database), so that the most up-to-date one
  // leads: the longest each waits for another present standby to rank it
  // (a lone standby, or one whose peers rank at once, waits a few ms of
  // etcd calls). 0: no ranking (the first standby to campaign wins).
  // Default: 100 ms.
  absl::Duration ranking_window = absl::Milliseconds(100);
  // With replication, a standby whose stream from the leader broke tries
  // the leader's address (a TCP connect, at most every follow_interval);
  // when the host answers that nothing listens there (ECONNREFUSED: the
  // leader's process is gone, its host is up) it revokes the leader's
  // lease (LeaderElection::RevokeLeaderLease), so that the standbys elect
  // at once instead of after the lease's TTL. A leader whose host is lost
  // or cut off answers no connect at all, and its lease runs out as
  // before. With preload_index it loads its index first, so that the
  // standby elected serves at once. And, with or without replication, a
  // master that finds the leader key naming its own address while it
  // stands by revokes that lease at once: it is an earlier process's on
  // this address (killed and restarted, by systemd say), with no probe.
  // false: always wait for the lease. Default: true.
  bool end_dead_leader_terms = true;
  // While leading, keep etcd's raft leadership off the member listed first
  // in etcd_endpoints (in a three-host install, the one on this host:
  // docs/ha.md, "A three-host install loses a host"): every few seconds
  // the leader asks that member's Status and, if it is the raft leader,
  // has it hand the leadership to another member (MoveLeader). A lost host
  // then never takes the leading master and etcd's raft leader at once,
  // which costs a raft election plus a whole lease TTL (a new raft leader
  // restarts every lease). Each move restarts the leases too, once. A
  // one-member etcd is left alone. Default: false.
  bool move_etcd_raft_leader = false;

  // InvalidArgument naming the first bad field.
  absl::Status Validate() const;
};

class HaMaster {
 public:
  // Binds the listen address (standby) and starts campaigning. Errors:
  // InvalidArgument (Validate); Unavailable if the address cannot be bound
  // or etcd cannot be reached.
  static absl::StatusOr<std::unique_ptr<HaMaster>> Create(
      const HaMasterOptions& options);
  // Shutdown().
  ~HaMaster();
  HaMaster(const HaMaster&) = delete;
  HaMaster& operator=(const HaMaster&) = delete;

  // "host:port" that clients dial (as MasterServer::address()).
  const std::string& address() const { return address_; }
  // The address in the leader key while this master leads.
  const std::string& advertise_address() const { return advertise_; }

  // The epoch while this master leads and serves; nullopt otherwise.
  std::optional<int64_t> ServingEpoch() const;
  // Whether this master serves reads only (its term ended when etcd
  // stopped answering; see 3' above).
  bool read_only() const {
    return read_only_epoch_.load(std::memory_order_acquire) != 0;
  }
  // Whether this master is done (deposed, or could not serve when
  // elected): the process should exit. finish_reason() says why.
  bool finished() const;
  absl::Status finish_reason() const;
  // Blocks until finished() or `deadline`; returns finished().
  bool WaitFinished(absl::Time deadline) const;

  // Re-reads identities and certificates (SIGHUP) while serving; OkStatus
  // otherwise (a standby reads them when elected).
  absl::Status Reload();
  // Whether the serving server answers (systemd watchdog); OkStatus while
  // standing by.
  absl::Status CheckAlive(absl::Duration timeout);

  // Stops campaigning (a leader resigns: a standby takes over at once),
  // stops serving. Idempotent.
  void Shutdown();

 private:
  explicit HaMaster(const HaMasterOptions& options);
  // The "master-ha" thread: waits for election, then serves until the term
  // ends or Shutdown.
  void Loop();
  // Opens the store and serves for `epoch`; retries while still leading.
  absl::Status Serve(int64_t epoch);
  // Read-only and elected again with `epoch`: retires the old term's server
  // (a standby holds the port meanwhile), then Serve(epoch).
  absl::Status ServeAgain(int64_t epoch);
  // The gate of the serving server: OK while this candidate leads; reads
  // only while read_only().
  absl::Status Gate(int64_t epoch, CallAccess access) const;
  // Serves until the term ends (deposed, or Shutdown) or, read-only, this
  // master is elected again (returns true, `*epoch` the new term's).
  bool ServeTerm(int64_t* epoch);
  // Read-only: whether the election observes another master's term (one
  // this master did not win), which deposes it.
  bool AnotherLeaderObserved(int64_t epoch) const;
  // What a standby (or a deposed leader) answers: kNotLeader with the
  // leader this candidate knows.
  absl::Status NotLeader() const;
  // The confirmations a standby server answers from the follower (commits
  // the client confirms); null without replication, or if its thread
  // cannot start (then WaitApplied is refused as every call is).
  std::unique_ptr<master::StandbyConfirmWaits> NewConfirmWaits();
  // Points the follower (if any) at the leader the election observes;
  // counts leader changes. On the master-ha thread.
  void FollowObservedLeader();
  // Stops the follower so the store can be opened; on the master-ha thread.
  void StopFollowing();
  // move_etcd_raft_leader's check and move; on the master-ha thread.
  void MaybeMoveRaftLeader();
  // Loads preloaded_ (options_.preload_index); on the master-ha thread.
  void Preload();
  // What the follower has changed in the directory so far (batches applied
  // and copies; max while it copies): preloaded_ is stale once it moves.
  uint64_t FollowerProgress() const;
  // Drops preloaded_ if the follower moved since; on the master-ha thread.
  void DropStalePreload();
  // Preloads again once the follower's stream has been down a while with
  // changes since the last preload (the leader died: the lease runs out
  // before anyone is elected, and the load runs meanwhile); at most once
  // per kPreloadInterval. On the master-ha thread.
  void MaybePreloadAgain();
  // end_dead_leader_terms: revokes the lease of a leader named by this
  // master's own address (an earlier process of it) at once; else, while
  // the follower's stream is down, probes the followed leader's address
  // and, if nothing listens there, preloads the index (preload_index) and
  // revokes the leader's lease. Returns whether it ended a term. On the
  // master-ha thread.
  bool MaybeEndDeadLeaderTerm();
  // The leadership stats (MasterOptions::extra_stats).
  void VisitStats(StatsVisitor* v) const;
  // How up to date the follower is, for the election's ranking (on the
  // election thread).
  CandidateStanding Standing() const;

  // Constant after Create.
  const HaMasterOptions options_;
  int port_ = 0;           // the bound port
  // The highest epoch its store's generations came from when it started:
  // the election's epoch_floor (common/leader_election.h, "Epoch").
  int64_t store_epoch_floor_ = 0;
  std::string address_;
  std::string advertise_;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<LeaderElection> election_;
  // election_.get() once it exists (the standby answers before).
  std::atomic<LeaderElection*> election_ptr_{nullptr};
  Thread thread_;
  // The standby's follower (null: replication off, or its directory is
  // held by another process). Used by the master-ha thread only, and by
  // Shutdown after joining it.
  std::unique_ptr<master::ReplicaFollower> follower_;
  // Snapshots of follower_'s store while standing by (null: replication or
  // snapshots off). Stopped before follower_ stops, joined by Shutdown.
  std::unique_ptr<StandbySnapshots> snapshots_;
  std::atomic<uint64_t> standby_snapshots_{0};  // written, at the election
  std::atomic<uint64_t> raft_leader_moves_{0};  // MaybeMoveRaftLeader's
  // follower_ as Standing() reads it: cleared before follower_ stops.
  mutable Mutex standing_mu_;
  master::ReplicaFollower* standing_source_ ABSL_GUARDED_BY(standing_mu_) =
      nullptr;
  std::string followed_;  // the leader follower_ follows; master-ha thread
  // The leader epochs this process has seen change (standing by, and its
  // own election).
  std::atomic<uint64_t> leader_changes_{0};
  int64_t observed_epoch_ = 0;  // master-ha thread
  // The index loaded while standing by, and FollowerProgress() before its
  // load began. master-ha thread only (Serve hands it to MasterServer::
  // Create there).
  std::optional<PreloadedIndex> preloaded_;
  uint64_t preload_progress_ = 0;
  // Preload ran (whatever it got), or Loop skipped the startup preload
  // for a term it ended at once.
  bool preloaded_once_ = false;
  absl::Time last_preload_ = absl::InfinitePast();       // MaybePreloadAgain's
  absl::Time stream_down_since_ = absl::InfinitePast();  // InfinitePast: up
  // MaybeEndDeadLeaderTerm's: the epoch it last ended, and when a probe
  // last found the leader alive or unreachable since the stream was last
  // up. master-ha thread.
  int64_t revoked_epoch_ = 0;
  absl::Time last_inconclusive_probe_ = absl::InfinitePast();
  // The serving term took over preloaded_ (1) or loaded its store (0).
  std::atomic<int> served_preloaded_{0};
  // What the follower had applied when this master was elected.
  std::atomic<uint64_t> applied_at_election_{0};
  // What the follower held when it stopped to lead (final), for the
  // confirmations asked until the standby server closes.
  master::StandbyApplied final_applied_ ABSL_GUARDED_BY(standing_mu_);
  std::atomic<uint64_t> full_copies_{0};
  // The ended term whose server serves reads only (3' above); 0: none.
  // Set by on_lost, cleared when elected again or deposed.
  std::atomic<int64_t> read_only_epoch_{0};
  std::atomic<uint64_t> read_only_periods_{0};
  mutable std::atomic<uint64_t> read_only_refusals_{0};

  mutable Mutex mu_;
  mutable CondVar cv_;
  std::unique_ptr<master::StandbyServer> standby_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<MasterServer> server_ ABSL_GUARDED_BY(mu_);
  // The term won (on_elected) and not yet served; 0: none.
  int64_t elected_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // The highest master epoch a registering node had accepted above the
  // serving term's (MasterServiceOptions::on_epoch_behind; 0: none).
  int64_t node_epoch_above_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t serving_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // on_lost ran (the term ended).
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status finish_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hymcache
