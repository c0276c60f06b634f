// Tests only: the receiving end of systemd's notification protocol, as
// systemd itself creates it: a unix datagram socket (abstract namespace, so
// the path length of TEST_TMPDIR does not matter). A daemon started with
// NOTIFY_SOCKET=name() sends its READY=1 / STOPPING=1 / WATCHDOG=1 here.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace hymcache::testing {

class NotifySocket {
 public:
  NotifySocket() {
    static std::atomic<int> counter{0};
    abstract_ = absl::StrCat("hymcache-notify-", getpid(), "-",
                             counter.fetch_add(1));
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    // Abstract: a leading NUL, then the name (no terminator).
    std::memcpy(a.sun_path + 1, abstract_.data(), abstract_.size());
    const socklen_t len = static_cast<socklen_t>(
        offsetof(sockaddr_un, sun_path) + 1 + abstract_.size());
    ok_ = fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&a), len) == 0;
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
