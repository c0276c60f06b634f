// What client.h and options.h define beside the abstract Client: option
// checks, and Get and Put on top of Load and Store.
#include "client/client.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/options.h"
#include "common/grpc_polling.h"
#include "common/limits.h"
#include "common/net.h"

namespace hymcache {

absl::StatusOr<TransportKind> ParseTransportKind(const std::string& name) {
  if (name == "tcp") return TransportKind::kTcp;
  if (name == "shm") return TransportKind::kShm;
  if (name == "rdma") return TransportKind::kRdma;
  if (name == "auto") return TransportKind::kAuto;
  return absl::InvalidArgumentError(absl::StrCat(
      "transport must be tcp, shm, rdma or auto, not '", name, "'"));
}

std::vector<std::string> ClientOptions::MasterAddresses() const {
  return absl::StrSplit(master_address, ',', absl::SkipEmpty());
}

std::vector<std::string> ClientOptions::EtcdEndpoints() const {
  return absl::StrSplit(etcd_endpoints, ',', absl::SkipEmpty());
}

absl::Status ClientOptions::Validate() const {
  if (MasterAddresses().empty() && EtcdEndpoints().empty()) {
    return absl::InvalidArgumentError(
        "ClientOptions.master_address (or etcd_endpoints) is required");
  }
  for (const std::string& e : EtcdEndpoints()) {
    absl::string_view hostport = e;
    absl::ConsumePrefix(&hostport, "http://");
    if (auto hp = SplitHostPort(std::string(hostport)); !hp.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ClientOptions.etcd_endpoints: ", hp.status().message()));
    }
  }
  if (!EtcdEndpoints().empty() &&
      (cluster.empty() || absl::StrContains(cluster, '/'))) {
    return absl::InvalidArgumentError(
        "ClientOptions.cluster must be a non-empty name without '/'");
  }
  for (const std::string& a : MasterAddresses()) {
    if (auto hp = SplitHostPort(a); !hp.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ClientOptions.master_address: ", hp.status().message()));
    }
  }
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "ClientOptions.tls_cert_file and tls_key_file go together");
  }
  if (default_deadline <= absl::ZeroDuration() ||
      default_store_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ClientOptions.default_deadline and default_store_deadline must be "
        "positive");
  }
  if (unresponsive_node_period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ClientOptions.unresponsive_node_period must be >= 0");
  }
  if (max_idle_connections_per_node < 0) {
    return absl::InvalidArgumentError(
        "ClientOptions.max_idle_connections_per_node must be >= 0");
  }
  if (host.size() > kMaxHostBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.host has ", host.size(), " bytes (at most ",
                     kMaxHostBytes, ")"));
  }
  if (max_keys_per_rpc == 0 || max_keys_per_rpc > 1024) {
    return absl::InvalidArgumentError(
        "ClientOptions.max_keys_per_rpc must be in 1..1024");
  }
  if (lookup_batch_keys == 0 || lookup_batch_keys > max_keys_per_rpc) {
    return absl::InvalidArgumentError(
        "ClientOptions.lookup_batch_keys must be in 1..max_keys_per_rpc");
  }
  if (lookup_pipeline_depth < 1 || lookup_pipeline_depth > 64) {
    return absl::InvalidArgumentError(
        "ClientOptions.lookup_pipeline_depth must be in 1..64");
  }
  if (master_connections < 1 || master_connections > 64) {
    return absl::InvalidArgumentError(
        "ClientOptions.master_connections must be in 1..64");
  }
  if (absl::Status s = ValidateGrpcPollStrategyChoice(grpc_poll_strategy);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.grpc_poll_strategy: ", s.message()));
  }
  if (read_batch_bytes == 0) {
    return absl::InvalidArgumentError(
        "ClientOptions.read_batch_bytes must be > 0");
  }
  if (location_cache_ttl < absl::Milliseconds(1) ||
      location_cache_ttl > absl::Seconds(60)) {
    return absl::InvalidArgumentError(
        "ClientOptions.location_cache_ttl must be in 1ms..60s");
  }
  if (store_threads < 1 || max_pending_stores < 1 || max_pending_hints < 1) {
    return absl::InvalidArgumentError(
        "ClientOptions.store_threads, max_pending_stores and "
        "max_pending_hints must be >= 1");
  }
  if (device.bounce_chunk_bytes == 0 || device.bounce_chunks < 1) {
    return absl::InvalidArgumentError(
        "ClientOptions.device.bounce_chunk_bytes and bounce_chunks must be "
        "positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadResult> Client::Get(absl::Span<const std::string> keys,
                                        absl::Span<const MutableBuffer> buffers,
                                        const CallOptions& call) {
  LoadOptions load;
  load.deadline = call.deadline;
  load.prefetch = false;
  return Load(keys, buffers, load);
}

absl::StatusOr<PutResult> Client::Put(absl::Span<const std::string> keys,
                                      absl::Span<const ConstBuffer> buffers,
                                      const CallOptions& call) {
  StoreOptions store;
  // The deadline of a call, not of an opportunistic store.
  store.deadline = call.deadline == absl::InfinitePast()
                       ? DefaultCallDeadline()
                       : call.deadline;
  return Store(keys, buffers, store)->Wait();
}

}  // namespace hymcache
