// StorageNode and its masters: connecting to them, registration, heartbeats,
// reconciliation, the master epoch and deregistration (the heartbeat thread's
// work). The rest of StorageNode is in storage_node.cc.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/etcd_client.h"
#include "common/grpc_status.h"
#include "common/leader_election.h"
#include "common/mutex.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "proto/master.grpc.pb.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/storage_node.h"
#include "storage_node/storage_node_internal.h"

namespace hymcache {
namespace {

namespace v1 = ::hymcache::v1;
using storage::internal::ToProto;

// Registration retry backoff while the master is unreachable.
constexpr absl::Duration kMinRetry = absl::Milliseconds(100);
constexpr absl::Duration kMaxRetry = absl::Seconds(2);
// With several masters a refused attempt is answered at once (a standby
// refuses, a dead master's port is closed): poll every 100 ms, so that a
// node re-registers within about 100 ms of a new leader serving.
constexpr absl::Duration kMaxRetryAmongMasters = absl::Milliseconds(100);
// Used when the master does not say how often to heartbeat.
constexpr absl::Duration kDefaultHeartbeat = absl::Seconds(1);
// With several masters, how long a heartbeat or a registration waits for
// its answer (at most rpc_timeout): a leader answers in milliseconds, and a
// leader whose host is lost answers nothing, so the node moves on to the
// next master after this rather than after the whole rpc_timeout (the
// client's attempt_timeout, FailoverMasterClientOptions, is the same).
constexpr absl::Duration kAttemptAmongMasters = absl::Seconds(1);
// Deadline of one reconciliation stream (a node may hold millions of
// extents: ~20 bytes each on the wire).
constexpr absl::Duration kReconcileTimeout = absl::Minutes(2);
// Extents per ReconcileNode message (the master accepts up to 65536).
constexpr size_t kReconcileChunk = 16384;

}  // namespace

absl::Status StorageNode::ConnectMaster() {
  grpc::ChannelArguments args;
  // Notice a restarted master quickly instead of after gRPC's default
  // reconnect backoff (up to two minutes).
  // (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also uses it as the minimum
  // connect timeout, and 100 ms fails connects on a loaded machine.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  master_ = std::make_unique<MasterLink>();
  const ChannelSecurity security{options_.tls, options_.master_token};
  master_->connect = [security, args](const std::string& address)
      -> absl::StatusOr<std::unique_ptr<MasterLink::Peer>> {
    auto peer = std::make_unique<MasterLink::Peer>();
    peer->address = address;
    ASSIGN_OR_RETURN(peer->channel, CreateChannel(address, security, args));
    peer->stub = v1::MasterService::NewStub(peer->channel);
    return peer;
  };
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  {
    MutexLock l(&master_->mu);
    for (absl::string_view address :
         absl::StrSplit(options_.master_address, ',', absl::SkipEmpty())) {
      ASSIGN_OR_RETURN(std::unique_ptr<MasterLink::Peer> peer,
                       master_->connect(std::string(address)));
      channels.push_back(peer->channel);
      master_->peers.push_back(std::move(peer));
    }
  }
  master_->reconnector = std::make_unique<ChannelReconnector>(channels);
  if (!options_.etcd_endpoints.empty()) {
    // The masters' leader as etcd names it, followed by a watch
    // (docs/ha.md): read once here (a node that cannot reach etcd does not
    // start), then asked after every refusal.
    struct EtcdLeader {
      std::unique_ptr<EtcdClient> etcd;
      std::unique_ptr<LeaderObserver> observer;
      ~EtcdLeader() { observer.reset(); }  // before the client it uses
    };
    auto holder = std::make_shared<EtcdLeader>();
    EtcdClientOptions eo;
    eo.endpoints =
        absl::StrSplit(options_.etcd_endpoints, ',', absl::SkipEmpty());
    ASSIGN_OR_RETURN(holder->etcd, EtcdClient::Create(eo));
    auto observer = LeaderObserver::Create(
        holder->etcd.get(), MasterLeaderKey(options_.cluster), nullptr);
    if (!observer.ok()) {
      return absl::Status(
          observer.status().code(),
          absl::StrCat("storage node: reading the leader of cluster '",
                       options_.cluster, "' from etcd (",
                       options_.etcd_endpoints,
                       "): ", observer.status().message()));
    }
    holder->observer = std::move(observer).value();
    EtcdLeader* const source = holder.get();
    master_->leader = [source]() -> std::string {
      std::optional<LeaderInfo> l = source->observer->current();
      return l.has_value() ? l->candidate : "";
    };
    master_->etcd = std::move(holder);
  }
  return absl::OkStatus();
}

bool StorageNode::SleepUnlessStopping(absl::Duration d) {
  MutexLock l(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(&stopping_), absl::Now() + d);
  return !stopping_;
}

template <typename Fn>
absl::Status StorageNode::CallMaster(Fn call, absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(
      absl::Now() +
      (timeout == absl::ZeroDuration() ? options_.rpc_timeout : timeout)));
  {
    MutexLock l(&mu_);
    if (stopping_) return absl::CancelledError("storage node shutting down");
    rpc_ = &ctx;
  }
  size_t index = 0;
  absl::Status out;
  if (master_->Current(&index) == nullptr) {
    // No list and etcd names no leader yet (an election is on).
    out = absl::UnavailableError(absl::StrCat(
        "no master leads cluster '", options_.cluster, "' in etcd yet"));
  } else {
    grpc::Status s = call(&ctx);
    out = FromGrpcStatus(s);
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      master_->reconnector->Kick(index);
      master_->Refused(out);
    } else if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      // Silence, not a refusal: a master frozen or whose host is lost
      // (packets dropped) never answers, and the next call must not wait
      // on it again. With several masters, move on as after a refusal (a
      // live leader merely slow is found again through the others'
      // hints once MasterLink::kSilentMemory has passed).
      master_->Silent(out, absl::Now());
    }
  }
  MutexLock l(&mu_);
  rpc_ = nullptr;
  return out;
}

