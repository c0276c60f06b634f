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

// Connects with TCP_NODELAY set, giving up at `deadline`.
absl::StatusOr<Socket> ConnectTcp(const std::string& host_port,
                                  absl::Time deadline);

// Applies the data-plane socket options (TCP_NODELAY, large buffers).
void TuneDataSocket(int fd);

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

}  // namespace hymcache
