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

// Header + op table of a response, in one buffer.
std::vector<uint8_t> EncodeResponse(wire::FrameType type, uint64_t request_id,
                                    uint64_t payload_bytes,
                                    const std::vector<wire::OpDesc>& ops) {
  std::vector<uint8_t> buf(wire::kHeaderBytes + ops.size() * wire::kOpBytes);
  wire::FrameHeader h;
  h.type = type;
  h.op_count = static_cast<uint16_t>(ops.size());
  h.request_id = request_id;
  h.payload_bytes = payload_bytes;
  wire::EncodeHeader(h, buf.data());
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::EncodeOp(ops[i], buf.data() + wire::kHeaderBytes + i * wire::kOpBytes);
  }
  return buf;
}

storage::ExtentKey KeyOf(const wire::OpDesc& op) {
  return ExtentKey{op.region_id, op.addr, op.length, op.generation};
}

uint32_t WireStatus(const absl::Status& s) {
  return wire::ToWireCode(s.code());
}

struct KeyLess {
  bool operator()(const ExtentKey& a, const ExtentKey& b) const {
    return std::tie(a.region_id, a.addr, a.length, a.generation) <
           std::tie(b.region_id, b.addr, b.length, b.generation);
  }
};

}  // namespace

// A connection's direct-access state: objects held for one-sided reads,
// destinations reserved for one-sided writes, the RDMA queue pair. Lives as
// long as the connection; used by whoever owns the connection.
struct DataServer::ConnState {
  struct WriteHold {
    ExtentTable::WriteTicket ticket;
    WriteView view;
  };
  std::map<ExtentKey, KvManager::StagedRead, KeyLess> reads;
  std::map<ExtentKey, WriteHold, KeyLess> writes;
  // Session for acquires that name none (0 until first needed).
  uint64_t own_session = 0;
  // The RDMA queue pair, and the key of each hold's grant on it (every
  // hold of `reads` and `writes` has one while `rdma` is set).
  std::unique_ptr<RdmaConnection> rdma;
  std::map<ExtentKey, uint32_t, KeyLess> read_keys;
  std::map<ExtentKey, uint32_t, KeyLess> write_keys;
};