absl::Duration StorageNode::AttemptTimeout() const {
  return master_->several()
             ? std::min(options_.rpc_timeout, kAttemptAmongMasters)
             : absl::ZeroDuration();
}

absl::Status StorageNode::Register() {
  // Writes that begin from here on may be the master's placements after it
  // registered us: a registration that forgets our objects keeps them.
  const uint64_t write_mark = extents_->WriteSequence();
  v1::RegisterNodeRequest req;
  req.set_name(name_);
  req.set_incarnation(incarnation_);
  req.set_data_address(data_address_);
  req.set_control_address(control_address_);
  req.set_host(host_);
  for (const storage::RegionDescriptor& r : device_->Regions()) {
    ToProto(r, req.add_regions());
  }
  for (const auto& [k, v] : transport_params_) {
    (*req.mutable_transport_params())[k] = v;
  }
  *req.mutable_auth() = Auth("register", 0);
  req.set_registration_nonce(registration_nonce_);
  {
    MutexLock l(&mu_);
    req.set_highest_master_epoch(highest_master_epoch_);
  }
  v1::RegisterNodeResponse resp;
  // The master lists this node as soon as it has answered, and clients may
  // come with its capabilities before the answer is applied here: data-
  // plane requests whose capabilities fail meanwhile wait for it.
  if (!identity_change_carried_) capabilities_->BeginIdentityChange();
  const bool carried = identity_change_carried_;
  identity_change_carried_ = false;
  absl::Status called = CallMaster(
      [&](grpc::ClientContext* ctx) {
        return master_->stub()->RegisterNode(ctx, req, &resp);
      },
      AttemptTimeout());
  if (called.ok()) called = CheckMasterEpoch(resp.master_epoch());
  if (called.ok() && resp.node_id() == 0) {
    called = absl::InternalError("master assigned node id 0");
  }
  if (called.ok() && resp.node_key().size() != kNodeKeyBytes) {
    called = absl::InternalError(absl::StrCat(
        "master sent a node key of ", resp.node_key().size(), " bytes"));
  }
  if (!called.ok()) {
    if (called.code() == absl::StatusCode::kDeadlineExceeded && !carried) {
      // The master may have answered after our deadline: keep requests
      // signed with that answer's key waiting for the next attempt.
      identity_change_carried_ = true;
    } else {
      capabilities_->AbandonIdentityChange();
    }
    return called;
  }
  absl::Duration interval =
      resp.heartbeat_interval_ms() == 0
          ? kDefaultHeartbeat
          : std::max(absl::Milliseconds(resp.heartbeat_interval_ms()),
                     absl::Milliseconds(10));
  // The ceiling first: a write with an old master's (higher) generation
  // that is still on its way must not land after the table is cleared.
  // Then the identity: capabilities the master signs for this registration
  // verify from now on, and the requests waiting for it go on (the key
  // file is written last: clients may already be writing).
  ApplyGenerationCeiling(resp.generation_ceiling());
  capabilities_->SetIdentity(resp.node_id(), incarnation_, resp.node_key());
  if (!resp.objects_retained()) {
    // The master knows none of the objects we held when we asked (say its
    // metadata was wiped): drop them, or their generations would refuse its
    // new allocations over the same space. Writes the master placed since
    // it registered us (clients may write before this answer arrives)
    // stay, unless their generation is one it has not issued.
    const uint64_t before = extents_->Stats().extents;
    extents_->ClearStale(write_mark, resp.generation_ceiling() == 0
                                         ? UINT64_MAX
                                         : resp.generation_ceiling());
    const uint64_t dropped =
        before - std::min(before, extents_->Stats().extents);
    if (dropped > 0) {
      LOG(WARNING) << "master " << master_->address()
                   << " does not retain this node's objects; dropped "
                   << dropped << " extents";
    }
  }
  {
    MutexLock l(&mu_);
    if (node_id_ != 0 && node_id_ != resp.node_id()) {
      LOG(WARNING) << "master changed this node's id from " << node_id_
                   << " to " << resp.node_id();
    }
    node_id_ = resp.node_id();
    heartbeat_interval_ = interval;
    registered_ = true;
    heartbeat_since_registration_ = false;
    reconcile_due_ = resp.reconcile();
    reconcile_before_ready_ = resp.reconcile();
    reconcile_interval_ = absl::Milliseconds(resp.reconcile_interval_ms());
    next_reconcile_ = absl::Now() + reconcile_interval_;
  }
  SaveNodeKey(resp.node_key());
  return absl::OkStatus();
}

