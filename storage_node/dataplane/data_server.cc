#include "storage_node/dataplane/data_server.h"

#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace hymcache::storage {
namespace {

void SignalFd(int fd) {
  uint64_t one = 1;
  ssize_t n;
  do {
    n = ::write(fd, &one, sizeof(one));
  } while (n < 0 && errno == EINTR);
}

void DrainFd(int fd) {
  uint64_t v;
  ssize_t n;
  do {
    n = ::read(fd, &v, sizeof(v));
  } while (n < 0 && errno == EINTR);
}

}  // namespace


// A connection. While `idle` it is owned by the loop (in the epoll set,
// waiting for its next header); otherwise by the worker serving it or the
// queue it waits in.
struct DataServer::Conn {
  uint64_t id = 0;
  Socket sock;
  std::string peer;
  ConnState state;
  // The request header gathered so far, and when its first byte came.
  uint8_t hdr[wire::kHeaderBytes];
  size_t hdr_got = 0;
  absl::Time header_start;
  // Guarded by mu_.
  bool idle = true;
  bool timer_set = false;
  absl::Time timer;
};

namespace {
// epoll data of the server's own descriptors; connections count from
// kFirstConnId.
constexpr uint64_t kListenId = 1;
constexpr uint64_t kStopId = 2;
constexpr uint64_t kWakeId = 3;
constexpr uint64_t kFirstConnId = 16;
// Connections accepted per turn of the loop (then it serves the others).
constexpr int kAcceptBurst = 64;
// Requests a worker serves back to back on one connection before giving
// it back to the loop (others waiting go first).
constexpr int kMaxRequestsInARow = 16;
// Longest sleep of the loop (it then looks at its timers again).
constexpr absl::Duration kMaxLoopWait = absl::Seconds(1);

bool EpollAdd(int epoll_fd, int fd, uint64_t id, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  return epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0;
}

int TimeoutMs(absl::Time deadline, absl::Time now) {
  const absl::Duration left = std::max(deadline - now, absl::ZeroDuration());
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
      INT_MAX));
}

}  // namespace

std::string DataServer::PeerKeyOf(const struct sockaddr_storage& addr) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    if (inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf)) != nullptr) {
      return buf;
    }
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      if (inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], buf, sizeof(buf)) !=
          nullptr) {
        return buf;
      }
    } else if (inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf)) !=
               nullptr) {
      return buf;
    }
  }
  return "unknown";
}