namespace {

// Whether `key` overlaps an entry of `held` (keyed by ExtentKey in KeyLess
// order). Walks back from the first entry past the key's end; entries are at
// most wire::kMaxObjectBytes long, so the walk stops that far before it.
template <typename Map>
bool OverlapsHeld(const Map& held, const ExtentKey& key) {
  const uint64_t end = key.addr + key.length;  // ValidateOps: no overflow
  auto it = held.lower_bound(ExtentKey{key.region_id, end, 0, 0});
  while (it != held.begin()) {
    --it;
    const ExtentKey& k = it->first;
    if (k.region_id != key.region_id) break;
    if (k.addr + k.length > key.addr) return true;  // k.addr < end
    if (k.addr + wire::kMaxObjectBytes <= key.addr) break;
  }
  return false;
}

// A write over what this connection itself holds (a write it began, an
// object it acquired) would wait for the connection's own hold to end, which
// cannot happen while the connection's one thread waits (it waited the
// extent table's drain timeout per op, far past io_timeout): refused at once.
template <typename Writes, typename Reads>
absl::Status CheckNotHeld(const Writes& writes, const Reads& reads,
                          const ExtentKey& key) {
  if (OverlapsHeld(writes, key) || OverlapsHeld(reads, key)) {
    return absl::FailedPreconditionError(
        "data plane: the write overlaps a write begun or an object acquired "
        "on this connection (commit or release it first)");
  }
  return absl::OkStatus();
}

// Ends the RDMA grants of `held` (keys of `grants`; `rdma` may be null: no
// queue pair, no grants) and forgets them.
void RevokeHolds(RdmaConnection* rdma,
                 std::map<ExtentKey, uint32_t, KeyLess>* grants,
                 absl::Span<const ExtentKey> held, absl::Time deadline) {
  if (rdma == nullptr || held.empty()) return;
  std::vector<uint32_t> keys;
  for (const ExtentKey& k : held) {
    auto it = grants->find(k);
    if (it == grants->end()) continue;
    keys.push_back(it->second);
    grants->erase(it);
  }
  rdma->Revoke(keys, deadline);
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
// Longest a request whose capabilities fail waits for a registration in
// flight (CapabilityVerifier::WaitForIdentityChange).
constexpr absl::Duration kIdentityChangeWait = absl::Seconds(2);
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
      areas_(options.device->Areas()),
      port_(port),
      epoll_fd_(epoll_fd),
      stop_fd_(stop_fd),
      wake_fd_(wake_fd),
      listen_(std::move(listen)) {
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
  EndConnState(&c->state);
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
  absl::StatusOr<wire::FrameHeader> h = wire::DecodeHeader(hdr);
  if (!h.ok()) {
    Add(counters_.protocol_errors, 1);
    VLOG(1) << "data server: bad header: " << h.status();
    SendError(fd, 0, h.status());
    return false;
  }
  switch (h->type) {
    case wire::FrameType::kPing: {
      std::vector<uint8_t> buf =
          EncodeResponse(wire::FrameType::kPong, h->request_id, 0, {});
      return SendAll(fd, buf.data(), buf.size(), deadline).ok();
    }
    case wire::FrameType::kReadRequest:
    case wire::FrameType::kWriteRequest:
    case wire::FrameType::kPrefetchRequest:
    case wire::FrameType::kReleaseRequest:
    case wire::FrameType::kAcquireRequest:
    case wire::FrameType::kWriteBeginRequest:
    case wire::FrameType::kWriteCommitRequest:
    case wire::FrameType::kRdmaConnectRequest:
      break;
    default:
      Add(counters_.protocol_errors, 1);
      SendError(fd, h->request_id,
                absl::InvalidArgumentError(absl::StrCat(
                    "data plane: a storage node does not accept frame type ",
                    static_cast<int>(h->type))));
      return false;
  }

  // DecodeHeader bounded op_count by kMaxOps.
  std::vector<uint8_t> table(size_t{h->op_count} * wire::kOpBytes);
  absl::Status s = RecvAll(fd, table.data(), table.size(), deadline);
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    SendError(fd, h->request_id,
              absl::Status(s.code(),
                           absl::StrCat("truncated op table: ", s.message())));
    return false;
  }
  std::vector<wire::OpDesc> ops(h->op_count);
  for (size_t i = 0; i < ops.size(); ++i) {
    ops[i] = wire::DecodeOp(table.data() + i * wire::kOpBytes);
  }
  s = wire::ValidateOps(*h, ops);
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    SendError(fd, h->request_id, s);
    return false;
  }
  if (h->type == wire::FrameType::kWriteCommitRequest) {
    // The status field says commit (0) or abort.
    return HandleWriteCommit(fd, *h, ops, deadline, cs);
  }
  for (wire::OpDesc& op : ops) op.status = 0;
  if (wire::CarriesCapabilities(h->type)) {
    // The capability table; an op it does not authorize is answered
    // PermissionDenied and otherwise skipped by the handlers below (its
    // status is set before they run).
    table.resize(size_t{h->op_count} * wire::kCapBytes);
    s = RecvAll(fd, table.data(), table.size(), deadline);
    for (size_t i = 0; s.ok() && i < ops.size(); ++i) {
      absl::StatusOr<wire::Capability> c =
          wire::DecodeCapability(table.data() + i * wire::kCapBytes);
      if (c.ok()) {
        ops[i].cap = *c;
      } else {
        s = c.status();
      }
    }
    if (!s.ok()) {
      Add(counters_.protocol_errors, 1);
      SendError(fd, h->request_id,
                absl::Status(s.code(), absl::StrCat("bad capability table: ",
                                                    s.message())));
      return false;
    }
    if (!skip_capability_checks_for_test_.load(std::memory_order_relaxed)) {
      uint8_t rights = h->type == wire::FrameType::kWriteRequest ||
                               h->type == wire::FrameType::kWriteBeginRequest
                           ? wire::kCapWrite
                           : wire::kCapRead;
      CapabilityVerifier::Snapshot id = options_.capabilities->Current();
      const int64_t now_ms = absl::ToUnixMillis(absl::Now());
      auto check = [&](wire::OpDesc& op) {
        // A queue pair may be granted by a read or a write capability.
        if (h->type == wire::FrameType::kRdmaConnectRequest) {
          rights = op.cap.rights == wire::kCapWrite ? wire::kCapWrite
                                                    : wire::kCapRead;
        }
        return id.Check(op, rights, now_ms);
      };
      std::vector<bool> failed(ops.size());
      bool denied = false;
      for (size_t i = 0; i < ops.size(); ++i) {
        failed[i] = !check(ops[i]).ok();
        denied = denied || failed[i];
      }
      // A registration in flight: the master may already grant under the
      // identity it sets. Wait for it (bounded) and check the refused ops
      // once more.
      if (denied &&
          options_.capabilities->WaitForIdentityChange(
              id, std::min(deadline, absl::Now() + kIdentityChangeWait))) {
        id = options_.capabilities->Current();
      }
      for (size_t i = 0; denied && i < ops.size(); ++i) {
        if (!failed[i]) continue;
        wire::OpDesc& op = ops[i];
        absl::Status c = check(op);
        if (c.ok()) continue;
        op.status = WireStatus(c);
        Add(counters_.denied_ops, 1);
        Add(counters_.rejected_ops, 1);
        VLOG(1) << "data server: op refused: " << c;
      }
    }
  }
  if (h->type == wire::FrameType::kRdmaConnectRequest) {
    return HandleRdmaConnect(fd, *h, ops[0], deadline, cs);
  }
  if (h->type == wire::FrameType::kWriteRequest) {
    return HandleWrite(fd, *h, ops, deadline, cs);
  }
  if (h->type == wire::FrameType::kWriteBeginRequest) {
    return HandleWriteBegin(fd, *h, ops, deadline, cs);
  }
  // Reads, prefetches and releases: the payload, if any, is a session id
  // (DecodeHeader checked its size).
  uint64_t session = 0;
  if (h->payload_bytes == wire::kSessionBytes) {
    uint8_t b[wire::kSessionBytes];
    s = RecvAll(fd, b, sizeof(b), deadline);
    if (!s.ok()) {
      Add(counters_.protocol_errors, 1);
      SendError(fd, h->request_id,
                absl::Status(s.code(), absl::StrCat("truncated session id: ",
                                                    s.message())));
      return false;
    }
    session = wire::DecodeSession(b);
  }
  if (h->type == wire::FrameType::kReadRequest) {
    const absl::Time start = absl::Now();
    const bool ok = HandleRead(fd, *h, ops, session, deadline);
    read_latency_.Observe(absl::Now() - start);
    return ok;
  }
  if (h->type == wire::FrameType::kAcquireRequest) {
    return HandleAcquire(fd, *h, ops, session, deadline, cs);
  }
  return HandleSession(fd, *h, ops, session, deadline, cs);
}