absl::Status StorageNode::CheckMasterEpoch(int64_t epoch) {
  if (epoch == 0) return absl::OkStatus();
  absl::Status stale;
  {
    MutexLock l(&mu_);
    if (epoch >= highest_master_epoch_) {
      highest_master_epoch_ = epoch;
      return absl::OkStatus();
    }
    stale = NotLeaderError(
        absl::StrCat("master ", master_->address(), " answered for epoch ",
                     epoch, ", below epoch ", highest_master_epoch_,
                     " already seen: a deposed leader"),
        {});
  }
  LOG(WARNING) << stale;
  master_->Refused(stale);
  return stale;
}

bool StorageNode::MasterReadOnly() {
  MutexLock l(&mu_);
  return master_read_only_;
}

absl::StatusOr<bool> StorageNode::Heartbeat(uint32_t node_id) {
  v1::HeartbeatRequest req;
  req.set_node_id(node_id);
  req.set_incarnation(incarnation_);
  *req.mutable_auth() = Auth("heartbeat", node_id);
  v1::HeartbeatResponse resp;
  RETURN_IF_ERROR(CallMaster(
      [&](grpc::ClientContext* ctx) {
        return master_->stub()->Heartbeat(ctx, req, &resp);
      },
      AttemptTimeout()));
  RETURN_IF_ERROR(CheckMasterEpoch(resp.master_epoch()));
  ApplyGenerationCeiling(resp.generation_ceiling());
  {
    MutexLock l(&mu_);
    if (resp.reconcile()) reconcile_due_ = true;
    if (!resp.reregister()) draining_ = resp.draining();
    master_read_only_ = resp.read_only();
    if (!resp.reregister()) heartbeat_since_registration_ = true;
  }
  return resp.reregister();
}

void StorageNode::MaybeReconcile() {
  uint32_t node_id;
  {
    MutexLock l(&mu_);
    const bool periodic = reconcile_interval_ > absl::ZeroDuration() &&
                          absl::Now() >= next_reconcile_;
    if (stopping_ || !registered_ || (!reconcile_due_ && !periodic)) return;
    node_id = node_id_;
  }
  absl::Status s = Reconcile(node_id);
  if (s.ok()) return;
  LOG(WARNING) << "reconciliation with master " << master_->address()
               << " failed: " << s;
  MutexLock l(&mu_);
  if (s.code() == absl::StatusCode::kFailedPrecondition ||
      s.code() == absl::StatusCode::kNotFound) {
    registered_ = false;  // the master does not know us (any more)
  }
  // A failed periodic round is retried after a heartbeat interval, not at
  // every heartbeat.
  next_reconcile_ = absl::Now() + std::max(heartbeat_interval_, kMaxRetry);
}