absl::Status DataServerOptions::Validate() const {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("data server: port ", port, " outside 0..65535"));
  }
  if (send_buffer_bytes < 0) {
    return absl::InvalidArgumentError(
        "data server: send_buffer_bytes must be >= 0");
  }
  if (max_connections < 1) {
    return absl::InvalidArgumentError("data server: max_connections must be >= 1");
  }
  if (max_connections_per_peer < 1) {
    return absl::InvalidArgumentError(
        "data server: max_connections_per_peer must be >= 1");
  }
  if (worker_threads < 1) {
    return absl::InvalidArgumentError("data server: worker_threads must be >= 1");
  }
  if (max_requests_per_peer < 1) {
    return absl::InvalidArgumentError(
        "data server: max_requests_per_peer must be >= 1");
  }
  if (io_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("data server: io_timeout must be > 0");
  }
  if (idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("data server: idle_timeout must be > 0");
  }
  if (device == nullptr || extents == nullptr) {
    return absl::InvalidArgumentError(
        "data server: device and extents are required");
  }
  if (capabilities == nullptr) {
    return absl::InvalidArgumentError(
        "data server: a capability verifier is required");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DataServer>> DataServer::Create(
    const DataServerOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(Socket listen, ListenTcp(options.host, options.port));
  ASSIGN_OR_RETURN(int port, LocalPort(listen.fd()));
  // Non-blocking so that a connection that vanishes between epoll_wait and
  // accept cannot block the loop.
  int flags = fcntl(listen.fd(), F_GETFL, 0);
  if (flags < 0 || fcntl(listen.fd(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::InternalError(
        absl::StrCat("data server: fcntl: ", strerror(errno)));
  }
  int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  int stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd < 0 || stop_fd < 0 || wake_fd < 0 ||
      !EpollAdd(epoll_fd, listen.fd(), kListenId, EPOLLIN) ||
      !EpollAdd(epoll_fd, stop_fd, kStopId, EPOLLIN) ||
      !EpollAdd(epoll_fd, wake_fd, kWakeId, EPOLLIN)) {
    int e = errno;
    for (int fd : {epoll_fd, stop_fd, wake_fd}) {
      if (fd >= 0) close(fd);
    }
    return absl::InternalError(
        absl::StrCat("data server: epoll/eventfd: ", strerror(e)));
  }
  std::unique_ptr<DataServer> server(new DataServer(
      options, std::move(listen), port, epoll_fd, stop_fd, wake_fd));
  DataServer* s = server.get();
  ASSIGN_OR_RETURN(server->loop_, Thread::Start("dp-poll", [s] { s->Loop(); }));
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 &&
      nofile.rlim_cur != RLIM_INFINITY &&
      nofile.rlim_cur < static_cast<rlim_t>(options.max_connections) + 64) {
    LOG(WARNING) << "data server: max_connections " << options.max_connections
                 << " is near or above the descriptor limit ("
                 << nofile.rlim_cur << "); accept fails beyond it";
  }
  LOG(INFO) << "data server listening on " << options.host << ":" << port;
  return server;
}

DataServer::DataServer(const DataServerOptions& options, Socket listen,
                       int port, int epoll_fd, int stop_fd, int wake_fd)
    : options_(options),
      port_(port),
      epoll_fd_(epoll_fd),
      stop_fd_(stop_fd),
      wake_fd_(wake_fd),
      listen_(std::move(listen)) {
  FrameHandlerOptions h;
  h.device = options.device;
  h.extents = options.extents;
  h.kv = options.kv;
  h.capabilities = options.capabilities;
  h.counters = &counters_;
  absl::StatusOr<std::unique_ptr<FrameHandler>> handler =
      FrameHandler::Create(h);
  // Its options are a subset of ours, which Create validated.
  CHECK(handler.ok()) << handler.status();
  handler_ = std::move(*handler);
  MutexLock l(&mu_);
  next_conn_id_ = kFirstConnId;
}

DataServer::~DataServer() {
  Shutdown(absl::Seconds(10));
  close(epoll_fd_);
  close(stop_fd_);
  close(wake_fd_);
}

// ---------------------------------------------------------------- the loop

void DataServer::Loop() {
  std::vector<epoll_event> events(256);
  bool stop = false;
  while (!stop) {
    int timeout_ms;
    {
      MutexLock l(&mu_);
      // At most kMaxLoopWait, so that a later timer never needs a wake-up.
      const absl::Time now = absl::Now();
      loop_wait_until_ = now + kMaxLoopWait;
      if (!timers_.empty() && timers_.begin()->first < loop_wait_until_) {
        loop_wait_until_ = timers_.begin()->first;
      }
      timeout_ms = TimeoutMs(loop_wait_until_, now);
    }
    int n = epoll_wait(epoll_fd_, events.data(),
                       static_cast<int>(events.size()), timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "data server: epoll_wait: " << strerror(errno);
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kStopId) {
        stop = true;
      } else if (id == kWakeId) {
        DrainFd(wake_fd_);
      } else if (id == kListenId) {
        if (!stop) Accept();
      } else {
        Conn* c = nullptr;
        {
          MutexLock l(&mu_);
          auto it = conns_.find(id);
          if (it != conns_.end() && it->second->idle) c = it->second.get();
        }
        if (c != nullptr) ReadHeader(c);
      }
    }
    // Idle too long, or a header not completed within io_timeout.
    std::vector<Conn*> expired;
    {
      MutexLock l(&mu_);
      const absl::Time now = absl::Now();
      while (!timers_.empty() && timers_.begin()->first <= now) {
        auto it = conns_.find(timers_.begin()->second);
        timers_.erase(timers_.begin());
        if (it == conns_.end()) continue;
        it->second->timer_set = false;
        expired.push_back(it->second.get());
      }
    }
    for (Conn* c : expired) {
      if (c->hdr_got == 0) {
        // Frees the slot. A client that comes back finds the connection
        // closed and retries on a fresh one.
        Add(counters_.idle_closed_connections, 1);
        VLOG(1) << "data server: closing a connection idle for "
                << absl::FormatDuration(options_.idle_timeout);
      } else {
        Add(counters_.protocol_errors, 1);
        SendError(c->sock.fd(), 0,
                  absl::DeadlineExceededError(
                      "truncated frame header: deadline exceeded"));
      }
      CloseConn(c);
    }
  }
  // Stop accepting: new connections are refused by the kernel from here on.
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_.fd(), nullptr);
  listen_.Close();
  // Close the idle connections. Workers close theirs after their request
  // (shutdown_started_ is set).
  std::vector<Conn*> idle;
  {
    MutexLock l(&mu_);
    for (auto& [id, c] : conns_) {
      if (c->idle) idle.push_back(c.get());
    }
  }
  for (Conn* c : idle) CloseConn(c);
}