bool DataServer::HandleSession(int fd, const wire::FrameHeader& h,
                               std::vector<wire::OpDesc>& ops,
                               uint64_t session, absl::Time deadline,
                               ConnState* cs) {
  const bool prefetch = h.type == wire::FrameType::kPrefetchRequest;
  std::vector<absl::Status> st(ops.size());
  // A release ends this connection's holds first (direct reads); the rest
  // are dropped from the session's prefetch queue.
  std::vector<ExtentKey> keys;
  std::vector<size_t> index;
  std::vector<ExtentKey> held;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].status != 0) {  // refused (capability)
      st[i] = absl::Status(wire::FromWireCode(ops[i].status), "refused");
      continue;
    }
    const ExtentKey k = KeyOf(ops[i]);
    if (!prefetch && cs->reads.count(k) != 0 &&
        std::find_if(held.begin(), held.end(), [&](const ExtentKey& h) {
          return !KeyLess()(h, k) && !KeyLess()(k, h);
        }) == held.end()) {
      held.push_back(k);  // a repeated op goes on: NotFound, as before
      continue;
    }
    keys.push_back(k);
    index.push_back(i);
  }
  // The peer's access to the held objects ends before the holds do (then
  // their space may be reused).
  RevokeHolds(cs->rdma.get(), &cs->read_keys, held, deadline);
  for (const ExtentKey& k : held) cs->reads.erase(k);  // releases the object
  if (!keys.empty() || (!prefetch && ops.empty())) {
    std::vector<absl::Status> r;
    if (options_.kv == nullptr) {
      r.assign(keys.size(), absl::UnimplementedError(
                                "storage node: no prefetch manager"));
    } else if (prefetch) {
      r = options_.kv->Prefetch(session, keys);
    } else {
      r = options_.kv->Release(session, keys);
    }
    for (size_t k = 0; k < keys.size(); ++k) st[index[k]] = r[k];
  }
  for (size_t i = 0; i < ops.size(); ++i) ops[i].status = WireStatus(st[i]);
  std::vector<uint8_t> buf = EncodeResponse(
      prefetch ? wire::FrameType::kPrefetchResponse
               : wire::FrameType::kReleaseResponse,
      h.request_id, 0, ops);
  absl::Status s = SendAll(fd, buf.data(), buf.size(), deadline);
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    return false;
  }
  return true;
}

