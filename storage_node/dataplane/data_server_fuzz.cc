// Fuzzes the storage node's data plane as a hostile client meets it: a real
// DataServer (over a DRAM device, its extent table and a KvManager, as the
// daemon runs them) on a loopback port, fed the input as the byte stream of
// one to three consecutive connections. Every frame type, truncated frames,
// bad op tables, writes, direct-access holds (acquire, write begin/commit,
// release), prefetch sessions and pipelined requests are reached through
// the same code path a socket reaches. The fixture is made afresh for each
// input so that a finding replays from its input alone.
//
// Besides crashes, sanitizer reports, leaks and hangs, it checks that
//   - everything the server sends parses as response frames (a kError only
//     as the last frame of a connection);
//   - a read answered OK for one of the objects stored before the input ran,
//     named exactly (region, addr, length, generation), returns that
//     object's bytes (never another object's);
//   - no connection waits (nothing else holds what it could wait for: a
//     request waiting for its own connection's holds is a hang);
//   - the server answers a ping on a fresh connection afterwards and has no
//     connection left open.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/net.h"
#include "common/wire.h"
#include "fuzz/fuzz_input.h"
#include "glog/logging.h"
#include "common/test_capabilities.h"
#include "storage_node/dataplane/data_server.h"
#include "storage_node/device/dram_device.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/dataplane/kv_manager.h"

namespace hymcache::storage {
namespace {

using fuzz::FuzzInput;

constexpr uint64_t kCapacity = 1 << 20;
constexpr uint64_t kCeiling = 1000;

struct Stored {
  ExtentKey key;
  uint8_t seed;
};
// Objects every input starts with (generations below the ceiling).
const Stored kStored[] = {
    {{0, 0, 4096, 1}, 0x11},
    {{0, 4096, 100, 2}, 0x22},
    {{0, 65536, 16384, 7}, 0x33},
};

uint8_t Pattern(uint8_t seed, uint64_t i) {
  return static_cast<uint8_t>(seed + i * 31);
}

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

struct Fixture {
  Fixture() {
    DramDeviceOptions d;
    d.capacity_bytes = kCapacity;
    d.huge_pages = false;
    auto dev = DramDevice::Create(d);
    FUZZ_CHECK(dev.ok()) << dev.status();
    device = std::move(*dev);
    ExtentTableOptions to;
    to.regions = device->Regions();
    auto t = ExtentTable::Create(to);
    FUZZ_CHECK(t.ok()) << t.status();
    extents = std::move(*t);
    extents->SetGenerationCeiling(kCeiling);
    for (const Stored& s : kStored) {
      auto ticket = extents->BeginWrite(s.key);
      FUZZ_CHECK(ticket.ok()) << ticket.status();
      auto view = device->BeginWrite(s.key.region_id, s.key.addr,
                                     s.key.length, s.key.generation);
      FUZZ_CHECK(view.ok()) << view.status();
      for (uint64_t i = 0; i < s.key.length; ++i) {
        view->data[i] = Pattern(s.seed, i);
      }
      FUZZ_CHECK(device->CommitWrite(*view).ok());
      FUZZ_CHECK(ticket->Commit().ok());
    }
    KvManagerOptions ko;
    ko.device = device.get();
    ko.extents = extents.get();
    ko.max_sessions = 8;
    ko.max_objects_per_session = 64;
    auto kvm = KvManager::Create(ko);
    FUZZ_CHECK(kvm.ok()) << kvm.status();
    kv = std::move(*kvm);
    DataServerOptions o;
    o.device = device.get();
    o.extents = extents.get();
    o.kv = kv.get();
    o.max_connections = 4;
    o.io_timeout = absl::Seconds(2);
    o.idle_timeout = absl::Seconds(2);
    o.capabilities = TestCapabilities::Get().verifier();
    auto s = DataServer::Create(o);
    FUZZ_CHECK(s.ok()) << s.status();
    server = std::move(*s);
    // Fuzzed inputs cannot forge HMACs: check the request handling behind
    // the capability check (common/capability_test covers the check).
    server->SetSkipCapabilityChecksForTest(true);
  }
  ~Fixture() {
    server.reset();  // before what it serves
    kv.reset();
  }

