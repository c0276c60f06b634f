#include "master/master_ha.h"

#include <glog/logging.h>
#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/etcd_client.h"
#include "common/grpc_status.h"
#include "common/leader_election.h"
#include "common/net.h"
#include "common/security.h"
#include "common/status_reason.h"
#include "master/cq_server.h"
#include "master/health_service.h"
#include "master/metadata_store.h"
#include "master/replica_follower.h"
#include "master/standby_confirm_waits.h"
#include "proto/master.grpc.pb.h"
#include "proto/replication.pb.h"

namespace hymcache {
namespace master {

// What a master that does not lead serves on its port: every call that is
// not grpc.health.v1 (so every MasterService method, whatever the caller's
// version) finishes at once with `refusal()`, and health says NOT_SERVING.
// No identity check: the answer holds nothing but the leader's address,
// which the leader key publishes anyway. With `waits`, it also serves
// StandbyConfirm.WaitApplied (commits the client confirms,
// master/standby_confirm_waits.h).
class StandbyServer {
 public:
  static absl::StatusOr<std::unique_ptr<StandbyServer>> Create(
      const MasterOptions& options, std::function<absl::Status()> refusal,
      std::unique_ptr<StandbyConfirmWaits> waits = nullptr) {
    std::unique_ptr<StandbyServer> s(
        new StandbyServer(std::move(refusal), std::move(waits)));
    auto tls = ReloadableServerTls::Create(options.tls);
    if (!tls.ok()) return tls.status();
    s->tls_ = std::move(tls).value();
    s->health_.SetServingStatus(v1::MasterService::service_full_name(), false);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(options.listen_address, s->tls_->credentials(),
                             &port);
    // The elected master binds the port beside it before it closes
    // (HaMaster::Serve). Two HaMasters configured on one host:port would
    // both bind it: give each master its own port.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 1);
    builder.SetOption(
        std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
    builder.RegisterService(s->health_.service());
    builder.RegisterAsyncGenericService(&s->generic_);
    auto cq = builder.AddCompletionQueue();
    s->server_ = builder.BuildAndStart();
    s->poller_ = std::make_unique<CqPoller>(std::move(cq));
    if (s->server_ == nullptr || port == 0) {
      return absl::UnavailableError(
          absl::StrCat("master: cannot listen on ", options.listen_address));
    }
    s->port_ = port;
    StandbyServer* raw = s.get();
    s->poller_->Start("master-standby", [raw] {
      raw->health_.StartOn(raw->poller_.get());
      StandbyCall::Request(raw);
    });
    return s;
  }

  ~StandbyServer() {
    health_.Shutdown();
    // The open confirmations are answered (FailedPrecondition: this master
    // no longer stands by) before the grace below, and no later ones wait.
    if (waits_ != nullptr) waits_->Shutdown();
    // A call already taken is answered with its refusal (UNAVAILABLE, which
    // callers retry on the leader) instead of being cancelled: with an
    // immediate deadline a client polling the standby while it handed the
    // port over got CANCELLED, which it does not retry. The refusals are
    // immediate, so the grace ends as soon as they are sent.
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(200));
    poller_->ShutdownAndJoin();
  }

  int port() const { return port_; }

 private:
  // One call: requested, then finished with the refusal; or, for
  // WaitApplied, its request read, then answered when the waits say.
  class StandbyCall final : public CqTag {
   public:
    static void Request(StandbyServer* server) {
      auto* call = new StandbyCall(server);
      if (!server->poller_->IfOpen([call, server] {
            grpc::ServerCompletionQueue* cq = server->poller_->cq();
            server->generic_.RequestCall(&call->ctx_, &call->stream_, cq, cq,
                                         call);
          })) {
        delete call;
      }
    }
    void Proceed(bool ok) override {
      switch (state_) {
        case State::kRequested:
          if (!ok) break;
          Request(server_);
          if (server_->waits_ != nullptr &&
              ctx_.method() == kWaitAppliedMethod) {
            state_ = State::kReading;
            stream_.Read(&request_, this);
          } else {
            Finish(server_->refusal_());
          }
          return;
        case State::kReading:
          Confirm(ok);
          return;
        case State::kFinishing:
          break;
      }
      delete this;
    }

   private:
    static constexpr char kWaitAppliedMethod[] =
        "/hymcache.v1.StandbyConfirm/WaitApplied";
    enum class State { kRequested, kReading, kFinishing };

    explicit StandbyCall(StandbyServer* server)
        : server_(server), stream_(&ctx_) {}

    void Confirm(bool read) {
      v1::WaitAppliedRequest req;
      std::vector<grpc::Slice> slices;
      std::string bytes;
      if (read && request_.Dump(&slices).ok()) {
        for (const grpc::Slice& slice : slices) {
          bytes.append(reinterpret_cast<const char*>(slice.begin()),
                       slice.size());
        }
      }
      if (!read || !req.ParseFromString(bytes)) {
        Finish(absl::InvalidArgumentError(
            "standby: a WaitApplied call without a request"));
        return;
      }
      // The call's own deadline, at most a minute away.
      const absl::Time deadline = std::min(absl::FromChrono(ctx_.deadline()),
                                           absl::Now() + absl::Minutes(1));
      // `this` may be gone once Wait returns (answered on another thread).
      server_->waits_->Wait(req.db_id(), req.sequence(), deadline,
                            [this](absl::Status status, uint64_t applied) {
                              if (!status.ok()) {
                                Finish(status);
                                return;
                              }
                              v1::WaitAppliedResponse resp;
                              resp.set_applied_sequence(applied);
                              const std::string out = resp.SerializeAsString();
                              grpc::Slice slice(out);
                              response_ = grpc::ByteBuffer(&slice, 1);
                              state_ = State::kFinishing;
                              if (!server_->poller_->IfOpen([this] {
                                    stream_.WriteAndFinish(
                                        response_, grpc::WriteOptions(),
                                        grpc::Status::OK, this);
                                  })) {
                                delete this;
                              }
                            });
    }