namespace {

// Sends a response frame whose payload is one AreaRef per op.
absl::Status SendWithAreaRefs(int fd, wire::FrameType type, uint64_t id,
                              const std::vector<wire::OpDesc>& ops,
                              const std::vector<wire::AreaRef>& refs,
                              absl::Time deadline) {
  std::vector<uint8_t> buf =
      EncodeResponse(type, id, ops.size() * wire::kAreaRefBytes, ops);
  const size_t head = buf.size();
  buf.resize(head + ops.size() * wire::kAreaRefBytes);
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::EncodeAreaRef(refs[i], buf.data() + head + i * wire::kAreaRefBytes);
  }
  return SendAll(fd, buf.data(), buf.size(), deadline);
}

}  // namespace

bool DataServer::HandleAcquire(int fd, const wire::FrameHeader& h,
                               std::vector<wire::OpDesc>& ops,
                               uint64_t session, absl::Time deadline,
                               ConnState* cs) {
  std::vector<wire::AreaRef> refs(ops.size());
  if (options_.kv == nullptr || areas_.empty()) {
    for (auto& op : ops) {
      if (op.status != 0) continue;
      op.status = WireStatus(absl::UnimplementedError(
          "storage node: no direct access to this device's memory"));
    }
  } else {
    if (session == 0) {
      if (cs->own_session == 0) {
        // Distinct from clients' random ids in practice; only this
        // connection uses it.
        cs->own_session = (uint64_t{1} << 63) |
                          next_conn_session_.fetch_add(1, std::memory_order_relaxed);
      }
      session = cs->own_session;
    }
    bool holding = false;
    // RDMA: the objects newly held, whose ranges this queue pair's peer is
    // granted once the loop is done (one batch of window binds).
    std::vector<RdmaConnection::Range> grant;
    std::vector<size_t> granted;
    for (size_t i = 0; i < ops.size(); ++i) {
      wire::OpDesc& op = ops[i];
      if (op.status != 0) continue;  // refused (capability)
      const ExtentKey key = KeyOf(op);
      auto held = cs->reads.find(key);
      if (held != cs->reads.end()) {
        // Acquired again on this connection: the same hold.
        auto loc = LocateInAreas(areas_, held->second.data(), op.length);
        refs[i].area = loc->first;
        refs[i].offset = loc->second;
        if (auto k = cs->read_keys.find(key); k != cs->read_keys.end()) {
          refs[i].rkey = k->second;
        }
        holding = true;
        continue;
      }
      // Staged through the session: queued now unless the load hinted it
      // (a repeated hint costs nothing). Only a request holding nothing may
      // wait, as for session reads.
      absl::Status hint = options_.kv->Prefetch(session, {key})[0];
      if (!hint.ok()) {
        op.status = WireStatus(hint);
        if (hint.code() == absl::StatusCode::kNotFound) {
          Add(counters_.stale_reads, 1);
        } else {
          Add(counters_.rejected_ops, 1);
        }
        continue;
      }
      absl::StatusOr<KvManager::StagedRead> r =
          holding ? options_.kv->AcquireReadIfStaged(session, key)
                  : options_.kv->AcquireRead(session, key, deadline);
      if (holding && r.status().code() == absl::StatusCode::kUnavailable) {
        for (size_t k = i; k < ops.size(); ++k) {
          ops[k].status = WireStatus(absl::AbortedError("not staged yet"));
        }
        break;
      }
      if (!r.ok()) {
        op.status = WireStatus(r.status());
        Add(counters_.rejected_ops, 1);
        continue;
      }
      auto loc = LocateInAreas(areas_, r->data(), op.length);
      if (!loc.ok()) {
        op.status = WireStatus(absl::InternalError(
            "storage node: staged copy outside the exposed memory"));
        Add(counters_.rejected_ops, 1);
        continue;  // `r` releases
      }
      refs[i].area = loc->first;
      refs[i].offset = loc->second;
      if (cs->rdma != nullptr) {
        grant.push_back({r->data(), op.length, /*write=*/false});
        granted.push_back(i);
      }
      cs->reads.emplace(key, std::move(*r));
      holding = true;
      Add(counters_.direct_acquired_ops, 1);
      Add(cs->rdma != nullptr ? counters_.rdma_bytes_read
                                 : counters_.shm_bytes_read,
          op.length);
    }
    if (!grant.empty()) {
      std::vector<absl::StatusOr<uint32_t>> keys =
          cs->rdma->Grant(grant, deadline);
      for (size_t k = 0; k < granted.size(); ++k) {
        wire::OpDesc& op = ops[granted[k]];
        if (keys[k].ok()) {
          refs[granted[k]].rkey = *keys[k];
          cs->read_keys[KeyOf(op)] = *keys[k];
          continue;
        }
        // Not reachable: not held either.
        op.status = WireStatus(keys[k].status());
        refs[granted[k]] = {};
        cs->reads.erase(KeyOf(op));
        Add(counters_.rejected_ops, 1);
      }
    }
  }
  absl::Status s = SendWithAreaRefs(fd, wire::FrameType::kAcquireResponse,
                                    h.request_id, ops, refs, deadline);
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    return false;
  }
  return true;
}

