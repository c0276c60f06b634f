// TcpTransport: the Transport over the data-plane framing of common/wire.h.
// Keeps a small pool of idle connections per node. A request's payload is
// received straight into the caller's buffers and sent straight from them.
//
// Thread safety: safe for concurrent use; each call uses its own connection.
#pragma once

#include <cstdint>
#include <memory>

#include "client/transport.h"

namespace hymcache {

struct TcpTransportOptions {
  // Idle connections kept per peer. Default: 4.
  int max_idle_per_peer = 4;
};

std::unique_ptr<Transport> NewTcpTransport(const TcpTransportOptions& options);

}  // namespace hymcache
