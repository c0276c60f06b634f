#include "common/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_reconnect.h"
#include "common/grpc_status.h"
#include "glog/logging.h"

namespace hymcache {

namespace {

std::string StripScheme(const std::string& endpoint) {
  for (const char* scheme : {"http://", "https://"}) {
    if (absl::StartsWith(endpoint, scheme)) {
      return endpoint.substr(std::string(scheme).size());
    }
  }
  return endpoint;
}

// Whether another endpoint may answer where this one did not.
bool Retriable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

}  // namespace

absl::Status EtcdClientOptions::Validate() const {
  if (endpoints.empty()) {
    return absl::InvalidArgumentError("etcd: no endpoints");
  }
  for (const std::string& e : endpoints) {
    const std::string hp = StripScheme(e);
    const size_t colon = hp.rfind(':');
    if (hp.empty() || colon == std::string::npos || colon == 0 ||
        colon + 1 == hp.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd: endpoint '", e, "' is not host:port"));
    }
  }
  if (call_timeout <= absl::ZeroDuration() ||
      attempt_timeout <= absl::ZeroDuration() ||
      retry_pause <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "etcd: call_timeout, attempt_timeout and retry_pause must be positive");
  }
  return absl::OkStatus();
}

EtcdClient::EtcdClient(const EtcdClientOptions& options) : options_(options) {}

EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(
    const EtcdClientOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto client = std::unique_ptr<EtcdClient>(new EtcdClient(options));
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const std::string& e : options.endpoints) {
    grpc::ChannelArguments args;
    // A restarted member is found again within a second.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // Each endpoint its own connection, even where gRPC would share.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    Endpoint ep;
    ep.channel = grpc::CreateCustomChannel(
        StripScheme(e), grpc::InsecureChannelCredentials(), args);
    ep.kv = etcdserverpb::KV::NewStub(ep.channel);
    ep.lease = etcdserverpb::Lease::NewStub(ep.channel);
    ep.watch = etcdserverpb::Watch::NewStub(ep.channel);
    ep.cluster = etcdserverpb::Cluster::NewStub(ep.channel);
    ep.maintenance = etcdserverpb::Maintenance::NewStub(ep.channel);
    channels.push_back(ep.channel);
    client->endpoints_.push_back(std::move(ep));
  }
  client->reconnector_ =
      std::make_unique<ChannelReconnector>(std::move(channels));
  return client;
}

absl::Time EtcdClient::Deadline(absl::Time deadline) const {
  return deadline == kDefaultDeadline ? absl::Now() + options_.call_timeout
                                      : deadline;
}

size_t EtcdClient::preferred_endpoint() const {
  MutexLock l(&mu_);
  return preferred_;
}

uint64_t EtcdClient::failovers() const {
  MutexLock l(&mu_);
  return failovers_;
}

void EtcdClient::Failover(size_t failed) {
  reconnector_->Kick(failed);
  MutexLock l(&mu_);
  if (preferred_ == failed) {
    preferred_ = (failed + 1) % endpoints_.size();
    ++failovers_;
  }
}

absl::Status EtcdClient::Call(const char* what, absl::Time deadline,
                              const Attempt& attempt) {
  absl::Status last = absl::DeadlineExceededError(
      absl::StrCat("etcd ", what, ": deadline passed before the call"));
  while (true) {
    size_t first;
    {
      MutexLock l(&mu_);
      first = preferred_;
    }
    for (size_t i = 0; i < endpoints_.size(); ++i) {
      const absl::Time now = absl::Now();
      if (now >= deadline) return last;
      const size_t index = (first + i) % endpoints_.size();
      grpc::ClientContext context;
      // Wait for the connection within the attempt: a fail-fast call on a
      // channel in TRANSIENT_FAILURE fails at once, and gRPC 1.51 then gave
      // up its reconnection attempts (measured: a member that came up after
      // the first call was never reached).
      context.set_wait_for_ready(true);
      context.set_deadline(absl::ToChronoTime(
          std::min(deadline, now + options_.attempt_timeout)));
      absl::Status s = attempt(endpoints_[index], &context);
      if (s.ok() || !Retriable(s)) return s;
      last = absl::Status(
          s.code(), absl::StrCat("etcd ", what, " (",
                                 options_.endpoints[index], "): ", s.message()));
      Failover(index);
    }
    const absl::Time pause_end = absl::Now() + options_.retry_pause;
    if (pause_end >= deadline) return last;
    absl::SleepFor(options_.retry_pause);
  }
}