bool DataServer::HandleWriteBegin(int fd, const wire::FrameHeader& h,
                                  std::vector<wire::OpDesc>& ops,
                                  absl::Time deadline, ConnState* cs) {
  MemoryDevice* device = options_.device;
  std::vector<wire::AreaRef> refs(ops.size());
  std::vector<RdmaConnection::Range> grant;
  std::vector<size_t> granted;
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::OpDesc& op = ops[i];
    if (op.status != 0) continue;  // refused (capability)
    const ExtentKey key = KeyOf(op);
    absl::Status st;
    if (areas_.empty()) {
      st = absl::UnimplementedError(
          "storage node: no direct access to this device's memory");
    } else if (cs->writes.count(key) != 0) {
      st = absl::AlreadyExistsError("write already begun on this connection");
    } else {
      st = CheckNotHeld(cs->writes, cs->reads, key);
    }
    absl::StatusOr<ExtentTable::WriteTicket> ticket =
        st.ok() ? options_.extents->BeginWrite(key, deadline)
                : absl::StatusOr<ExtentTable::WriteTicket>(st);
    WriteView view;
    if (ticket.ok()) {
      absl::StatusOr<WriteView> v =
          device->BeginWrite(op.region_id, op.addr, op.length, op.generation);
      if (v.ok()) {
        auto loc = LocateInAreas(areas_, v->data, op.length);
        if (loc.ok()) {
          view = *v;
          refs[i].area = loc->first;
          refs[i].offset = loc->second;
        } else {
          device->AbortWrite(*v);
          st = absl::UnimplementedError(
              "storage node: write destination outside the exposed memory");
        }
      } else {
        st = v.status();
      }
    } else {
      st = ticket.status();
    }
    if (!st.ok()) {
      op.status = WireStatus(st);
      Add(counters_.rejected_ops, 1);
      continue;  // `ticket` aborts
    }
    if (cs->rdma != nullptr) {
      grant.push_back({view.data, op.length, /*write=*/true});
      granted.push_back(i);
    }
    cs->writes.emplace(key, ConnState::WriteHold{std::move(*ticket), view});
  }
  if (!grant.empty()) {
    // Each reserved destination is opened, for writing only, to this queue
    // pair's peer; one that cannot be is aborted.
    std::vector<absl::StatusOr<uint32_t>> keys =
        cs->rdma->Grant(grant, deadline);
    for (size_t k = 0; k < granted.size(); ++k) {
      wire::OpDesc& op = ops[granted[k]];
      if (keys[k].ok()) {
        refs[granted[k]].rkey = *keys[k];
        cs->write_keys[KeyOf(op)] = *keys[k];
        continue;
      }
      auto it = cs->writes.find(KeyOf(op));
      device->AbortWrite(it->second.view);
      it->second.ticket.Abort();
      cs->writes.erase(it);
      op.status = WireStatus(keys[k].status());
      refs[granted[k]] = {};
      Add(counters_.rejected_ops, 1);
    }
  }
  absl::Status s = SendWithAreaRefs(fd, wire::FrameType::kWriteBeginResponse,
                                    h.request_id, ops, refs, deadline);
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    return false;
  }
  return true;
}

