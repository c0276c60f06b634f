#include "storage_node/storage_node.h"

#include <errno.h>
#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/grpc_reconnect.h"
#include "common/grpc_status.h"
#include "common/health_probe.h"
#include "common/limits.h"
#include "common/metrics_exporter.h"
#include "common/net.h"
#include "common/rdma.h"
#include "common/stats.h"
#include "common/status_macros.h"
#include "common/status_reason.h"
#include "common/transport_params.h"
#include "glog/logging.h"
#include "proto/master.grpc.pb.h"
#include "proto/storage.grpc.pb.h"
#include "storage_node/dataplane/data_server.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/dataplane/kv_manager.h"
#include "storage_node/dataplane/rdma_plane.h"
#include "storage_node/dataplane/shm_export.h"
#include "storage_node/device/capacity_tier.h"
#include "storage_node/device/dram_device.h"
#include "storage_node/device/host_memory.h"
#include "storage_node/device/hybrid_device.h"
#include "storage_node/device/lru_device.h"
#include "storage_node/device/memory_device.h"
#include "storage_node/storage_node_internal.h"

namespace hymcache {
namespace {

namespace v1 = ::hymcache::v1;
using storage::internal::ToProto;

// How long reads of reused space may hold up a write.
constexpr absl::Duration kExtentDrainTimeout = absl::Seconds(5);

std::string JoinHostPort(const std::string& host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace

// The gRPC StorageControl service. Handlers never block.

class StorageNode::ControlService final
    : public v1::StorageControl::CallbackService {
 public:
  explicit ControlService(StorageNode* node) : node_(node) {}

  // Only admins (hymctl) call the control service.
  absl::Status Admit(grpc::CallbackServerContext* ctx,
                     const char* method) const {
    const Authenticator* auth = node_->security_->authenticator();
    if (auth == nullptr) return absl::OkStatus();
    absl::Status s = auth->Check(*ctx, Role::kAdmin, method).status();
    if (!s.ok()) {
      LOG_EVERY_N(WARNING, 100)
          << "storage node: refused a call from " << ctx->peer() << ": " << s
          << " (every 100th refusal logged)";
    }
    return s;
  }
  static grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx,
                                          const absl::Status& s) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }

  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const v1::StorageStatsRequest* /*req*/,
                                     v1::StorageStatsResponse* resp) override {
    if (absl::Status a = Admit(ctx, "GetStats"); !a.ok()) return Refuse(ctx, a);
    StorageNode* n = node_;
    {
      MutexLock l(&n->mu_);
      resp->set_node_id(n->node_id_);
      resp->set_registered(n->registered_);
    }
    resp->set_name(n->name_);
    resp->set_incarnation(n->incarnation_);
    for (const storage::RegionDescriptor& r : n->device_->Regions()) {
      ToProto(r, resp->add_regions());
    }
    resp->set_extents(n->extents_->Stats().extents);
    storage::DataServerStats d = n->data_server_->Stats();
    resp->set_bytes_read(d.bytes_read);
    resp->set_bytes_written(d.bytes_written);
    resp->set_read_ops(d.read_ops);
    resp->set_write_ops(d.write_ops);
    resp->set_stale_reads(d.stale_reads);
    resp->set_rejected_ops(d.rejected_ops);
    resp->set_open_connections(d.open_connections);
    FlatStatsVisitor flat;
    n->VisitStats(&flat, "");
    auto& m = *resp->mutable_device_stats();
    for (const auto& [name, value] : flat.values()) m[name] = value;
    {
      MutexLock l(&n->mu_);
      resp->set_reconciliations(n->reconciliations_);
      resp->set_reconcile_freed_extents(n->reconcile_freed_);
      resp->set_last_reconcile(n->last_reconcile_);
    }
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* RequestReconcile(
      grpc::CallbackServerContext* ctx,
      const v1::RequestReconcileRequest* /*req*/,
      v1::RequestReconcileResponse* resp) override {
    if (absl::Status a = Admit(ctx, "RequestReconcile"); !a.ok())
      return Refuse(ctx, a);
    {
      MutexLock l(&node_->mu_);
      node_->reconcile_due_ = true;
      resp->set_reconciliations(node_->reconciliations_);
      resp->set_registered(node_->registered_);
    }
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // Pages of the extent table (each page under the table's lock once).
  grpc::ServerWriteReactor<v1::ListExtentsResponse>* ListExtents(
      grpc::CallbackServerContext* ctx,
      const v1::ListExtentsRequest* req) override {
    if (absl::Status a = Admit(ctx, "ListExtents"); !a.ok()) {
      class Refused final
          : public grpc::ServerWriteReactor<v1::ListExtentsResponse> {
       public:
        explicit Refused(const absl::Status& s) {
          TsanRelease(this);
          Finish(ToGrpcStatus(s));
        }
        void OnDone() override {
          TsanAcquire(this);
          delete this;
        }
      };
      return new Refused(a);
    }
    // TsanAcquire/TsanRelease: see MasterRpcHandler::ReconcileNode.
    class Writer final
        : public grpc::ServerWriteReactor<v1::ListExtentsResponse> {
     public:
      Writer(StorageNode* node, uint32_t page)
          : node_(node), page_(page), node_id_(node->node_id()) {
        Next();
      }
      void OnWriteDone(bool ok) override {
        TsanAcquire(this);
        if (ok) {
          Next();
        } else {
          TsanRelease(this);
          Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                              "ListExtents: stream broken"));
        }
      }
      void OnDone() override {
        TsanAcquire(this);
        delete this;
      }

     private:
      void Next() {
        resp_.Clear();
        keys_.clear();
        node_->extents_->ListReadable(&cursor_, page_, &keys_);
        if (keys_.empty()) {
          TsanRelease(this);
          Finish(grpc::Status::OK);
          return;
        }
        for (const storage::ExtentKey& k : keys_) {
          v1::Location* loc = resp_.add_extents();
          loc->set_node_id(node_id_);
          loc->set_region_id(k.region_id);
          loc->set_addr(k.addr);
          loc->set_length(k.length);
          loc->set_generation(k.generation);
        }
        TsanRelease(this);
        StartWrite(&resp_);
      }

      StorageNode* const node_;
      const uint32_t page_;
      const uint32_t node_id_;
      storage::ExtentTable::Cursor cursor_;
      std::vector<storage::ExtentKey> keys_;
      v1::ListExtentsResponse resp_;
    };
    const uint32_t page = req->page_size() == 0
                              ? 4096
                              : std::min<uint32_t>(req->page_size(), 65536);
    return new Writer(node_, page);
  }

