// Hostile clients: malformed and malicious input thrown at every port of the
// real daemons (the master's gRPC port, the storage node's control gRPC port,
// its TCP data port and its same-host shared-memory socket), each kind a named
// case in a table. After every case the daemons must still be running and
// answer a correct request (a Put and a Get through the client SDK, compared
// byte for byte, plus a block stored before the first case); at the end their
// memory (VmRSS) and descriptors must not have grown beyond a generous bound.
// A one-line summary per port is printed: kinds thrown, kinds answered with an
// error, connections closed by the server.
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/block_key.h"
#include "client/client.h"
#include "common/capability.h"
#include "common/fd_passing.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/status_reason.h"
#include "common/transport_params.h"
#include "common/wire.h"
#include "master/proving_heartbeat.h"
#include "proto/master.grpc.pb.h"
#include "proto/storage.grpc.pb.h"
#include "tests/daemon.h"

namespace hymcache {
namespace {

using testing::MasterProcess;
using testing::StorageProcess;
using testing::TempDir;
namespace pb = ::hymcache::v1;

// How much each daemon's VmRSS may grow over the run, after the warm-up.
#if defined(__SANITIZE_ADDRESS__)
// Not checked: ASan keeps up to 256 MiB of freed memory in quarantine per
// process (plus fake stacks), so RSS says little; instead LeakSanitizer
// checks each daemon when it exits at the end (exit status 0 required).
constexpr bool kCheckRss = false;
constexpr int64_t kRssBoundBytes = 0;
#elif defined(HYMCACHE_TSAN)
// TSan's shadow and meta memory add several bytes per byte touched.
constexpr bool kCheckRss = true;
constexpr int64_t kRssBoundBytes = int64_t{320} << 20;
#else
constexpr bool kCheckRss = true;
constexpr int64_t kRssBoundBytes = int64_t{64} << 20;
#endif
// Generous: the daemons run 5-15x slower under ThreadSanitizer.
constexpr absl::Duration kSlack = absl::Seconds(20);
// The node's data-plane timeouts, set low so that slow peers are cut quickly.
// Correct requests must fit too, under TSan on a loaded machine.
constexpr int kIoTimeoutMs = 2000;
constexpr int kIdleTimeoutMs = 2500;
constexpr size_t kBlockBytes = 64 << 10;

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> b(n);
  std::mt19937_64 rng(seed);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

std::string RandomString(size_t n, uint64_t seed) {
  std::vector<uint8_t> b = RandomBytes(n, seed);
  return std::string(b.begin(), b.end());
}

// ---------------------------------------------------------------- /proc

int64_t RssBytes(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      return std::stoll(line.substr(6)) * 1024;  // "VmRSS:  1234 kB"
    }
  }
  return -1;
}

int OpenFds(pid_t pid) {
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n - 2;
}

// ---------------------------------------------------------------- outcomes

// What one case observed from the server.
struct Outcome {
  bool error = false;   // answered with an error (status, kError, per-op)
  bool closed = false;  // the server closed the connection
  Outcome& operator|=(const Outcome& o) {
    error |= o.error;
    closed |= o.closed;
    return *this;
  }
};

struct Case {
  std::string name;
  std::function<Outcome()> run;
};

struct Tally {
  std::string port;
  int thrown = 0;
  int errors = 0;
  int closed = 0;
  void Print() const {
    std::printf(
        "hostile-client %-18s kinds=%d answered_with_error=%d "
        "closed_by_server=%d\n",
        port.c_str(), thrown, errors, closed);
    std::fflush(stdout);
  }
};

// ---------------------------------------------------------------- raw TCP

Socket Dial(const std::string& addr) {
  auto s = ConnectTcp(addr, absl::Now() + absl::Seconds(10));
  INFO(addr << ": " << s.status().ToString());
  REQUIRE(s.ok());
  return std::move(*s);
}

// Best effort: the server may close while we still send.
bool Send(int fd, const std::string& b) {
  return SendAll(fd, b.data(), b.size(), absl::Now() + absl::Seconds(10)).ok();
}

// Reads what the server sends until it closes the connection or `within`
// passes without a close.
struct Drained {
  bool closed = false;
  std::string data;
};
Drained Drain(int fd, absl::Duration within, size_t max_bytes = 1 << 20) {
  Drained d;
  const absl::Time deadline = absl::Now() + within;
  char buf[16384];
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return d;
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return d;
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      d.closed = true;
      return d;
    }
    if (d.data.size() < max_bytes) d.data.append(buf, static_cast<size_t>(n));
  }
}

// ---------------------------------------------------------------- HTTP/2

constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
enum : uint8_t {
  kData = 0,
  kHeaders = 1,
  kRstStream = 3,
  kSettings = 4,
  kPing = 6,
  kGoAway = 7,
  kWindowUpdate = 8,
  kContinuation = 9,
};

std::string Be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
          static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string H2Frame(uint8_t type, uint8_t flags, uint32_t stream,
                    const std::string& payload, int64_t length = -1) {
  const uint32_t len =
      length < 0 ? static_cast<uint32_t>(payload.size()) : static_cast<uint32_t>(length);
  std::string f = {static_cast<char>(len >> 16), static_cast<char>(len >> 8),
                   static_cast<char>(len), static_cast<char>(type),
                   static_cast<char>(flags)};
  f += Be32(stream & 0x7fffffffu);
  return f + payload;
}

void HpackInt(std::string* out, uint8_t first, int prefix, uint64_t v) {
  const uint64_t max = (uint64_t{1} << prefix) - 1;
  if (v < max) {
    out->push_back(static_cast<char>(first | v));
    return;
  }
  out->push_back(static_cast<char>(first | max));
  v -= max;
  while (v >= 128) {
    out->push_back(static_cast<char>((v % 128) + 128));
    v /= 128;
  }
  out->push_back(static_cast<char>(v));
}

// Literal header field without indexing, new name, no Huffman coding.
void HpackLiteral(std::string* out, const std::string& name,
                  const std::string& value) {
  out->push_back(0);
  HpackInt(out, 0, 7, name.size());
  *out += name;
  HpackInt(out, 0, 7, value.size());
  *out += value;
}

std::string GrpcRequestHeaders(const std::string& path) {
  std::string h;
  HpackLiteral(&h, ":method", "POST");
  HpackLiteral(&h, ":scheme", "http");
  HpackLiteral(&h, ":path", path);
  HpackLiteral(&h, ":authority", "hostile");
  HpackLiteral(&h, "content-type", "application/grpc");
  HpackLiteral(&h, "te", "trailers");
  return h;
}

// The preface and an empty SETTINGS frame: a well-behaved connection start.
std::string H2Start() { return std::string(kPreface) + H2Frame(kSettings, 0, 0, ""); }

// An HTTP/2 exchange: what the server did with `bytes`. An error is a
// GOAWAY, a RST_STREAM, or a trailers-only answer (HEADERS with END_STREAM).
Outcome H2Exchange(const std::string& addr, const std::string& bytes,
                   absl::Duration wait = absl::Milliseconds(600)) {
  Socket s = Dial(addr);
  Send(s.fd(), bytes);
  Outcome o;
  std::string data;
  const absl::Time deadline = absl::Now() + wait;
  while (absl::Now() < deadline) {
    // In slices: once the server has answered with an error and gone quiet,
    // there is nothing more to wait for.
    Drained d = Drain(s.fd(), absl::Milliseconds(200));
    data += d.data;
    o.closed = d.closed;
    size_t at = 0;
    while (at + 9 <= data.size()) {
      const uint32_t len = (uint8_t(data[at]) << 16) |
                           (uint8_t(data[at + 1]) << 8) | uint8_t(data[at + 2]);
      const uint8_t type = static_cast<uint8_t>(data[at + 3]);
      const uint8_t flags = static_cast<uint8_t>(data[at + 4]);
      if (type == kGoAway || type == kRstStream ||
          (type == kHeaders && (flags & 0x1) != 0)) {
        o.error = true;
      }
      at += 9 + len;
    }
    if (o.closed || (o.error && d.data.empty())) break;
  }
  return o;
}

// ---------------------------------------------------------------- gRPC

std::shared_ptr<grpc::Channel> NewChannel(const std::string& addr) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  args.SetMaxReceiveMessageSize(64 << 20);
  // A fresh connection per channel: cases must not share one.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args);
}

struct RawCallOptions {
  absl::Duration timeout = absl::Seconds(15);
  // Cancel the call after the writes instead of half-closing.
  bool cancel = false;
  // Wait this long before cancelling (so that the server has the messages).
  absl::Duration before_cancel = absl::ZeroDuration();
  std::vector<std::pair<std::string, std::string>> metadata;
};

struct RawCallResult {
  grpc::Status status;
  int responses = 0;
  std::vector<std::string> messages;
};

// Any call (unary or streaming) with hand-made message bytes, through the
// generic stub: the server parses the bytes itself.
RawCallResult RawCall(const std::shared_ptr<grpc::Channel>& ch,
                      const std::string& method,
                      const std::vector<std::string>& messages,
                      const RawCallOptions& opt = {}) {
  grpc::CompletionQueue cq;
  grpc::GenericStub stub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + opt.timeout));
  for (const auto& [k, v] : opt.metadata) ctx.AddMetadata(k, v);
  RawCallResult out;
  auto wait = [&]() {
    void* tag;
    bool ok = false;
    REQUIRE(cq.Next(&tag, &ok));
    return ok;
  };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&ctx, method, &cq);
  call->StartCall(nullptr);
  bool ok = wait();
  for (const std::string& m : messages) {
    if (!ok) break;
    grpc::Slice slice(m);
    grpc::ByteBuffer bb(&slice, 1);
    call->Write(bb, nullptr);
    ok = wait();
  }
  if (opt.cancel) {
    if (opt.before_cancel > absl::ZeroDuration()) absl::SleepFor(opt.before_cancel);
    ctx.TryCancel();
  } else if (ok) {
    call->WritesDone(nullptr);
    wait();
  }
  while (true) {
    grpc::ByteBuffer r;
    call->Read(&r, nullptr);
    if (!wait()) break;
    ++out.responses;
    std::vector<grpc::Slice> slices;
    std::string s;
    if (r.Dump(&slices).ok()) {
      for (const auto& sl : slices) s.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    out.messages.push_back(std::move(s));
  }
  call->Finish(&out.status, nullptr);
  wait();
  cq.Shutdown();
  void* tag;
  bool ignored;
  while (cq.Next(&tag, &ignored)) {
  }
  return out;
}

std::string Ser(const google::protobuf::Message& m) { return m.SerializeAsString(); }

Outcome FromStatus(const grpc::Status& s) {
  Outcome o;
  o.error = !s.ok();
  return o;
}

// Bytes no proto3 parser accepts, bytes it accepts with unknown fields.
std::vector<std::pair<std::string, std::string>> MalformedProtos() {
  std::string unknown;
  unknown += std::string("\xa8\x1f\x01", 3);               // field 501 varint
  unknown += std::string("\xb2\x1f\x03" "abc", 6);         // field 502 bytes
  unknown += std::string("\xbd\x1f\x01\x02\x03\x04", 6);   // field 503 fixed32
  unknown += std::string("\xb9\x1f", 2) + std::string(8, '\x7f');  // fixed64
  return {
      {"truncated_length", std::string("\x0a\xff\xff\xff\xff\x0f", 6)},
      {"length_past_end", std::string("\x0a\x10" "ab", 4)},
      {"bad_varint", std::string(11, '\xff')},
      {"field_zero", std::string("\x00\x01", 2)},
      {"end_group_without_start", std::string("\x0c", 1)},
      {"wire_type_7", std::string("\x0f\x00", 2)},
      {"wrong_wire_type", std::string("\x0d\x01\x02\x03\x04", 5)},
      {"unknown_fields", unknown},
      {"random_4k", RandomString(4096, 11)},
  };
}

