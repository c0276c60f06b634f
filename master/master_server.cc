#include "master/master_server.h"

#include <glog/logging.h>
#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/health_probe.h"
#include "common/metrics_exporter.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/stats.h"
#include "common/wire.h"
#include "master/cq_server.h"
#include "master/health_service.h"
#include "master/master_rpc_handler.h"
#include "master/master_service.h"
#include "master/metadata_store.h"
#include "master/tenant.h"
#include "master/tenants.h"
#include "proto/master.grpc.pb.h"

namespace hymcache {
namespace master {
namespace {

// Large enough for max_batch_keys keys of max_key_bytes each plus framing.
constexpr int kMinMaxMessageBytes = 16 << 20;

}  // namespace
}  // namespace master

absl::Status MasterOptions::Validate() const {
  if (db_path.empty()) {
    return absl::InvalidArgumentError("master: db_path is required");
  }
  auto hp = SplitHostPort(listen_address);
  if (!hp.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("master: listen_address: ", hp.status().message()));
  }
  if (rpc_threads < 1 || rpc_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("master: rpc_threads must be 1..64, not ", rpc_threads));
  }
  if (max_lookup_streams < 1 || max_lookup_streams > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "master: max_lookup_streams must be 1..1000000, not ",
        max_lookup_streams));
  }
  absl::Status daemon = DaemonOptions::Validate("master", hp->first);
  if (!daemon.ok()) return daemon;
  if (replication == master::ReplicationMode::kSync &&
      replication_sync_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "master: replication_sync_timeout must be positive");
  }
  if (replication != master::ReplicationMode::kOff) {
    absl::Status s = master::ValidateReplicationBatchDelay(
        replication_async_batch_delay, "master: replication_async_batch_delay");
    if (!s.ok()) return s;
    s = master::ValidateReplicationBatchDelay(
        replication_confirm_batch_delay,
        "master: replication_confirm_batch_delay");
    if (!s.ok()) return s;
  }
  if (!service.snapshot_path.empty()) {
    return absl::InvalidArgumentError(
        "master: service.snapshot_path is derived from db_path (see "
        "index_snapshots); leave it empty");
  }
  absl::Status s = service.Validate();
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("master: ", s.message()));
  }
  return absl::OkStatus();
}

namespace {

// The store's options for `options` (PreloadIndex opens the same ones
// read-only).
master::RocksDbMetadataStoreOptions StoreOptions(const MasterOptions& options) {
  master::RocksDbMetadataStoreOptions store_options;
  store_options.path = options.db_path;
  store_options.sync_writes = options.sync_writes;
  store_options.generation_floor = options.generation_floor;
  store_options.generation_end = options.generation_end;
  if (options.index_snapshots) {
    store_options.keep_wal_seconds = static_cast<uint64_t>(absl::ToInt64Seconds(
        std::max(2 * options.service.snapshot_interval, absl::Hours(1))));
  }
  if (options.replication != master::ReplicationMode::kOff) {
    // A standby that reconnects resumes from the log instead of copying.
    store_options.keep_wal_seconds =
        std::max<uint64_t>(store_options.keep_wal_seconds, 3600);
  }
  return store_options;
}

// The service's options for `options`.
master::MasterServiceOptions ServiceOptions(const MasterOptions& options) {
  master::MasterServiceOptions so = options.service;
  // Keys of tenants other than the default carry a prefix (tenant.h); the
  // handler checks the length the caller sent against max_key_bytes.
  so.max_key_bytes = static_cast<uint32_t>(std::min<uint64_t>(
      master::MetadataIndex::kMaxKeyBytes,
      uint64_t{options.service.max_key_bytes} + master::kMaxTenantPrefixBytes));
  if (options.index_snapshots) so.snapshot_path = options.db_path + ".snapshot";
  return so;
}

// Create's first step: the RocksDB store and the service over it (the
// index loaded from the store or the last snapshot, or taken over from
// options.take_preloaded). `store_out`: the store, still owned by the
// service.
absl::StatusOr<std::unique_ptr<master::MasterService>> OpenService(
    const MasterOptions& options, master::RocksDbMetadataStore** store_out) {
  auto store = master::RocksDbMetadataStore::Create(StoreOptions(options));
  if (!store.ok()) return store.status();
  *store_out = store->get();
  if (options.take_preloaded) {
    // A standby's index, loaded while it stood by: taken over only if it
    // was loaded at exactly the sequence the store opened at (nothing
    // changed the nodes or objects since).
    const uint64_t opened = (*store)->opened_sequence();
    if (std::unique_ptr<master::MasterService> preloaded =
            options.take_preloaded(opened)) {
      return master::MasterService::CreatePreloaded(ServiceOptions(options),
                                                    std::move(store).value(),
                                                    std::move(preloaded));
    }
  }
  return master::MasterService::Create(ServiceOptions(options),
                                       std::move(store).value());
}

}  // namespace