void DataServer::Accept() {
  for (int i = 0; i < kAcceptBurst; ++i) {
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof(addr);
    int fd = accept4(listen_.fd(), reinterpret_cast<sockaddr*>(&addr),
                     &addr_len, SOCK_CLOEXEC);
    if (fd < 0) {
      int e = errno;
      if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR || e == ECONNABORTED) {
        return;
      }
      LOG_EVERY_N(WARNING, 100) << "data server: accept: " << strerror(e);
      // Out of descriptors or memory: back off rather than spin.
      absl::SleepFor(absl::Milliseconds(50));
      return;
    }
    Socket sock(fd);
    TuneDataSocket(fd, options_.send_buffer_bytes);
    std::string peer = PeerKeyOf(addr);
    absl::Status refused;
    bool per_peer = false;
    size_t open = 0;
    {
      MutexLock l(&mu_);
      open = conns_.size();
      if (conns_.size() >= static_cast<size_t>(options_.max_connections)) {
        refused = absl::ResourceExhaustedError(absl::StrCat(
            "storage node: too many data-plane connections (limit ",
            options_.max_connections, ")"));
      } else if (peers_[peer].conns >= options_.max_connections_per_peer) {
        per_peer = true;
        refused = absl::ResourceExhaustedError(absl::StrCat(
            "storage node: too many data-plane connections from ", peer,
            " (limit ", options_.max_connections_per_peer, " per peer)"));
      } else {
        auto owned = std::make_unique<Conn>();
        Conn* c = owned.get();
        c->id = next_conn_id_++;
        c->sock = std::move(sock);
        c->peer = peer;
        c->state.peer = peer;
        if (EpollAdd(epoll_fd_, fd, c->id, EPOLLIN | EPOLLONESHOT)) {
          ++peers_[peer].conns;
          conns_.emplace(c->id, std::move(owned));
          SetTimerLocked(c, options_.idle_timeout == absl::InfiniteDuration()
                                ? absl::InfiniteFuture()
                                : absl::Now() + options_.idle_timeout);
          // Counted before it can be served: a client may read Stats once
          // answered.
          Add(counters_.accepted_connections, 1);
        } else {
          refused = absl::InternalError(absl::StrCat(
              "storage node: cannot watch the connection: ", strerror(errno)));
          sock = std::move(c->sock);
        }
      }
      auto p = peers_.find(peer);
      if (p != peers_.end() && p->second.conns == 0 &&
          p->second.requests == 0 && p->second.deferred.empty()) {
        peers_.erase(p);
      }
    }
    if (refused.ok()) continue;
    Add(counters_.refused_connections, 1);
    if (per_peer) Add(counters_.peer_refused_connections, 1);
    LOG_EVERY_N(WARNING, 100) << "data server: refusing a connection from "
                              << peer << ": " << refused.message() << " ("
                              << open << " open)";
    SendError(fd, 0, refused);
    // `sock` closes the connection.
  }
}

