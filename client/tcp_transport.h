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
  // Most payload bytes one Read request asks for (an op larger than this
  // goes alone; ReadSession is not split); a longer Read is several
  // exchanges in turn on the connection. Between them the node's
  // connection thread sleeps until the next request, and the reader's
  // wake-up places it beside the reader again. A thread that streams a
  // whole batch never sleeps: left on a core shared with other work it gets
  // half of that core while the reader's core idles (a GET of 16 x 16 MiB
  // lost up to 40% that way with one core busy).
  // 0: up to wire::kMaxOps ops per request. Default: 16 MiB.
  uint64_t max_read_frame_bytes = uint64_t{16} << 20;
};

std::unique_ptr<Transport> NewTcpTransport(const TcpTransportOptions& options);

}  // namespace hymcache