absl::Status StorageNode::Reconcile(uint32_t node_id) {
  v1::ReconcileNodeResponse resp;
  const absl::Time start = absl::Now();
  uint64_t sent = 0;
  // The master tracks commits from here on; only then do we list (a
  // listing it committed earlier was written here before, so we hold it).
  v1::BeginReconcileRequest begin;
  begin.set_node_id(node_id);
  begin.set_incarnation(incarnation_);
  *begin.mutable_auth() = Auth("reconcile", node_id);
  v1::BeginReconcileResponse begun;
  RETURN_IF_ERROR(CallMaster([&](grpc::ClientContext* ctx) {
    return master_->stub()->BeginReconcile(ctx, begin, &begun);
  }));
  RETURN_IF_ERROR(CallMaster(
      [&](grpc::ClientContext* ctx) {
        std::unique_ptr<grpc::ClientWriter<v1::ReconcileNodeRequest>> w =
            master_->stub()->ReconcileNode(ctx, &resp);
        v1::ReconcileNodeRequest req;
        req.set_node_id(node_id);
        req.set_incarnation(incarnation_);
        req.set_epoch(begun.epoch());
        *req.mutable_auth() = Auth("reconcile", node_id);
        storage::ExtentTable::Cursor cursor;
        std::vector<storage::ExtentKey> keys;
        bool first = true;
        while (!cursor.done || first) {
          keys.clear();
          extents_->ListReadable(&cursor, kReconcileChunk, &keys);
          for (const storage::ExtentKey& k : keys) {
            v1::Location* loc = req.add_extents();
            loc->set_region_id(k.region_id);
            loc->set_addr(k.addr);
            loc->set_length(k.length);
            loc->set_generation(k.generation);
          }
          sent += keys.size();
          // The final message says so (possibly with no extents): the
          // master judges only a stream that was not cut short.
          req.set_last(cursor.done);
          if (!keys.empty() || first || cursor.done) {
            if (!w->Write(req)) break;  // Finish reports why
          }
          first = false;
          req.clear_extents();
          req.clear_auth();  // the first message proves it
        }
        w->WritesDone();
        return w->Finish();
      },
      kReconcileTimeout));
  // What the master neither lists nor will commit: free it.
  uint64_t freed = 0;
  for (const v1::Location& loc : resp.unlisted()) {
    if (extents_->Drop(storage::ExtentKey{loc.region_id(), loc.addr(),
                                          loc.length(), loc.generation()})) {
      // A persistent device forgets it too, or a restart would adopt it again.
      device_->Discard(loc.region_id(), loc.addr(), loc.length(),
                       loc.generation());
      ++freed;
    }
  }
  const std::string outcome =
      absl::StrCat("held ", sent, ", master listed ", resp.listed(),
                   ", matched ", resp.matched(), ", master dropped ",
                   resp.dropped_listings(), " listings, freed ", freed, " of ",
                   resp.unlisted_count(), " unlisted extents, in ",
                   absl::FormatDuration(absl::Trunc(absl::Now() - start,
                                                    absl::Milliseconds(1))));
  if (resp.dropped_listings() > 0 || freed > 0) {
    LOG(INFO) << "reconciled with master: " << outcome;
  } else {
    VLOG(1) << "reconciled with master: " << outcome;
  }
  MutexLock l(&mu_);
  reconcile_before_ready_ = false;
  ++reconciliations_;
  reconcile_freed_ += freed;
  last_reconcile_ = outcome;
  // The rest of the unlisted extents come in the next round, at once.
  reconcile_due_ =
      resp.unlisted_count() > static_cast<uint64_t>(resp.unlisted_size());
  next_reconcile_ = absl::Now() + reconcile_interval_;
  return absl::OkStatus();
}

void StorageNode::ApplyGenerationCeiling(uint64_t ceiling) {
  // 0: a master that does not send a ceiling; keep the last one.
  // It may go down (a master that lost its state starts over).
  if (ceiling != 0) extents_->SetGenerationCeiling(ceiling);
}