absl::StatusOr<PreloadedIndex> MasterServer::PreloadIndex(
    const MasterOptions& options) {
  absl::Status s = options.Validate();
  if (!s.ok()) return s;
  const absl::Time start = absl::Now();
  master::RocksDbMetadataStoreOptions store_options = StoreOptions(options);
  store_options.read_only = true;
  auto store = master::RocksDbMetadataStore::Create(store_options);
  if (!store.ok()) return store.status();
  PreloadedIndex preloaded;
  preloaded.sequence = (*store)->opened_sequence();
  auto service = master::MasterService::Create(ServiceOptions(options),
                                               std::move(store).value());
  if (!service.ok()) return service.status();
  preloaded.service = std::move(service).value();
  preloaded.took = absl::Now() - start;
  return preloaded;
}

absl::StatusOr<std::unique_ptr<MasterServer>> MasterServer::Create(
    const MasterOptions& options) {
  absl::Status s = options.Validate();
  if (!s.ok()) return s;
  master::RocksDbMetadataStore* store = nullptr;
  auto service = OpenService(options, &store);
  if (!service.ok()) return service.status();
  auto security = ServerSecurity::Create(
      options, "master", SplitHostPort(options.listen_address)->first);
  if (!security.ok()) return security.status();
  std::unique_ptr<master::MasterReplication> replication;
  if (options.replication != master::ReplicationMode::kOff) {
    master::MasterReplicationOptions ro;
    ro.mode = options.replication;
    ro.sync_timeout = options.replication_sync_timeout;
    ro.async_batch_delay = options.replication_async_batch_delay;
    ro.confirm_batch_delay = options.replication_confirm_batch_delay;
    ro.store = store;
    ro.authenticator = (*security)->authenticator();
    auto r = master::MasterReplication::Create(ro);
    if (!r.ok()) return r.status();
    replication = std::move(r).value();
  }
  auto tenants = master::TenantRegistry::Create(
      options.tenant_quotas_file.empty() ? options.db_path + ".quotas"
                                         : options.tenant_quotas_file);
  if (!tenants.ok()) return tenants.status();

  std::unique_ptr<MasterServer> server(new MasterServer);
  server->security_ = std::move(security).value();
  server->tenants_ = std::move(tenants).value();
  server->daemon_ = options;
  server->service_ = std::move(service).value();
  server->replication_ = std::move(replication);
  master::MasterRpcHooks hooks;
  hooks.gate = options.gate;
  master::MasterReplication* repl = server->replication_.get();
  if (repl != nullptr) {
    hooks.after_commit = [repl](v1::PutCommitResponse* resp,
                                std::function<void()> answer) {
      repl->AfterCommit(resp, std::move(answer));
    };
  }
  hooks.extra_stats = [repl, extra = options.extra_stats](StatsVisitor* v) {
    if (repl != nullptr) repl->VisitStats(v);
    if (extra) extra(v);
  };
  server->handler_ =
      std::make_unique<master::MasterRpcHandler>(
          server->service_.get(), server->security_->authenticator(),
          server->tenants_.get(),
          options.service.max_key_bytes, options.max_lookup_streams,
          options.service.clock != nullptr ? options.service.clock
                                           : Clock::Real(),
          std::move(hooks));
  s = server->StartRpc(options);
  if (!s.ok()) return s;
  s = server->StartMetrics(options);
  if (!s.ok()) return s;
  MasterServer* raw = server.get();
  const absl::Duration interval = std::clamp(
      options.service.put_timeout / 4, absl::Milliseconds(10),
      absl::Seconds(1));
  server->reaper_ =
      Thread("master-reaper", [raw, interval] { raw->ReaperLoop(interval); });
  server->LogServing(options);
  // Loaded and serving: health probes say so from now on.
  server->health_->SetAllServing(true);
  return server;
}