absl::Status EtcdClient::CallOne(const char* what, size_t index,
                                 absl::Time deadline, const Attempt& attempt) {
  if (index >= endpoints_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd ", what, ": no endpoint ", index));
  }
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(absl::ToChronoTime(deadline));
  absl::Status s = attempt(endpoints_[index], &context);
  if (s.ok()) return s;
  return absl::Status(
      s.code(), absl::StrCat("etcd ", what, " (", options_.endpoints[index],
                             "): ", s.message()));
}

absl::StatusOr<etcdserverpb::MemberListResponse> EtcdClient::MemberList(
    absl::Time deadline) {
  etcdserverpb::MemberListRequest request;
  etcdserverpb::MemberListResponse response;
  absl::Status s = Call(
      "MemberList", Deadline(deadline),
      [&](const Endpoint& ep, grpc::ClientContext* c) {
        return FromGrpcStatus(ep.cluster->MemberList(c, request, &response));
      });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<etcdserverpb::StatusResponse> EtcdClient::MemberStatus(
    size_t index, absl::Time deadline) {
  etcdserverpb::StatusRequest request;
  etcdserverpb::StatusResponse response;
  absl::Status s = CallOne(
      "Status", index, Deadline(deadline),
      [&](const Endpoint& ep, grpc::ClientContext* c) {
        return FromGrpcStatus(ep.maintenance->Status(c, request, &response));
      });
  if (!s.ok()) return s;
  return response;
}

absl::Status EtcdClient::MoveLeader(size_t index, uint64_t target,
                                    absl::Time deadline) {
  etcdserverpb::MoveLeaderRequest request;
  request.set_targetid(target);
  etcdserverpb::MoveLeaderResponse response;
  return CallOne("MoveLeader", index, Deadline(deadline),
                 [&](const Endpoint& ep, grpc::ClientContext* c) {
                   return FromGrpcStatus(
                       ep.maintenance->MoveLeader(c, request, &response));
                 });
}

absl::StatusOr<etcdserverpb::RangeResponse> EtcdClient::Range(
    const etcdserverpb::RangeRequest& request, absl::Time deadline) {
  etcdserverpb::RangeResponse response;
  absl::Status s = Call("Range", Deadline(deadline),
                        [&](const Endpoint& ep, grpc::ClientContext* c) {
                          return FromGrpcStatus(
                              ep.kv->Range(c, request, &response));
                        });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<etcdserverpb::PutResponse> EtcdClient::Put(
    const etcdserverpb::PutRequest& request, absl::Time deadline) {
  etcdserverpb::PutResponse response;
  absl::Status s = Call("Put", Deadline(deadline),
                        [&](const Endpoint& ep, grpc::ClientContext* c) {
                          return FromGrpcStatus(
                              ep.kv->Put(c, request, &response));
                        });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<etcdserverpb::DeleteRangeResponse> EtcdClient::DeleteRange(
    const etcdserverpb::DeleteRangeRequest& request, absl::Time deadline) {
  etcdserverpb::DeleteRangeResponse response;
  absl::Status s = Call("DeleteRange", Deadline(deadline),
                        [&](const Endpoint& ep, grpc::ClientContext* c) {
                          return FromGrpcStatus(
                              ep.kv->DeleteRange(c, request, &response));
                        });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(
    const etcdserverpb::TxnRequest& request, absl::Time deadline) {
  etcdserverpb::TxnResponse response;
  absl::Status s = Call("Txn", Deadline(deadline),
                        [&](const Endpoint& ep, grpc::ClientContext* c) {
                          return FromGrpcStatus(
                              ep.kv->Txn(c, request, &response));
                        });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<etcdserverpb::LeaseGrantResponse> EtcdClient::LeaseGrant(
    absl::Duration ttl, absl::Time deadline) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(
                                           ttl, absl::Seconds(1)))));
  etcdserverpb::LeaseGrantResponse response;
  absl::Status s = Call("LeaseGrant", Deadline(deadline),
                        [&](const Endpoint& ep, grpc::ClientContext* c) {
                          return FromGrpcStatus(
                              ep.lease->LeaseGrant(c, request, &response));
                        });
  if (!s.ok()) return s;
  if (!response.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("etcd LeaseGrant: ", response.error()));
  }
  return response;
}