    void Finish(const absl::Status& status) {
      state_ = State::kFinishing;
      // The queue may be shut down already (an answer from the waits'
      // thread): then no event would come.
      if (!server_->poller_->IfOpen(
              [this, status] { stream_.Finish(ToGrpcStatus(status), this); })) {
        delete this;
      }
    }

    StandbyServer* const server_;
    grpc::GenericServerContext ctx_;
    grpc::GenericServerAsyncReaderWriter stream_;
    grpc::ByteBuffer request_;
    grpc::ByteBuffer response_;
    State state_ = State::kRequested;
  };

  StandbyServer(std::function<absl::Status()> refusal,
                std::unique_ptr<StandbyConfirmWaits> waits)
      : refusal_(std::move(refusal)), waits_(std::move(waits)) {}

  const std::function<absl::Status()> refusal_;
  const std::unique_ptr<StandbyConfirmWaits> waits_;
  std::unique_ptr<ReloadableServerTls> tls_;
  HealthService health_;
  grpc::AsyncGenericService generic_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CqPoller> poller_;
  int port_ = 0;
};

}  // namespace master

namespace {

constexpr int kEpochShift = 32;

std::string JoinHostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos
             ? absl::StrCat("[", host, "]:", port)
             : absl::StrCat(host, ":", port);
}

// `listen`'s host (as configured: a wildcard listens everywhere) with
// `port`.
std::string WithPort(const std::string& listen, int port) {
  return JoinHostPort(SplitHostPort(listen)->first, port);
}

// What a client dials for `listen` bound at `port` (as
// MasterServer::address()).
std::string DialAddress(const std::string& listen, int port) {
  std::string host = SplitHostPort(listen)->first;
  if (host == "0.0.0.0" || host == "::" || host == "*") host = "127.0.0.1";
  return JoinHostPort(host, port);
}

}  // namespace

absl::Status HaMasterOptions::Validate() const {
  if (etcd_endpoints.empty()) {
    return absl::InvalidArgumentError("master HA: etcd_endpoints is required");
  }
  if (cluster.empty() || cluster.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        "master HA: cluster must be a non-empty name without '/'");
  }
  if (!advertise_address.empty() && !SplitHostPort(advertise_address).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("master HA: advertise_address '", advertise_address,
                     "' is not host:port"));
  }
  if (lease_ttl < absl::Seconds(1) ||
      absl::Ceil(lease_ttl, absl::Seconds(1)) != lease_ttl) {
    return absl::InvalidArgumentError(
        "master HA: lease_ttl must be whole seconds, at least 1 s");
  }
  if (ranking_window < absl::ZeroDuration() || ranking_window >= lease_ttl) {
    return absl::InvalidArgumentError(
        "master HA: ranking_window must be >= 0 and below lease_ttl");
  }
  if (open_retry < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("master HA: open_retry must be >= 0");
  }
  if (follow_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "master HA: follow_interval must be positive");
  }
  return master.Validate();
}

HaMaster::HaMaster(const HaMasterOptions& options) : options_(options) {}

HaMaster::~HaMaster() { Shutdown(); }