bool DataServer::HandleWriteCommit(int fd, const wire::FrameHeader& h,
                                   std::vector<wire::OpDesc>& ops,
                                   absl::Time deadline, ConnState* cs) {
  MemoryDevice* device = options_.device;
  {
    // The peer's write access ends before the bytes are committed (or the
    // space given back): nothing changes a committed object.
    std::vector<ExtentKey> held;
    for (const wire::OpDesc& op : ops) held.push_back(KeyOf(op));
    RevokeHolds(cs->rdma.get(), &cs->write_keys, held, deadline);
  }
  for (wire::OpDesc& op : ops) {
    const bool commit = op.status == 0;
    auto it = cs->writes.find(KeyOf(op));
    if (it == cs->writes.end()) {
      op.status = WireStatus(
          absl::NotFoundError("no write begun for this allocation"));
      continue;
    }
    ConnState::WriteHold hold = std::move(it->second);
    cs->writes.erase(it);
    absl::Status st;
    if (!commit) {
      device->AbortWrite(hold.view);
      hold.ticket.Abort();
      st = absl::CancelledError("write aborted by the client");
    } else {
      st = device->CommitWrite(hold.view);
      if (st.ok()) {
        st = hold.ticket.Commit();
      } else {
        hold.ticket.Abort();
      }
    }
    op.status = WireStatus(st);
    if (st.ok()) {
      Add(counters_.direct_write_ops, 1);
      Add(counters_.write_ops, 1);
      Add(counters_.bytes_written, op.length);
      Add(cs->rdma != nullptr ? counters_.rdma_bytes_written
                                 : counters_.shm_bytes_written,
          op.length);
    } else if (commit) {
      Add(counters_.rejected_ops, 1);
    }
  }
  std::vector<uint8_t> buf = EncodeResponse(
      wire::FrameType::kWriteCommitResponse, h.request_id, 0, ops);
  absl::Status s = SendAll(fd, buf.data(), buf.size(), deadline);
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    return false;
  }
  return true;
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