void StorageNode::HeartbeatLoop() {
  absl::Duration retry = kMinRetry;
  bool outage = false;           // a warning was logged for the current outage
  bool published_ready = false;  // what the health service says
  bool heartbeat_now = false;    // registered just now: no pause first
  while (true) {
    bool registered;
    uint32_t node_id;
    absl::Duration interval;
    bool ready;
    {
      MutexLock l(&mu_);
      if (stopping_) return;
      registered = registered_;
      node_id = node_id_;
      interval = heartbeat_interval_;
      ready = ReadyLocked() && !draining_;
    }
    // Only this thread changes the status (Shutdown ends it for good).
    if (ready != published_ready) {
      if (auto* health = control_server_->GetHealthCheckService()) {
        health->SetServingStatus(ready);
      }
      LOG(INFO) << "storage node '" << name_ << "' is "
                << (ready ? "ready (health: SERVING)"
                    : draining()
                        ? "drained (health: NOT_SERVING) until undrained"
                        : "not ready (health: NOT_SERVING) until it is "
                          "registered with the master and reconciled");
      published_ready = ready;
    }
    if (!registered) {
      absl::Status s = Register();
      if (s.ok()) {
        {
          MutexLock l(&mu_);
          LOG(INFO) << "registered with master " << master_->address()
                    << " as node " << node_id_ << " (heartbeat every "
                    << absl::FormatDuration(heartbeat_interval_) << ")";
        }
        outage = false;
        retry = kMinRetry;
        MaybeReconcile();
        // Prove the new key at once: the master places nothing on a node
        // given a fresh key until it has (MasterService::IsPlaceable).
        heartbeat_now = true;
        continue;
      }
      if (s.code() == absl::StatusCode::kCancelled) {
        // CallMaster's own CANCELLED means this node is stopping; a master
        // answers CANCELLED too, when its server shuts down under the call
        // (a standby handing its port to the elected leader): that one is
        // retried like any refusal, or the node would never register again.
        MutexLock l(&mu_);
        if (stopping_) return;
      }
      if (!outage) {
        LOG(WARNING) << "cannot register with master " << master_->address()
                     << ": " << s << "; retrying in the background";
        outage = true;
      } else {
        // Every 50th failure (about 5 s among several masters): a node
        // that stays unregistered says why, and that it is still trying.
        LOG_EVERY_N(WARNING, 50) << "still cannot register with master "
                                 << master_->address() << ": " << s;
      }
      if (!SleepUnlessStopping(retry)) return;
      // With several masters the next attempt goes to another one (the
      // leader, after a failover): keep the pause short.
      retry = std::min(retry * 2,
                       master_->several() ? kMaxRetryAmongMasters : kMaxRetry);
      continue;
    }
    if (!heartbeat_now && !SleepUnlessStopping(interval)) return;
    heartbeat_now = false;
    absl::StatusOr<bool> reregister = Heartbeat(node_id);
    if (reregister.ok() && !*reregister) {
      if (MasterReadOnly() && master_->several()) {
        const std::string from = master_->address();
        if (master_->MoveToServingLeader(options_.rpc_timeout)) {
          // Another master leads (this one lost etcd, and may never learn
          // of the new term): register there; its epoch fences the old one.
          LOG(WARNING) << "master " << from << " serves read-only; moving to "
                       << master_->address() << ", which leads";
          MutexLock l(&mu_);
          registered_ = false;
          master_read_only_ = false;
          continue;
        }
      }
      MaybeReconcile();
      continue;
    }
    {
      MutexLock l(&mu_);
      if (stopping_) return;
      // Either the master forgot this node, or it was unreachable (and may
      // have restarted meanwhile): register again, which is idempotent for
      // the same name and incarnation.
      registered_ = false;
    }
    if (reregister.ok()) {
      LOG(INFO) << "master asked node " << node_id << " to register again";
    } else if (!outage) {
      LOG(WARNING) << "heartbeat to master " << master_->address()
                   << " failed: " << reregister.status()
                   << "; will register again once it is reachable";
      outage = true;
    }
  }
}

void StorageNode::Deregister(uint32_t node_id) {
  v1::DeregisterNodeRequest req;
  req.set_node_id(node_id);
  req.set_incarnation(incarnation_);
  *req.mutable_auth() = Auth("deregister", node_id);
  v1::DeregisterNodeResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  v1::MasterService::Stub* stub = master_->stub();
  absl::Status s = stub == nullptr
                       ? absl::UnavailableError("no master known")
                       : FromGrpcStatus(stub->DeregisterNode(&ctx, req, &resp));
  if (s.ok()) {
    LOG(INFO) << "deregistered node " << node_id << " from the master";
  } else {
    LOG(WARNING) << "deregistering node " << node_id
                 << " from the master failed: " << s
                 << " (it will notice the missing heartbeats)";
  }
}

}  // namespace hymcache