 private:
  StorageNode* const node_;
};

void StorageNode::VisitStats(StatsVisitor* v,
                             const std::string& device_prefix) const {
  VisitBuildInfo(options_, v);
  data_server_->VisitStats(v);
  PrefixedStatsVisitor device(v, device_prefix);
  device_->VisitStats(&device);
  PrefixedStatsVisitor prefetch(v, "prefetch_");
  kv_->VisitStats(&prefetch);
  v->Gauge("rdma_enabled", "Whether the RDMA data plane is on",
           rdma_ != nullptr ? 1 : 0);
  v->Gauge("extents", "Extents the node holds or is writing",
           static_cast<double>(extents_->Stats().extents));
  MutexLock l(&mu_);
  v->Gauge("registered", "Whether the node is registered with the master",
           registered_ ? 1 : 0);
  v->Counter("reconciliations", "Completed reconciliations with the master",
             static_cast<double>(reconciliations_));
  v->Counter(
      "reconcile_freed_extents",
      "Extents freed because the master neither listed nor expected them",
      static_cast<double>(reconcile_freed_));
}

namespace {

// Builds the configured memory device. A persistent device replaces
// `*incarnation` with the one recorded in its capacity file. The LRU
// baseline does not own its capacity tier: `*tier_out` keeps it alive.
absl::StatusOr<std::unique_ptr<storage::MemoryDevice>> MakeDevice(
    const StorageNodeOptions& o, uint64_t max_region_bytes,
    uint64_t* incarnation, std::unique_ptr<storage::CapacityTier>* tier_out) {
  const bool shareable = o.expose_shm || o.rdma != RdmaMode::kOff;
  const storage::DramDeviceOptions* dram = o.dram();
  const StorageNodeOptions::HybridDevice* hybrid = o.hybrid();
  const StorageNodeOptions::LruDevice* lru = o.lru();
  RETURN_IF_ERROR(storage::CheckMemoryFits(
      dram != nullptr ? dram->capacity_bytes
      : hybrid != nullptr
          ? hybrid->device.staging_bytes + hybrid->device.write_buffer_bytes
          : lru->device.cache_bytes,
      dram != nullptr     ? dram->numa_node
      : hybrid != nullptr ? hybrid->device.numa_node
                          : -1,
      o.allow_memory_overcommit,
      dram != nullptr ? "--dram_bytes"
                      : "--staging_bytes + --write_buffer_bytes"));
  if (shareable && o.shared_huge_pages) {
    absl::Status hp = storage::EnableSharedHugePages();
    if (!hp.ok()) {
      LOG(WARNING) << "storage node: shared device memory may get 4 KiB "
                      "pages: "
                   << hp;
    }
  }
  if (dram != nullptr) {
    storage::DramDeviceOptions dev = *dram;
    dev.region_id = 0;
    dev.max_region_bytes = max_region_bytes;
    dev.shareable = shareable;
    ASSIGN_OR_RETURN(auto d, storage::DramDevice::Create(dev));
    return std::unique_ptr<storage::MemoryDevice>(std::move(d));
  }
  storage::CapacityTierOptions tier =
      hybrid != nullptr ? hybrid->tier : lru->tier;
  tier.node_name = hybrid != nullptr ? o.node_name : "lru-baseline";
  ASSIGN_OR_RETURN(std::unique_ptr<storage::CapacityTier> t,
                   storage::CapacityTier::Open(tier));
  if (hybrid != nullptr) {
    *incarnation = t->incarnation();
    storage::HybridDeviceOptions h = hybrid->device;
    h.shareable = shareable;
    // Overcommitted (--allow_overcommit): faulting it all in now would only
    // get the node killed at start; pages come as they are used.
    if (h.populate_memory &&
        !storage::CheckMemoryFits(h.staging_bytes + h.write_buffer_bytes,
                                  h.numa_node, /*allow_overcommit=*/false,
                                  "--staging_bytes + --write_buffer_bytes")
             .ok()) {
      LOG(WARNING) << "hybrid device: not faulting in the overcommitted "
                      "staging window and write buffer at start";
      h.populate_memory = false;
    }
    LOG(INFO) << "hybrid device: capacity file " << tier.path << " ("
              << (t->adopted() ? "adopted" : "formatted") << ", "
              << t->io()->engine()
              << (t->io()->async_submit() ? ", async submission" : "")
              << "), staging window " << h.staging_bytes
              << " bytes, write buffer " << h.write_buffer_bytes << " bytes";
    ASSIGN_OR_RETURN(auto d, storage::HybridDevice::Create(h, std::move(t)));
    return std::unique_ptr<storage::MemoryDevice>(std::move(d));
  }
  storage::LruCacheDeviceOptions l = lru->device;
  l.capacity_bytes = tier.capacity_bytes;
  l.data_offset = storage::CapacityTier::kHeaderBytes;
  LOG(INFO) << "LRU baseline device: capacity file " << tier.path << ", cache "
            << l.cache_bytes << " bytes";
  ASSIGN_OR_RETURN(auto d, storage::LruCacheDevice::Create(l, t->io()));
  *tier_out = std::move(t);
  return std::unique_ptr<storage::MemoryDevice>(std::move(d));
}

}  // namespace

