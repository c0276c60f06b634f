#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "client/device_memory_select.h"
#include "client/failover_master_client.h"
#include "client/grpc_master_client.h"
#include "client/transport_select.h"
#include "common/etcd_client.h"
#include "common/grpc_polling.h"
#include "common/leader_election.h"
#include "common/limits.h"
#include "common/net.h"
#include "common/security.h"
#include "common/status_macros.h"

namespace hymcache {
namespace {

// An etcd client and the observer of the masters' leader key: the leader
// source of a client given etcd_endpoints. The observer goes first.
struct EtcdLeader {
  std::unique_ptr<EtcdClient> etcd;
  std::unique_ptr<LeaderObserver> observer;
  ~EtcdLeader() { observer.reset(); }
};

// Reads who leads options.cluster (once, within default_deadline), then
// watches it; returns the address of the leader as last seen ("" while none
// leads), for FailoverMasterClientOptions::leader.
absl::StatusOr<std::function<std::string()>> FollowLeaderInEtcd(
    const ClientOptions& options) {
  auto holder = std::make_shared<EtcdLeader>();
  EtcdClientOptions eo;
  eo.endpoints = options.EtcdEndpoints();
  eo.call_timeout = options.default_deadline;
  eo.attempt_timeout = std::min(eo.attempt_timeout, options.default_deadline);
  ASSIGN_OR_RETURN(holder->etcd, EtcdClient::Create(eo));
  auto observer = LeaderObserver::Create(
      holder->etcd.get(), MasterLeaderKey(options.cluster), nullptr);
  if (!observer.ok()) {
    return absl::Status(
        observer.status().code(),
        absl::StrCat("reading the leader of cluster '", options.cluster,
                     "' from etcd (ClientOptions.etcd_endpoints): ",
                     observer.status().message()));
  }
  holder->observer = std::move(observer).value();
  return std::function<std::string()>([holder]() -> std::string {
    std::optional<LeaderInfo> l = holder->observer->current();
    return l.has_value() ? l->candidate : "";
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(
    const ClientOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  // Calls fail fast while the master is unreachable (the engine recomputes);
  // reconnect quickly once it is back instead of after gRPC's default
  // backoff of up to two minutes.
  // (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also uses it as the minimum
  // connect timeout, and 100 ms fails connects on a loaded machine.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  ChannelSecurity security;
  security.token = options.auth_token;
  security.tls.ca_file = options.tls_ca_file;
  security.tls.cert_file = options.tls_cert_file;
  security.tls.key_file = options.tls_key_file;
  security.tls.server_name = options.tls_server_name;
  // Before the first channel: gRPC may start with it.
  if (absl::Status s =
          ApplyGrpcPollStrategyChoice(options.grpc_poll_strategy, "poll");
      !s.ok()) {
    return absl::Status(
        s.code(),
        absl::StrCat("ClientOptions.grpc_poll_strategy: ", s.message()));
  }
  // One MasterClient per master address, each over master_connections
  // channels.
  const std::string reader_host =
      options.host.empty() ? DefaultHostName() : options.host;
  if (reader_host.size() > kMaxHostBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.host ($HYM_HOST) has ", reader_host.size(),
                     " bytes (at most ", kMaxHostBytes, ")"));
  }
  // Commits a leader with --replication=confirm answers are confirmed with
  // its standbys (docs/ha.md), over channels of the same security.
  ASSIGN_OR_RETURN(std::shared_ptr<StandbyConfirmer> confirmer,
                   StandbyConfirmer::Create(
                       {.dial = [security, args](const std::string& address) {
                         return CreateChannel(address, security, args);
                       }}));
  auto connect = [options, security, args, reader_host,
                  confirmer](const std::string& address)
      -> absl::StatusOr<std::unique_ptr<MasterClient>> {
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    for (int i = 0; i < options.master_connections; ++i) {
      // Distinct arguments: gRPC would otherwise share one connection.
      grpc::ChannelArguments channel_args = args;
      if (options.master_connections > 1) {
        channel_args.SetInt("hymcache.master_connection", i);
      }
      ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                       CreateChannel(address, security, channel_args));
      channels.push_back(std::move(channel));
    }
    return NewGrpcMasterClient(
        channels, {.lookup_pipeline_depth = options.lookup_pipeline_depth,
                   .reader_host = reader_host,
                   .confirmer = confirmer});
  };
  const std::vector<std::string> masters = options.MasterAddresses();
  std::unique_ptr<MasterClient> master;
  if (!options.EtcdEndpoints().empty()) {
    // The leader named in etcd (docs/ha.md), followed by a watch; the list
    // (if any) is tried first.
    ASSIGN_OR_RETURN(std::function<std::string()> leader,
                     FollowLeaderInEtcd(options));
    ASSIGN_OR_RETURN(
        master, FailoverMasterClient::Create({.addresses = masters,
                                              .connect = connect,
                                              .leader = std::move(leader)}));
  } else if (masters.size() == 1) {
    ASSIGN_OR_RETURN(master, connect(masters[0]));
  } else {
    // Several masters, one leading (docs/ha.md).
    ASSIGN_OR_RETURN(master, FailoverMasterClient::Create(
                                 {.addresses = masters, .connect = connect}));
  }
  // gRPC runs now, with its strategy: the processes this one starts
  // choose their own.
  RestoreGrpcPollStrategyEnvironment();
  ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport,
                   NewTransportFor(options));
  return NewClientImpl(
      options, std::move(master), std::move(transport), Clock::Real(),
      std::shared_ptr<DeviceMemory>(NewDeviceMemory()));
}

}  // namespace hymcache