void DataServer::ReadHeader(Conn* c) {
  const int fd = c->sock.fd();
  ssize_t n;
  do {
    n = recv(fd, c->hdr + c->hdr_got, sizeof(c->hdr) - c->hdr_got,
             MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
    if (c->hdr_got > 0) {
      Add(counters_.protocol_errors, 1);
      SendError(fd, 0,
                absl::UnavailableError(
                    "truncated frame header: connection closed"));
    }
    CloseConn(c);  // a clean close by the peer when nothing came
    return;
  }
  if (n > 0) {
    if (c->hdr_got == 0) c->header_start = absl::Now();
    c->hdr_got += static_cast<size_t>(n);
  }
  if (c->hdr_got == sizeof(c->hdr)) {
    Dispatch(c);
    return;
  }
  MutexLock l(&mu_);
  if (c->hdr_got > 0) SetTimerLocked(c, c->header_start + options_.io_timeout);
  if (!Arm(c)) {
    // Cannot watch it any more: closed by the next timer turn.
    SetTimerLocked(c, absl::Now());
  }
}

void DataServer::SetTimerLocked(Conn* c, absl::Time when) {
  ClearTimerLocked(c);
  if (when == absl::InfiniteFuture()) return;
  timers_.emplace(when, c->id);
  c->timer = when;
  c->timer_set = true;
  // The loop sleeps until loop_wait_until_; wake it for an earlier timer.
  if (when < loop_wait_until_) {
    loop_wait_until_ = when;
    SignalFd(wake_fd_);
  }
}

void DataServer::ClearTimerLocked(Conn* c) {
  if (!c->timer_set) return;
  timers_.erase({c->timer, c->id});
  c->timer_set = false;
}

bool DataServer::Arm(Conn* c) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.u64 = c->id;
  return epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c->sock.fd(), &ev) == 0;
}

// ---------------------------------------------------------------- workers

void DataServer::Dispatch(Conn* c) {
  absl::Status no_worker;
  {
    MutexLock l(&mu_);
    c->idle = false;
    ClearTimerLocked(c);
    ++requests_;
    Peer& p = peers_[c->peer];
    if (p.requests >= options_.max_requests_per_peer) {
      // Served when one of the peer's requests finishes.
      p.deferred.push_back(c);
      Add(counters_.deferred_requests, 1);
      return;
    }
    ++p.requests;
    ready_.push_back(c);
    if (MaybeStartWorkerLocked()) {
      work_cv_.Signal();
      return;
    }
    // No worker at all: the request cannot be served.
    ready_.pop_back();
    --p.requests;
    --requests_;
    no_worker = absl::ResourceExhaustedError(
        "storage node: too many connections / cannot start a thread");
    done_cv_.SignalAll();
  }
  Add(counters_.refused_connections, 1);
  LOG_EVERY_N(WARNING, 100) << "data server: " << no_worker.message();
  SendError(c->sock.fd(), 0, no_worker);
  CloseConn(c);
}

bool DataServer::MaybeStartWorkerLocked() {
  if (ready_.size() <= static_cast<size_t>(idle_workers_) ||
      workers_.size() >= static_cast<size_t>(options_.worker_threads)) {
    return !workers_.empty();
  }
  absl::StatusOr<Thread> t =
      fail_thread_starts_for_test_.load(std::memory_order_relaxed)
          ? absl::ResourceExhaustedError("thread start refused for test")
          : Thread::Start("dp-work", [this] { Work(); });
  if (t.ok()) {
    workers_.push_back(std::move(*t));
  } else {
    // At the thread or pid limit: the workers there are serve the queue.
    Add(counters_.thread_start_failures, 1);
    LOG_EVERY_N(WARNING, 100) << "data server: cannot start a worker ("
                              << workers_.size() << " running): " << t.status();
  }
  return !workers_.empty();
}

void DataServer::Work() {
  mu_.Lock();
  while (true) {
    while (ready_.empty() && !workers_exit_) {
      ++idle_workers_;
      work_cv_.Wait(&mu_);
      --idle_workers_;
    }
    if (ready_.empty()) break;  // workers_exit_
    Conn* c = ready_.front();
    ready_.pop_front();
    mu_.Unlock();
    Serve(c);
    mu_.Lock();
  }
  mu_.Unlock();
}