namespace {

// The node key file: exactly kNodeKeyBytes. NotFound if it does not exist.
absl::StatusOr<std::string> ReadNodeKey(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return absl::NotFoundError(path);
    return absl::InternalError(
        absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  }
  std::string key(kNodeKeyBytes + 1, '\0');
  const size_t n = std::fread(key.data(), 1, key.size(), f);
  std::fclose(f);
  if (n != kNodeKeyBytes) {
    return absl::DataLossError(
        absl::StrCat(path, " holds ", n, " bytes, not a node key"));
  }
  key.resize(kNodeKeyBytes);
  return key;
}

// Replaces the node key file atomically (mode 0600).
absl::Status WriteNodeKey(const std::string& path, const std::string& key) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create ", tmp, ": ", strerror(errno)));
  }
  const bool ok =
      ::write(fd, key.data(), key.size()) == static_cast<ssize_t>(key.size()) &&
      ::fsync(fd) == 0;
  const int e = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot write ", path, ": ", strerror(ok ? errno : e)));
  }
  return absl::OkStatus();
}

}  // namespace

v1::NodeAuth StorageNode::Auth(absl::string_view purpose,
                               uint32_t node_id) const {
  v1::NodeAuth auth;
  std::string key;
  {
    MutexLock l(&mu_);
    key = node_key_;
  }
  if (key.empty()) return auth;
  auth.set_unix_ms(absl::ToUnixMillis(absl::Now()));
  auth.set_proof(NodeProof(HmacSha256(key), purpose, name_, node_id,
                           incarnation_, auth.unix_ms()));
  return auth;
}

