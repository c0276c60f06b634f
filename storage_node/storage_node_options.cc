// StorageNodeOptions::Validate and the names of the node's enum options
// (rdma, io_engine, io_submit) that flags and config files use.
#include "storage_node/storage_node.h"

#include <cstddef>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/limits.h"
#include "common/net.h"
#include "common/security.h"
#include "storage_node/device/block_io.h"
#include "storage_node/device/capacity_tier.h"

namespace hymcache {

namespace {

template <typename Enum, size_t N>
absl::StatusOr<Enum> ParseName(absl::string_view what, absl::string_view name,
                               const std::pair<Enum, const char*> (&names)[N]) {
  std::string choices;
  for (size_t i = 0; i < N; ++i) {
    if (name == names[i].second) return names[i].first;
    absl::StrAppend(&choices, i == 0 ? "" : i + 1 == N ? " or " : ", ",
                    names[i].second);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(what), " '", std::string(name), "' (want ",
                   choices, ")"));
}

template <typename Enum, size_t N>
const char* NameOf(Enum value, const std::pair<Enum, const char*> (&names)[N]) {
  for (const auto& [v, name] : names) {
    if (v == value) return name;
  }
  return "?";
}

constexpr std::pair<RdmaMode, const char*> kRdmaModes[] = {
    {RdmaMode::kOff, "off"}, {RdmaMode::kAuto, "auto"}, {RdmaMode::kOn, "on"}};
using Engine = storage::BlockIoOptions::Engine;
constexpr std::pair<Engine, const char*> kIoEngines[] = {
    {Engine::kAuto, "auto"},
    {Engine::kIoUring, "io_uring"},
    {Engine::kThreadPool, "threadpool"}};
using Submit = storage::BlockIoOptions::Submit;
constexpr std::pair<Submit, const char*> kIoSubmits[] = {
    {Submit::kAuto, "auto"},
    {Submit::kInline, "inline"},
    {Submit::kAsync, "async"}};

absl::Status Invalid(const absl::Status& s) {
  return absl::InvalidArgumentError(
      absl::StrCat("storage node: ", s.message()));
}

// A hybrid or LRU device's capacity file.
absl::Status ValidateTier(const storage::CapacityTierOptions& tier) {
  if (tier.path.empty() || tier.capacity_bytes == 0 ||
      tier.capacity_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(
        "storage node: a hybrid device needs capacity_path and "
        "capacity_bytes (a positive multiple of 4096)");
  }
  storage::BlockIoOptions io = tier.io;  // Open fills in the file
  io.path = tier.path;
  io.size_bytes = tier.capacity_bytes + storage::CapacityTier::kHeaderBytes;
  absl::Status s = io.Validate();
  return s.ok() ? s : Invalid(s);
}

}  // namespace

const char* RdmaModeName(RdmaMode mode) { return NameOf(mode, kRdmaModes); }
absl::StatusOr<RdmaMode> ParseRdmaMode(absl::string_view name) {
  return ParseName("rdma", name, kRdmaModes);
}
const char* IoEngineName(Engine engine) { return NameOf(engine, kIoEngines); }
absl::StatusOr<Engine> ParseIoEngine(absl::string_view name) {
  return ParseName("io_engine", name, kIoEngines);
}
const char* IoSubmitName(Submit submit) { return NameOf(submit, kIoSubmits); }
absl::StatusOr<Submit> ParseIoSubmit(absl::string_view name) {
  return ParseName("io_submit", name, kIoSubmits);
}