void DataServer::Serve(Conn* c) {
  const int fd = c->sock.fd();
  bool keep = true;
  for (int served = 1;; ++served) {
    keep = HandleRequest(fd, c->hdr, c->header_start + options_.io_timeout,
                         &c->state);
    c->hdr_got = 0;
    if (!keep || served == kMaxRequestsInARow) break;
    {
      MutexLock l(&mu_);
      if (shutdown_started_) break;
    }
    // The next request may be here already: serve it without a turn
    // through the loop.
    ssize_t n;
    do {
      n = recv(fd, c->hdr, sizeof(c->hdr), MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      keep = false;  // closed by the peer, or broken
      break;
    }
    c->header_start = absl::Now();
    c->hdr_got = static_cast<size_t>(n);
    if (c->hdr_got < sizeof(c->hdr)) break;  // the loop gathers the rest
  }
  {
    MutexLock l(&mu_);
    FinishRequestLocked(c);
    if (keep && !shutdown_started_) {
      c->idle = true;
      SetTimerLocked(
          c, c->hdr_got > 0 ? c->header_start + options_.io_timeout
             : options_.idle_timeout == absl::InfiniteDuration()
                 ? absl::InfiniteFuture()
                 : absl::Now() + options_.idle_timeout);
      if (Arm(c)) return;  // the loop owns `c` from here
      c->idle = false;
      ClearTimerLocked(c);
    }
  }
  CloseConn(c);
}

void DataServer::FinishRequestLocked(Conn* c) {
  --requests_;
  Peer& p = peers_[c->peer];
  --p.requests;
  if (!p.deferred.empty()) {
    Conn* next = p.deferred.front();
    p.deferred.pop_front();
    ++p.requests;
    ready_.push_back(next);  // at least this worker is coming back
    work_cv_.Signal();
  }
  done_cv_.SignalAll();
}

void DataServer::CloseConn(Conn* c) {
  // Before the peer learns the connection is gone (a client must not touch
  // held memory after closing it anyway).
  handler_->EndConnection(&c->state);
  ::shutdown(c->sock.fd(), SHUT_RDWR);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->sock.fd(), nullptr);
  std::unique_ptr<Conn> owned;
  {
    MutexLock l(&mu_);
    ClearTimerLocked(c);
    auto it = conns_.find(c->id);
    CHECK(it != conns_.end()) << "data server: connection lost";
    owned = std::move(it->second);
    conns_.erase(it);
    auto p = peers_.find(c->peer);
    if (p != peers_.end() && --p->second.conns <= 0 &&
        p->second.requests == 0 && p->second.deferred.empty()) {
      peers_.erase(p);
    }
    done_cv_.SignalAll();
  }
  // `owned` closes the socket.
}

// ---------------------------------------------------------------- serving