absl::StatusOr<std::unique_ptr<HaMaster>> HaMaster::Create(
    const HaMasterOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<HaMaster> ha(new HaMaster(options));
  EtcdClientOptions eo;
  eo.endpoints = options.etcd_endpoints;
  auto etcd = EtcdClient::Create(eo);
  if (!etcd.ok()) return etcd.status();
  ha->etcd_ = std::move(etcd).value();

  HaMaster* raw = ha.get();
  auto standby = master::StandbyServer::Create(
      options.master, [raw] { return raw->NotLeader(); },
      raw->NewConfirmWaits());
  if (!standby.ok()) return standby.status();
  ha->port_ = (*standby)->port();
  ha->address_ = DialAddress(options.master.listen_address, ha->port_);
  ha->advertise_ = options.advertise_address.empty()
                       ? ha->address_
                       : options.advertise_address;
  {
    MutexLock l(&ha->mu_);
    ha->standby_ = std::move(standby).value();
  }
  // Before the follower writes to the directory (not that it matters: the
  // read takes no lock). A store that cannot be read is the open's problem
  // once elected; here it only lowers what the floor knows.
  if (auto limit = master::ReadReservedGenerationLimit(options.master.db_path);
      limit.ok()) {
    ha->store_epoch_floor_ = static_cast<int64_t>(*limit >> kEpochShift);
  } else {
    LOG(WARNING) << "master HA: cannot read the generations reserved in "
                 << options.master.db_path << ": " << limit.status();
  }
  if (options.master.replication != master::ReplicationMode::kOff) {
    // The same directory and options the master opens when elected
    // (MasterServer's OpenService).
    master::ReplicaFollowerOptions fo;
    fo.store.path = options.master.db_path;
    fo.store.sync_writes = options.master.sync_writes;
    fo.store.keep_wal_seconds = 3600;
    fo.security = options.replication_security;
    fo.name = ha->advertise_;
    auto follower = master::ReplicaFollower::Create(fo);
    if (follower.ok()) {
      ha->follower_ = std::move(follower).value();
      {
        MutexLock l(&ha->standing_mu_);
        ha->standing_source_ = ha->follower_.get();
      }
      if (options.master.index_snapshots &&
          options.master.service.snapshot_changes > 0) {
        StandbySnapshotsOptions so;
        so.master = options.master;
        so.applied = [f = ha->follower_.get()]() -> uint64_t {
          const master::ReplicaFollower::Stats st = f->GetStats();
          return st.copying ? 0 : st.applied_sequence;
        };
        auto snapshots = StandbySnapshots::Start(so);
        if (snapshots.ok()) {
          ha->snapshots_ = std::move(snapshots).value();
        } else {
          LOG(WARNING) << "master HA: no snapshots while standing by: "
                       << snapshots.status();
        }
      }
    } else {
      LOG(WARNING) << "master HA: not following the leader: "
                   << follower.status()
                   << " (another master holds the directory?); when elected "
                      "this master serves what its directory holds then";
    }
  }

  LeaderElectionOptions lo;
  lo.etcd = ha->etcd_.get();
  lo.key = MasterLeaderKey(options.cluster);
  lo.candidate = ha->advertise_;
  lo.lease_ttl = options.lease_ttl;
  lo.thread_name = "master-election";
  // Its store may hold generations of epochs that etcd no longer knows of
  // (etcd recreated empty): never lead with one of those again.
  lo.epoch_floor = [raw] { return raw->store_epoch_floor_; };
  // A standby whose follower could not start ranks too (knowing nothing, it
  // yields to one that follows). Without replication every master serves
  // the same directory: nothing to rank.
  if (options.master.replication != master::ReplicationMode::kOff &&
      options.ranking_window > absl::ZeroDuration()) {
    lo.standing = [raw] { return raw->Standing(); };
    lo.ranking_window = options.ranking_window;
    // An outranked standby waits for the better one's election: its Txn,
    // and the watch event (a few ms), with room for a loaded host.
    lo.ranking_patience =
        std::max(5 * options.ranking_window, absl::Milliseconds(500));
  }
  lo.on_elected = [raw](int64_t epoch) {
    LOG(INFO) << "master HA: elected leader of cluster '"
              << raw->options_.cluster << "' with epoch " << epoch;
    MutexLock l(&raw->mu_);
    raw->elected_epoch_ = epoch;
    raw->cv_.SignalAll();
  };
  lo.on_lost = [raw](int64_t epoch, const absl::Status& why) {
    MutexLock l(&raw->mu_);
    // Only a term that ran out without an answer from etcd (no quorum, or
    // cut off) turns read-only: a revoked lease or a replaced key means
    // another master may lead.
    if (raw->options_.serve_reads_without_etcd &&
        why.code() == absl::StatusCode::kDeadlineExceeded &&
        raw->serving_epoch_ == epoch && !raw->stopping_) {
      LOG(WARNING) << "master HA: the term of epoch " << epoch
                   << " ended without an answer from etcd (" << why
                   << "): serving lookups only, refusing writes, until an "
                      "election decides again";
      raw->read_only_epoch_.store(epoch, std::memory_order_release);
      raw->read_only_periods_.fetch_add(1, std::memory_order_relaxed);
    } else {
      LOG(WARNING) << "master HA: lost the leadership of epoch " << epoch
                   << ": " << why;
      raw->lost_ = true;
    }
    raw->cv_.SignalAll();
  };
  auto election = LeaderElection::Create(lo);
  if (!election.ok()) return election.status();
  ha->election_ = std::move(election).value();
  ha->election_ptr_.store(ha->election_.get(), std::memory_order_release);
  ha->thread_ = Thread("master-ha", [raw] { raw->Loop(); });
  LOG(INFO) << "master HA: standing by on " << ha->address_
            << ", campaigning as " << ha->advertise_ << " under " << lo.key;
  return ha;
}

absl::Status HaMaster::NotLeader() const {
  // election_ is set after the standby starts answering.
  LeaderHint hint;
  if (LeaderElection* e = election_ptr_.load(std::memory_order_acquire)) {
    if (std::optional<LeaderInfo> l = e->ObservedLeader();
        l.has_value() && l->candidate != advertise_) {
      hint.address = l->candidate;
      hint.epoch = l->epoch;
    }
  }
  return NotLeaderError(
      hint.address.empty()
          ? absl::StrCat("master ", advertise_,
                         " does not lead and knows no leader")
          : absl::StrCat("master ", advertise_,
                         " does not lead; the leader is ", hint.address,
                         " (epoch ", hint.epoch, ")"),
      hint);
}