  std::unique_ptr<DramDevice> device;
  std::unique_ptr<ExtentTable> extents;
  std::unique_ptr<KvManager> kv;
  std::unique_ptr<DataServer> server;
};

// Sends `stream` while reading whatever comes back, then half-closes and
// reads until the server closes. Returns the bytes received.
std::string Exchange(int port, const std::string& stream) {
  auto sock = ConnectTcp("127.0.0.1:" + std::to_string(port), Soon());
  FUZZ_CHECK(sock.ok()) << sock.status();
  const int fd = sock->fd();
  std::string got;
  size_t sent = 0;
  bool closed_write = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(8);
  while (true) {
    if (!closed_write && sent == stream.size()) {
      ::shutdown(fd, SHUT_WR);
      closed_write = true;
    }
    pollfd p = {fd, static_cast<short>(POLLIN | (closed_write ? 0 : POLLOUT)),
                0};
    const int r = poll(&p, 1, 100);
    FUZZ_CHECK(absl::Now() < deadline)
        << "the server neither answered nor closed the connection";
    if (r <= 0) continue;
    if (p.revents & POLLIN || p.revents & (POLLHUP | POLLERR)) {
      char buf[65536];
      const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        break;  // reset by the server: it gave up on us
      }
      // Object payloads can be large: keep the frames' structure, not
      // necessarily every byte (bounded memory).
      if (got.size() < (64u << 20)) got.append(buf, n);
    }
    if (!closed_write && (p.revents & POLLOUT)) {
      const ssize_t n = ::send(fd, stream.data() + sent, stream.size() - sent,
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        sent += n;
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        closed_write = true;  // the server closed; read what it said
      }
    }
  }
  return got;
}

bool IsResponse(wire::FrameType t) {
  switch (t) {
    case wire::FrameType::kPong:
    case wire::FrameType::kReadResponse:
    case wire::FrameType::kWriteResponse:
    case wire::FrameType::kPrefetchResponse:
    case wire::FrameType::kReleaseResponse:
    case wire::FrameType::kHintResponse:
    case wire::FrameType::kAcquireResponse:
    case wire::FrameType::kWriteBeginResponse:
    case wire::FrameType::kWriteCommitResponse:
    case wire::FrameType::kError:
      return true;
    default:
      return false;
  }
}

// Parses everything the server sent on one connection.
void CheckResponses(const std::string& got) {
  if (got.size() >= (64u << 20)) return;  // truncated by Exchange
  const uint8_t* p = reinterpret_cast<const uint8_t*>(got.data());
  size_t pos = 0;
  while (pos < got.size()) {
    FUZZ_CHECK(got.size() - pos >= wire::kHeaderBytes)
        << "a partial frame header from the server";
    auto h = wire::DecodeHeader(p + pos);
    FUZZ_CHECK(h.ok()) << "the server sent a malformed frame: " << h.status();
    FUZZ_CHECK(IsResponse(h->type)) << "frame type " << int(h->type);
    pos += wire::kHeaderBytes;
    FUZZ_CHECK(got.size() - pos >= h->op_count * wire::kOpBytes)
        << "a partial op table from the server";
    std::vector<wire::OpDesc> ops;
    for (size_t i = 0; i < h->op_count; ++i) {
      ops.push_back(wire::DecodeOp(p + pos));
      pos += wire::kOpBytes;
    }
    FUZZ_CHECK(got.size() - pos >= h->payload_bytes)
        << "a partial payload from the server";
    if (h->type == wire::FrameType::kError) {
      FUZZ_CHECK(h->status != 0) << "kError with status OK";
      FUZZ_CHECK(pos + h->payload_bytes == got.size())
          << "the server went on after a kError";
    }
    if (h->type == wire::FrameType::kReadResponse) {
      FUZZ_CHECK(wire::ValidateOps(*h, ops).ok())
          << "read response op table does not add up";
      uint64_t off = 0;
      for (const wire::OpDesc& op : ops) {
        if (op.status != 0) continue;
        for (const Stored& s : kStored) {
          if (op.region_id == s.key.region_id && op.addr == s.key.addr &&
              op.length == s.key.length && op.generation == s.key.generation) {
            for (uint64_t i = 0; i < op.length; ++i) {
              FUZZ_CHECK(p[pos + off + i] == Pattern(s.seed, i))
                  << "read of generation " << op.generation
                  << " returned other bytes at offset " << i;
            }
          }
        }
        off += op.length;
      }
    }
    pos += h->payload_bytes;
  }
}

void Ping(int port) {
  auto sock = ConnectTcp("127.0.0.1:" + std::to_string(port), Soon());
  FUZZ_CHECK(sock.ok()) << sock.status();
  uint8_t hdr[wire::kHeaderBytes];
  wire::FrameHeader h;
  h.type = wire::FrameType::kPing;
  h.request_id = 42;
  wire::EncodeHeader(h, hdr);
  FUZZ_CHECK(SendAll(sock->fd(), hdr, sizeof(hdr), Soon()).ok());
  FUZZ_CHECK(RecvAll(sock->fd(), hdr, sizeof(hdr), Soon()).ok())
      << "no answer to a ping after the input";
  auto r = wire::DecodeHeader(hdr);
  FUZZ_CHECK(r.ok() && r->type == wire::FrameType::kPong &&
             r->request_id == 42);
}

}  // namespace
}  // namespace hymcache::storage

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  FLAGS_minloglevel = 2;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hymcache::storage;  // NOLINT
  hymcache::fuzz::FuzzInput in(data, size);
  // Connections, one after another: all but the last take a length-prefixed
  // share of the input, the last the rest.
  const int conns = 1 + in.Range(0, 2);
  std::vector<std::string> streams;
  for (int i = 0; i + 1 < conns; ++i) streams.push_back(in.Bytes(in.U16()));
  streams.push_back(in.Rest());
  Fixture f;
  for (const std::string& s : streams) {
    // Connections run one at a time, so nothing else holds what a request
    // may wait for (drained reads, staging): a connection that takes long
    // waited for its own holds.
    const absl::Time start = absl::Now();
    CheckResponses(Exchange(f.server->port(), s));
    FUZZ_CHECK(absl::Now() - start < absl::Milliseconds(1500))
        << "a connection took " << absl::Now() - start
        << ": a request waited for what the connection itself holds";
  }
  Ping(f.server->port());
  // Connections end asynchronously after the client sees them close.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (f.server->Stats().open_connections > 0) {
    FUZZ_CHECK(absl::Now() < deadline) << "a connection stays open";
    absl::SleepFor(absl::Milliseconds(1));
  }
  return 0;
}