bool DataServer::HandleRequest(int fd, const uint8_t* hdr, absl::Time deadline,
                               ConnState* cs) {
  Request req;
  const wire::FrameHeader& h = req.header;
  absl::Status s = handler_->ParseHeader(hdr, &req.header);
  if (!s.ok()) {
    VLOG(1) << "data server: bad header: " << s;
    SendError(fd, h.request_id, s);
    return false;
  }
  if (h.type == wire::FrameType::kPing) {
    return SendResponse(fd, handler_->Handle(cs, std::move(req), deadline),
                        deadline);
  }
  // DecodeHeader bounded op_count by kMaxOps.
  std::vector<uint8_t> table(FrameHandler::OpTableBytes(h));
  s = RecvAll(fd, table.data(), table.size(), deadline);
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    SendError(fd, h.request_id,
              absl::Status(s.code(),
                           absl::StrCat("truncated op table: ", s.message())));
    return false;
  }
  s = handler_->ParseOps(table, &req);
  if (!s.ok()) {
    SendError(fd, h.request_id, s);
    return false;
  }
  if (wire::CarriesCapabilities(h.type)) {
    table.resize(size_t{h.op_count} * wire::kCapBytes);
    s = RecvAll(fd, table.data(), table.size(), deadline);
    if (!s.ok()) {
      Add(counters_.protocol_errors, 1);
      SendError(fd, h.request_id,
                absl::Status(s.code(), absl::StrCat("bad capability table: ",
                                                    s.message())));
      return false;
    }
    s = handler_->ParseCapabilities(table, &req);
    if (!s.ok()) {
      SendError(fd, h.request_id, s);
      return false;
    }
  }
  switch (h.type) {
    case wire::FrameType::kRdmaConnectRequest:
      // An op its capability does not authorize gets its status set.
      handler_->Authorize(&req, deadline);
      return HandleRdmaConnect(fd, h, req.ops[0], deadline, cs);
    case wire::FrameType::kWriteRequest: {
      const uint64_t id = h.request_id;
      return HandleWrite(fd, id,
                         handler_->StartWrite(cs, std::move(req), deadline),
                         deadline);
    }
    case wire::FrameType::kReadRequest:
    case wire::FrameType::kPrefetchRequest:
    case wire::FrameType::kReleaseRequest:
    case wire::FrameType::kAcquireRequest:
      // The payload, if any, is a session id (DecodeHeader checked its
      // size).
      if (h.payload_bytes == wire::kSessionBytes) {
        uint8_t b[wire::kSessionBytes];
        s = RecvAll(fd, b, sizeof(b), deadline);
        if (!s.ok()) {
          Add(counters_.protocol_errors, 1);
          SendError(fd, h.request_id,
                    absl::Status(s.code(), absl::StrCat("truncated session id: ",
                                                        s.message())));
          return false;
        }
        req.session = wire::DecodeSession(b);
      }
      break;
    case wire::FrameType::kHintRequest: {
      uint8_t b[wire::kHintTimesBytes];
      s = RecvAll(fd, b, sizeof(b), deadline);
      if (!s.ok()) {
        Add(counters_.protocol_errors, 1);
        SendError(fd, h.request_id,
                  absl::Status(s.code(), absl::StrCat("truncated hint times: ",
                                                      s.message())));
        return false;
      }
      req.hint = wire::DecodeHintTimes(b);
      break;
    }
    default:
      break;
  }
  const bool read = h.type == wire::FrameType::kReadRequest;
  const absl::Time start = absl::Now();
  const bool ok =
      SendResponse(fd, handler_->Handle(cs, std::move(req), deadline), deadline);
  if (read) read_latency_.Observe(absl::Now() - start);
  return ok;
}

bool DataServer::SendResponse(int fd, Response response, absl::Time deadline) {
  // A copy of the gather list (SendAllV advances it), not of the bytes.
  std::vector<iovec> iov = response.iov();
  if (response.closes_connection()) {
    // Best effort: the connection is closed next either way.
    SendAllV(fd, iov.data(), static_cast<int>(iov.size()),
             std::min(deadline, absl::Now() + absl::Seconds(1)))
        .IgnoreError();
    return false;
  }
  absl::Status s =
      SendAllV(fd, iov.data(), static_cast<int>(iov.size()), deadline);
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    VLOG(1) << "data server: sending a response failed: " << s;
    return false;
  }
  return true;
  // `response` ends its holds (a read's objects) once sent.
}

bool DataServer::HandleRdmaConnect(int fd, const wire::FrameHeader& h,
                                   const wire::OpDesc& grant,
                                   absl::Time deadline, ConnState* cs) {
  // DecodeHeader bounded the payload by kMaxConnectBytes.
  std::string info(h.payload_bytes, '\0');
  absl::Status s = RecvAll(fd, info.data(), info.size(), deadline);
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    return false;
  }
  if (grant.status != 0) {
    // Nobody gets a queue pair (and with it one-sided access to the
    // registered memory) without a capability the master issued for an
    // object on this node.
    SendError(fd, h.request_id,
              absl::PermissionDeniedError(
                  "data plane: RDMA connect refused: its grant carries no "
                  "valid capability for an object on this node"));
    return false;
  }
  if (options_.rdma == nullptr) {
    SendError(fd, h.request_id,
              absl::UnimplementedError("storage node: RDMA is not enabled"));
    return false;
  }
  if (cs->rdma != nullptr) {
    SendError(fd, h.request_id,
              absl::FailedPreconditionError(
                  "data plane: this connection already has a queue pair"));
    return false;
  }
  auto accepted = options_.rdma->Accept(info);
  if (!accepted.ok()) {
    SendError(fd, h.request_id, accepted.status());
    return false;
  }
  cs->rdma = std::move(accepted->first);
  const std::string& mine = accepted->second;
  Add(counters_.rdma_connections, 1);
  wire::FrameHeader r;
  r.type = wire::FrameType::kRdmaConnectResponse;
  r.request_id = h.request_id;
  r.payload_bytes = mine.size();
  uint8_t hdr[wire::kHeaderBytes];
  wire::EncodeHeader(r, hdr);
  iovec iov[2] = {{hdr, sizeof(hdr)},
                  {const_cast<char*>(mine.data()), mine.size()}};
  s = SendAllV(fd, iov, 2, deadline);
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    return false;
  }
  return true;
}