absl::Status HaMaster::Gate(int64_t epoch, CallAccess access) const {
  LeaderElection* e = election_ptr_.load(std::memory_order_acquire);
  // The server of `epoch` writes only within that term: a later term won
  // while it still runs (read-only, before the handoff) is not its own.
  if (e != nullptr && e->LeaderEpoch() == epoch) return absl::OkStatus();
  // Reads also between the lease's local deadline and on_lost (which
  // decides whether the term turns read-only): nobody else can be elected
  // before etcd expires the lease, later still.
  if (access == CallAccess::kRead && options_.serve_reads_without_etcd &&
      e != nullptr && e->UnendedTermEpoch() == epoch) {
    return absl::OkStatus();
  }
  if (read_only_epoch_.load(std::memory_order_acquire) == epoch) {
    if (access == CallAccess::kRead) return absl::OkStatus();
    if (access == CallAccess::kWrite) {
      read_only_refusals_.fetch_add(1, std::memory_order_relaxed);
    }
    return WithReason(
        absl::UnavailableError(absl::StrCat(
            "master ", advertise_, " lost etcd (its term of epoch ", epoch,
            " ended unrenewed): it answers lookups but refuses writes until "
            "an election decides again")),
        StatusReason::kReadOnly);
  }
  return NotLeader();
}

bool HaMaster::AnotherLeaderObserved(int64_t epoch) const {
  // This master's own campaigns show its own address (an old key of its
  // own, or a term it just won): not another leader.
  std::optional<LeaderInfo> l = election_->ObservedLeader();
  return l.has_value() && l->candidate != advertise_ && l->epoch > epoch;
}

bool HaMaster::ServeTerm(int64_t* epoch) {
  // How often a leader checks where etcd's raft leader is
  // (move_etcd_raft_leader).
  constexpr absl::Duration kRaftLeaderCheck = absl::Seconds(2);
  int64_t ended_above = 0;  // the node epoch this term was ended for
  absl::Time next_raft_check = absl::Now();  // at the term's start
  while (true) {
    int64_t end_above = 0;
    bool check_raft = false;
    {
      // Read-write: nothing to do until on_lost (or Shutdown) signals, or a
      // node shows an epoch above this term's (or the raft leader's check
      // is due). The read-only flag is read under mu_, which on_lost holds
      // to set it.
      MutexLock l(&mu_);
      while (
          !stopping_ && !lost_ &&
          read_only_epoch_.load(std::memory_order_acquire) != *epoch &&
          (node_epoch_above_ <= *epoch || node_epoch_above_ == ended_above)) {
        if (!options_.move_etcd_raft_leader) {
          cv_.Wait(&mu_);
        } else if (absl::Now() >= next_raft_check) {
          check_raft = true;
          break;
        } else {
          cv_.WaitWithDeadline(&mu_, next_raft_check);
        }
      }
    }
    if (check_raft) {
      MaybeMoveRaftLeader();
      next_raft_check = absl::Now() + kRaftLeaderCheck;
      continue;
    }
    {
      MutexLock l(&mu_);
      if (stopping_ || lost_) return false;
      if (node_epoch_above_ > *epoch && node_epoch_above_ != ended_above) {
        end_above = node_epoch_above_;
      } else if (elected_epoch_ > *epoch) {
        *epoch = elected_epoch_;
        return true;
      }
    }
    if (end_above != 0) {
      // A node has accepted a master of a higher epoch than this term's
      // (etcd was recreated and no store remembered it): end the term above
      // it, so that whoever leads next (this master restarted, or a
      // standby) is a leader the nodes accept. on_lost follows.
      ended_above = end_above;
      absl::Status ended = election_->EndTermAbove(end_above);
      LOG(WARNING) << "master HA: a storage node has accepted epoch "
                   << end_above << ", above this term's " << *epoch
                   << ": ending the term for a leader above it: " << ended;
      continue;
    }
    // Read-only: poll the election for another master's term.
    if (AnotherLeaderObserved(*epoch)) {
      LOG(WARNING) << "master HA: read-only since epoch " << *epoch
                   << ", and another master leads now: deposed";
      MutexLock l(&mu_);
      lost_ = true;
      return false;
    }
    MutexLock l(&mu_);
    if (!stopping_ && !lost_ && elected_epoch_ <= *epoch) {
      cv_.WaitWithDeadline(&mu_, absl::Now() + options_.follow_interval);
    }
  }
}

void HaMaster::FollowObservedLeader() {
  std::optional<LeaderInfo> l = election_->ObservedLeader();
  if (!l.has_value()) return;
  if (l->epoch != observed_epoch_) {
    observed_epoch_ = l->epoch;
    leader_changes_.fetch_add(1, std::memory_order_relaxed);
  }
  if (follower_ == nullptr || l->candidate == advertise_ ||
      l->candidate == followed_) {
    return;
  }
  LOG(INFO) << "master HA: following leader " << l->candidate << " (epoch "
            << l->epoch << ")";
  followed_ = l->candidate;
  follower_->SetLeader(followed_);
}

void HaMaster::StopFollowing() {
  if (follower_ == nullptr) return;
  if (snapshots_ != nullptr) {
    // A view still loading finishes on its thread and is dropped.
    snapshots_->Stop();
    standby_snapshots_.store(snapshots_->GetStats().written,
                             std::memory_order_relaxed);
  }
  const master::ReplicaFollower::Stats st = follower_->GetStats();
  applied_at_election_.store(st.applied_sequence, std::memory_order_relaxed);
  full_copies_.store(st.full_copies, std::memory_order_relaxed);
  if (st.copying) {
    LOG(WARNING) << "master HA: elected while copying the old leader's store: "
                    "serving the part copied (objects not copied are misses)";
  }
  LOG(INFO) << "master HA: stopped following " << followed_
            << " at leader sequence " << st.applied_sequence << " of database "
            << st.leader_db_id << " (" << st.batches_applied
            << " batches applied, " << st.full_copies << " full copies)";
  {
    MutexLock l(&standing_mu_);
    standing_source_ = nullptr;
    final_applied_.following = !st.copying && !st.leader_db_id.empty();
    final_applied_.final = true;
    final_applied_.db_id = st.leader_db_id;
    final_applied_.sequence = st.applied_sequence;
  }
  absl::Status closed = follower_->Stop();
  if (!closed.ok()) {
    LOG(WARNING) << "master HA: closing the follower's store: " << closed;
  }
  follower_.reset();
}