absl::Status StorageNodeOptions::Validate() const {
  if (capability_skew < absl::ZeroDuration() ||
      capability_skew > absl::Hours(1)) {
    return absl::InvalidArgumentError(
        "storage node: capability_skew must be 0..1h");
  }
  if (master_address.empty() && etcd_endpoints.empty()) {
    return absl::InvalidArgumentError(
        "storage node: master_address (or etcd_endpoints) is required");
  }
  for (absl::string_view endpoint :
       absl::StrSplit(etcd_endpoints, ',', absl::SkipEmpty())) {
    absl::ConsumePrefix(&endpoint, "http://");
    if (absl::Status s = SplitHostPort(std::string(endpoint)).status();
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage node: etcd_endpoints: ", s.message()));
    }
  }
  if (!etcd_endpoints.empty() &&
      (cluster.empty() || cluster.find('/') != std::string::npos)) {
    return absl::InvalidArgumentError(
        "storage node: cluster must be a non-empty name without '/'");
  }
  for (absl::string_view address :
       absl::StrSplit(master_address, ',', absl::SkipEmpty())) {
    absl::Status s = SplitHostPort(std::string(address)).status();
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage node: master_address: ", s.message()));
    }
  }
  if (listen_host.empty()) {
    return absl::InvalidArgumentError("storage node: listen_host is empty");
  }
  // The master refuses a longer name at registration; say so at start-up.
  if (node_name.size() > kMaxNodeNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage node: node_name has ", node_name.size(),
                     " bytes (at most ", kMaxNodeNameBytes, ")"));
  }
  if (host.size() > kMaxHostBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage node: host has ", host.size(), " bytes (at most ",
                     kMaxHostBytes, ")"));
  }
  absl::Status s = DaemonOptions::Validate("storage node", listen_host);
  if (!s.ok()) return s;
  if (data.port < 0 || data.port > 65535 || control_port < 0 ||
      control_port > 65535) {
    return absl::InvalidArgumentError("storage node: ports must be in 0..65535");
  }
  if (data.port != 0 && data.port == control_port) {
    return absl::InvalidArgumentError(
        "storage node: data_port and control_port must differ");
  }
  if (const storage::DramDeviceOptions* d = dram()) {
    if (d->alignment != 0 && (d->alignment & (d->alignment - 1)) == 0 &&
        d->capacity_bytes < d->alignment) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage node: dram_bytes ", d->capacity_bytes,
                       " is below the alignment"));
    }
    s = d->Validate();
  } else if (const HybridDevice* h = hybrid()) {
    s = ValidateTier(h->tier);
    if (!s.ok()) return s;
    if (node_name.empty()) {
      return absl::InvalidArgumentError(
          "storage node: a hybrid device needs a stable node_name (its "
          "capacity file records which node owns it)");
    }
    s = h->device.Validate();
  } else {
    const LruDevice& l = *lru();
    s = ValidateTier(l.tier);
    if (!s.ok()) return s;
    if (l.device.alignment < 4096) {
      return absl::InvalidArgumentError(
          "storage node: a hybrid device needs alignment >= 4096");
    }
    storage::LruCacheDeviceOptions dev = l.device;  // the node sets these
    dev.capacity_bytes = l.tier.capacity_bytes;
    dev.data_offset = storage::CapacityTier::kHeaderBytes;
    s = dev.Validate();
  }
  if (!s.ok()) return Invalid(s);
  // The data server's and the KV manager's own settings (their Validate
  // also wants the parts the node builds at Create).
  if (data.send_buffer_bytes < 0) {
    return absl::InvalidArgumentError(
        "storage node: data_send_buffer_bytes must be >= 0");
  }
  if (data.max_connections < 1 || data.max_connections_per_peer < 1 ||
      data.worker_threads < 1 || data.max_requests_per_peer < 1) {
    return absl::InvalidArgumentError(
        "storage node: max_connections, max_connections_per_peer, "
        "data_worker_threads and max_requests_per_peer must be >= 1");
  }
  if (data.io_timeout <= absl::ZeroDuration() ||
      data.idle_timeout <= absl::ZeroDuration() ||
      drain_timeout < absl::ZeroDuration() ||
      rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "storage node: io_timeout, idle_timeout and rpc_timeout must be > 0, "
        "drain_timeout >= 0");
  }
  if (prefetch.window_bytes == 0 ||
      prefetch.session_timeout <= absl::ZeroDuration() ||
      prefetch.reap_interval <= absl::ZeroDuration() ||
      prefetch.max_sessions < 1 || prefetch.max_objects_per_session < 1) {
    return absl::InvalidArgumentError(
        "storage node: prefetch window_bytes, session_timeout, "
        "reap_interval, max_sessions and max_objects_per_session must be "
        "> 0");
  }
  if (!(prefetch.hint_share >= 0 && prefetch.hint_share <= 1) ||
      prefetch.max_hints < 1 ||
      prefetch.max_hint_hold <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "storage node: prefetch hint_share must be in [0, 1], max_hints >= 1 "
        "and max_hint_hold > 0");
  }
  if (rdma != RdmaMode::kOff && rdma != RdmaMode::kAuto &&
      rdma != RdmaMode::kOn) {
    return absl::InvalidArgumentError(
        "storage node: rdma must be off, auto or on");
  }
  return absl::OkStatus();
}

}  // namespace hymcache