void StorageNode::SaveNodeKey(const std::string& key) {
  {
    MutexLock l(&mu_);
    if (node_key_ == key) return;
    node_key_ = key;
  }
  if (node_key_path_.empty()) return;
  absl::Status s = WriteNodeKey(node_key_path_, key);
  if (!s.ok()) {
    LOG(WARNING) << "storage node: cannot keep the node key: " << s
                 << " (a restart will have to wait for the old process to "
                    "time out, and will lose its objects)";
  }
}

absl::StatusOr<std::unique_ptr<StorageNode>> StorageNode::Create(
    const StorageNodeOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<StorageNode> node(new StorageNode(options));
  const std::string advertise = options.advertise_host.empty()
                                    ? options.listen_host
                                    : options.advertise_host;
  RETURN_IF_ERROR(node->InitIdentity());
  RETURN_IF_ERROR(node->OpenDevice());
  RETURN_IF_ERROR(node->OpenExtentTable());
  RETURN_IF_ERROR(node->StartDataPlane(advertise));
  RETURN_IF_ERROR(node->LoadSecurity());
  RETURN_IF_ERROR(node->StartControlService(advertise));
  RETURN_IF_ERROR(node->StartMetrics());
  RETURN_IF_ERROR(node->ConnectMaster());

  uint64_t region_bytes = 0;
  for (const storage::RegionDescriptor& r : node->device_->Regions()) {
    region_bytes += r.capacity_bytes;
  }
  LOG(INFO) << "storage node '" << node->name_ << "' incarnation "
            << node->incarnation_ << ": data " << node->data_address_
            << ", control " << node->control_address_ << ", " << region_bytes
            << " bytes in " << node->device_->Regions().size()
            << " regions; master " << options.master_address
            << (options.etcd_endpoints.empty()
                    ? ""
                    : " (the leader of cluster '" + options.cluster +
                          "' in etcd " + options.etcd_endpoints + ")");
  StorageNode* n = node.get();
  ASSIGN_OR_RETURN(node->heartbeat_,
                   Thread::Start("sn-heartbeat", [n] { n->HeartbeatLoop(); }));
  return node;
}

absl::Status StorageNode::InitIdentity() {
  absl::BitGen gen;
  do {
    incarnation_ = absl::Uniform<uint64_t>(gen);
  } while (incarnation_ == 0);
  // Secret random bytes (as a node key is) naming this process's
  // registrations: a retry after a lost answer gets the same key back.
  ASSIGN_OR_RETURN(registration_nonce_, NewNodeKey());
  node_key_path_ = options_.node_key_path;
  if (node_key_path_.empty() && options_.hybrid() != nullptr) {
    node_key_path_ = options_.hybrid()->tier.path + ".node_key";
  }
  if (!node_key_path_.empty()) {
    absl::StatusOr<std::string> key = ReadNodeKey(node_key_path_);
    if (key.ok()) {
      MutexLock l(&mu_);
      node_key_ = *std::move(key);
    } else if (key.status().code() != absl::StatusCode::kNotFound) {
      LOG(WARNING) << "storage node: ignoring node key file " << node_key_path_
                   << ": " << key.status();
    }
  }
  return absl::OkStatus();
}

absl::Status StorageNode::OpenDevice() {
  // RDMA first: its registration limit decides how the DRAM device is
  // split into regions (no object may straddle two registrations).
  std::unique_ptr<rdma::Device> rdma_device;
  if (options_.rdma != RdmaMode::kOff) {
    rdma::DeviceOptions ro;
    ro.device_name = options_.rdma_device;
    absl::StatusOr<std::unique_ptr<rdma::Device>> d = rdma::Device::Open(ro);
    if (d.ok()) {
      rdma_device = std::move(*d);
    } else if (options_.rdma == RdmaMode::kOn) {
      return d.status();
    } else {
      LOG(INFO) << "storage node: no RDMA data plane (" << d.status().message()
                << "); serving TCP and shared memory";
    }
  }
  uint64_t max_region =
      options_.dram() != nullptr ? options_.dram()->max_region_bytes : 0;
  if (max_region == 0 && rdma_device != nullptr) {
    max_region = rdma_device->max_mr_size();
  }
  ASSIGN_OR_RETURN(device_,
                   MakeDevice(options_, max_region, &incarnation_, &lru_tier_));
  if (rdma_device != nullptr) {
    absl::StatusOr<std::unique_ptr<storage::RdmaPlane>> plane =
        storage::RdmaPlane::Create(
            std::move(rdma_device), device_->Areas(),
            storage::RdmaPlaneOptions{options_.rdma_trusted_clients});
    if (plane.ok()) {
      rdma_ = std::move(*plane);
      for (auto& [k, v] : rdma_->TransportParams()) {
        transport_params_[k] = v;
      }
    } else if (options_.rdma == RdmaMode::kOn) {
      return plane.status();
    } else {
      LOG(WARNING) << "storage node: RDMA data plane disabled: "
                   << plane.status();
    }
  }
  return absl::OkStatus();
}