std::unique_ptr<master::StandbyConfirmWaits> HaMaster::NewConfirmWaits() {
  if (options_.master.replication == master::ReplicationMode::kOff) {
    return nullptr;
  }
  master::StandbyConfirmWaitsOptions wo;
  wo.applied = [this] {
    master::StandbyApplied out;
    MutexLock l(&standing_mu_);
    if (standing_source_ == nullptr) return final_applied_;
    const master::ReplicaFollower::Stats st = standing_source_->GetStats();
    out.following = !st.copying && !st.leader_db_id.empty();
    out.db_id = st.leader_db_id;
    out.sequence = st.applied_sequence;
    return out;
  };
  wo.wait_applied = [this](uint64_t seen, absl::Time deadline) {
    // Held while it waits (at most a deadline slice, 5 ms): StopFollowing
    // takes it before the follower goes.
    MutexLock l(&standing_mu_);
    if (standing_source_ == nullptr) return;
    standing_source_->WaitApplied(seen + 1, deadline).IgnoreError();
  };
  auto waits = master::StandbyConfirmWaits::Create(wo);
  if (!waits.ok()) {
    LOG(WARNING) << "master HA: no commit confirmations while standing by: "
                 << waits.status();
    return nullptr;
  }
  return std::move(waits).value();
}

CandidateStanding HaMaster::Standing() const {
  MutexLock l(&standing_mu_);
  if (standing_source_ == nullptr) return {};
  const master::ReplicaFollower::Stats st = standing_source_->GetStats();
  // Mid-copy the directory is no usable state, and a store not yet
  // confirmed by the leader it follows (the one that just went) lacks
  // everything that leader committed: it knows nothing.
  if (st.copying || st.leader_db_id.empty() || st.data_leader.empty() ||
      st.data_leader != st.leader) {
    return {};
  }
  return {st.leader_db_id, st.applied_sequence};
}

uint64_t HaMaster::FollowerProgress() const {
  if (follower_ == nullptr) return 0;
  const master::ReplicaFollower::Stats st = follower_->GetStats();
  if (st.copying) return UINT64_MAX;
  return st.batches_applied + st.full_copies;
}

void HaMaster::Preload() {
  if (follower_ == nullptr || !options_.preload_index) return;
  preloaded_once_ = true;
  preloaded_.reset();
  preload_progress_ = FollowerProgress();
  auto loaded = MasterServer::PreloadIndex(options_.master);
  if (!loaded.ok()) {
    LOG(INFO) << "master HA: no index preloaded (" << loaded.status()
              << "); once elected this master loads its store";
    return;
  }
  LOG(INFO) << "master HA: preloaded the index of " << options_.master.db_path
            << " at sequence " << loaded->sequence << " in "
            << absl::FormatDuration(loaded->took)
            << ": served at once if elected before the follower applies "
               "anything";
  preloaded_ = std::move(loaded).value();
  DropStalePreload();
}

void HaMaster::MaybePreloadAgain() {
  // Down this long before it counts: a stream that reconnects at once (a
  // leader's restart of the stream, a blip) is not a dead leader.
  constexpr absl::Duration kStreamDownFor = absl::Milliseconds(100);
  // Repeated leader deaths (or a leader that keeps dropping the stream)
  // preload at most this often.
  constexpr absl::Duration kPreloadInterval = absl::Seconds(5);
  if (follower_ == nullptr || !options_.preload_index || !preloaded_once_ ||
      preloaded_.has_value()) {
    return;
  }
  const master::ReplicaFollower::Stats st = follower_->GetStats();
  const absl::Time now = absl::Now();
  if (st.streaming || st.copying) {
    stream_down_since_ = absl::InfinitePast();
    return;
  }
  if (stream_down_since_ == absl::InfinitePast()) stream_down_since_ = now;
  if (now - stream_down_since_ < kStreamDownFor ||
      now - last_preload_ < kPreloadInterval ||
      FollowerProgress() == preload_progress_) {
    return;  // not long enough, too soon, or nothing new to load
  }
  LOG(INFO) << "master HA: the stream from the leader is down ("
            << st.last_error << "): preloading the index meanwhile";
  last_preload_ = now;
  Preload();
}

