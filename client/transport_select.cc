// Transport selection: which data plane ClientOptions::transport asks for.
#include <memory>
#include <utility>
#include <vector>

#include "client/direct_transport.h"
#include "client/rdma_mover.h"
#include "client/tcp_transport.h"
#include "client/transport_select.h"
#include "common/status_macros.h"

namespace hymcache {

absl::StatusOr<std::unique_ptr<Transport>> NewTransportFor(
    const ClientOptions& options) {
  TcpTransportOptions t;
  t.max_idle_per_peer = options.max_idle_connections_per_node;
  DirectTransportOptions d;
  d.max_idle_per_peer = options.max_idle_connections_per_node;
  std::vector<std::unique_ptr<Transport>> candidates;
  switch (options.transport) {
    case TransportKind::kTcp:
      return NewTcpTransport(t);
    case TransportKind::kShm:
      candidates.push_back(NewDirectTransport(NewShmMover(), d));
      return NewFirstReachableTransport(std::move(candidates));
    case TransportKind::kRdma: {
      ASSIGN_OR_RETURN(std::unique_ptr<DirectMover> rdma,
                       NewRdmaMover(options.rdma_device));
      candidates.push_back(NewDirectTransport(std::move(rdma), d));
      return NewFirstReachableTransport(std::move(candidates));
    }
    case TransportKind::kAuto: {
      candidates.push_back(NewDirectTransport(NewShmMover(), d));
      absl::StatusOr<std::unique_ptr<DirectMover>> rdma =
          NewRdmaMover(options.rdma_device);
      if (rdma.ok()) {
        candidates.push_back(NewDirectTransport(std::move(*rdma), d));
      }
      candidates.push_back(NewTcpTransport(t));
      return NewFirstReachableTransport(std::move(candidates));
    }
  }
  return absl::InvalidArgumentError("unknown transport kind");
}

}  // namespace hymcache
