// Small TCP helpers for the data plane: an owning socket, listen/connect, and
// send/receive-all with an absolute deadline. Errors are absl::Status:
// Unavailable for peer/socket failures, DeadlineExceeded when the deadline
// passes, InvalidArgument for bad addresses.
//
// Thread safety: a Socket is used by one thread at a time; the free functions
// are thread-safe.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hymcache {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { Close(); }
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      Close();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Close();

 private:
  int fd_ = -1;
};

// Splits "host:port" (IPv4, name, or "[v6]:port").
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(
    const std::string& host_port);

// Listens on host:port (port 0 picks a free port; read it with LocalPort).
absl::StatusOr<Socket> ListenTcp(const std::string& host, int port,
                                 int backlog = 128);
absl::StatusOr<int> LocalPort(int fd);

// Connects with TCP_NODELAY set, giving up at `deadline`. Errors:
// Unavailable; with reason kConnectionRefused (common/status_reason.h) when
// the host answered that nothing listens there.
absl::StatusOr<Socket> ConnectTcp(const std::string& host_port,
                                  absl::Time deadline);

// Send buffer a data-plane server gives each connection (see
// TuneDataSocket): 512 KiB, which the kernel doubles for its bookkeeping.
inline constexpr int kDataSendBufferBytes = 512 << 10;

// Applies the data-plane socket options: TCP_NODELAY and, when
// `send_buffer_bytes` > 0, a fixed send buffer of that size (SO_SNDBUF, which
// also stops the kernel autotuning it; capped by net.core.wmem_max).
//
// Why a bounded send buffer on the serving side: it bounds the bytes a
// sender has unacknowledged, and autotuning grows it to net.ipv4.tcp_wmem's
// maximum (4 MiB by default). When the sender and its reader share a core
// (another core busy, a loaded host), each switch between them then hands
// over megabytes that have left the core's cache. With the whole GET bench
// on one core (16 x 16 MiB over loopback, 1 MiB of L2 per core): 2.8 GB/s
// autotuned, 4.4 GB/s with 512 KiB. It is a cliff: a raw loopback stream
// beside a busy core moved 4.3 GB/s with 512 KiB, 2.7 GB/s with 640 KiB.
// 512 KiB still covers a data-centre link's bandwidth-delay product
// (100 Gb/s x 40 us = 500 KB); raise it (or 0) for longer paths.
void TuneDataSocket(int fd, int send_buffer_bytes = 0);

// Sends all `len` bytes (or all iovecs).
absl::Status SendAll(int fd, const void* buf, size_t len, absl::Time deadline);
absl::Status SendAllV(int fd, struct iovec* iov, int iovcnt,
                      absl::Time deadline);
// Receives exactly `len` bytes. A clean close by the peer before the first
// byte is Unavailable("connection closed"); `*got_any` (if given) tells
// whether any byte arrived.
absl::Status RecvAll(int fd, void* buf, size_t len, absl::Time deadline,
                     bool* got_any = nullptr);
// Receives and drops `len` bytes.
absl::Status Discard(int fd, size_t len, absl::Time deadline);

// Identifies this host's running kernel ("hostname/boot_id"): two processes
// with the same identity can share memory. Empty if it cannot be read.
std::string LocalHostIdentity();

// The machine this process runs on, as storage nodes and readers name it
// to the master (NodeInfo.host, BatchLookupRequest.reader_host): $HYM_HOST
// when set (a container's own hostname is not its machine's: a Kubernetes
// pod sets it from spec.nodeName), else the hostname; "" if neither.
std::string DefaultHostName();

}  // namespace hymcache