// The cases every gRPC port gets: transport-level garbage and malformed
// messages for each of its methods.
void AddGrpcPortCases(std::vector<Case>* cases, const std::string& addr,
                      const std::string& service,
                      const std::vector<std::string>& methods,
                      const std::function<void()>& healthy) {
  const std::string probe = absl::StrCat("/", service, "/", methods.front());
  cases->push_back({"tcp_random_bytes", [addr] {
                      return H2Exchange(addr, RandomString(4096, 1));
                    }});
  cases->push_back({"http1_request", [addr] {
                      return H2Exchange(addr,
                                        "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
                    }});
  cases->push_back({"tcp_silent_connection", [addr, healthy] {
                      // Held open, sending nothing, while a correct request
                      // is served.
                      Socket s = Dial(addr);
                      healthy();
                      return Outcome{};
                    }});
  cases->push_back({"h2_half_preface", [addr, healthy] {
                      Socket s = Dial(addr);
                      Send(s.fd(), std::string(kPreface).substr(0, 10));
                      healthy();
                      return Outcome{};
                    }});
  cases->push_back({"h2_preface_then_close", [addr] {
                      Socket s = Dial(addr);
                      Send(s.fd(), kPreface);
                      return Outcome{};
                    }});
  cases->push_back({"h2_bad_settings_length", [addr] {
                      return H2Exchange(addr, std::string(kPreface) +
                                                  H2Frame(kSettings, 0, 0,
                                                          "12345"));
                    }});
  cases->push_back({"h2_frame_over_max_size", [addr] {
                      return H2Exchange(
                          addr, H2Start() + H2Frame(kData, 0, 1,
                                                    RandomString(1000, 2),
                                                    0xffffff));
                    }});
  cases->push_back({"h2_headers_on_stream_0", [addr, probe] {
                      return H2Exchange(addr, H2Start() +
                                                  H2Frame(kHeaders, 0x4, 0,
                                                          GrpcRequestHeaders(probe)));
                    }});
  cases->push_back({"h2_garbage_hpack", [addr] {
                      return H2Exchange(addr, H2Start() +
                                                  H2Frame(kHeaders, 0x4, 1,
                                                          RandomString(200, 3)));
                    }});
  cases->push_back({"h2_window_update_zero", [addr] {
                      return H2Exchange(addr, H2Start() +
                                                  H2Frame(kWindowUpdate, 0, 0,
                                                          Be32(0)));
                    }});
  cases->push_back({"h2_data_on_idle_stream", [addr] {
                      return H2Exchange(addr, H2Start() +
                                                  H2Frame(kData, 0, 7, "hello"));
                    }});
  cases->push_back({"h2_continuation_flood", [addr, probe] {
                      // Headers that never end: 4 MiB of CONTINUATION.
                      std::string b = H2Start() + H2Frame(kHeaders, 0, 1,
                                                          GrpcRequestHeaders(probe));
                      std::string more;
                      for (int i = 0; i < 100; ++i) {
                        HpackLiteral(&more, absl::StrCat("x-junk-", i),
                                     std::string(100, 'j'));
                      }
                      for (int i = 0; i < 400; ++i) {
                        b += H2Frame(kContinuation, 0, 1, more.substr(0, 10000));
                      }
                      return H2Exchange(addr, b);
                    }});
  cases->push_back({"h2_ping_flood", [addr] {
                      std::string b = H2Start();
                      for (int i = 0; i < 2000; ++i) {
                        b += H2Frame(kPing, 0, 0, std::string(8, char(i)));
                      }
                      return H2Exchange(addr, b, absl::Seconds(1));
                    }});
  cases->push_back({"h2_rapid_reset", [addr, probe] {
                      std::string b = H2Start();
                      const std::string hdr = GrpcRequestHeaders(probe);
                      for (uint32_t id = 1; id < 1000; id += 2) {
                        b += H2Frame(kHeaders, 0x4, id, hdr);
                        b += H2Frame(kRstStream, 0, id, Be32(8));  // CANCEL
                      }
                      return H2Exchange(addr, b, absl::Seconds(1));
                    }});
  cases->push_back({"grpc_length_prefix_4GiB", [addr, probe] {
                      std::string msg = std::string("\x00", 1) + Be32(0xffffffffu) + "x";
                      return H2Exchange(addr, H2Start() +
                                                  H2Frame(kHeaders, 0x4, 1,
                                                          GrpcRequestHeaders(probe)) +
                                                  H2Frame(kData, 0x1, 1, msg));
                    }});
  cases->push_back({"grpc_compressed_without_encoding", [addr, probe] {
                      std::string msg = std::string("\x01", 1) + Be32(4) + "zzzz";
                      return H2Exchange(addr, H2Start() +
                                                  H2Frame(kHeaders, 0x4, 1,
                                                          GrpcRequestHeaders(probe)) +
                                                  H2Frame(kData, 0x1, 1, msg));
                    }});
  cases->push_back({"connections_100_dropped", [addr] {
                      std::vector<Socket> socks;
                      for (int i = 0; i < 100; ++i) socks.push_back(Dial(addr));
                      for (size_t i = 0; i < socks.size(); i += 2) {
                        Send(socks[i].fd(), kPreface);  // half of them start
                      }
                      return Outcome{};
                    }});
  cases->push_back({"huge_metadata_1MiB", [addr, probe] {
                      RawCallOptions o;
                      o.metadata = {{"x-hostile", std::string(1 << 20, 'm')}};
                      return FromStatus(RawCall(NewChannel(addr), probe, {""}, o).status);
                    }});
  cases->push_back({"metadata_5000_entries", [addr, probe] {
                      RawCallOptions o;
                      for (int i = 0; i < 5000; ++i) {
                        o.metadata.push_back({absl::StrCat("x-h-", i), "v"});
                      }
                      return FromStatus(RawCall(NewChannel(addr), probe, {""}, o).status);
                    }});
  cases->push_back({"unknown_method", [addr, service] {
                      auto r = RawCall(NewChannel(addr),
                                       absl::StrCat("/", service, "/NoSuchMethod"), {""});
                      CHECK(r.status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
                      return FromStatus(r.status);
                    }});
  cases->push_back({"unknown_service", [addr] {
                      auto r = RawCall(NewChannel(addr), "/hymcache.v9.Nope/Get", {""});
                      CHECK(r.status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
                      return FromStatus(r.status);
                    }});
  cases->push_back({"deadline_zero_calls", [addr, service, methods] {
                      auto ch = NewChannel(addr);
                      Outcome o;
                      for (const std::string& m : methods) {
                        for (absl::Duration t : {absl::ZeroDuration(), absl::Microseconds(1),
                                                 absl::Microseconds(300)}) {
                          RawCallOptions opt;
                          opt.timeout = t;
                          o |= FromStatus(
                              RawCall(ch, absl::StrCat("/", service, "/", m), {""}, opt).status);
                        }
                      }
                      return o;
                    }});
  cases->push_back({"cancelled_calls", [addr, service, methods] {
                      auto ch = NewChannel(addr);
                      Outcome o;
                      for (const std::string& m : methods) {
                        for (int i = 0; i < 5; ++i) {
                          RawCallOptions opt;
                          opt.cancel = true;
                          o |= FromStatus(
                              RawCall(ch, absl::StrCat("/", service, "/", m), {""}, opt).status);
                        }
                      }
                      return o;
                    }});
  for (const std::string& m : methods) {
    const std::string path = absl::StrCat("/", service, "/", m);
    cases->push_back({absl::StrCat("malformed_proto/", m), [addr, path] {
                        auto ch = NewChannel(addr);
                        Outcome o;
                        for (const auto& [what, bytes] : MalformedProtos()) {
                          RawCallResult r = RawCall(ch, path, {bytes});
                          INFO(what << ": " << r.status.error_message());
                          o |= FromStatus(r.status);
                          // A message no parser accepts never reaches the
                          // service.
                          if (what != "unknown_fields" && what != "wrong_wire_type" &&
                              what != "random_4k") {
                            CHECK(!r.status.ok());
                          }
                        }
                        // Two messages on a unary call.
                        o |= FromStatus(RawCall(ch, path, {"", ""}).status);
                        return o;
                      }});
  }
}

// ---------------------------------------------------------------- data plane

std::string EncodeFrame(wire::FrameType type, const std::vector<wire::OpDesc>& ops,
                        uint64_t payload_bytes, const std::string& payload = "",
                        uint64_t request_id = 42) {
  std::string b(wire::kHeaderBytes + ops.size() * wire::kOpBytes, '\0');
  wire::FrameHeader h;
  h.type = type;
  h.op_count = static_cast<uint16_t>(ops.size());
  h.request_id = request_id;
  h.payload_bytes = payload_bytes;
  wire::EncodeHeader(h, reinterpret_cast<uint8_t*>(b.data()));
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::EncodeOp(ops[i], reinterpret_cast<uint8_t*>(b.data()) + wire::kHeaderBytes +
                               i * wire::kOpBytes);
  }
  if (wire::CarriesCapabilities(type)) {
    // The capability table: each op's (zero, so refused, unless the case
    // copied one from the master).
    std::string caps(ops.size() * wire::kCapBytes, '\0');
    for (size_t i = 0; i < ops.size(); ++i) {
      wire::EncodeCapability(ops[i].cap, reinterpret_cast<uint8_t*>(caps.data()) +
                                             i * wire::kCapBytes);
    }
    b += caps;
  }
  return b + payload;
}

wire::Capability ToWire(const pb::Capability& c) {
  wire::Capability w;
  w.expires_unix_ms = c.expires_unix_ms();
  w.rights = static_cast<uint8_t>(c.rights());
  const uint64_t lo = c.tag_lo(), hi = c.tag_hi();  // little-endian host
  std::memcpy(w.tag, &lo, 8);
  std::memcpy(w.tag + 8, &hi, 8);
  return w;
}

// A node's proof of its key for the master's node RPCs.
pb::NodeAuth Auth(const std::string& key, const char* purpose,
                  const std::string& name, uint32_t id, uint64_t incarnation) {
  pb::NodeAuth a;
  a.set_unix_ms(absl::ToUnixMillis(absl::Now()));
  a.set_proof(NodeProof(HmacSha256(key), purpose, name, id, incarnation, a.unix_ms()));
  return a;
}

std::string Session(uint64_t id) {
  std::string s(wire::kSessionBytes, '\0');
  wire::EncodeSession(id, reinterpret_cast<uint8_t*>(s.data()));
  return s;
}

struct Response {
  wire::FrameHeader h;
  std::vector<wire::OpDesc> ops;
  std::string payload;
};

// The server's next frame; nullopt-like error when it closed instead.
absl::StatusOr<Response> ReadFrame(int fd, absl::Duration within = kSlack) {
  const absl::Time deadline = absl::Now() + within;
  uint8_t hdr[wire::kHeaderBytes];
  absl::Status s = RecvAll(fd, hdr, sizeof(hdr), deadline);
  if (!s.ok()) return s;
  absl::StatusOr<wire::FrameHeader> h = wire::DecodeHeader(hdr);
  if (!h.ok()) return h.status();
  Response r;
  r.h = *h;
  std::string table(size_t{h->op_count} * wire::kOpBytes, '\0');
  s = RecvAll(fd, table.data(), table.size(), deadline);
  if (!s.ok()) return s;
  for (size_t i = 0; i < h->op_count; ++i) {
    r.ops.push_back(wire::DecodeOp(reinterpret_cast<const uint8_t*>(table.data()) +
                                   i * wire::kOpBytes));
  }
  if (h->payload_bytes > (64u << 20)) return absl::DataLossError("huge payload");
  r.payload.resize(h->payload_bytes);
  s = RecvAll(fd, r.payload.data(), r.payload.size(), deadline);
  if (!s.ok()) return s;
  return r;
}

// Writes `slot` (a PutStart slot with its write capability) over the
// node's TCP data plane at `addr`, as a client does, and returns the write
// receipt the node answers with.
std::string WriteForReceipt(const std::string& addr, const pb::PutSlot& slot) {
  REQUIRE(slot.state() == pb::SLOT_ALLOCATED);
  wire::OpDesc op;
  op.region_id = slot.location().region_id();
  op.addr = slot.location().addr();
  op.length = slot.location().length();
  op.generation = slot.location().generation();
  op.cap = ToWire(slot.capability());
  Socket s = Dial(addr);
  Send(s.fd(), EncodeFrame(wire::FrameType::kWriteRequest, {op}, op.length,
                           std::string(op.length, 'w')));
  absl::StatusOr<Response> r = ReadFrame(s.fd());
  REQUIRE(r.ok());
  REQUIRE(r->h.type == wire::FrameType::kWriteResponse);
  REQUIRE(r->ops.size() == 1);
  REQUIRE(r->ops[0].status == 0);
  REQUIRE(r->payload.size() == wire::kReceiptBytes);
  return r->payload;
}

// The reason a master's refusal carries (common/status_reason.h).
StatusReason ReasonOfGrpc(const grpc::Status& s) {
  return ReasonOf(FromGrpcStatus(s));
}

// Sends `bytes` on a fresh connection and classifies the answer: a kError
// frame (then the server must close), or a response whose ops carry
// statuses; `expect_error_frame` requires the former.
Outcome DataExchange(const std::string& addr, const std::string& bytes,
                     bool expect_error_frame,
                     wire::FrameType expect_type = wire::FrameType::kError) {
  Socket s = Dial(addr);
  Send(s.fd(), bytes);
  Outcome o;
  absl::StatusOr<Response> r = ReadFrame(s.fd());
  if (!r.ok()) {
    // Closed without an answer (e.g. after a truncated frame).
    o.closed = true;
    return o;
  }
  if (r->h.type == wire::FrameType::kError) {
    o.error = true;
    INFO("kError: " << r->payload);
    CHECK(r->h.op_count == 0);
    Drained d = Drain(s.fd(), kSlack);
    CHECK(d.closed);  // the server closes after kError
    o.closed = d.closed;
    CHECK(expect_error_frame);
    return o;
  }
  CHECK_FALSE(expect_error_frame);
  CHECK(r->h.type == expect_type);
  CHECK(r->h.request_id == 42);
  for (const auto& op : r->ops) o.error |= op.status != 0;
  return o;
}

// ---------------------------------------------------------------- cluster

struct Blocks {
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> data;
};

std::vector<std::string> Keys(size_t n, const std::string& model) {
  KeyNamespace ns;
  ns.model = model;
  BlockKeyBuilder b(ns, 16);
  std::vector<int32_t> tokens(n * 16);
  std::iota(tokens.begin(), tokens.end(), 1);
  return b.Keys(tokens);
}

struct Cluster {
  std::string dir = TempDir("hostile");
  MasterProcess master;
  StorageProcess node;
  std::unique_ptr<Client> client;      // tcp
  std::unique_ptr<Client> shm_client;  // same-host shared memory
  std::shared_ptr<grpc::Channel> master_ch;
  std::unique_ptr<pb::MasterService::Stub> master_stub;
  std::unique_ptr<pb::StorageControl::Stub> control_stub;
  pb::NodeInfo info;  // the node as the master lists it
  Blocks known;       // stored before the first case
  pb::Location known_loc;
  pb::Capability known_cap;  // read permission from the lookup
  int fresh = 0;
  bool hybrid = false;

  explicit Cluster(bool hybrid_node) : hybrid(hybrid_node) {
    auto m = MasterProcess::Start(dir + "/master", "127.0.0.1:0");
    REQUIRE(m.ok());
    master = std::move(*m);
    std::vector<std::string> flags = {
        absl::StrCat("--io_timeout_ms=", kIoTimeoutMs),
        absl::StrCat("--idle_timeout_ms=", kIdleTimeoutMs)};
    if (hybrid) {
      flags.insert(flags.end(),
                   {"--device=hybrid", "--capacity_path=" + dir + "/capacity.dat",
                    "--capacity_bytes=64M", "--staging_bytes=8M",
                    "--write_buffer_bytes=4M", "--io_queue_depth=16"});
    } else {
      flags.push_back("--dram_bytes=64M");
    }
    auto s = StorageProcess::Start(master.address, "hostile-node", flags);
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    node = std::move(*s);
    ClientOptions o;
    o.master_address = master.address;
    client = std::move(*Client::Create(o));
    o.transport = TransportKind::kShm;
    auto sc = Client::Create(o);
    REQUIRE(sc.ok());
    shm_client = std::move(*sc);
    master_ch = NewChannel(master.address);
    master_stub = pb::MasterService::NewStub(master_ch);
    control_stub = pb::StorageControl::NewStub(NewChannel(node.control_address));
    WaitAlive();
    known.keys = Keys(2, "known");
    known.data = {RandomBytes(kBlockBytes, 1), RandomBytes(kBlockBytes, 2)};
    PutOrRetry(*client, known);
    pb::BatchLookupRequest lr;
    lr.add_keys(known.keys[0]);
    pb::BatchLookupResponse lp;
    grpc::ClientContext ctx;
    REQUIRE(master_stub->BatchLookup(&ctx, lr, &lp).ok());
    REQUIRE(lp.results(0).found());
    known_loc = lp.results(0).location();
    known_cap = lp.results(0).capability();
  }

  void WaitAlive() {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      pb::ListNodesResponse r;
      grpc::ClientContext ctx;
      if (master_stub->ListNodes(&ctx, {}, &r).ok()) {
        for (const auto& n : r.nodes()) {
          if (n.alive() && n.data_address() == node.data_address) {
            info = n;
            return;
          }
        }
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL("the storage node never became alive");
  }

  // A hybrid node's small write buffer may refuse a write for a moment.
  void PutOrRetry(Client& c, const Blocks& b) {
    std::vector<ConstBuffer> in;
    for (const auto& d : b.data) in.push_back({d.data(), d.size()});
    const absl::Time deadline = absl::Now() + kSlack;
    while (true) {
      auto r = c.Put(b.keys, in);
      INFO(r.status().ToString());
      REQUIRE(r.ok());
      if (r->stored + r->skipped == b.keys.size()) return;
      for (const auto& e : r->errors) {
        INFO(e.ToString());
        REQUIRE((e.ok() || e.code() == absl::StatusCode::kResourceExhausted));
      }
      REQUIRE(absl::Now() < deadline);
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  void GetAndCompare(Client& c, const Blocks& b) {
    std::vector<std::vector<uint8_t>> out;
    std::vector<MutableBuffer> bufs;
    for (const auto& d : b.data) out.emplace_back(d.size(), 0xEE);
    for (auto& o : out) bufs.push_back({o.data(), o.size()});
    auto r = c.Get(b.keys, bufs);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    INFO(r->stop_reason.ToString());
    REQUIRE(r->loaded == b.keys.size());
    for (size_t i = 0; i < b.keys.size(); ++i) REQUIRE(out[i] == b.data[i]);
  }

  // Both daemons alive; a correct Put and Get work, byte for byte; the block
  // stored before the first case still reads back.
  void Healthy(bool shm = false) {
    REQUIRE(master.daemon.Alive());
    REQUIRE(node.daemon.Alive());
    Client& c = shm ? *shm_client : *client;
    Blocks b;
    b.keys = Keys(1, absl::StrCat("fresh-", fresh));
    b.data = {RandomBytes(kBlockBytes, 1000 + fresh)};
    ++fresh;
    PutOrRetry(c, b);
    GetAndCompare(c, b);
    GetAndCompare(c, known);
  }

  std::function<void()> HealthyFn() {
    return [this] { Healthy(); };
  }

  // Runs a group of cases, checking health after each; prints the summary.
  void Run(const std::string& port, const std::vector<Case>& cases,
           bool shm_check = false) {
    Tally t;
    t.port = port;
    for (const Case& c : cases) {
      INFO("port " << port << " case " << c.name);
      const absl::Time start = absl::Now();
      Outcome o = c.run();
      ++t.thrown;
      t.errors += o.error ? 1 : 0;
      t.closed += o.closed ? 1 : 0;
      Healthy(shm_check);
      const absl::Duration took = absl::Now() - start;
      if (took > absl::Milliseconds(300)) {
        std::printf("hostile-client %s/%s took %s\n", port.c_str(), c.name.c_str(),
                    absl::FormatDuration(took).c_str());
      }
    }
    t.Print();
  }

  // Waits until the daemon's descriptors are back near `baseline` (closed
  // connections are reaped asynchronously).
  void RequireFdsSettle(pid_t pid, int baseline, const char* who) {
    const absl::Time deadline = absl::Now() + kSlack;
    int now = OpenFds(pid);
    while (now > baseline + 16 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
      now = OpenFds(pid);
    }
    INFO(who << " descriptors: " << baseline << " -> " << now);
    REQUIRE(now <= baseline + 16);
  }

  uint64_t NodeOpenConnections() {
    pb::StorageStatsResponse r;
    grpc::ClientContext ctx;
    REQUIRE(control_stub->GetStats(&ctx, {}, &r).ok());
    return r.open_connections();
  }
};

const std::vector<std::string> kMasterMethods = {
    "ListNodes",   "GetStats",       "RegisterNode",  "Heartbeat",
    "DeregisterNode", "PutStart",    "PutCommit",     "PutAbort",
    "BatchLookup", "Remove",         "BeginReconcile", "ReconcileNode",
    "ReportMissing", "ListObjects"};
const std::vector<std::string> kControlMethods = {"GetStats", "ListExtents",
                                                  "RequestReconcile"};

// ---------------------------------------------------------------- master

pb::RegisterNodeRequest FakeNode(const std::string& name) {
  pb::RegisterNodeRequest r;
  r.set_name(name);
  r.set_incarnation(7);
  r.set_data_address("127.0.0.1:1");
  r.set_control_address("127.0.0.1:1");
  pb::RegionInfo* region = r.add_regions();
  region->set_region_id(1);
  // Too small for the health checks' blocks: nothing of theirs lands here.
  // (One caller may hold a quarter of a node in pending puts: 4 KiB.)
  region->set_capacity_bytes(16384);
  region->set_alignment(4096);
  region->set_device_kind("dram");
  return r;
}

std::vector<Case> MasterSemanticCases(Cluster& c) {
  auto stub = [&c]() { return c.master_stub.get(); };
  auto keys_of = [](int n, size_t bytes) {
    std::vector<std::string> k;
    for (int i = 0; i < n; ++i) {
      std::string s = absl::StrCat("hostile-", i, "-");
      s.resize(std::max(bytes, s.size()), 'k');
      k.push_back(s);
    }
    return k;
  };
  auto lookup = [&c](const std::vector<std::string>& keys) {
    pb::BatchLookupRequest r;
    for (const auto& k : keys) r.add_keys(k);
    pb::BatchLookupResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = c.master_stub->BatchLookup(&ctx, r, &resp);
    return std::make_pair(s, resp);
  };
  auto put_start = [&c](const std::vector<std::string>& keys,
                        const std::vector<uint64_t>& lengths,
                        const std::string& parent = "", uint32_t node = 0) {
    pb::PutStartRequest r;
    for (const auto& k : keys) r.add_keys(k);
    for (uint64_t l : lengths) r.add_lengths(l);
    r.set_parent_key(parent);
    r.set_preferred_node_id(node);
    pb::PutStartResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = c.master_stub->PutStart(&ctx, r, &resp);
    return std::make_pair(s, resp);
  };
  auto expect = [](const grpc::Status& s, grpc::StatusCode code) {
    INFO(s.error_message());
    CHECK(s.error_code() == code);
    return FromStatus(s);
  };
  using grpc::StatusCode;
  std::vector<Case> v;
  v.push_back({"lookup_no_keys", [=] {
                 return expect(lookup({}).first, StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"lookup_empty_key", [=] {
                 return expect(lookup({"a", ""}).first, StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"lookup_oversize_key", [=] {
                 return expect(lookup({std::string(257, 'k')}).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"lookup_100k_keys", [=] {
                 return expect(lookup(keys_of(100000, 16)).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"lookup_1024_duplicate_keys", [=, &c] {
                 auto [s, r] = lookup(std::vector<std::string>(1024, c.known.keys[0]));
                 CHECK(s.ok());
                 CHECK(r.hit_prefix_length() == 1024);
                 return FromStatus(s);
               }});
  v.push_back({"put_duplicate_keys", [=] {
                 return expect(put_start({"d", "d"}, {4096, 4096}).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_length_0", [=] {
                 return expect(put_start({"z"}, {0}).first, StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_length_2^63", [=] {
                 return expect(put_start({"z"}, {uint64_t{1} << 63}).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_length_2^64-1_twice", [=] {
                 // Lengths whose sum wraps around.
                 return expect(put_start({"y", "z"}, {~uint64_t{0}, 2}).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_lengths_count_mismatch", [=] {
                 return expect(put_start({"y", "z"}, {4096}).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_100k_keys", [=] {
                 std::vector<std::string> k = keys_of(100000, 16);
                 return expect(put_start(k, std::vector<uint64_t>(k.size(), 4096)).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_oversize_and_empty_keys", [=] {
                 Outcome o = expect(put_start({std::string(257, 'k')}, {1}).first,
                                    StatusCode::INVALID_ARGUMENT);
                 o |= expect(put_start({""}, {1}).first, StatusCode::INVALID_ARGUMENT);
                 return o;
               }});
  v.push_back({"put_parent_is_own_key", [=] {
                 return expect(put_start({"p", "q"}, {4096, 4096}, "q").first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_parent_not_stored", [=] {
                 return expect(put_start({"p"}, {4096}, "never-stored").first,
                               StatusCode::FAILED_PRECONDITION);
               }});
  v.push_back({"put_parent_oversize", [=] {
                 return expect(put_start({"p"}, {4096}, std::string(1 << 20, 'p')).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_unknown_preferred_node", [=] {
                 return expect(put_start({"p"}, {4096}, "", 0xfffffff0u).first,
                               StatusCode::NOT_FOUND);
               }});
  v.push_back({"put_more_than_the_node_holds", [=] {
                 // 1024 objects of 1 GiB on a 64 MiB node.
                 std::vector<std::string> k = keys_of(1024, 20);
                 auto [s, r] = put_start(k, std::vector<uint64_t>(k.size(), 1 << 30));
                 CHECK(!s.ok());
                 return FromStatus(s);
               }});
  v.push_back({"commit_bogus_put_ids", [=] {
                 Outcome o;
                 for (uint64_t id : {uint64_t{0}, uint64_t{1}, uint64_t{12345678},
                                     ~uint64_t{0}}) {
                   pb::PutCommitRequest r;
                   r.set_put_id(id);
                   r.add_failed_indexes(0);
                   pb::PutCommitResponse resp;
                   grpc::ClientContext ctx;
                   o |= expect(stub()->PutCommit(&ctx, r, &resp), StatusCode::NOT_FOUND);
                 }
                 return o;
               }});
  // Node-confirmed commits (docs/ha.md): a commit of a slot needs the
  // node's receipt for exactly that slot's bytes, else nothing is listed.
  // The puts go to the real node (the fake node of ReconcileCases, alive
  // meanwhile, has no data plane).
  auto commit = [&c](const pb::PutStartResponse& start,
                     const std::vector<std::string>& receipts) {
    pb::PutCommitRequest r;
    r.set_put_id(start.put_id());
    for (const std::string& rc : receipts) r.add_receipts(rc);
    pb::PutCommitResponse resp;
    grpc::ClientContext ctx;
    return c.master_stub->PutCommit(&ctx, r, &resp);
  };
  auto refused_unlisted = [=](const grpc::Status& s,
                              const std::vector<std::string>& keys) {
    INFO(s.error_message());
    CHECK(s.error_code() == StatusCode::PERMISSION_DENIED);
    CHECK(ReasonOfGrpc(s) == StatusReason::kWriteReceiptInvalid);
    auto [ls, found] = lookup(keys);
    REQUIRE(ls.ok());
    for (int i = 0; i < found.results_size(); ++i) {
      CHECK_FALSE(found.results(i).found());
    }
    return FromStatus(s);
  };
  auto gone = [&c](const pb::PutStartResponse& start) {
    // A refused commit ends its put: its space is free again.
    pb::PutAbortRequest a;
    a.set_put_id(start.put_id());
    pb::PutAbortResponse ar;
    grpc::ClientContext ctx;
    CHECK(c.master_stub->PutAbort(&ctx, a, &ar).error_code() ==
          grpc::StatusCode::NOT_FOUND);
  };
  v.push_back({"commit_a_slot_never_written", [=, &c] {
                 auto [s, start] = put_start({"hostile-phantom"}, {4096}, "",
                                             c.info.node_id());
                 REQUIRE(s.ok());
                 REQUIRE(start.put_id() != 0);
                 Outcome o =
                     refused_unlisted(commit(start, {}), {"hostile-phantom"});
                 gone(start);
                 return o;
               }});
  v.push_back(
      {"commit_with_forged_or_empty_receipts", [=, &c] {
         Outcome o;
         for (int variant = 0; variant < 3; ++variant) {
           const std::string key = absl::StrCat("hostile-forged-", variant);
           auto [s, start] = put_start({key}, {4096}, "", c.info.node_id());
           REQUIRE(s.ok());
           REQUIRE(start.put_id() != 0);
           const pb::Location& loc = start.slots(0).location();
           // Exactly the slot's fields, under a key not the node's.
           const std::string forged = master::WriteReceiptFor(
               HmacSha256(std::string(kNodeKeyBytes, 'f')), loc);
           const std::vector<std::string> receipts[] = {
               {forged}, {""}, {std::string(wire::kReceiptBytes, '\0')}};
           o |= refused_unlisted(commit(start, receipts[variant]), {key});
           gone(start);
         }
         return o;
       }});
  v.push_back({"commit_with_another_slots_receipt", [=, &c] {
                 auto [s, start] =
                     put_start({"hostile-rc-a", "hostile-rc-b"}, {4096, 4096},
                               "", c.info.node_id());
                 REQUIRE(s.ok());
                 REQUIRE(start.put_id() != 0);
                 // Slot a is written; b is not, and carries a's receipt.
                 const std::string ra =
                     WriteForReceipt(c.node.data_address, start.slots(0));
                 Outcome o = refused_unlisted(commit(start, {ra, ra}),
                                              {"hostile-rc-a", "hostile-rc-b"});
                 gone(start);
                 return o;
               }});
  v.push_back(
      {"commit_with_an_earlier_generations_receipt", [=, &c] {
         const std::string key = "hostile-old-generation";
         auto [s1, first] = put_start({key}, {4096}, "", c.info.node_id());
         REQUIRE(s1.ok());
         REQUIRE(first.put_id() != 0);
         const std::string old =
             WriteForReceipt(c.node.data_address, first.slots(0));
         {
           pb::PutAbortRequest a;
           a.set_put_id(first.put_id());
           pb::PutAbortResponse ar;
           grpc::ClientContext ctx;
           REQUIRE(c.master_stub->PutAbort(&ctx, a, &ar).ok());
         }
         auto [s2, second] = put_start({key}, {4096}, "", c.info.node_id());
         REQUIRE(s2.ok());
         REQUIRE(second.put_id() != 0);
         REQUIRE(second.slots(0).location().generation() !=
                 first.slots(0).location().generation());
         Outcome o = refused_unlisted(commit(second, {old}), {key});
         gone(second);
         // The same steps with the node's receipt for the slot
         // written: committed and listed.
         auto [s3, third] = put_start({key}, {4096}, "", c.info.node_id());
         REQUIRE(s3.ok());
         REQUIRE(third.put_id() != 0);
         const std::string good =
             WriteForReceipt(c.node.data_address, third.slots(0));
         grpc::Status ok = commit(third, {good});
         INFO(ok.error_message());
         CHECK(ok.ok());
         CHECK(lookup({key}).second.results(0).found());
         return o;
       }});
  v.push_back({"abort_bogus_put_ids", [=] {
                 Outcome o;
                 for (uint64_t id : {uint64_t{0}, ~uint64_t{0}}) {
                   pb::PutAbortRequest r;
                   r.set_put_id(id);
                   pb::PutAbortResponse resp;
                   grpc::ClientContext ctx;
                   o |= expect(stub()->PutAbort(&ctx, r, &resp), StatusCode::NOT_FOUND);
                 }
                 return o;
               }});
  v.push_back({"commit_failed_index_out_of_range_then_twice", [=, &c] {
                 auto [s, start] = put_start({"hostile-commit-a", "hostile-commit-b"},
                                             {4096, 4096});
                 REQUIRE(s.ok());
                 REQUIRE(start.put_id() != 0);
                 Outcome o;
                 for (uint32_t bad : {2u, 1000000u, ~0u}) {
                   pb::PutCommitRequest r;
                   r.set_put_id(start.put_id());
                   r.add_failed_indexes(0);
                   r.add_failed_indexes(bad);
                   pb::PutCommitResponse resp;
                   grpc::ClientContext ctx;
                   o |= expect(stub()->PutCommit(&ctx, r, &resp),
                               StatusCode::INVALID_ARGUMENT);
                 }
                 // Still pending: aborted once, then unknown.
                 pb::PutAbortRequest a;
                 a.set_put_id(start.put_id());
                 pb::PutAbortResponse ar;
                 {
                   grpc::ClientContext ctx;
                   CHECK(stub()->PutAbort(&ctx, a, &ar).ok());
                 }
                 grpc::ClientContext ctx;
                 o |= expect(stub()->PutAbort(&ctx, a, &ar), StatusCode::NOT_FOUND);
                 CHECK_FALSE(lookup({"hostile-commit-a"}).second.results(0).found());
                 (void)c;
                 return o;
               }});
  v.push_back({"remove_no_keys_100k_keys_empty_key", [=] {
                 Outcome o;
                 for (const auto& keys : {std::vector<std::string>{},
                                          keys_of(100000, 8),
                                          std::vector<std::string>{""}}) {
                   pb::RemoveRequest r;
                   for (const auto& k : keys) r.add_keys(k);
                   pb::RemoveResponse resp;
                   grpc::ClientContext ctx;
                   o |= expect(stub()->Remove(&ctx, r, &resp), StatusCode::INVALID_ARGUMENT);
                 }
                 return o;
               }});
  v.push_back({"report_missing_other_keys_locations", [=, &c] {
                 // The known block's key with the location of another key,
                 // and unknown keys with the known block's location: no
                 // listing may be dropped.
                 auto [s0, fresh] = lookup({c.known.keys[1]});
                 REQUIRE(fresh.results(0).found());
                 pb::ReportMissingRequest r;
                 r.add_keys(c.known.keys[0]);
                 *r.add_locations() = fresh.results(0).location();
                 r.add_keys("not-a-key");
                 *r.add_locations() = c.known_loc;
                 pb::Location shifted = c.known_loc;
                 shifted.set_generation(shifted.generation() + 1);
                 r.add_keys(c.known.keys[0]);
                 *r.add_locations() = shifted;
                 pb::ReportMissingResponse resp;
                 grpc::ClientContext ctx;
                 grpc::Status s = stub()->ReportMissing(&ctx, r, &resp);
                 REQUIRE(s.ok());
                 for (bool d : resp.dropped()) CHECK_FALSE(d);
                 CHECK(lookup(c.known.keys).second.hit_prefix_length() == 2);
                 return Outcome{};
               }});
  v.push_back({"report_missing_count_mismatch", [=] {
                 pb::ReportMissingRequest r;
                 r.add_keys("a");
                 r.add_keys("b");
                 r.add_locations();
                 pb::ReportMissingResponse resp;
                 grpc::ClientContext ctx;
                 return expect(stub()->ReportMissing(&ctx, r, &resp),
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"register_malformed_nodes", [=] {
                 Outcome o;
                 std::vector<pb::RegisterNodeRequest> bad;
                 auto add = [&](const std::function<void(pb::RegisterNodeRequest&)>& f) {
                   pb::RegisterNodeRequest r = FakeNode("hostile-malformed");
                   f(r);
                   bad.push_back(r);
                 };
                 add([](auto& r) { r.set_name(std::string(1 << 20, 'n')); });
                 add([](auto& r) { r.set_name(""); });
                 add([](auto& r) { r.set_incarnation(0); });
                 add([](auto& r) { r.set_data_address("no-port"); });
                 add([](auto& r) { r.set_control_address("host:99999999"); });
                 add([](auto& r) { r.clear_regions(); });
                 add([](auto& r) { r.mutable_regions(0)->set_alignment(3); });
                 add([](auto& r) { r.mutable_regions(0)->set_alignment(0); });
                 add([](auto& r) { r.mutable_regions(0)->set_capacity_bytes(0); });
                 add([](auto& r) { *r.add_regions() = r.regions(0); });
                 add([](auto& r) {
                   for (int i = 0; i < 100000; ++i) {
                     pb::RegionInfo* g = r.add_regions();
                     g->set_region_id(i + 2);
                     g->set_capacity_bytes(4096);
                     g->set_alignment(4096);
                   }
                 });
                 for (const auto& r : bad) {
                   pb::RegisterNodeResponse resp;
                   grpc::ClientContext ctx;
                   o |= expect(stub()->RegisterNode(&ctx, r, &resp),
                               StatusCode::INVALID_ARGUMENT);
                 }
                 return o;
               }});
  v.push_back({"register_huge_fields", [=] {
                 // 4 MiB of transport parameters, 1 MiB addresses: refused
                 // by a size cap, or accepted; either way the node record
                 // goes again at once (it could not be reached anyway).
                 Outcome o;
                 std::vector<pb::RegisterNodeRequest> regs;
                 regs.push_back(FakeNode("hostile-params"));
                 for (int i = 0; i < 4; ++i) {
                   (*regs.back().mutable_transport_params())[absl::StrCat("p", i)] =
                       std::string(1 << 20, 'x');
                 }
                 regs.push_back(FakeNode("hostile-address"));
                 regs.back().set_data_address(std::string(1 << 20, 'a') + ":1");
                 regs.push_back(FakeNode("hostile-control-address"));
                 regs.back().set_control_address(std::string(1 << 20, 'a') + ":1");
                 for (const auto& r : regs) {
                   pb::RegisterNodeResponse resp;
                   grpc::ClientContext ctx;
                   grpc::Status s = stub()->RegisterNode(&ctx, r, &resp);
                   o |= FromStatus(s);
                   if (!s.ok()) {
                     CHECK(s.error_code() == StatusCode::INVALID_ARGUMENT);
                     continue;
                   }
                   pb::DeregisterNodeRequest d;
                   d.set_node_id(resp.node_id());
                   d.set_incarnation(r.incarnation());
                   *d.mutable_auth() = Auth(resp.node_key(), "deregister", r.name(),
                                            resp.node_id(), r.incarnation());
                   pb::DeregisterNodeResponse dr;
                   grpc::ClientContext dctx;
                   CHECK(stub()->DeregisterNode(&dctx, d, &dr).ok());
                 }
                 // ListNodes (hymctl status) still answers.
                 pb::ListNodesResponse ln;
                 grpc::ClientContext lctx;
                 CHECK(stub()->ListNodes(&lctx, {}, &ln).ok());
                 return o;
               }});
  v.push_back({"heartbeat_unknown_and_wrong_incarnation", [=, &c] {
                 Outcome o;
                 for (auto [id, inc] : {std::make_pair(0xfffffff0u, uint64_t{1}),
                                        std::make_pair(c.info.node_id(),
                                                       c.info.incarnation() + 1)}) {
                   pb::HeartbeatRequest r;
                   r.set_node_id(id);
                   r.set_incarnation(inc);
                   pb::HeartbeatResponse resp;
                   grpc::ClientContext ctx;
                   REQUIRE(stub()->Heartbeat(&ctx, r, &resp).ok());
                   CHECK(resp.reregister());
                   o.error = true;  // told to register
                 }
                 return o;
               }});
  v.push_back({"deregister_unknown_and_wrong_incarnation", [=, &c] {
                 Outcome o;
                 pb::DeregisterNodeRequest r;
                 pb::DeregisterNodeResponse resp;
                 r.set_node_id(0xfffffff0u);
                 {
                   grpc::ClientContext ctx;
                   o |= expect(stub()->DeregisterNode(&ctx, r, &resp), StatusCode::NOT_FOUND);
                 }
                 // The real node's id without its node key.
                 r.set_node_id(c.info.node_id());
                 r.set_incarnation(c.info.incarnation() + 1);
                 grpc::ClientContext ctx;
                 o |= expect(stub()->DeregisterNode(&ctx, r, &resp),
                             StatusCode::PERMISSION_DENIED);
                 return o;
               }});
  v.push_back({"begin_reconcile_unknown_and_wrong_incarnation", [=, &c] {
                 Outcome o;
                 pb::BeginReconcileRequest r;
                 pb::BeginReconcileResponse resp;
                 r.set_node_id(0xfffffff0u);
                 {
                   grpc::ClientContext ctx;
                   o |= expect(stub()->BeginReconcile(&ctx, r, &resp), StatusCode::NOT_FOUND);
                 }
                 r.set_node_id(c.info.node_id());
                 r.set_incarnation(c.info.incarnation() + 1);
                 grpc::ClientContext ctx;
                 o |= expect(stub()->BeginReconcile(&ctx, r, &resp),
                             StatusCode::PERMISSION_DENIED);
                 return o;
               }});
  v.push_back({"list_objects_page_sizes", [=] {
                 Outcome o;
                 for (uint32_t page : {0u, 1u, 65536u, 65537u, 0x7fffffffu, ~0u}) {
                   for (uint32_t node : {0u, 0xfffffff0u}) {
                     pb::ListObjectsRequest r;
                     r.set_page_size(page);
                     r.set_node_id(node);
                     grpc::ClientContext ctx;
                     auto reader = stub()->ListObjects(&ctx, r);
                     pb::ListObjectsResponse resp;
                     size_t objects = 0;
                     while (reader->Read(&resp)) {
                       CHECK(resp.objects_size() > 0);
                       if (page != 0) CHECK(resp.objects_size() <= int(std::min(page, 65536u)));
                       objects += resp.objects_size();
                     }
                     grpc::Status s = reader->Finish();
                     CHECK(s.ok());
                     if (node == 0) CHECK(objects >= 2);
                     if (node != 0) CHECK(objects == 0);
                   }
                 }
                 return o;
               }});
  v.push_back({"list_objects_cancelled", [=, &c] {
                 Outcome o;
                 for (int i = 0; i < 20; ++i) {
                   pb::ListObjectsRequest r;
                   r.set_page_size(1);
                   o |= FromStatus(RawCall(c.master_ch, "/hymcache.v1.MasterService/ListObjects",
                                           {Ser(r)},
                                           RawCallOptions{absl::Seconds(15), true})
                                       .status);
                 }
                 return o;
               }});
  return v;
}

// Reconciliation cases against a node record of the test's own (so the
// real node's reconciliation is never superseded): a fake node with one
// committed 4 KiB listing, which no reconciliation stream that the node did
// not complete may drop.
struct FakeReconcile {
  Cluster& c;
  pb::RegisterNodeRequest reg = FakeNode("hostile-reconciler");
  uint32_t id = 0;
  std::string key;  // the node key the master issued
  std::string listing = "hostile-fake-listing";
  pb::Location loc;

  explicit FakeReconcile(Cluster& cluster) : c(cluster) {
    pb::RegisterNodeResponse resp;
    grpc::ClientContext ctx;
    REQUIRE(c.master_stub->RegisterNode(&ctx, reg, &resp).ok());
    id = resp.node_id();
    key = resp.node_key();
    {
      grpc::ClientContext hctx;  // proves the key: the node is placeable
      pb::HeartbeatResponse hb;
      REQUIRE(c.master_stub
                  ->Heartbeat(&hctx, master::ProvingHeartbeat(reg, resp), &hb)
                  .ok());
    }
    pb::PutStartRequest ps;
    ps.add_keys(listing);
    ps.add_lengths(4096);
    ps.set_preferred_node_id(id);
    pb::PutStartResponse psr;
    grpc::ClientContext pctx;
    grpc::Status s = c.master_stub->PutStart(&pctx, ps, &psr);
    INFO(s.error_message());
    REQUIRE(s.ok());
    REQUIRE(psr.slots(0).state() == pb::SLOT_ALLOCATED);
    REQUIRE(psr.node().node_id() == id);
    loc = psr.slots(0).location();
    pb::PutCommitRequest pc;
    pc.set_put_id(psr.put_id());
    // This node holds no bytes; it signs the receipt a real one would.
    master::AddWriteReceipts(psr, HmacSha256(key), &pc);
    pb::PutCommitResponse pcr;
    grpc::ClientContext cctx;
    REQUIRE(c.master_stub->PutCommit(&cctx, pc, &pcr).ok());
    REQUIRE(pcr.committed() == 1);
  }
  ~FakeReconcile() {
    pb::DeregisterNodeRequest d;
    d.set_node_id(id);
    d.set_incarnation(reg.incarnation());
    *d.mutable_auth() = Auth(key, "deregister", reg.name(), id, reg.incarnation());
    pb::DeregisterNodeResponse dr;
    grpc::ClientContext ctx;
    c.master_stub->DeregisterNode(&ctx, d, &dr);
  }

  uint64_t Begin() {
    pb::BeginReconcileRequest r;
    r.set_node_id(id);
    r.set_incarnation(reg.incarnation());
    *r.mutable_auth() = Auth(key, "reconcile", reg.name(), id, reg.incarnation());
    pb::BeginReconcileResponse resp;
    grpc::ClientContext ctx;
    REQUIRE(c.master_stub->BeginReconcile(&ctx, r, &resp).ok());
    return resp.epoch();
  }
  pb::ReconcileNodeRequest First(uint64_t epoch) {
    pb::ReconcileNodeRequest r;
    r.set_node_id(id);
    r.set_incarnation(reg.incarnation());
    r.set_epoch(epoch);
    *r.mutable_auth() = Auth(key, "reconcile", reg.name(), id, reg.incarnation());
    return r;
  }
  // The stream's outcome; the listing must survive every one of them.
  grpc::Status Stream(const std::vector<std::string>& messages,
                      RawCallOptions opt = {}) {
    grpc::Status s = RawCall(c.master_ch, "/hymcache.v1.MasterService/ReconcileNode",
                             messages, opt)
                         .status;
    return s;
  }
  bool Listed() {
    pb::BatchLookupRequest r;
    r.add_keys(listing);
    pb::BatchLookupResponse resp;
    grpc::ClientContext ctx;
    REQUIRE(c.master_stub->BatchLookup(&ctx, r, &resp).ok());
    // A node that misses heartbeats is not served, but still listed: ask
    // ListObjects.
    pb::ListObjectsRequest lr;
    lr.set_node_id(id);
    grpc::ClientContext lctx;
    auto reader = c.master_stub->ListObjects(&lctx, lr);
    pb::ListObjectsResponse page;
    bool found = false;
    while (reader->Read(&page)) {
      for (const auto& o : page.objects()) found |= o.key() == listing;
    }
    REQUIRE(reader->Finish().ok());
    return found;
  }
};

std::vector<Case> ReconcileCases(Cluster& c, FakeReconcile& f) {
  using grpc::StatusCode;
  auto expect = [&f](const grpc::Status& s, std::initializer_list<StatusCode> codes) {
    INFO(s.error_code() << ": " << s.error_message());
    bool any = false;
    for (StatusCode code : codes) any |= s.error_code() == code;
    CHECK(any);
    CHECK(f.Listed());
    return FromStatus(s);
  };
  auto extent = [](uint32_t region, uint64_t addr, uint64_t len, uint64_t gen) {
    pb::Location l;
    l.set_region_id(region);
    l.set_addr(addr);
    l.set_length(len);
    l.set_generation(gen);
    return l;
  };
  std::vector<Case> v;
  v.push_back(
      {"commit_with_another_nodes_receipt", [&, expect] {
         // A slot on the real node, "confirmed" by a receipt that
         // the fake node (whose key this client holds) signs for
         // its fields (under the real node's id, then its own):
         // not the placed node's.
         Outcome o;
         for (int variant = 0; variant < 2; ++variant) {
           const std::string key = absl::StrCat("hostile-other-node-", variant);
           pb::PutStartRequest ps;
           ps.add_keys(key);
           ps.add_lengths(4096);
           ps.set_preferred_node_id(c.info.node_id());
           pb::PutStartResponse start;
           {
             grpc::ClientContext ctx;
             REQUIRE(c.master_stub->PutStart(&ctx, ps, &start).ok());
           }
           REQUIRE(start.put_id() != 0);
           REQUIRE(start.node().node_id() == c.info.node_id());
           pb::Location loc = start.slots(0).location();
           if (variant == 1) loc.set_node_id(f.id);
           pb::PutCommitRequest r;
           r.set_put_id(start.put_id());
           r.add_receipts(master::WriteReceiptFor(HmacSha256(f.key), loc));
           pb::PutCommitResponse resp;
           grpc::ClientContext ctx;
           grpc::Status s = c.master_stub->PutCommit(&ctx, r, &resp);
           o |= expect(s, {StatusCode::PERMISSION_DENIED});
           CHECK(ReasonOfGrpc(s) == StatusReason::kWriteReceiptInvalid);
           pb::BatchLookupRequest lr;
           lr.add_keys(key);
           pb::BatchLookupResponse lookup;
           grpc::ClientContext lctx;
           REQUIRE(c.master_stub->BatchLookup(&lctx, lr, &lookup).ok());
           CHECK_FALSE(lookup.results(0).found());
         }
         return o;
       }});
  v.push_back({"reconcile_empty_stream", [&, expect] {
                 return expect(f.Stream({}), {StatusCode::INVALID_ARGUMENT});
               }});
  v.push_back({"reconcile_wrong_epoch", [&, expect] {
                 const uint64_t epoch = f.Begin();
                 Outcome o = expect(f.Stream({Ser(f.First(epoch + 1))}), {StatusCode::ABORTED});
                 o |= expect(f.Stream({Ser(f.First(0))}), {StatusCode::ABORTED});
                 return o;
               }});
  v.push_back({"reconcile_unknown_node_and_incarnation", [&, expect] {
                 pb::ReconcileNodeRequest r = f.First(f.Begin());
                 r.set_incarnation(r.incarnation() + 1);
                 // (Its proof names the registered incarnation.)
                 Outcome o = expect(f.Stream({Ser(r)}), {StatusCode::FAILED_PRECONDITION,
                                                         StatusCode::PERMISSION_DENIED});
                 r.set_node_id(0xfffffff0u);
                 o |= expect(f.Stream({Ser(r)}), {StatusCode::NOT_FOUND});
                 return o;
               }});
  v.push_back({"reconcile_absurd_extents", [&, expect, extent] {
                 Outcome o;
                 for (const pb::Location& bad :
                      {extent(1, 0, 0, 5), extent(1, 0, 4096, 0)}) {
                   pb::ReconcileNodeRequest r = f.First(f.Begin());
                   *r.add_extents() = f.loc;
                   *r.add_extents() = bad;
                   o |= expect(f.Stream({Ser(r)}), {StatusCode::INVALID_ARGUMENT});
                 }
                 // A generation twice.
                 pb::ReconcileNodeRequest r = f.First(f.Begin());
                 *r.add_extents() = f.loc;
                 *r.add_extents() = f.loc;
                 o |= expect(f.Stream({Ser(r)}), {StatusCode::INVALID_ARGUMENT});
                 return o;
               }});
  v.push_back({"reconcile_chunk_over_limit", [&, expect, extent] {
                 pb::ReconcileNodeRequest r = f.First(f.Begin());
                 *r.add_extents() = f.loc;
                 for (uint64_t i = 0; i < 65536; ++i) {
                   *r.add_extents() = extent(1, i << 12, 4096, (uint64_t{1} << 40) + i);
                 }
                 return expect(f.Stream({Ser(r)}), {StatusCode::INVALID_ARGUMENT});
               }});
  v.push_back({"reconcile_unsorted_and_huge_extents", [&, extent] {
                 // Accepted (the master compares by generation): what it
                 // does not list is handed back as unlisted.
                 pb::ReconcileNodeRequest r = f.First(f.Begin());
                 *r.add_extents() = extent(9, ~uint64_t{0} - 10, ~uint64_t{0}, ~uint64_t{0});
                 *r.add_extents() = extent(1, uint64_t{1} << 63, uint64_t{1} << 63, 3);
                 *r.add_extents() = f.loc;
                 *r.add_extents() = extent(0, 0, 1, 2);
                 r.set_last(true);
                 RawCallResult res =
                     RawCall(c.master_ch, "/hymcache.v1.MasterService/ReconcileNode", {Ser(r)});
                 INFO(res.status.error_message());
                 CHECK(res.status.ok());
                 REQUIRE(res.messages.size() == 1);
                 pb::ReconcileNodeResponse resp;
                 REQUIRE(resp.ParseFromString(res.messages[0]));
                 CHECK(resp.matched() == 1);
                 CHECK(resp.unlisted_count() == 3);
                 CHECK(f.Listed());
                 return Outcome{};
               }});
  v.push_back({"reconcile_message_after_last", [&, expect] {
                 pb::ReconcileNodeRequest r = f.First(f.Begin());
                 *r.add_extents() = f.loc;
                 r.set_last(true);
                 pb::ReconcileNodeRequest more;
                 return expect(f.Stream({Ser(r), Ser(more)}), {StatusCode::INVALID_ARGUMENT});
               }});
  v.push_back({"reconcile_ends_without_last", [&, expect] {
                 // Half-closed after a first message that is not the last.
                 return expect(f.Stream({Ser(f.First(f.Begin()))}), {StatusCode::ABORTED});
               }});
  v.push_back({"reconcile_garbage_after_first_message", [&, expect] {
                 // The node's first message, then bytes no parser accepts:
                 // the stream is broken, not complete; nothing is judged.
                 const std::string garbage("\x0a\xff\xff\xff\xff\x0f", 6);
                 return expect(f.Stream({Ser(f.First(f.Begin())), garbage}),
                               {StatusCode::INTERNAL, StatusCode::INVALID_ARGUMENT,
                                StatusCode::ABORTED, StatusCode::CANCELLED});
               }});
  v.push_back({"reconcile_cancelled_mid_stream", [&, expect] {
                 RawCallOptions o;
                 o.cancel = true;
                 o.before_cancel = absl::Milliseconds(200);
                 return expect(f.Stream({Ser(f.First(f.Begin()))}, o),
                               {StatusCode::CANCELLED});
               }});
  v.push_back({"reconcile_deadline_mid_stream", [&, expect] {
                 RawCallOptions o;
                 o.cancel = true;  // never half-closes: the deadline ends it
                 o.before_cancel = absl::Milliseconds(600);
                 o.timeout = absl::Milliseconds(300);
                 return expect(f.Stream({Ser(f.First(f.Begin()))}, o),
                               {StatusCode::DEADLINE_EXCEEDED, StatusCode::CANCELLED});
               }});
  return v;
}

// ---------------------------------------------------------------- node

std::vector<Case> ControlCases(Cluster& c) {
  std::vector<Case> v;
  v.push_back({"list_extents_page_sizes", [&c] {
                 for (uint32_t page : {0u, 1u, 65537u, ~0u}) {
                   pb::ListExtentsRequest r;
                   r.set_page_size(page);
                   grpc::ClientContext ctx;
                   auto reader = c.control_stub->ListExtents(&ctx, r);
                   pb::ListExtentsResponse resp;
                   size_t n = 0;
                   while (reader->Read(&resp)) {
                     CHECK(resp.extents_size() > 0);
                     if (page == 1) CHECK(resp.extents_size() == 1);
                     n += resp.extents_size();
                   }
                   CHECK(reader->Finish().ok());
                   CHECK(n >= 2);
                 }
                 return Outcome{};
               }});
  v.push_back({"list_extents_cancelled", [&c] {
                 Outcome o;
                 for (int i = 0; i < 20; ++i) {
                   pb::ListExtentsRequest r;
                   r.set_page_size(1);
                   RawCallOptions opt;
                   opt.cancel = true;
                   o |= FromStatus(RawCall(NewChannel(c.node.control_address),
                                           "/hymcache.v1.StorageControl/ListExtents",
                                           {Ser(r)}, opt)
                                       .status);
                 }
                 return o;
               }});
  v.push_back({"request_reconcile_x200", [&c] {
                 for (int i = 0; i < 200; ++i) {
                   pb::RequestReconcileResponse resp;
                   grpc::ClientContext ctx;
                   REQUIRE(c.control_stub->RequestReconcile(&ctx, {}, &resp).ok());
                 }
                 return Outcome{};
               }});
  return v;
}

std::vector<Case> DataCases(Cluster& c) {
  const std::string addr = c.node.data_address;
  const uint32_t region = c.known_loc.region_id();
  uint64_t capacity = 0;
  for (const auto& r : c.info.regions()) {
    if (r.region_id() == region) capacity = r.capacity_bytes();
  }
  REQUIRE(capacity > 0);
  auto op = [](uint32_t region, uint64_t addr, uint64_t len, uint64_t gen) {
    wire::OpDesc o;
    o.region_id = region;
    o.addr = addr;
    o.length = len;
    o.generation = gen;
    return o;
  };
  wire::OpDesc known = op(region, c.known_loc.addr(), c.known_loc.length(),
                          c.known_loc.generation());
  known.cap = ToWire(c.known_cap);
  using FT = wire::FrameType;
  auto raw_header = [](uint32_t magic, uint8_t version, uint8_t type, uint16_t ops,
                       uint64_t payload, uint32_t reserved = 0) {
    std::string h(wire::kHeaderBytes, '\0');
    std::memcpy(&h[0], &magic, 4);
    h[4] = static_cast<char>(version);
    h[5] = static_cast<char>(type);
    std::memcpy(&h[6], &ops, 2);
    std::memcpy(&h[16], &payload, 8);
    std::memcpy(&h[28], &reserved, 4);
    return h;
  };
  // A real allocation from the master, for the write cases.
  auto allocate = [&c](const std::string& key) {
    pb::PutStartRequest r;
    r.add_keys(key);
    r.add_lengths(4096);
    pb::PutStartResponse resp;
    grpc::ClientContext ctx;
    REQUIRE(c.master_stub->PutStart(&ctx, r, &resp).ok());
    REQUIRE(resp.slots(0).state() == pb::SLOT_ALLOCATED);
    return resp;
  };
  auto abort_put = [&c](uint64_t id) {
    pb::PutAbortRequest r;
    r.set_put_id(id);
    pb::PutAbortResponse resp;
    grpc::ClientContext ctx;
    CHECK(c.master_stub->PutAbort(&ctx, r, &resp).ok());
  };
  auto slot_op = [](const pb::PutStartResponse& r) {
    const pb::Location& l = r.slots(0).location();
    wire::OpDesc o;
    o.region_id = l.region_id();
    o.addr = l.addr();
    o.length = l.length();
    o.generation = l.generation();
    o.cap = ToWire(r.slots(0).capability());
    return o;
  };
  // After a write was abandoned: the same key stores and reads back.
  auto store_again = [&c](const std::string& key) {
    Blocks b;
    b.keys = {key};
    b.data = {RandomBytes(4096, std::hash<std::string>()(key))};
    c.PutOrRetry(*c.client, b);
    c.GetAndCompare(*c.client, b);
  };

  std::vector<Case> v;
  v.push_back({"bad_magic", [=] {
                 return DataExchange(addr, raw_header(0xdeadbeef, 1, 6, 0, 0), true);
               }});
  v.push_back({"bad_version", [=] {
                 return DataExchange(addr, raw_header(wire::kMagic, 99, 6, 0, 0), true);
               }});
  v.push_back({"unknown_type", [=] {
                 return DataExchange(addr, raw_header(wire::kMagic, wire::kVersion, 200, 0, 0), true);
               }});
  v.push_back({"type_zero", [=] {
                 return DataExchange(addr, raw_header(wire::kMagic, wire::kVersion, 0, 0, 0), true);
               }});
  v.push_back({"reserved_bits_set", [=] {
                 return DataExchange(addr, raw_header(wire::kMagic, wire::kVersion, 6, 0, 0, 1), true);
               }});
  v.push_back({"op_count_over_max", [=] {
                 return DataExchange(addr,
                                     raw_header(wire::kMagic, wire::kVersion, uint8_t(FT::kReadRequest),
                                                wire::kMaxOps + 1, 0),
                                     true);
               }});
  v.push_back({"op_count_65535", [=] {
                 return DataExchange(addr,
                                     raw_header(wire::kMagic, wire::kVersion, uint8_t(FT::kReadRequest),
                                                65535, 0),
                                     true);
               }});
  v.push_back({"read_with_no_ops", [=] {
                 return DataExchange(addr, EncodeFrame(FT::kReadRequest, {}, 0), true);
               }});
  for (FT t : {FT::kReadResponse, FT::kWriteResponse, FT::kPong, FT::kError,
               FT::kPrefetchResponse, FT::kAcquireResponse, FT::kWriteBeginResponse,
               FT::kWriteCommitResponse, FT::kRdmaConnectResponse}) {
    v.push_back({absl::StrCat("response_type_as_request_", int(t)), [=] {
                   return DataExchange(addr, EncodeFrame(t, {}, 0), true);
                 }});
  }
  v.push_back({"length_0", [=] {
                 return DataExchange(addr,
                                     EncodeFrame(FT::kReadRequest, {op(region, 0, 0, 1)}, 0),
                                     true);
               }});
  v.push_back({"length_over_max_object", [=] {
                 return DataExchange(
                     addr,
                     EncodeFrame(FT::kReadRequest,
                                 {op(region, 0, wire::kMaxObjectBytes + 1, 1)}, 0),
                     true);
               }});
  v.push_back({"addr_plus_length_overflows", [=] {
                 return DataExchange(
                     addr,
                     EncodeFrame(FT::kReadRequest, {op(region, ~uint64_t{0} - 10, 4096, 1)}, 0),
                     true);
               }});
  v.push_back({"read_beyond_region", [=] {
                 Outcome o = DataExchange(
                     addr,
                     EncodeFrame(FT::kReadRequest,
                                 {op(region, capacity, 4096, 1),
                                  op(region, capacity - 4096, 8192, 1),
                                  op(region + 77, 0, 4096, 1)},
                                 0),
                     false, FT::kReadResponse);
                 CHECK(o.error);
                 return o;
               }});
  v.push_back({"write_beyond_region", [=] {
                 const std::string payload(2 * 4096, 'w');
                 Outcome o = DataExchange(
                     addr,
                     EncodeFrame(FT::kWriteRequest,
                                 {op(region, capacity, 4096, 1),
                                  op(region + 77, 0, 4096, 1)},
                                 payload.size(), payload),
                     false, FT::kWriteResponse);
                 CHECK(o.error);
                 return o;
               }});
  v.push_back({"write_generation_over_ceiling", [=] {
                 const std::string payload(4096, 'g');
                 Outcome o = DataExchange(
                     addr,
                     EncodeFrame(FT::kWriteRequest,
                                 {op(region, capacity - 4096, 4096, uint64_t{1} << 62)},
                                 payload.size(), payload),
                     false, FT::kWriteResponse);
                 CHECK(o.error);
                 return o;
               }});
  v.push_back({"read_unknown_generations", [=] {
                 std::vector<wire::OpDesc> ops;
                 for (uint64_t g : {known.generation + 1, known.generation - 1,
                                    uint64_t{0}, ~uint64_t{0}}) {
                   ops.push_back(op(region, known.addr, known.length, g));
                 }
                 ops.push_back(op(region, known.addr, known.length - 1, known.generation));
                 ops.push_back(op(region, known.addr + 1, known.length - 1, known.generation));
                 Socket s = Dial(addr);
                 Send(s.fd(), EncodeFrame(FT::kReadRequest, ops, 0));
                 auto r = ReadFrame(s.fd());
                 REQUIRE(r.ok());
                 REQUIRE(r->h.type == FT::kReadResponse);
                 CHECK(r->payload.empty());  // never another object's bytes
                 for (const auto& o : r->ops) CHECK(o.status != 0);
                 return Outcome{true, false};
               }});
  v.push_back({"read_1024_unknown_ops", [=] {
                 std::vector<wire::OpDesc> ops;
                 for (uint64_t i = 0; i < wire::kMaxOps; ++i) {
                   ops.push_back(op(region, i * 4096, 4096, 1000000 + i));
                 }
                 return DataExchange(addr, EncodeFrame(FT::kReadRequest, ops, 0), false,
                                     FT::kReadResponse);
               }});
  v.push_back({"session_payload_wrong_size", [=] {
                 Outcome o = DataExchange(addr,
                                          EncodeFrame(FT::kReadRequest, {known}, 7, "1234567"),
                                          true);
                 o |= DataExchange(addr, EncodeFrame(FT::kPrefetchRequest, {known}, 9,
                                                     "123456789"),
                                   true);
                 o |= DataExchange(addr, EncodeFrame(FT::kReleaseRequest, {}, 0), true);
                 o |= DataExchange(addr, EncodeFrame(FT::kAcquireRequest, {known}, 0), true);
                 return o;
               }});
  v.push_back({"payload_bytes_huge", [=] {
                 Outcome o = DataExchange(
                     addr,
                     EncodeFrame(FT::kWriteRequest, {op(region, 0, 4096, 1)}, uint64_t{1} << 63),
                     true);
                 o |= DataExchange(addr,
                                   EncodeFrame(FT::kWriteRequest, {op(region, 0, 4096, 1)},
                                               ~uint64_t{0}),
                                   true);
                 o |= DataExchange(addr, EncodeFrame(FT::kPing, {}, uint64_t{1} << 40), true);
                 o |= DataExchange(addr,
                                   EncodeFrame(FT::kRdmaConnectRequest, {}, 1 << 20), true);
                 return o;
               }});
  v.push_back({"payload_bytes_short_of_lengths", [=] {
                 // payload_bytes says 100, the op 4096.
                 return DataExchange(addr,
                                     EncodeFrame(FT::kWriteRequest, {op(region, 0, 4096, 1)},
                                                 100, std::string(100, 'x')),
                                     true);
               }});
  v.push_back({"write_payload_short_then_close", [=] {
                 auto put = allocate("hostile-short-write");
                 {
                   Socket s = Dial(addr);
                   Send(s.fd(), EncodeFrame(FT::kWriteRequest, {slot_op(put)}, 4096,
                                            std::string(1000, 'x')));
                 }
                 abort_put(put.put_id());
                 store_again("hostile-short-write");
                 return Outcome{};
               }});
  v.push_back({"write_payload_short_then_stall", [=] {
                 // The server gives up after io_timeout and closes.
                 auto put = allocate("hostile-stalled-write");
                 Socket s = Dial(addr);
                 Send(s.fd(), EncodeFrame(FT::kWriteRequest, {slot_op(put)}, 4096,
                                          std::string(1000, 'x')));
                 Outcome o;
                 auto r = ReadFrame(s.fd());
                 o.error = r.ok() && r->h.type == FT::kError;
                 Drained d = Drain(s.fd(), kSlack);
                 o.closed = d.closed;
                 CHECK(o.closed);
                 abort_put(put.put_id());
                 store_again("hostile-stalled-write");
                 return o;
               }});
  v.push_back({"write_begin_then_disconnect", [=] {
                 auto put = allocate("hostile-begun-write");
                 Outcome o;
                 {
                   Socket s = Dial(addr);
                   Send(s.fd(), EncodeFrame(FT::kWriteBeginRequest, {slot_op(put)}, 0));
                   auto r = ReadFrame(s.fd());
                   REQUIRE(r.ok());
                   REQUIRE(r->h.type == FT::kWriteBeginResponse);
                   o.error = r->ops[0].status != 0;
                 }
                 abort_put(put.put_id());
                 store_again("hostile-begun-write");
                 return o;
               }});
  v.push_back({"write_commit_never_begun", [=] {
                 Outcome o = DataExchange(
                     addr, EncodeFrame(FT::kWriteCommitRequest, {known, op(region, 0, 1, 1)}, 0),
                     false, FT::kWriteCommitResponse);
                 CHECK(o.error);
                 return o;
               }});
  v.push_back({"release_never_acquired", [=] {
                 Outcome o = DataExchange(
                     addr,
                     EncodeFrame(FT::kReleaseRequest, {known, op(region, 0, 1, 1)}, 8,
                                 Session(12345)),
                     false, FT::kReleaseResponse);
                 CHECK(o.error);
                 o |= DataExchange(addr, EncodeFrame(FT::kReleaseRequest, {}, 8, Session(0)),
                                   false, FT::kReleaseResponse);
                 return o;
               }});
  v.push_back({"acquire_and_prefetch_unknown", [=] {
                 Outcome o = DataExchange(
                     addr,
                     EncodeFrame(FT::kAcquireRequest, {op(region, 0, 4096, 999999)}, 8,
                                 Session(0)),
                     false, FT::kAcquireResponse);
                 o |= DataExchange(addr,
                                   EncodeFrame(FT::kPrefetchRequest,
                                               {op(region, 0, 4096, 999999)}, 8, Session(7)),
                                   false, FT::kPrefetchResponse);
                 CHECK(o.error);
                 return o;
               }});
  v.push_back({"acquire_then_disconnect", [=] {
                 Socket s = Dial(addr);
                 Send(s.fd(), EncodeFrame(FT::kAcquireRequest, {known}, 8, Session(0)));
                 auto r = ReadFrame(s.fd());
                 REQUIRE(r.ok());
                 REQUIRE(r->h.type == FT::kAcquireResponse);
                 return Outcome{r->ops[0].status != 0, false};
               }});
  v.push_back({"rdma_connect_garbage", [=] {
                 return DataExchange(addr,
                                     EncodeFrame(FT::kRdmaConnectRequest, {}, 300,
                                                 RandomString(300, 5)),
                                     true);
               }});
  v.push_back({"truncated_header_then_close", [=] {
                 Socket s = Dial(addr);
                 Send(s.fd(), EncodeFrame(FT::kPing, {}, 0).substr(0, 13));
                 return Outcome{};
               }});
  v.push_back({"truncated_op_table_then_close", [=] {
                 Socket s = Dial(addr);
                 Send(s.fd(), EncodeFrame(FT::kReadRequest, {known, known}, 0).substr(0, 50));
                 return Outcome{};
               }});
  v.push_back({"frame_split_in_1_byte_writes", [=, &c] {
                 Socket s = Dial(addr);
                 const std::string f = EncodeFrame(FT::kReadRequest, {known}, 0);
                 for (char ch : f) REQUIRE(Send(s.fd(), std::string(1, ch)));
                 auto r = ReadFrame(s.fd());
                 REQUIRE(r.ok());
                 REQUIRE(r->h.type == FT::kReadResponse);
                 REQUIRE(r->ops[0].status == 0);
                 CHECK(std::vector<uint8_t>(r->payload.begin(), r->payload.end()) ==
                       c.known.data[0]);
                 return Outcome{};
               }});
  v.push_back({"pipelined_pings_then_bad_header", [=] {
                 Socket s = Dial(addr);
                 std::string b;
                 for (int i = 0; i < 100; ++i) b += EncodeFrame(FT::kPing, {}, 0);
                 Send(s.fd(), b);
                 for (int i = 0; i < 100; ++i) {
                   auto r = ReadFrame(s.fd());
                   INFO("pong " << i << ": " << r.status().ToString());
                   REQUIRE(r.ok());
                   REQUIRE(r->h.type == FT::kPong);
                 }
                 // Exactly one bad header: the server has read everything
                 // when it answers (a close with unread input resets the
                 // connection, and the peer may lose the kError).
                 Send(s.fd(), RandomString(wire::kHeaderBytes, 9));
                 auto r = ReadFrame(s.fd());
                 Outcome o;
                 o.error = r.ok() && r->h.type == FT::kError;
                 o.closed = Drain(s.fd(), kSlack).closed;
                 CHECK(o.error);
                 CHECK(o.closed);
                 return o;
               }});
  v.push_back({"random_bytes_1MiB", [=] {
                 return DataExchange(addr, RandomString(1 << 20, 10), true);
               }});
  v.push_back({"slowloris_and_idle", [=] {
                 // Three slow peers at once: a header one byte at a time, an
                 // op table stalled half-way, and a connection that never
                 // sends. io_timeout / idle_timeout must cut them all.
                 Socket header = Dial(addr);
                 Socket table = Dial(addr);
                 Socket idle = Dial(addr);
                 const std::string f = EncodeFrame(FT::kReadRequest, {known, known}, 0);
                 Send(table.fd(), f.substr(0, 40));
                 const absl::Time start = absl::Now();
                 size_t sent = 0;
                 bool header_closed = false;
                 while (absl::Now() - start < kSlack && sent < f.size()) {
                   if (!Send(header.fd(), f.substr(sent, 1))) {
                     header_closed = true;
                     break;
                   }
                   ++sent;
                   Drained d = Drain(header.fd(), absl::Milliseconds(300));
                   if (d.closed) {
                     header_closed = true;
                     break;
                   }
                 }
                 CHECK(header_closed);
                 CHECK(sent < 32);  // cut before its header was complete
                 Outcome o;
                 o.closed = header_closed && Drain(table.fd(), kSlack).closed &&
                            Drain(idle.fd(), kSlack).closed;
                 CHECK(o.closed);
                 return o;
               }});
  v.push_back({"connections_200_dropped", [=, &c] {
                 const uint64_t before = c.NodeOpenConnections();
                 {
                   std::vector<Socket> socks;
                   for (int i = 0; i < 200; ++i) socks.push_back(Dial(addr));
                   for (size_t i = 0; i < socks.size(); i += 3) {
                     Send(socks[i].fd(), EncodeFrame(FT::kPing, {}, 0).substr(0, 5));
                   }
                 }
                 // Every slot comes back.
                 const absl::Time deadline = absl::Now() + kSlack;
                 uint64_t open = c.NodeOpenConnections();
                 while (open > before && absl::Now() < deadline) {
                   absl::SleepFor(absl::Milliseconds(20));
                   open = c.NodeOpenConnections();
                 }
                 CHECK(open <= before);
                 return Outcome{};
               }});
  return v;
}

// ---------------------------------------------------------------- shm

std::vector<Case> ShmCases(Cluster& c) {
  auto params = c.info.transport_params();
  auto it = params.find(kShmSocketParam);
  if (it == params.end()) return {};
  const std::string name = it->second;
  auto dial = [name] {
    auto s = ConnectUnixAbstract(name, absl::Now() + absl::Seconds(10));
    REQUIRE(s.ok());
    return std::move(*s);
  };
  // What the exporter sends back: descriptors (closed here) or nothing.
  auto receive = [](int fd) {
    std::string payload;
    std::vector<int> fds;
    absl::Status s = RecvWithFds(fd, &payload, &fds, absl::Now() + kSlack);
    for (int f : fds) close(f);
    return s;
  };
  std::vector<Case> v;
  v.push_back({"shm_connect_close_x50", [dial] {
                 for (int i = 0; i < 50; ++i) dial();
                 return Outcome{};
               }});
  v.push_back({"shm_garbage", [dial, receive] {
                 Socket s = dial();
                 Send(s.fd(), RandomString(4096, 21));
                 receive(s.fd()).IgnoreError();
                 return Outcome{false, Drain(s.fd(), kSlack).closed};
               }});
  v.push_back({"shm_wrong_message_sizes", [dial] {
                 Outcome o;
                 for (size_t n : {size_t{0}, size_t{1}, size_t{65536}, size_t{200000}}) {
                   Socket s = dial();
                   // Non-blocking: what the socket buffer takes.
                   const std::string b(n, 'q');
                   ::send(s.fd(), b.data(), b.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
                   o.closed |= Drain(s.fd(), kSlack).closed;
                 }
                 return o;
               }});
  v.push_back({"shm_random_fds", [dial] {
                 Socket s = dial();
                 int pipefd[2];
                 REQUIRE(pipe(pipefd) == 0);
                 int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
                 int mfd = memfd_create("hostile", MFD_CLOEXEC);
                 REQUIRE(ftruncate(mfd, 1 << 20) == 0);
                 std::vector<int> fds = {pipefd[0], pipefd[1], devnull, mfd};
                 for (int i = 0; i < 30; ++i) fds.push_back(devnull);
                 SendWithFds(s.fd(), "here are some descriptors", fds).IgnoreError();
                 for (int f : {pipefd[0], pipefd[1], devnull, mfd}) close(f);
                 return Outcome{false, Drain(s.fd(), kSlack).closed};
               }});
  v.push_back({"shm_50_held_unread", [dial] {
                 std::vector<Socket> socks;
                 for (int i = 0; i < 50; ++i) socks.push_back(dial());
                 int closed = 0;
                 for (auto& s : socks) closed += Drain(s.fd(), kSlack).closed ? 1 : 0;
                 CHECK(closed == 50);
                 return Outcome{false, true};
               }});
  return v;
}

// ---------------------------------------------------------------- runs

struct Baseline {
  int64_t master_rss, node_rss;
  int master_fds, node_fds;
};

Baseline Measure(Cluster& c) {
  return {RssBytes(c.master.daemon.pid()), RssBytes(c.node.daemon.pid()),
          OpenFds(c.master.daemon.pid()), OpenFds(c.node.daemon.pid())};
}

void RequireBounded(Cluster& c, const Baseline& before) {
  c.RequireFdsSettle(c.master.daemon.pid(), before.master_fds, "master");
  c.RequireFdsSettle(c.node.daemon.pid(), before.node_fds, "node");
  Baseline after = Measure(c);
  std::printf("hostile-client rss master %.1f -> %.1f MiB, node %.1f -> %.1f MiB\n",
              before.master_rss / 1048576.0, after.master_rss / 1048576.0,
              before.node_rss / 1048576.0, after.node_rss / 1048576.0);
  if (kCheckRss) {
    CHECK(after.master_rss - before.master_rss < kRssBoundBytes);
    CHECK(after.node_rss - before.node_rss < kRssBoundBytes);
  }
}

// Both daemons stop on SIGTERM and exit 0 (under ASan: no leak either).
void RequireCleanExit(Cluster& c) {
  for (testing::Daemon* d : {&c.node.daemon, &c.master.daemon}) {
    absl::StatusOr<int> st = d->Stop(SIGTERM);
    REQUIRE(st.ok());
    CHECK(WIFEXITED(*st));
    CHECK(WEXITSTATUS(*st) == 0);
  }
}

// Warm-up: correct requests, and the HTTP/2 floods on both gRPC ports once.
// gRPC's buffers and the allocator's per-thread arenas grow to a working
// size on the first floods (the master's RSS rose by ~20 MiB, then stayed
// level over six more rounds of each): that is not growth to measure.
void WarmUp(Cluster& c) {
  for (int i = 0; i < 5; ++i) c.Healthy();
  c.Healthy(/*shm=*/true);
  for (const std::string& addr : {c.master.address, c.node.control_address}) {
    std::vector<Case> cases;
    AddGrpcPortCases(&cases, addr, "hymcache.v1.MasterService", {"ListNodes"},
                     c.HealthyFn());
    for (const Case& k : cases) {
      if (k.name == "h2_ping_flood" || k.name == "h2_rapid_reset") k.run();
    }
  }
}

TEST_CASE("hostile clients on every port of a DRAM node's cluster") {
  signal(SIGPIPE, SIG_IGN);
  Cluster c(/*hybrid_node=*/false);
  WarmUp(c);
  const Baseline before = Measure(c);
  const absl::Time start = absl::Now();

  std::vector<Case> master_cases;
  AddGrpcPortCases(&master_cases, c.master.address, "hymcache.v1.MasterService",
                   kMasterMethods, c.HealthyFn());
  for (Case& k : MasterSemanticCases(c)) master_cases.push_back(std::move(k));
  {
    FakeReconcile fake(c);
    for (Case& k : ReconcileCases(c, fake)) master_cases.push_back(std::move(k));
    c.Run("master-grpc", master_cases);
  }

  std::vector<Case> control_cases;
  AddGrpcPortCases(&control_cases, c.node.control_address, "hymcache.v1.StorageControl",
                   kControlMethods, c.HealthyFn());
  for (Case& k : ControlCases(c)) control_cases.push_back(std::move(k));
  c.Run("node-control-grpc", control_cases);

  c.Run("node-data-tcp", DataCases(c));
  std::vector<Case> shm = ShmCases(c);
  REQUIRE(!shm.empty());
  c.Run("node-shm-socket", shm, /*shm_check=*/true);

  RequireBounded(c, before);
  std::printf("hostile-client dram run took %s\n",
              absl::FormatDuration(absl::Now() - start).c_str());
  RequireCleanExit(c);
}

TEST_CASE("hostile clients on a hybrid node's data plane and sockets") {
  signal(SIGPIPE, SIG_IGN);
  Cluster c(/*hybrid_node=*/true);
  WarmUp(c);
  const Baseline before = Measure(c);
  c.Run("hybrid-data-tcp", DataCases(c));
  std::vector<Case> shm = ShmCases(c);
  REQUIRE(!shm.empty());
  c.Run("hybrid-shm-socket", shm, /*shm_check=*/true);
  c.Run("hybrid-control-grpc", ControlCases(c));
  RequireBounded(c, before);
  RequireCleanExit(c);
}

}  // namespace
}  // namespace hymcache