absl::Status StorageNode::OpenExtentTable() {
  storage::ExtentTableOptions ext;
  ext.regions = device_->Regions();
  ext.drain_timeout = kExtentDrainTimeout;
  ASSIGN_OR_RETURN(extents_, storage::ExtentTable::Create(ext));
  // A persistent device still holds the objects it flushed before a
  // restart: they are readable again (the master keeps them while this
  // incarnation is the one it knows; otherwise registration clears them).
  size_t adopted = 0;
  for (const storage::RecoveredExtent& e : device_->RecoveredExtents()) {
    auto ticket = extents_->BeginWrite(
        storage::ExtentKey{e.region_id, e.addr, e.length, e.generation});
    if (ticket.ok() && ticket->Commit().ok()) {
      ++adopted;
    } else {
      LOG(WARNING) << "storage node: cannot re-adopt extent at " << e.addr
                   << " (" << e.length << " bytes, generation " << e.generation
                   << ")";
    }
  }
  if (adopted > 0) {
    LOG(INFO) << "storage node: re-adopted " << adopted
              << " objects from the capacity tier";
  }
  // No writes before the master has registered this process: a master
  // that still takes the previous process (or incarnation) for alive would
  // place puts here that this process's registration then purges. The
  // registration sets the real ceiling.
  extents_->SetGenerationCeiling(0);
  return absl::OkStatus();
}

absl::Status StorageNode::StartDataPlane(const std::string& advertise) {
  storage::KvManagerOptions kv = options_.prefetch;
  // The hybrid device's window is shared between requests; the LRU
  // baseline and DRAM stage nothing (their "prefetch" costs no space).
  kv.staging_capacity = options_.hybrid() != nullptr
                            ? options_.hybrid()->device.staging_bytes
                            : 0;
  kv.device = device_.get();
  kv.extents = extents_.get();
  ASSIGN_OR_RETURN(kv_, storage::KvManager::Create(kv));

  if (options_.expose_shm) {
    // Same-host clients get read-only descriptors of the memfds over a Unix
    // socket that checks who they are.
    storage::ShmExportOptions so;
    so.areas = device_->Areas();
    so.allowed_uids = options_.shm_allowed_uids;
    so.allowed_gids = options_.shm_allowed_gids;
    absl::StatusOr<std::unique_ptr<storage::ShmExport>> ex =
        storage::ShmExport::Create(so);
    if (ex.ok()) {
      shm_export_ = std::move(*ex);
      for (auto& [k, v] : shm_export_->TransportParams()) {
        transport_params_[k] = v;
      }
    } else {
      LOG(INFO) << "storage node: no shared-memory data plane ("
                << ex.status().message() << ")";
    }
  }

  storage::DataServerOptions ds = options_.data;
  ds.kv = kv_.get();
  ds.rdma = rdma_.get();
  ds.host = options_.listen_host;
  ds.device = device_.get();
  ds.extents = extents_.get();
  capabilities_ =
      std::make_unique<CapabilityVerifier>(options_.capability_skew);
  ds.capabilities = capabilities_.get();
  ASSIGN_OR_RETURN(data_server_, storage::DataServer::Create(ds));
  data_port_ = data_server_->port();

  data_address_ = JoinHostPort(advertise, data_port_);
  name_ = options_.node_name.empty() ? data_address_ : options_.node_name;
  host_ = options_.host.empty() ? DefaultHostName() : options_.host;
  if (host_.size() > kMaxHostBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage node: host ($HYM_HOST) has ", host_.size(),
                     " bytes (at most ", kMaxHostBytes, ")"));
  }
  return absl::OkStatus();
}

absl::Status StorageNode::LoadSecurity() {
  ASSIGN_OR_RETURN(security_, ServerSecurity::Create(options_, "storage node",
                                                     options_.listen_host));
  return absl::OkStatus();
}