absl::Status MasterServer::StartRpc(const MasterOptions& options) {
  const int max_message = static_cast<int>(std::min<uint64_t>(
      INT32_MAX,
      std::max<uint64_t>(
          master::kMinMaxMessageBytes,
          uint64_t{options.service.max_batch_keys} *
                  (options.service.max_key_bytes + 16) +
              (1 << 20))));
  // grpc.health.v1 (NOT_SERVING until Create returns, and again from
  // Shutdown on) and server reflection on the same port. Health is our own
  // completion-queue service (gRPC's default one is a callback service);
  // reflection is a sync service, which gRPC serves from non-polling
  // queues beside ours. The reflection switch is process-wide and takes
  // effect for servers built afterwards.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  health_ = std::make_unique<master::HealthService>();
  health_->SetServingStatus(
      ::hymcache::v1::MasterService::service_full_name(), false);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address, security_->credentials(),
                           &port);
  // Without this, gRPC sets SO_REUSEPORT and a second master would bind the
  // same port silently.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT,
                             options.reuse_port ? 1 : 0);
  builder.SetMaxReceiveMessageSize(max_message);
  // No default (callback) health service: ours is registered instead.
  builder.SetOption(
      std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
  builder.RegisterService(handler_->async_service());
  builder.RegisterService(health_->service());
  // Standby replication: its streams on the pollers too.
  if (replication_ != nullptr) builder.RegisterService(replication_->service());
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs;
  for (uint32_t i = 0; i < options.rpc_threads; ++i) {
    cqs.push_back(builder.AddCompletionQueue());
  }
  server_ = builder.BuildAndStart();
  for (auto& cq : cqs) {
    pollers_.push_back(std::make_unique<master::CqPoller>(std::move(cq)));
  }
  if (server_ == nullptr || port == 0) {
    Shutdown();
    return absl::UnavailableError(absl::StrCat(
        "master: cannot listen on ", options.listen_address));
  }
  port_ = port;
  for (size_t i = 0; i < pollers_.size(); ++i) {
    master::CqPoller* poller = pollers_[i].get();
    master::MasterRpcHandler* handler = handler_.get();
    master::HealthService* health = health_.get();
    master::MasterReplication* replication = replication_.get();
    poller->Start(absl::StrCat("master-rpc-", i),
                  [poller, handler, health, replication] {
                    handler->StartOn(poller);
                    health->StartOn(poller);
                    if (replication != nullptr) replication->StartOn(poller);
                  });
  }
  std::string host = SplitHostPort(options.listen_address)->first;
  if (host == "0.0.0.0" || host == "::" || host == "*") host = "127.0.0.1";
  address_ = host.find(':') != std::string::npos
                 ? absl::StrCat("[", host, "]:", port)
                 : absl::StrCat(host, ":", port);
  return absl::OkStatus();
}

absl::Status MasterServer::StartMetrics(const MasterOptions& options) {
  if (options.metrics_listen.empty()) return absl::OkStatus();
  MetricsExporterOptions mo;
  mo.listen_address = options.metrics_listen;
  mo.prefix = "hymcache_master_";
  mo.collect = [this](StatsVisitor* v) { VisitStats(v); };
  auto metrics = MetricsExporter::Create(mo);
  if (!metrics.ok()) {
    Shutdown();
    return metrics.status();
  }
  metrics_ = std::move(metrics).value();
  metrics_address_ = metrics_->address();
  LOG(INFO) << "master: metrics on http://" << metrics_address_ << "/metrics";
  return absl::OkStatus();
}

void MasterServer::LogServing(const MasterOptions& options) const {
  LOG(INFO) << "master serving on " << address_ << " (db "
            << options.db_path << ", "
            << (options.tls.ServerEnabled()
                    ? (options.tls.require_client_cert ? "mutual TLS"
                                                       : "TLS")
                    : "plaintext")
            << ")";
  // ServerSecurity logged the identities, or protected mode.
}

MasterServer::~MasterServer() { Shutdown(); }

void MasterServer::ReaperLoop(absl::Duration interval) {
  while (true) {
    {
      MutexLock l(&mu_);
      if (stopping_) return;
      cv_.WaitWithDeadline(&mu_, absl::Now() + interval);
      if (stopping_) return;
    }
    service_->ReapExpired();
    absl::Status s = service_->MaybeSnapshot();
    if (!s.ok()) LOG(WARNING) << "index snapshot not written: " << s;
  }
}

void MasterServer::Shutdown() {
  {
    MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    cv_.SignalAll();
  }
  metrics_.reset();  // no scrape runs past this point
  // NOT_SERVING first (Watch callers hear it, then their streams end), and
  // for good: later status changes are ignored.
  if (health_) health_->Shutdown();
  // Open LookupStreams end now (they would hold Shutdown to its deadline).
  if (handler_) handler_->CancelLookupStreams();
  // Standbys' streams end, held commits are answered (before the server
  // waits for in-flight calls).
  if (replication_) replication_->Shutdown();
  if (server_) {
    // In-flight calls get a second to finish, then are cancelled; the
    // pollers keep running them meanwhile.
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(1));
  }
  // Each poller drains its queue (every call's last event deletes it) and
  // its thread ends: what the handlers did happens before the teardown.
  for (auto& p : pollers_) p->ShutdownAndJoin();
  reaper_.Join();
  server_.reset();
  pollers_.clear();
  handler_.reset();
  health_.reset();
  replication_.reset();
  service_.reset();  // closes RocksDB
  LOG(INFO) << "master on " << address_ << " stopped";
  MutexLock l(&mu_);
  stopped_ = true;
  cv_.SignalAll();
}

absl::Status MasterServer::CheckAlive(absl::Duration timeout) {
  return CheckServerAnswers(server_.get(), timeout);
}

void MasterServer::Wait() {
  MutexLock l(&mu_);
  while (!stopped_) cv_.Wait(&mu_);
}

}  // namespace hymcache
