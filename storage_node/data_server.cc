#include "storage_node/data_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <exception>
#include <system_error>
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
// destinations reserved for one-sided writes, the RDMA queue pair. Owned by
// the connection's thread.
struct DataServer::ConnState {
  struct WriteHold {
    ExtentTable::WriteTicket ticket;
    WriteView view;
  };
  std::map<ExtentKey, KvManager::StagedRead, KeyLess> reads;
  std::map<ExtentKey, WriteHold, KeyLess> writes;
  // Session for acquires that name none (0 until first needed).
  uint64_t own_session = 0;
  std::shared_ptr<void> rdma_qp;
};

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
  // Non-blocking so that a connection that vanishes between poll and accept
  // cannot block the acceptor.
  int flags = fcntl(listen.fd(), F_GETFL, 0);
  if (flags < 0 || fcntl(listen.fd(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::InternalError(
        absl::StrCat("data server: fcntl: ", strerror(errno)));
  }
  int stop_fd = eventfd(0, EFD_CLOEXEC);
  int reap_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0 || reap_fd < 0) {
    int e = errno;
    if (stop_fd >= 0) close(stop_fd);
    if (reap_fd >= 0) close(reap_fd);
    return absl::InternalError(absl::StrCat("data server: eventfd: ", strerror(e)));
  }
  std::unique_ptr<DataServer> server(
      new DataServer(options, std::move(listen), port, stop_fd, reap_fd));
  DataServer* s = server.get();
  try {
    server->acceptor_ = Thread("dp-accept", [s] { s->AcceptLoop(); });
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "data server: cannot start the acceptor thread: ", e.what()));
  }
  LOG(INFO) << "data server listening on " << options.host << ":" << port;
  return server;
}

DataServer::DataServer(const DataServerOptions& options, Socket listen,
                       int port, int stop_fd, int reap_fd)
    : options_(options),
      areas_(options.device->Areas()),
      port_(port),
      stop_fd_(stop_fd),
      reap_fd_(reap_fd),
      listen_(std::move(listen)) {}

DataServer::~DataServer() {
  Shutdown(absl::Seconds(10));
  close(stop_fd_);
  close(reap_fd_);
}

// ---------------------------------------------------------------- accepting

void DataServer::AcceptLoop() {
  while (true) {
    pollfd p[3] = {{listen_.fd(), POLLIN, 0},
                   {stop_fd_, POLLIN, 0},
                   {reap_fd_, POLLIN, 0}};
    int r = poll(p, 3, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "data server: poll: " << strerror(errno);
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    if (p[1].revents != 0) break;
    if (p[2].revents != 0) {
      DrainFd(reap_fd_);
      Reap();
    }
    if (p[0].revents != 0) Accept();
  }
  // Stop accepting: new connections are refused by the kernel from here on.
  listen_.Close();
}

void DataServer::Accept() {
  int fd = accept4(listen_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR || e == ECONNABORTED) {
      return;
    }
    LOG_EVERY_N(WARNING, 100) << "data server: accept: " << strerror(e);
    // Out of descriptors or memory: back off rather than spin on poll.
    absl::SleepFor(absl::Milliseconds(50));
    return;
  }
  Socket sock(fd);
  TuneDataSocket(fd, options_.send_buffer_bytes);
  auto owned = std::make_unique<Conn>();
  Conn* c = owned.get();
  int open = 0;
  bool admitted = false;
  {
    MutexLock l(&mu_);
    open = active_;
    if (active_ < options_.max_connections) {
      ++active_;
      c->sock = std::move(sock);
      conns_.push_back(std::move(owned));
      admitted = true;
    }
  }
  if (admitted) {
    // Outside mu_: creating a thread can be slow, and it can fail. Only this
    // thread reaps `c`, and Shutdown touches conns_ only after joining it.
    // Counted before the thread starts: it may answer a request (and the
    // client read Stats) before this thread runs again.
    accepted_.fetch_add(1, std::memory_order_relaxed);
    absl::Status started = StartConnThread(c);
    if (started.ok()) return;
    accepted_.fetch_sub(1, std::memory_order_relaxed);
    {
      MutexLock l(&mu_);
      --active_;
      auto it = std::find_if(conns_.begin(), conns_.end(),
                             [c](const std::unique_ptr<Conn>& p) {
                               return p.get() == c;
                             });
      CHECK(it != conns_.end()) << "data server: connection lost";
      sock = std::move((*it)->sock);
      conns_.erase(it);
      cv_.SignalAll();
    }
    thread_start_failures_.fetch_add(1, std::memory_order_relaxed);
    refused_.fetch_add(1, std::memory_order_relaxed);
    LOG_EVERY_N(WARNING, 100) << "data server: refusing a connection: "
                              << started.message() << " (" << open
                              << " open)";
    SendError(sock.fd(), 0, started);
    return;  // `sock` closes the connection
  }
  refused_.fetch_add(1, std::memory_order_relaxed);
  LOG_EVERY_N(WARNING, 100) << "data server: refusing a connection: " << open
                            << " open (limit " << options_.max_connections
                            << ")";
  SendError(fd, 0,
            absl::ResourceExhaustedError(absl::StrCat(
                "storage node: too many data-plane connections (limit ",
                options_.max_connections, ")")));
  // `sock` closes the connection.
}

