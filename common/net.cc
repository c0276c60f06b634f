#include "common/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_reason.h"

namespace hymcache {
namespace {

absl::Status Errno(const char* what) {
  int e = errno;
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(e)));
}

// A failed connect's errno as a status; ECONNREFUSED carries the reason
// kConnectionRefused.
absl::Status ConnectErrno(const std::string& host_port) {
  const bool refused = errno == ECONNREFUSED;
  absl::Status s = Errno(absl::StrCat("connect ", host_port).c_str());
  return refused ? WithReason(std::move(s), StatusReason::kConnectionRefused)
                 : s;
}

// Milliseconds to wait in poll() for `deadline`, -1 for no deadline.
int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  int64_t ms = absl::ToInt64Milliseconds(left) + 1;
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// Waits until `fd` is ready for `events` or `deadline` passes.
absl::Status WaitFd(int fd, short events, absl::Time deadline) {
  while (true) {
    int timeout = PollTimeoutMs(deadline);
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, timeout);
    if (r > 0) return absl::OkStatus();
    if (r == 0) return absl::DeadlineExceededError("data plane: deadline exceeded");
    if (errno != EINTR) return Errno("poll");
  }
}

}  // namespace

void Socket::Close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(
    const std::string& host_port) {
  std::string host;
  std::string port;
  if (!host_port.empty() && host_port[0] == '[') {
    size_t close = host_port.find(']');
    if (close == std::string::npos || close + 1 >= host_port.size() ||
        host_port[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("bad address '", host_port, "' (want [v6]:port)"));
    }
    host = host_port.substr(1, close - 1);
    port = host_port.substr(close + 2);
  } else {
    size_t colon = host_port.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad address '", host_port, "' (want host:port)"));
    }
    host = host_port.substr(0, colon);
    port = host_port.substr(colon + 1);
  }
  int p = 0;
  if (host.empty() || !absl::SimpleAtoi(port, &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad address '", host_port, "' (want host:port)"));
  }
  return std::make_pair(host, p);
}

absl::StatusOr<Socket> ListenTcp(const std::string& host, int port,
                                 int backlog) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(),
                       &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no address to listen on");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    Socket s(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0));
    if (!s.valid()) {
      last = Errno("socket");
      continue;
    }
    int one = 1;
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = Errno(absl::StrCat("bind ", host, ":", port).c_str());
      continue;
    }
    if (listen(s.fd(), backlog) != 0) {
      last = Errno("listen");
      continue;
    }
    freeaddrinfo(res);
    return s;
  }
  freeaddrinfo(res);
  return last;
}

absl::StatusOr<int> LocalPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Errno("getsockname");
  }
  if (ss.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  }
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

void TuneDataSocket(int fd, int send_buffer_bytes) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (send_buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &send_buffer_bytes,
               sizeof(send_buffer_bytes));
  }
}

absl::StatusOr<Socket> ConnectTcp(const std::string& host_port,
                                  absl::Time deadline) {
  auto hp = SplitHostPort(host_port);
  if (!hp.ok()) return hp.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(hp->second);
  int rc = getaddrinfo(hp->first.c_str(), port_str.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot resolve '", hp->first, "': ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no address");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    Socket s(socket(ai->ai_family,
                    ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.valid()) {
      last = Errno("socket");
      continue;
    }
    int r = connect(s.fd(), ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno != EINPROGRESS) {
      last = ConnectErrno(host_port);
      continue;
    }
    if (r != 0) {
      absl::Status w = WaitFd(s.fd(), POLLOUT, deadline);
      if (!w.ok()) {
        last = w;
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        errno = err;
        last = ConnectErrno(host_port);
        continue;
      }
    }
    // Back to blocking mode; every call below uses MSG_DONTWAIT + poll.
    int flags = fcntl(s.fd(), F_GETFL, 0);
    fcntl(s.fd(), F_SETFL, flags & ~O_NONBLOCK);
    TuneDataSocket(s.fd());
    freeaddrinfo(res);
    return s;
  }
  freeaddrinfo(res);
  return last;
}

absl::Status SendAll(int fd, const void* buf, size_t len, absl::Time deadline) {
  iovec iov{const_cast<void*>(buf), len};
  return SendAllV(fd, &iov, 1, deadline);
}

absl::Status SendAllV(int fd, struct iovec* iov, int iovcnt,
                      absl::Time deadline) {
  while (iovcnt > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --iovcnt;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(std::min(iovcnt, 1024));
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        absl::Status w = WaitFd(fd, POLLOUT, deadline);
        if (!w.ok()) return w;
        continue;
      }
      return Errno("send");
    }
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0 && left > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* buf, size_t len, absl::Time deadline,
                     bool* got_any) {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  if (got_any != nullptr) *got_any = false;
  while (done < len) {
    ssize_t n = recv(fd, p + done, len - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      if (got_any != nullptr) *got_any = true;
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(done == 0 ? "connection closed by peer"
                                              : "connection closed mid-frame");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      absl::Status w = WaitFd(fd, POLLIN, deadline);
      if (!w.ok()) return w;
      continue;
    }
    return Errno("recv");
  }
  return absl::OkStatus();
}

absl::Status Discard(int fd, size_t len, absl::Time deadline) {
  std::vector<char> scratch(std::min<size_t>(len, 1 << 20));
  while (len > 0) {
    size_t chunk = std::min(len, scratch.size());
    absl::Status s = RecvAll(fd, scratch.data(), chunk, deadline);
    if (!s.ok()) return s;
    len -= chunk;
  }
  return absl::OkStatus();
}

std::string DefaultHostName() {
  if (const char* env = std::getenv("HYM_HOST"); env != nullptr && *env) {
    return env;
  }
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

std::string LocalHostIdentity() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "";
  std::string boot;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {0};
    if (std::fgets(buf, sizeof(buf), f) != nullptr) boot = buf;
    std::fclose(f);
  }
  while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) {
    boot.pop_back();
  }
  if (boot.empty()) return "";
  return std::string(host) + "/" + boot;
}

}  // namespace hymcache