absl::Status StorageNode::StartControlService(const std::string& advertise) {
  control_service_ = std::make_unique<ControlService>(this);
  // grpc.health.v1 (see Ready()) and server reflection on the control port;
  // process-wide switches for servers built from here on.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Without this, gRPC binds with SO_REUSEPORT and "succeeds" on a port
  // another server already holds.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const std::string control_listen =
      JoinHostPort(options_.listen_host, options_.control_port);
  builder.AddListeningPort(control_listen, security_->credentials(),
                           &control_port_);
  builder.RegisterService(control_service_.get());
  control_server_ = builder.BuildAndStart();
  if (control_server_ == nullptr || control_port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "storage node: cannot serve the control service on ", control_listen));
  }

  if (auto* health = control_server_->GetHealthCheckService()) {
    health->SetServingStatus(v1::StorageControl::service_full_name(), false);
    health->SetServingStatus(false);  // until registered and reconciled
  }
  control_address_ = JoinHostPort(advertise, control_port_);
  return absl::OkStatus();
}

absl::Status StorageNode::StartMetrics() {
  if (options_.metrics_listen.empty()) return absl::OkStatus();
  MetricsExporterOptions mo;
  mo.listen_address = options_.metrics_listen;
  mo.prefix = "hymcache_storage_";
  mo.collect = [this](StatsVisitor* v) { VisitStats(v, "device_"); };
  ASSIGN_OR_RETURN(metrics_, MetricsExporter::Create(mo));
  metrics_address_ = metrics_->address();
  return absl::OkStatus();
}

StorageNode::StorageNode(const StorageNodeOptions& options)
    : options_(options) {}

StorageNode::~StorageNode() { Shutdown(); }

void StorageNode::SetSkipCapabilityChecksForTest(bool skip) {
  data_server_->SetSkipCapabilityChecksForTest(skip);
}

uint32_t StorageNode::node_id() const {
  MutexLock l(&mu_);
  return node_id_;
}

bool StorageNode::ReadyLocked() const {
  return registered_ && !stopping_ && !reconcile_before_ready_;
}

bool StorageNode::ready() const {
  MutexLock l(&mu_);
  return ReadyLocked();
}

bool StorageNode::draining() const {
  MutexLock l(&mu_);
  return draining_;
}

bool StorageNode::registered() const {
  MutexLock l(&mu_);
  return registered_;
}

bool StorageNode::WaitRegistered(absl::Time deadline) {
  MutexLock l(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (registered_ && heartbeat_since_registration_) || stopping_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  return registered_ && heartbeat_since_registration_;
}

void StorageNode::Shutdown() {
  {
    MutexLock l(&mu_);
    if (shutdown_started_) {
      mu_.Await(absl::Condition(&shutdown_done_));
      return;
    }
    shutdown_started_ = true;
  }
  metrics_.reset();  // no scrape runs past this point
  // NOT_SERVING for good, before the node leaves the master and drains.
  if (control_server_ != nullptr) {
    if (auto* health = control_server_->GetHealthCheckService()) {
      health->Shutdown();
    }
  }
  // A node whose Create failed half-way has nothing to announce.
  if (heartbeat_.joinable()) {
    LOG(INFO) << "storage node '" << name_ << "' shutting down";
  }
  // Leave the master first, so that it stops placing objects here while
  // the data plane drains.
  uint32_t node_id = 0;
  bool was_registered = false;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    if (rpc_ != nullptr) rpc_->TryCancel();
  }
  heartbeat_.Join();
  if (identity_change_carried_) {  // the heartbeat thread has ended
    capabilities_->AbandonIdentityChange();
    identity_change_carried_ = false;
  }
  {
    MutexLock l(&mu_);
    node_id = node_id_;
    was_registered = registered_;
    registered_ = false;
  }
  // Try even after a missed heartbeat: the master may be back. Bounded by
  // rpc_timeout.
  if (master_ != nullptr && node_id != 0) {
    if (!was_registered) VLOG(1) << "deregistering while not registered";
    Deregister(node_id);
  }
  // Then stop accepting and let requests in progress finish.
  if (data_server_ != nullptr) data_server_->Shutdown(options_.drain_timeout);
  if (control_server_ != nullptr) {
    control_server_->Shutdown(
        absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    control_server_->Wait();
  }
  MutexLock l(&mu_);
  shutdown_done_ = true;
}

absl::Status StorageNode::CheckAlive(absl::Duration timeout) {
  return CheckServerAnswers(control_server_.get(), timeout);
}

void StorageNode::Wait() {
  MutexLock l(&mu_);
  mu_.Await(absl::Condition(&shutdown_done_));
}

}  // namespace hymcache