absl::Status DataServer::StartConnThread(Conn* c) {
  try {
    if (fail_thread_starts_for_test_.load(std::memory_order_relaxed)) {
      throw std::system_error(EAGAIN, std::generic_category(),
                              "thread start refused for test");
    }
    c->thread = Thread("dp-conn", [this, c] { ServeConnection(c); });
  } catch (const std::exception& e) {
    // std::system_error at the thread or pid limit, std::bad_alloc.
    return absl::ResourceExhaustedError(absl::StrCat(
        "storage node: too many connections / cannot start a thread: ",
        e.what()));
  }
  return absl::OkStatus();
}

void DataServer::Reap() {
  std::list<std::unique_ptr<Conn>> finished;
  {
    MutexLock l(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->done) {
        finished.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) c->thread.Join();
  // `finished` closes the sockets.
}

// ---------------------------------------------------------------- serving

void DataServer::ServeConnection(Conn* conn) {
  const int fd = conn->sock.fd();
  ConnState cs;
  while (true) {
    // Wait for the next request header, up to idle_timeout.
    const absl::Time idle_deadline = absl::Now() + options_.idle_timeout;
    pollfd p[2];
    int r;
    do {
      p[0] = {fd, POLLIN, 0};
      p[1] = {stop_fd_, POLLIN, 0};
      int timeout_ms = -1;
      if (idle_deadline != absl::InfiniteFuture()) {
        const absl::Duration left = std::max(
            idle_deadline - absl::Now(), absl::ZeroDuration());
        timeout_ms = static_cast<int>(std::min<int64_t>(
            absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
            INT_MAX));
      }
      r = poll(p, 2, timeout_ms);
    } while (r < 0 && errno == EINTR);
    if (r < 0) break;
    if (r == 0) {
      // Idle too long: free the thread and the slot. A client that comes
      // back finds the connection closed and retries on a fresh one.
      idle_closed_.fetch_add(1, std::memory_order_relaxed);
      VLOG(1) << "data server: closing a connection idle for "
              << absl::FormatDuration(options_.idle_timeout);
      break;
    }
    if (p[1].revents != 0) break;  // shutting down: close idle connection
    uint8_t hdr[wire::kHeaderBytes];
    const absl::Time deadline = absl::Now() + options_.io_timeout;
    bool got_any = false;
    absl::Status s = RecvAll(fd, hdr, sizeof(hdr), deadline, &got_any);
    if (!s.ok()) {
      if (got_any) {
        protocol_errors_.fetch_add(1, std::memory_order_relaxed);
        SendError(fd, 0,
                  absl::Status(s.code(), absl::StrCat("truncated frame header: ",
                                                      s.message())));
      }
      break;  // clean close by the peer when !got_any
    }
    if (!HandleRequest(fd, hdr, deadline, &cs)) break;
  }
  // Before the peer learns the connection is gone (a client must not touch
  // held memory after closing it anyway).
  EndConnState(&cs);
  // Tell the peer at once; the descriptor is closed when the thread is
  // reaped.
  ::shutdown(fd, SHUT_RDWR);
  {
    MutexLock l(&mu_);
    conn->done = true;
    --active_;
    cv_.SignalAll();
  }
  SignalFd(reap_fd_);
}

bool DataServer::HandleRequest(int fd, const uint8_t* hdr, absl::Time deadline,
                               ConnState* cs) {
  absl::StatusOr<wire::FrameHeader> h = wire::DecodeHeader(hdr);
  if (!h.ok()) {
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
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
      break;
    case wire::FrameType::kRdmaConnectRequest:
      return HandleRdmaConnect(fd, *h, deadline, cs);
    default:
      protocol_errors_.fetch_add(1, std::memory_order_relaxed);
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
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
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
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
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
      protocol_errors_.fetch_add(1, std::memory_order_relaxed);
      SendError(fd, h->request_id,
                absl::Status(s.code(), absl::StrCat("bad capability table: ",
                                                    s.message())));
      return false;
    }
    if (!skip_capability_checks_for_test_.load(std::memory_order_relaxed)) {
      const uint8_t rights = h->type == wire::FrameType::kWriteRequest ||
                                     h->type == wire::FrameType::kWriteBeginRequest
                                 ? wire::kCapWrite
                                 : wire::kCapRead;
      const CapabilityVerifier::Snapshot id = options_.capabilities->Current();
      const int64_t now_ms = absl::ToUnixMillis(absl::Now());
      for (wire::OpDesc& op : ops) {
        absl::Status c = id.Check(op, rights, now_ms);
        if (c.ok()) continue;
        op.status = WireStatus(c);
        denied_ops_.fetch_add(1, std::memory_order_relaxed);
        rejected_ops_.fetch_add(1, std::memory_order_relaxed);
        VLOG(1) << "data server: op refused: " << c;
      }
    }
  }
  if (h->type == wire::FrameType::kWriteRequest) {
    return HandleWrite(fd, *h, ops, deadline);
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
      protocol_errors_.fetch_add(1, std::memory_order_relaxed);
      SendError(fd, h->request_id,
                absl::Status(s.code(), absl::StrCat("truncated session id: ",
                                                    s.message())));
      return false;
    }
    session = wire::DecodeSession(b);
  }
  if (h->type == wire::FrameType::kReadRequest) {
    return HandleRead(fd, *h, ops, session, deadline);
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
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].status != 0) {  // refused (capability)
      st[i] = absl::Status(wire::FromWireCode(ops[i].status), "refused");
      continue;
    }
    const ExtentKey k = KeyOf(ops[i]);
    if (!prefetch) {
      auto it = cs->reads.find(k);
      if (it != cs->reads.end()) {
        cs->reads.erase(it);  // releases the object
        continue;
      }
    }
    keys.push_back(k);
    index.push_back(i);
  }
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
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
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
    for (size_t i = 0; i < ops.size(); ++i) {
      wire::OpDesc& op = ops[i];
      if (op.status != 0) continue;  // refused (capability)
      const ExtentKey key = KeyOf(op);
      auto held = cs->reads.find(key);
      if (held != cs->reads.end()) {
        // Acquired again on this connection: the same hold.
        auto loc = LocateInAreas(areas_, held->second.data(), op.length);
        refs[i] = {loc->first, loc->second};
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
          stale_reads_.fetch_add(1, std::memory_order_relaxed);
        } else {
          rejected_ops_.fetch_add(1, std::memory_order_relaxed);
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
        rejected_ops_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      auto loc = LocateInAreas(areas_, r->data(), op.length);
      if (!loc.ok()) {
        op.status = WireStatus(absl::InternalError(
            "storage node: staged copy outside the exposed memory"));
        rejected_ops_.fetch_add(1, std::memory_order_relaxed);
        continue;  // `r` releases
      }
      refs[i] = {loc->first, loc->second};
      cs->reads.emplace(key, std::move(*r));
      holding = true;
      acquired_ops_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  absl::Status s = SendWithAreaRefs(fd, wire::FrameType::kAcquireResponse,
                                    h.request_id, ops, refs, deadline);
  if (!s.ok()) {
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  return true;
}

bool DataServer::HandleWriteBegin(int fd, const wire::FrameHeader& h,
                                  std::vector<wire::OpDesc>& ops,
                                  absl::Time deadline, ConnState* cs) {
  MemoryDevice* device = options_.device;
  std::vector<wire::AreaRef> refs(ops.size());
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
    }
    absl::StatusOr<ExtentTable::WriteTicket> ticket =
        st.ok() ? options_.extents->BeginWrite(key)
                : absl::StatusOr<ExtentTable::WriteTicket>(st);
    WriteView view;
    if (ticket.ok()) {
      absl::StatusOr<WriteView> v =
          device->BeginWrite(op.region_id, op.addr, op.length, op.generation);
      if (v.ok()) {
        auto loc = LocateInAreas(areas_, v->data, op.length);
        if (loc.ok()) {
          view = *v;
          refs[i] = {loc->first, loc->second};
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
      rejected_ops_.fetch_add(1, std::memory_order_relaxed);
      continue;  // `ticket` aborts
    }
    cs->writes.emplace(key, ConnState::WriteHold{std::move(*ticket), view});
  }
  absl::Status s = SendWithAreaRefs(fd, wire::FrameType::kWriteBeginResponse,
                                    h.request_id, ops, refs, deadline);
  if (!s.ok()) {
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  return true;
}

bool DataServer::HandleWriteCommit(int fd, const wire::FrameHeader& h,
                                   std::vector<wire::OpDesc>& ops,
                                   absl::Time deadline, ConnState* cs) {
  MemoryDevice* device = options_.device;
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
      direct_write_ops_.fetch_add(1, std::memory_order_relaxed);
      write_ops_.fetch_add(1, std::memory_order_relaxed);
      bytes_written_.fetch_add(op.length, std::memory_order_relaxed);
    } else if (commit) {
      rejected_ops_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  std::vector<uint8_t> buf = EncodeResponse(
      wire::FrameType::kWriteCommitResponse, h.request_id, 0, ops);
  absl::Status s = SendAll(fd, buf.data(), buf.size(), deadline);
  if (!s.ok()) {
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  return true;
}

bool DataServer::HandleRdmaConnect(int fd, const wire::FrameHeader& h,
                                   absl::Time deadline, ConnState* cs) {
  // DecodeHeader bounded the payload by kMaxConnectBytes.
  std::string info(h.payload_bytes, '\0');
  absl::Status s = RecvAll(fd, info.data(), info.size(), deadline);
  if (!s.ok()) {
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (options_.rdma == nullptr) {
    SendError(fd, h.request_id,
              absl::UnimplementedError("storage node: RDMA is not enabled"));
    return false;
  }
  if (cs->rdma_qp != nullptr) {
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
  cs->rdma_qp = std::move(accepted->first);
  const std::string& mine = accepted->second;
  rdma_connections_.fetch_add(1, std::memory_order_relaxed);
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
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void DataServer::EndConnState(ConnState* cs) {
  for (auto& [key, hold] : cs->writes) {
    options_.device->AbortWrite(hold.view);
    hold.ticket.Abort();
  }
  cs->writes.clear();
  cs->reads.clear();  // releases the held objects
  if (cs->own_session != 0 && options_.kv != nullptr) {
    options_.kv->Release(cs->own_session, {});
  }
  cs->rdma_qp.reset();
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
        rejected_ops_.fetch_add(1, std::memory_order_relaxed);
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
        stale_reads_.fetch_add(1, std::memory_order_relaxed);
      } else {
        rejected_ops_.fetch_add(1, std::memory_order_relaxed);
      }
      continue;
    }
    absl::StatusOr<ReadView> view =
        device->AcquireRead(op.region_id, op.addr, op.length);
    if (!view.ok()) {
      op.status = WireStatus(view.status());
      rejected_ops_.fetch_add(1, std::memory_order_relaxed);
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
  read_ops_.fetch_add(ok_ops, std::memory_order_relaxed);
  staged_read_ops_.fetch_add(staged_ops, std::memory_order_relaxed);
  bytes_read_.fetch_add(payload, std::memory_order_relaxed);
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
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
    VLOG(1) << "data server: sending a read response failed: " << s;
    return false;
  }
  return true;
}

bool DataServer::HandleWrite(int fd, const wire::FrameHeader& h,
                             std::vector<wire::OpDesc>& ops,
                             absl::Time deadline) {
  MemoryDevice* device = options_.device;
  for (wire::OpDesc& op : ops) {
    absl::Status st;
    absl::StatusOr<ExtentTable::WriteTicket> ticket =
        op.status != 0
            ? absl::StatusOr<ExtentTable::WriteTicket>(absl::Status(
                  wire::FromWireCode(op.status), "refused (capability)"))
            : options_.extents->BeginWrite(KeyOf(op));
    st = ticket.status();
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
        rejected_ops_.fetch_add(1, std::memory_order_relaxed);
      }
      absl::Status d = Discard(fd, op.length, deadline);
      if (!d.ok()) {
        protocol_errors_.fetch_add(1, std::memory_order_relaxed);
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
      protocol_errors_.fetch_add(1, std::memory_order_relaxed);
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
      write_ops_.fetch_add(1, std::memory_order_relaxed);
      bytes_written_.fetch_add(op.length, std::memory_order_relaxed);
    } else {
      op.status = WireStatus(st);
      rejected_ops_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  std::vector<uint8_t> buf =
      EncodeResponse(wire::FrameType::kWriteResponse, h.request_id, 0, ops);
  absl::Status s = SendAll(fd, buf.data(), buf.size(), deadline);
  if (!s.ok()) {
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
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
      while (!shutdown_done_) cv_.Wait(&mu_);
      return;
    }
    shutdown_started_ = true;
  }
  // Wakes the acceptor and every idle connection; stays readable.
  SignalFd(stop_fd_);
  acceptor_.Join();  // the listening socket is closed when this returns

  const absl::Time deadline = absl::Now() + drain_timeout;
  std::list<std::unique_ptr<Conn>> conns;
  {
    MutexLock l(&mu_);
    while (active_ > 0) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    if (active_ > 0) {
      LOG(WARNING) << "data server: " << active_
                   << " requests still in progress after "
                   << absl::FormatDuration(drain_timeout)
                   << "; breaking their connections";
      for (auto& c : conns_) {
        if (!c->done) ::shutdown(c->sock.fd(), SHUT_RDWR);
      }
    }
    conns.swap(conns_);
  }
  for (auto& c : conns) c->thread.Join();
  conns.clear();
  MutexLock l(&mu_);
  shutdown_done_ = true;
  cv_.SignalAll();
}

DataServerStats DataServer::Stats() const {
  DataServerStats s;
  s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
  s.bytes_written = bytes_written_.load(std::memory_order_relaxed);
  s.read_ops = read_ops_.load(std::memory_order_relaxed);
  s.write_ops = write_ops_.load(std::memory_order_relaxed);
  s.staged_read_ops = staged_read_ops_.load(std::memory_order_relaxed);
  s.acquired_ops = acquired_ops_.load(std::memory_order_relaxed);
  s.direct_write_ops = direct_write_ops_.load(std::memory_order_relaxed);
  s.rdma_connections = rdma_connections_.load(std::memory_order_relaxed);
  s.stale_reads = stale_reads_.load(std::memory_order_relaxed);
  s.rejected_ops = rejected_ops_.load(std::memory_order_relaxed);
  s.accepted_connections = accepted_.load(std::memory_order_relaxed);
  s.refused_connections = refused_.load(std::memory_order_relaxed);
  s.protocol_errors = protocol_errors_.load(std::memory_order_relaxed);
  s.thread_start_failures =
      thread_start_failures_.load(std::memory_order_relaxed);
  s.idle_closed_connections = idle_closed_.load(std::memory_order_relaxed);
  s.denied_ops = denied_ops_.load(std::memory_order_relaxed);
  MutexLock l(&mu_);
  s.open_connections = static_cast<uint64_t>(active_);
  return s;
}

}  // namespace hymcache::storage