void DataServer::EndConnState(ConnState* cs) {
  // The queue pair's grants end (and the queue pair with them) before the
  // holds do.
  cs->rdma.reset();
  cs->read_keys.clear();
  cs->write_keys.clear();
  for (auto& [key, hold] : cs->writes) {
    options_.device->AbortWrite(hold.view);
    hold.ticket.Abort();
  }
  cs->writes.clear();
  cs->reads.clear();  // releases the held objects
  if (cs->own_session != 0 && options_.kv != nullptr) {
    options_.kv->Release(cs->own_session, {});
  }
}

bool DataServer::HandleRead(int fd, const wire::FrameHeader& h,
                            std::vector<wire::OpDesc>& ops, uint64_t session,
                            absl::Time deadline) {
  MemoryDevice* device = options_.device;
  std::vector<ExtentTable::ReadPin> pins(ops.size());
  std::vector<ReadView> views(ops.size());
  std::vector<KvManager::StagedRead> staged(ops.size());
  uint64_t payload = 0;
  uint64_t ok_ops = 0;
  uint64_t staged_ops = 0;
  bool holding = false;  // a staged object of this request is held
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::OpDesc& op = ops[i];
    if (op.status != 0) continue;  // refused (capability)
    if (session != 0 && options_.kv != nullptr) {
      // Prefetched by the session: its staged copy. Only a request holding
      // no staged object waits for one; otherwise the rest of the request
      // is answered ABORTED (asked again), so that requests holding part of
      // the window never wait for each other. Anything not prefetched (not
      // hinted, dropped as stale) is read the ordinary way below.
      absl::StatusOr<KvManager::StagedRead> r =
          holding ? options_.kv->AcquireReadIfStaged(session, KeyOf(op))
                  : options_.kv->AcquireRead(session, KeyOf(op), deadline);
      if (holding && r.status().code() == absl::StatusCode::kUnavailable) {
        for (size_t k = i; k < ops.size(); ++k) {
          ops[k].status = WireStatus(absl::AbortedError("not staged yet"));
        }
        break;
      }
      if (r.ok()) {
        holding = true;
        staged[i] = std::move(*r);
        payload += op.length;
        ++ok_ops;
        ++staged_ops;
        continue;
      }
      if (r.status().code() != absl::StatusCode::kNotFound) {
        op.status = WireStatus(r.status());
        Add(counters_.rejected_ops, 1);
        if (r.status().code() == absl::StatusCode::kDataLoss) {
          options_.extents->Drop(KeyOf(op));  // as below
        }
        continue;
      }
    }
    absl::StatusOr<ExtentTable::ReadPin> pin =
        options_.extents->PinRead(KeyOf(op));
    if (!pin.ok()) {
      op.status = WireStatus(pin.status());
      if (pin.status().code() == absl::StatusCode::kNotFound) {
        Add(counters_.stale_reads, 1);
      } else {
        Add(counters_.rejected_ops, 1);
      }
      continue;
    }
    absl::StatusOr<ReadView> view =
        device->AcquireRead(op.region_id, op.addr, op.length);
    if (!view.ok()) {
      op.status = WireStatus(view.status());
      Add(counters_.rejected_ops, 1);
      // The object's bytes are gone for good (a checksum mismatch): forget
      // it, so the master's next reconciliation drops its listing (the
      // reader reports it at once).
      if (view.status().code() == absl::StatusCode::kDataLoss) {
        options_.extents->Drop(KeyOf(op));
      }
      continue;  // `pin` releases
    }
    pins[i] = std::move(*pin);
    views[i] = *view;
    payload += op.length;
    ++ok_ops;
  }

  std::vector<uint8_t> head =
      EncodeResponse(wire::FrameType::kReadResponse, h.request_id, payload, ops);
  std::vector<iovec> iov;
  iov.reserve(ops.size() + 1);
  iov.push_back({head.data(), head.size()});
  for (size_t i = 0; i < ops.size(); ++i) {
    if (staged[i].valid()) {
      iov.push_back({const_cast<uint8_t*>(staged[i].data()),
                     static_cast<size_t>(staged[i].length())});
      continue;
    }
    if (views[i].data == nullptr) continue;
    iov.push_back({const_cast<uint8_t*>(views[i].data),
                   static_cast<size_t>(views[i].length)});
  }
  // Counted before sending so that a client that has its answer sees them.
  Add(counters_.read_ops, ok_ops);
  Add(counters_.staged_read_ops, staged_ops);
  Add(counters_.bytes_read, payload);
  absl::Status s =
      SendAllV(fd, iov.data(), static_cast<int>(iov.size()), deadline);
  // Device views end before the extent pins that protect them.
  for (ReadView& v : views) {
    if (v.data != nullptr) device->ReleaseRead(v);
  }
  pins.clear();
  // Read: released on the node, and the sessions stage their next objects.
  staged.clear();
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    VLOG(1) << "data server: sending a read response failed: " << s;
    return false;
  }
  return true;
}