absl::Status EtcdClient::LeaseRevoke(int64_t lease, absl::Time deadline) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseRevokeResponse response;
  return Call("LeaseRevoke", Deadline(deadline),
              [&](const Endpoint& ep, grpc::ClientContext* c) {
                return FromGrpcStatus(
                    ep.lease->LeaseRevoke(c, request, &response));
              });
}

absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse>
EtcdClient::LeaseKeepAliveOnce(int64_t lease, absl::Time deadline) {
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse response;
  absl::Status s = Call(
      "LeaseKeepAlive", Deadline(deadline),
      [&](const Endpoint& ep, grpc::ClientContext* c) -> absl::Status {
        auto stream = ep.lease->LeaseKeepAlive(c);
        if (!stream->Write(request) || !stream->Read(&response)) {
          // The stream's status says why (refused, deadline, etcd's error).
          c->TryCancel();
          grpc::Status st = stream->Finish();
          return st.ok() ? absl::UnavailableError("keepalive stream closed")
                         : FromGrpcStatus(st);
        }
        stream->WritesDone();
        return FromGrpcStatus(stream->Finish());
      });
  if (!s.ok()) return s;
  if (response.ttl() <= 0) {
    return absl::NotFoundError(
        absl::StrCat("etcd lease ", lease, " no longer exists"));
  }
  return response;
}

absl::StatusOr<etcdserverpb::LeaseTimeToLiveResponse>
EtcdClient::LeaseTimeToLive(int64_t lease, bool keys, absl::Time deadline) {
  etcdserverpb::LeaseTimeToLiveRequest request;
  request.set_id(lease);
  request.set_keys(keys);
  etcdserverpb::LeaseTimeToLiveResponse response;
  absl::Status s = Call("LeaseTimeToLive", Deadline(deadline),
                        [&](const Endpoint& ep, grpc::ClientContext* c) {
                          return FromGrpcStatus(
                              ep.lease->LeaseTimeToLive(c, request, &response));
                        });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<std::optional<mvccpb::KeyValue>> EtcdClient::Get(
    const std::string& key, absl::Time deadline) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  auto response = Range(request, deadline);
  if (!response.ok()) return response.status();
  if (response->kvs_size() == 0) return std::optional<mvccpb::KeyValue>();
  return std::optional<mvccpb::KeyValue>(response->kvs(0));
}

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

absl::StatusOr<std::unique_ptr<EtcdWatcher>> EtcdClient::Watch(
    const EtcdWatchOptions& options, EtcdWatchCallback callback) {
  if (options.key.empty()) {
    return absl::InvalidArgumentError("etcd Watch: empty key");
  }
  auto watcher = std::unique_ptr<EtcdWatcher>(
      new EtcdWatcher(this, options, std::move(callback)));
  EtcdWatcher* w = watcher.get();
  auto thread = Thread::Start(options.thread_name, [w] { w->Run(); });
  if (!thread.ok()) return thread.status();
  watcher->thread_ = std::move(*thread);
  if (options.probe_interval > absl::ZeroDuration()) {
    auto prober =
        Thread::Start(options.thread_name + "-p", [w] { w->Probe(); });
    if (!prober.ok()) return prober.status();
    watcher->prober_ = std::move(*prober);
  }
  return watcher;
}

// ---------------------------------------------------------------- watcher

EtcdWatcher::EtcdWatcher(EtcdClient* client, EtcdWatchOptions options,
                         EtcdWatchCallback callback)
    : client_(client),
      options_(std::move(options)),
      callback_(std::move(callback)),
      next_revision_(options_.start_revision) {}

EtcdWatcher::~EtcdWatcher() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
    cv_.SignalAll();
  }
  thread_.Join();
  prober_.Join();
}

bool EtcdWatcher::connected() const {
  MutexLock l(&mu_);
  return connected_;
}

int64_t EtcdWatcher::next_revision() const {
  MutexLock l(&mu_);
  return next_revision_;
}

void EtcdWatcher::Run() {
  while (true) {
    const size_t index = client_->preferred_endpoint();
    const bool accepted = RunStream(index);
    MutexLock l(&mu_);
    connected_ = false;
    if (stopping_) return;
    // This endpoint failed us: move on, and pause before a stream that was
    // never accepted is tried again (a member down, etcd without quorum).
    client_->Failover(index);
    if (!accepted) {
      cv_.WaitWithDeadline(&mu_, absl::Now() + client_->options().retry_pause);
      if (stopping_) return;
    }
  }
}