bool HaMaster::MaybeEndDeadLeaderTerm() {
  if (!options_.end_dead_leader_terms) return false;
  const std::optional<LeaderInfo> l = election_->ObservedLeader();
  if (l.has_value() && l->candidate == advertise_ &&
      l->epoch != revoked_epoch_) {
    // The leader key names this master's address while this process
    // stands by: it is the term of an earlier process on this address
    // (killed and restarted, by systemd say), which is gone, since this one
    // listens there now. Ended at once instead of after its lease, with no
    // probe and no preload first (at start, Loop preloads only if no term
    // ended: the elected master loads its store). RevokeLeaderLease refuses
    // (FailedPrecondition) this process's own term, won meanwhile.
    revoked_epoch_ = l->epoch;
    absl::Status r = election_->RevokeLeaderLease(*l);
    if (r.ok()) {
      LOG(WARNING) << "master HA: the leader key named this master's address "
                   << advertise_ << " (epoch " << l->epoch
                   << ") under an earlier process's lease: ended its term";
    } else if (!absl::IsFailedPrecondition(r)) {
      LOG(WARNING) << "master HA: the leader key names this master's address "
                   << advertise_ << " (epoch " << l->epoch
                   << ") under an earlier process's lease; could not end its "
                      "term: "
                   << r << "; its lease will run out";
    }
    return r.ok();
  }
  if (follower_ == nullptr) return false;
  const master::ReplicaFollower::Stats st = follower_->GetStats();
  if (st.streaming || st.copying) {
    last_inconclusive_probe_ = absl::InfinitePast();  // probe at the break
    return false;
  }
  // A leader that answered (or whose host did not) is probed again only
  // this much later: a stream refused for another reason (credentials)
  // must not become a connect every follow_interval.
  constexpr absl::Duration kProbeAgainAfter = absl::Seconds(1);
  const absl::Time now = absl::Now();
  if (!l.has_value() || l->candidate == advertise_ ||
      l->candidate != followed_ || l->epoch == revoked_epoch_ ||
      now - last_inconclusive_probe_ < kProbeAgainAfter) {
    return false;
  }
  // A connect answered "refused" comes within a round trip; one that
  // times out says nothing (a lost host, a partition: the lease decides).
  absl::StatusOr<Socket> probe =
      ConnectTcp(l->candidate, now + options_.follow_interval);
  if (probe.ok() ||
      ReasonOf(probe.status()) != StatusReason::kConnectionRefused) {
    last_inconclusive_probe_ = now;
    return false;
  }
  revoked_epoch_ = l->epoch;
  LOG(WARNING) << "master HA: the leader " << l->candidate << " (epoch "
               << l->epoch << ") refuses connections (" << probe.status()
               << "): its process is gone; ending its term now";
  // Load the index first, as while a lease runs out (MaybePreloadAgain),
  // so that whichever standby is elected serves at once: the load is due
  // before serving either way, and now it precedes the election.
  if (options_.preload_index && preloaded_once_ && !preloaded_.has_value() &&
      FollowerProgress() != preload_progress_) {
    last_preload_ = now;
    Preload();
  }
  absl::Status r = election_->RevokeLeaderLease(*l);
  if (!r.ok()) {
    LOG(WARNING) << "master HA: could not end the term: " << r
                 << "; its lease will run out";
  }
  return r.ok();
}

void HaMaster::MaybeMoveRaftLeader() {
  if (options_.etcd_endpoints.size() < 2) return;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(500);
  auto status = etcd_->MemberStatus(0, deadline);
  if (!status.ok()) {
    VLOG(1) << "master HA: etcd member " << options_.etcd_endpoints[0] << ": "
            << status.status();
    return;
  }
  const uint64_t first = status->header().member_id();
  if (status->leader() != first) return;
  auto members = etcd_->MemberList(deadline);
  if (!members.ok()) return;
  uint64_t target = 0;
  for (const etcdserverpb::Member& m : members->members()) {
    if (m.id() != first && !m.islearner() && m.clienturls_size() > 0) {
      target = m.id();
      break;
    }
  }
  if (target == 0) return;
  absl::Status moved = etcd_->MoveLeader(0, target, deadline);
  if (!moved.ok()) {
    LOG(WARNING) << "master HA: etcd's raft leader is "
                 << options_.etcd_endpoints[0]
                 << ", beside this leading master; moving it failed: " << moved;
    return;
  }
  raft_leader_moves_.fetch_add(1, std::memory_order_relaxed);
  LOG(INFO) << "master HA: moved etcd's raft leadership from "
            << options_.etcd_endpoints[0] << " (beside this leading master) "
            << "to member " << absl::StrCat(absl::Hex(target));
}

void HaMaster::DropStalePreload() {
  if (!preloaded_.has_value()) return;
  const uint64_t now = FollowerProgress();
  if (now == preload_progress_) return;
  LOG(INFO) << "master HA: dropped the preloaded index (the follower has "
               "changed the store since)";
  preloaded_.reset();
}