bool DataServer::HandleWrite(int fd, const wire::FrameHeader& h,
                             std::vector<wire::OpDesc>& ops,
                             absl::Time deadline, ConnState* cs) {
  MemoryDevice* device = options_.device;
  for (wire::OpDesc& op : ops) {
    absl::Status held = op.status != 0
                            ? absl::Status(wire::FromWireCode(op.status),
                                           "refused (capability)")
                            : CheckNotHeld(cs->writes, cs->reads, KeyOf(op));
    absl::StatusOr<ExtentTable::WriteTicket> ticket =
        held.ok() ? options_.extents->BeginWrite(KeyOf(op), deadline)
                  : absl::StatusOr<ExtentTable::WriteTicket>(held);
    absl::Status st = ticket.status();
    WriteView view;
    if (st.ok()) {
      absl::StatusOr<WriteView> v =
          device->BeginWrite(op.region_id, op.addr, op.length, op.generation);
      if (v.ok()) {
        view = *v;
      } else {
        st = v.status();
        ticket->Abort();
      }
    }
    if (!st.ok()) {
      // Rejected: skip its bytes to stay in step with the stream.
      if (op.status == 0) {
        op.status = WireStatus(st);
        Add(counters_.rejected_ops, 1);
      }
      absl::Status d = Discard(fd, op.length, deadline);
      if (!d.ok()) {
        Add(counters_.protocol_errors, 1);
        SendError(fd, h.request_id,
                  absl::Status(d.code(), absl::StrCat("truncated write payload: ",
                                                      d.message())));
        return false;
      }
      continue;
    }
    absl::Status r = RecvAll(fd, view.data, op.length, deadline);
    if (!r.ok()) {
      device->AbortWrite(view);
      ticket->Abort();
      Add(counters_.protocol_errors, 1);
      SendError(fd, h.request_id,
                absl::Status(r.code(), absl::StrCat("truncated write payload: ",
                                                    r.message())));
      return false;
    }
    st = device->CommitWrite(view);
    if (st.ok()) {
      st = ticket->Commit();
    } else {
      ticket->Abort();
    }
    if (st.ok()) {
      Add(counters_.write_ops, 1);
      Add(counters_.bytes_written, op.length);
      Add(counters_.tcp_bytes_written, op.length);
    } else {
      op.status = WireStatus(st);
      Add(counters_.rejected_ops, 1);
    }
  }
  std::vector<uint8_t> buf =
      EncodeResponse(wire::FrameType::kWriteResponse, h.request_id, 0, ops);
  absl::Status s = SendAll(fd, buf.data(), buf.size(), deadline);
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    return false;
  }
  return true;
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