bool EtcdWatcher::RunStream(size_t index) {
  grpc::ClientContext context;
  // etcd closes the stream when its member loses the raft leader, so a
  // watcher on a partitioned member moves to another.
  context.AddMetadata("hasleader", "true");
  context.set_wait_for_ready(true);
  etcdserverpb::WatchRequest request;
  {
    MutexLock l(&mu_);
    if (stopping_) return false;
    context_ = &context;
    auto* create = request.mutable_create_request();
    create->set_key(options_.key);
    create->set_range_end(options_.range_end);
    create->set_start_revision(next_revision_);
    VLOG(1) << "etcd watch of " << options_.key << ": from revision "
            << next_revision_;
  }
  bool accepted = false;
  // Connect first, for at most an attempt: a stream waiting for a member
  // that is down would never move on.
  auto& channel = client_->endpoints_[index].channel;
  VLOG(1) << "etcd watch of " << options_.key << ": stream on "
          << client_->options().endpoints[index];
  if (!channel->WaitForConnected(absl::ToChronoTime(
          absl::Now() + client_->options().attempt_timeout))) {
    VLOG(1) << "etcd watch of " << options_.key << ": cannot connect";
    MutexLock l(&mu_);
    context_ = nullptr;
    return false;
  }
  auto stream = client_->endpoints_[index].watch->Watch(&context);
  {
    // From here the prober may cancel the stream if it stays silent.
    MutexLock l(&mu_);
    stream_ = stream.get();
    last_heard_ = absl::Now();
  }
  if (stream->Write(request)) {
    etcdserverpb::WatchResponse response;
    while (stream->Read(&response)) {
      {
        MutexLock l(&mu_);
        last_heard_ = absl::Now();
      }
      VLOG(2) << "etcd watch of " << options_.key << ": id "
              << response.watch_id() << " created " << response.created()
              << " canceled " << response.canceled() << " events "
              << response.events_size() << " revision "
              << response.header().revision();
      if (response.created()) {
        MutexLock l(&mu_);
        accepted = true;
        connected_ = true;
        if (next_revision_ == 0) next_revision_ = response.header().revision() + 1;
      }
      if (response.canceled()) {
        if (response.compact_revision() > 0) {
          {
            MutexLock l(&mu_);
            next_revision_ = response.compact_revision();
          }
          callback_(absl::OutOfRangeError(absl::StrCat(
              "etcd watch of ", options_.key, ": revisions before ",
              response.compact_revision(), " were compacted")));
        } else {
          LOG(WARNING) << "etcd watch of " << options_.key
                       << " canceled: " << response.cancel_reason();
        }
        break;
      }
      if (response.events_size() > 0) {
        EtcdWatchBatch batch;
        batch.revision = response.header().revision();
        batch.events.assign(response.events().begin(), response.events().end());
        {
          MutexLock l(&mu_);
          next_revision_ = batch.events.back().kv().mod_revision() + 1;
        }
        callback_(std::move(batch));
      }
    }
  }
  {
    MutexLock l(&mu_);
    stream_ = nullptr;
    // The prober may be writing to the stream: let it finish.
    mu_.Await(absl::Condition(
        +[](bool* probing) { return !*probing; }, &probing_));
    context.TryCancel();
    context_ = nullptr;
  }
  VLOG(1) << "etcd watch of " << options_.key << ": finishing";
  grpc::Status st = stream->Finish();
  if (!st.ok()) {
    VLOG(1) << "etcd watch stream on " << client_->options().endpoints[index]
            << " ended: " << st.error_message();
  }
  return accepted;
}

void EtcdWatcher::Probe() {
  etcdserverpb::WatchRequest progress;
  progress.mutable_progress_request();
  while (true) {
    Stream* stream;
    {
      MutexLock l(&mu_);
      const absl::Time next = absl::Now() + options_.probe_interval;
      while (!stopping_ && absl::Now() < next) cv_.WaitWithDeadline(&mu_, next);
      if (stopping_) return;
      if (stream_ == nullptr) continue;
      if (absl::Now() - last_heard_ > 3 * options_.probe_interval) {
        // Silent for three probes: the member is frozen or cut off.
        LOG(WARNING) << "etcd watch of " << options_.key
                     << ": no answer from its member; moving on";
        context_->TryCancel();
        continue;
      }
      // Probes only once etcd confirmed the watch (no write races the
      // create request).
      if (!connected_) continue;
      stream = stream_;
      probing_ = true;
    }
    stream->Write(progress);
    MutexLock l(&mu_);
    probing_ = false;
  }
}

}  // namespace hymcache