void HaMaster::VisitStats(StatsVisitor* v) const {
  v->Counter(
      "leader_changes",
      "Leaders (epochs) this master process has seen, itself included",
      static_cast<double>(leader_changes_.load(std::memory_order_relaxed)));
  v->Gauge("replica_applied_sequence_at_election",
           "The old leader's write sequence this master's standby store held "
           "when it was elected (0: it did not follow)",
           static_cast<double>(
               applied_at_election_.load(std::memory_order_relaxed)));
  v->Counter(
      "etcd_raft_leader_moves",
      "Times this leading master moved etcd's raft leadership off the "
      "etcd member listed first (--etcd_move_raft_leader)",
      static_cast<double>(raft_leader_moves_.load(std::memory_order_relaxed)));
  v->Gauge(
      "standby_snapshots_at_election",
      "Index snapshots this master wrote of its store while standing by "
      "(master/standby_snapshots.h)",
      static_cast<double>(standby_snapshots_.load(std::memory_order_relaxed)));
  v->Gauge("replica_full_copies_at_election",
           "Full copies of the leader's store this master took while standing "
           "by",
           static_cast<double>(full_copies_.load(std::memory_order_relaxed)));
  v->Gauge("index_preloaded",
           "1 if this master's serving term took over the index it loaded "
           "while standing by (preload_index) instead of loading its store",
           served_preloaded_.load(std::memory_order_relaxed));
  v->Gauge("leader_read_only",
           "1 while this master serves lookups only: its term ended without "
           "an answer from etcd (no quorum, or cut off) and no election has "
           "decided since",
           read_only_epoch_.load(std::memory_order_relaxed) != 0 ? 1 : 0);
  v->Counter(
      "read_only_periods",
      "Terms of this master that ended without an answer from etcd "
      "and turned read-only",
      static_cast<double>(read_only_periods_.load(std::memory_order_relaxed)));
  if (LeaderElection* e = election_ptr_.load(std::memory_order_acquire)) {
    const LeaderElectionStats es = e->stats();
    v->Counter("election_rankings",
               "Vacancies this master ranked before campaigning "
               "(--election_ranking_ms)",
               static_cast<double>(es.rankings));
    v->Counter("election_yielded",
               "Vacancies where this master waited for a more up-to-date "
               "standby to lead",
               static_cast<double>(es.yielded));
    v->Counter("dead_leaders_revoked",
               "Terms of leaders whose address refused connections (their "
               "process gone) that this master ended by revoking their "
               "lease (--end_dead_leader_terms)",
               static_cast<double>(es.leaders_revoked));
  }
  v->Counter(
      "read_only_write_refusals",
      "Writes refused (reason read_only) while read-only",
      static_cast<double>(read_only_refusals_.load(std::memory_order_relaxed)));
}

void HaMaster::Loop() {
  // A first look at the leader key before the startup preload: a term
  // whose process is gone (this master's earlier process, or a leader
  // whose address refuses connections) ends at once, and the election
  // runs while the elected master loads its store. Preloading first would
  // put every standby's load, each contending for the cores, before the
  // election (ha_bench --restart_objects, docs/ha.md).
  constexpr absl::Duration kFirstLook = absl::Milliseconds(200);
  bool ended_at_start = false;
  if (options_.end_dead_leader_terms) {
    const absl::Time until = absl::Now() + kFirstLook;
    while (!election_->ObservedLeader().has_value() && absl::Now() < until) {
      MutexLock l(&mu_);
      if (stopping_) return;
      cv_.WaitWithDeadline(&mu_, absl::Now() + absl::Milliseconds(5));
    }
    FollowObservedLeader();
    ended_at_start = MaybeEndDeadLeaderTerm();
  }
  if (!ended_at_start) {
    Preload();
  } else {
    // Skipped, not off: later preloads (MaybePreloadAgain, and before
    // ending a dead leader's term) still run.
    preloaded_once_ = true;
  }
  int64_t epoch = 0;
  while (true) {
    FollowObservedLeader();
    DropStalePreload();
    MaybeEndDeadLeaderTerm();
    MaybePreloadAgain();
    MutexLock l(&mu_);
    if (stopping_) return;
    if (elected_epoch_ != 0) {
      epoch = elected_epoch_;
      break;
    }
    cv_.WaitWithDeadline(&mu_, absl::Now() + options_.follow_interval);
  }
  FollowObservedLeader();  // counts this master's own term
  StopFollowing();
  absl::Status served = Serve(epoch);
  preloaded_.reset();  // not taken: stale
  while (served.ok()) {
    const int64_t ended = epoch;
    if (!ServeTerm(&epoch)) {
      MutexLock l(&mu_);
      served = stopping_ ? absl::CancelledError("shutting down")
                         : absl::UnavailableError(absl::StrCat(
                               "lost the leadership of epoch ", ended));
      break;
    }
    // Read-only, and elected again: the new term's server takes the port
    // over (its generations lie in the new epoch's range).
    leader_changes_.fetch_add(1, std::memory_order_relaxed);
    LOG(INFO) << "master HA: read-only since epoch " << ended
              << ", elected again with epoch " << epoch
              << ": serving read-write again";
    served = ServeAgain(epoch);
  }
  std::unique_ptr<MasterServer> server;
  {
    MutexLock l(&mu_);
    server = std::move(server_);
    serving_epoch_ = 0;
  }
  read_only_epoch_.store(0, std::memory_order_release);
  if (server != nullptr) server->Shutdown();
  MutexLock l(&mu_);
  finished_ = true;
  finish_reason_ = served;
  cv_.SignalAll();
}

absl::Status HaMaster::ServeAgain(int64_t epoch) {
  // The old term's server holds the store: a standby takes the port (beside
  // it, SO_REUSEPORT) while the store is closed and opened again, so that
  // the port never closes; Serve then retires the standby.
  MasterOptions so = options_.master;
  so.listen_address = WithPort(options_.master.listen_address, port_);
  auto standby = master::StandbyServer::Create(
      so, [this] { return NotLeader(); }, NewConfirmWaits());
  if (!standby.ok()) return standby.status();
  std::unique_ptr<MasterServer> old;
  {
    MutexLock l(&mu_);
    standby_ = std::move(standby).value();
    old = std::move(server_);
    serving_epoch_ = 0;
  }
  read_only_epoch_.store(0, std::memory_order_release);
  if (old != nullptr) old->Shutdown();
  old.reset();
  return Serve(epoch);
}