bool DataServer::HandleWrite(int fd, uint64_t request_id, WriteStream w,
                             absl::Time deadline) {
  for (size_t i = 0; i < w.op_count(); ++i) {
    uint8_t* dest = w.Begin(i);
    // Refused: skip its bytes to stay in step with the stream.
    absl::Status r = dest == nullptr
                         ? Discard(fd, w.length(i), deadline)
                         : RecvAll(fd, dest, w.length(i), deadline);
    if (!r.ok()) {
      w.Abort();
      Add(counters_.protocol_errors, 1);
      SendError(fd, request_id,
                absl::Status(r.code(), absl::StrCat("truncated write payload: ",
                                                    r.message())));
      return false;
    }
    if (dest != nullptr) w.Commit(i);
  }
  return SendResponse(fd, w.Finish(), deadline);
}

void DataServer::SendError(int fd, uint64_t request_id,
                           const absl::Status& status) {
  absl::StatusCode code =
      status.ok() ? absl::StatusCode::kInternal : status.code();
  std::string msg(status.message().substr(0, wire::kMaxErrorBytes));
  uint8_t hdr[wire::kHeaderBytes];
  wire::FrameHeader h;
  h.type = wire::FrameType::kError;
  h.request_id = request_id;
  h.payload_bytes = msg.size();
  h.status = wire::ToWireCode(code);
  wire::EncodeHeader(h, hdr);
  iovec iov[2] = {{hdr, sizeof(hdr)}, {msg.data(), msg.size()}};
  // Best effort: the connection is closed next either way.
  SendAllV(fd, iov, 2, absl::Now() + absl::Seconds(1)).IgnoreError();
}

// ---------------------------------------------------------------- shutdown

void DataServer::Shutdown(absl::Duration drain_timeout) {
  {
    MutexLock l(&mu_);
    if (shutdown_started_) {
      while (!shutdown_done_) done_cv_.Wait(&mu_);
      return;
    }
    shutdown_started_ = true;
  }
  // Stops the loop, which closes the listening socket and every idle
  // connection; stays readable.
  SignalFd(stop_fd_);
  loop_.Join();

  const absl::Time deadline = absl::Now() + drain_timeout;
  std::vector<Thread> workers;
  {
    MutexLock l(&mu_);
    while (requests_ > 0) {
      if (done_cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    if (requests_ > 0) {
      LOG(WARNING) << "data server: " << requests_
                   << " requests still in progress after "
                   << absl::FormatDuration(drain_timeout)
                   << "; breaking their connections";
      for (auto& [id, c] : conns_) {
        if (!c->idle) ::shutdown(c->sock.fd(), SHUT_RDWR);
      }
    }
    // Workers finish what is queued (broken connections fail fast), then
    // exit.
    workers_exit_ = true;
    work_cv_.SignalAll();
    workers.swap(workers_);
  }
  for (Thread& w : workers) w.Join();
  workers.clear();
  std::vector<Conn*> left;  // none expected: each was closed by its owner
  {
    MutexLock l(&mu_);
    for (auto& [id, c] : conns_) left.push_back(c.get());
  }
  for (Conn* c : left) CloseConn(c);
  MutexLock l(&mu_);
  shutdown_done_ = true;
  done_cv_.SignalAll();
}

DataServerStats DataServer::Stats() const {
  DataServerStats s = counters_.Load();
  MutexLock l(&mu_);
  s.open_connections = conns_.size();
  s.worker_threads = workers_.size();
  s.requests_in_progress = static_cast<uint64_t>(requests_);
  return s;
}

void DataServer::VisitStats(StatsVisitor* v) const {
  Stats().Visit(v);
  v->Histogram("read_seconds",
               "TCP read requests: header received to reply sent",
               read_latency_.Snapshot());
}

}  // namespace hymcache::storage
