// Tests only: the receiving end of systemd's notification protocol, as
// systemd itself creates it: a unix datagram socket (abstract namespace, so
// the path length of TEST_TMPDIR does not matter). A daemon started with
// NOTIFY_SOCKET=name() sends its READY=1 / STOPPING=1 / WATCHDOG=1 here.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace hymcache::testing {

class NotifySocket {
 public:
  NotifySocket() {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    // Autobind: binding only the family makes the kernel choose a name that
    // is unique in this network namespace. A name built from getpid() is
    // not: tests in separate PID namespaces (Bazel's linux-sandbox) share
    // the network namespace and the same small pids.
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(sa_family_t)) != 0) {
      return;
    }
    socklen_t len = sizeof(a);
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    const size_t path = len - offsetof(sockaddr_un, sun_path);
    if (path < 2 || a.sun_path[0] != '\0') return;
    // Abstract: a leading NUL, then the name (no terminator).
    abstract_.assign(a.sun_path + 1, path - 1);
    ok_ = true;
  }
  ~NotifySocket() {
    if (fd_ >= 0) close(fd_);
  }
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  bool ok() const { return ok_; }
  // The NOTIFY_SOCKET value ('@' marks the abstract namespace).
  std::string name() const { return "@" + abstract_; }

  // The next datagram, or "" after `timeout`.
  std::string Next(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const int left = static_cast<int>(
          absl::ToInt64Milliseconds(deadline - absl::Now()));
      if (left <= 0) return "";
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, left) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n > 0) {
        std::string m(buf, static_cast<size_t>(n));
        received_.push_back(m);
        return m;
      }
    }
  }
  // Reads until a datagram contains `text`; false after `timeout`.
  bool WaitFor(const std::string& text, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (absl::StrContains(Next(deadline - absl::Now()), text)) return true;
    }
    return false;
  }
  // Every datagram read so far, in order.
  const std::vector<std::string>& received() const { return received_; }

 private:
  std::string abstract_;
  int fd_ = -1;
  bool ok_ = false;
  std::vector<std::string> received_;
};

}  // namespace hymcache::testing