absl::Status HaMaster::Serve(int64_t epoch) {
  // The port is the standby's: the server binds it beside the standby
  // (SO_REUSEPORT), and the standby closes once the server serves, so that
  // a client never finds the port closed (a refused connection costs it
  // gRPC's reconnect backoff). Meanwhile a connection may still land on
  // the standby, which refuses (not_leader) and is retried.
  MasterOptions mo = options_.master;
  mo.reuse_port = true;
  mo.listen_address = WithPort(options_.master.listen_address, port_);
  mo.gate = [this, epoch](CallAccess access) { return Gate(epoch, access); };
  mo.generation_floor = static_cast<uint64_t>(epoch) << kEpochShift;
  mo.generation_end = static_cast<uint64_t>(epoch + 1) << kEpochShift;
  mo.service.epoch = epoch;
  mo.service.on_epoch_behind = [this](int64_t node_epoch) {
    MutexLock l(&mu_);
    if (node_epoch > node_epoch_above_) {
      node_epoch_above_ = node_epoch;
      cv_.SignalAll();
    }
  };
  mo.take_preloaded =
      [this](uint64_t sequence) -> std::unique_ptr<master::MasterService> {
    if (!preloaded_.has_value()) return nullptr;
    PreloadedIndex p = std::move(*preloaded_);
    preloaded_.reset();
    if (p.sequence != sequence) {
      LOG(INFO) << "master HA: the preloaded index is stale (loaded at "
                   "sequence "
                << p.sequence << ", the store is at " << sequence
                << "): loading the store";
      return nullptr;
    }
    served_preloaded_.store(1, std::memory_order_relaxed);
    return std::move(p.service);
  };
  mo.extra_stats = [this,
                    extra = options_.master.extra_stats](StatsVisitor* v) {
    VisitStats(v);
    if (extra) extra(v);
  };
  const absl::Time give_up = absl::Now() + options_.open_retry;
  absl::Duration pause = absl::Milliseconds(20);
  while (true) {
    if (!election_->IsLeader()) {
      return absl::UnavailableError(absl::StrCat(
          "lost the leadership of epoch ", epoch, " before serving"));
    }
    auto server = MasterServer::Create(mo);
    if (server.ok()) {
      LOG(INFO) << "master HA: serving as leader, epoch " << epoch
                << ", generations from " << mo.generation_floor;
      std::unique_ptr<master::StandbyServer> standby;
      {
        MutexLock l(&mu_);
        server_ = std::move(server).value();
        serving_epoch_ = epoch;
        standby = std::move(standby_);
        cv_.SignalAll();
      }
      standby.reset();
      return absl::OkStatus();
    }
    if (absl::Now() + pause > give_up) {
      return absl::Status(
          server.status().code(),
          absl::StrCat("elected with epoch ", epoch,
                       " but cannot serve: ", server.status().message()));
    }
    LOG_EVERY_N(WARNING, 10)
        << "master HA: cannot serve yet (" << server.status() << "); retrying";
    {
      MutexLock l(&mu_);
      if (stopping_ || lost_) {
        return absl::CancelledError("stopped before serving");
      }
      cv_.WaitWithDeadline(&mu_, absl::Now() + pause);
    }
    pause = std::min(pause * 2, absl::Milliseconds(200));
  }
}

std::optional<int64_t> HaMaster::ServingEpoch() const {
  MutexLock l(&mu_);
  if (serving_epoch_ == 0) return std::nullopt;
  return serving_epoch_;
}

bool HaMaster::finished() const {
  MutexLock l(&mu_);
  return finished_;
}

absl::Status HaMaster::finish_reason() const {
  MutexLock l(&mu_);
  return finish_reason_;
}

bool HaMaster::WaitFinished(absl::Time deadline) const {
  MutexLock l(&mu_);
  while (!finished_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return finished_;
}

absl::Status HaMaster::Reload() {
  MutexLock l(&mu_);
  if (server_ == nullptr) return absl::OkStatus();
  absl::Status ids = server_->ReloadIdentities();
  absl::Status certs = server_->ReloadCertificates();
  return ids.ok() ? certs : ids;
}

absl::Status HaMaster::CheckAlive(absl::Duration timeout) {
  MutexLock l(&mu_);
  if (server_ == nullptr) return absl::OkStatus();
  return server_->CheckAlive(timeout);
}

void HaMaster::Shutdown() {
  {
    MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    cv_.SignalAll();
  }
  // Resign first: a standby takes over while this one stops serving (its
  // gate already refuses).
  if (election_ != nullptr) election_->Resign();
  thread_.Join();
  snapshots_.reset();
  if (follower_ != nullptr) {
    {
      MutexLock l(&standing_mu_);
      standing_source_ = nullptr;
    }
    absl::Status closed = follower_->Stop();
    if (!closed.ok()) LOG(WARNING) << "master HA: follower: " << closed;
    follower_.reset();
  }
  std::unique_ptr<master::StandbyServer> standby;
  {
    MutexLock l(&mu_);
    standby = std::move(standby_);
    finished_ = true;
    if (finish_reason_.ok()) {
      finish_reason_ = absl::CancelledError("shutting down");
    }
    cv_.SignalAll();
  }
}

}  // namespace hymcache
