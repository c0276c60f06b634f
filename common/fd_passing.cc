#include "common/fd_passing.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace hymcache {
namespace {

constexpr size_t kMaxPayload = 64 << 10;
constexpr size_t kMaxFds = 64;

absl::StatusOr<sockaddr_un> Address(const std::string& name, socklen_t* len) {
  if (name.empty() || name.size() > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix socket name '", name, "': want 1..100 bytes"));
  }
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  a.sun_path[0] = '\0';  // abstract namespace
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

absl::Status WaitReadable(int fd, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("unix socket: deadline exceeded");
    }
    pollfd p{fd, POLLIN, 0};
    int ms = static_cast<int>(std::min<int64_t>(
        absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
        INT_MAX));
    int r = poll(&p, 1, ms);
    if (r > 0) return absl::OkStatus();
    if (r < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll: ", strerror(errno)));
    }
  }
}

}  // namespace

absl::StatusOr<Socket> ListenUnixAbstract(const std::string& name) {
  socklen_t len = 0;
  absl::StatusOr<sockaddr_un> a = Address(name, &len);
  if (!a.ok()) return a.status();
  Socket s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.fd() < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("socket: ", strerror(errno)));
  }
  if (bind(s.fd(), reinterpret_cast<sockaddr*>(&*a), len) != 0 ||
      listen(s.fd(), 64) != 0) {
    return absl::UnavailableError(
        absl::StrCat("unix socket @", name, ": ", strerror(errno)));
  }
  return s;
}

absl::StatusOr<Socket> ConnectUnixAbstract(const std::string& name,
                                           absl::Time deadline) {
  socklen_t len = 0;
  absl::StatusOr<sockaddr_un> a = Address(name, &len);
  if (!a.ok()) return a.status();
  Socket s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.fd() < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("socket: ", strerror(errno)));
  }
  // A local connect does not block for long; the deadline bounds the reply.
  (void)deadline;
  if (connect(s.fd(), reinterpret_cast<sockaddr*>(&*a), len) != 0) {
    return absl::UnavailableError(
        absl::StrCat("unix socket @", name, ": ", strerror(errno)));
  }
  return s;
}

absl::StatusOr<ucred> PeerCredentials(int fd) {
  ucred c{};
  socklen_t len = sizeof(c);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) {
    return absl::InternalError(absl::StrCat("SO_PEERCRED: ", strerror(errno)));
  }
  return c;
}

absl::StatusOr<std::vector<gid_t>> PeerGroups(int fd) {
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      return groups;
    }
    if (errno != ERANGE) break;
    groups.resize(len / sizeof(gid_t) + 1);  // len says how many it needs
  }
  return absl::InternalError(absl::StrCat("SO_PEERGROUPS: ", strerror(errno)));
}

absl::Status SendWithFds(int fd, const std::string& payload,
                         const std::vector<int>& fds) {
  if (payload.empty() || payload.size() > kMaxPayload || fds.size() > kMaxFds) {
    return absl::InvalidArgumentError("fd passing: bad payload or fd count");
  }
  iovec iov{const_cast<char*>(payload.data()), payload.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(fds.size(), 1)));
  if (!fds.empty()) {
    m.msg_control = control.data();
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = sendmsg(fd, &m, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(payload.size())) {
    return absl::UnavailableError(absl::StrCat("sendmsg: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status RecvWithFds(int fd, std::string* payload, std::vector<int>* fds,
                         absl::Time deadline) {
  absl::Status ready = WaitReadable(fd, deadline);
  if (!ready.ok()) return ready;
  std::string buf(kMaxPayload, '\0');
  iovec iov{buf.data(), buf.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFds));
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control.data();
  m.msg_controllen = control.size();
  ssize_t n;
  do {
    n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {
    return absl::UnavailableError(
        n == 0 ? "unix socket: peer closed" : absl::StrCat("recvmsg: ", strerror(errno)));
  }
  fds->clear();
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int* p = reinterpret_cast<const int*>(CMSG_DATA(c));
      fds->insert(fds->end(), p, p + count);
    }
  }
  if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    for (int f : *fds) close(f);
    fds->clear();
    return absl::DataLossError("unix socket: truncated message");
  }
  buf.resize(static_cast<size_t>(n));
  *payload = std::move(buf);
  return absl::OkStatus();
}

}  // namespace hymcache
