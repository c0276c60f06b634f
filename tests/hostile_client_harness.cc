// Hostile clients: the shared helpers (tests/hostile_client.h).
#include "tests/hostile_client.h"

namespace hymcache {
namespace hostile {

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

Drained Drain(int fd, absl::Duration within, size_t max_bytes) {
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
  const uint32_t len = length < 0 ? static_cast<uint32_t>(payload.size())
                                  : static_cast<uint32_t>(length);
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
std::string H2Start() {
  return std::string(kPreface) + H2Frame(kSettings, 0, 0, "");
}

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
  return grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(),
                                   args);
}

// Any call (unary or streaming) with hand-made message bytes, through the
// generic stub: the server parses the bytes itself.
RawCallResult RawCall(const std::shared_ptr<grpc::Channel>& ch,
                      const std::string& method,
                      const std::vector<std::string>& messages,
                      const RawCallOptions& opt) {
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
    if (opt.before_cancel > absl::ZeroDuration())
      absl::SleepFor(opt.before_cancel);
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
      for (const auto& sl : slices)
        s.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
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

std::string Ser(const google::protobuf::Message& m) {
  return m.SerializeAsString();
}

Outcome FromStatus(const grpc::Status& s) {
  Outcome o;
  o.error = !s.ok();
  return o;
}

// Bytes no proto3 parser accepts, bytes it accepts with unknown fields.
std::vector<std::pair<std::string, std::string>> MalformedProtos() {
  std::string unknown;
  unknown += std::string("\xa8\x1f\x01", 3);  // field 501 varint
  unknown += std::string(
      "\xb2\x1f\x03"
      "abc",
      6);                                                 // field 502 bytes
  unknown += std::string("\xbd\x1f\x01\x02\x03\x04", 6);  // field 503 fixed32
  unknown += std::string("\xb9\x1f", 2) + std::string(8, '\x7f');  // fixed64
  return {
      {"truncated_length", std::string("\x0a\xff\xff\xff\xff\x0f", 6)},
      {"length_past_end", std::string("\x0a\x10"
                                      "ab",
                                      4)},
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
                      return H2Exchange(addr,
                                        std::string(kPreface) +
                                            H2Frame(kSettings, 0, 0, "12345"));
                    }});
  cases->push_back(
      {"h2_frame_over_max_size", [addr] {
         return H2Exchange(
             addr,
             H2Start() + H2Frame(kData, 0, 1, RandomString(1000, 2), 0xffffff));
       }});
  cases->push_back({"h2_headers_on_stream_0", [addr, probe] {
                      return H2Exchange(
                          addr, H2Start() + H2Frame(kHeaders, 0x4, 0,
                                                    GrpcRequestHeaders(probe)));
                    }});
  cases->push_back(
      {"h2_garbage_hpack", [addr] {
         return H2Exchange(
             addr, H2Start() + H2Frame(kHeaders, 0x4, 1, RandomString(200, 3)));
       }});
  cases->push_back({"h2_window_update_zero", [addr] {
                      return H2Exchange(
                          addr,
                          H2Start() + H2Frame(kWindowUpdate, 0, 0, Be32(0)));
                    }});
  cases->push_back({"h2_data_on_idle_stream", [addr] {
                      return H2Exchange(
                          addr, H2Start() + H2Frame(kData, 0, 7, "hello"));
                    }});
  cases->push_back(
      {"h2_continuation_flood", [addr, probe] {
         // Headers that never end: 4 MiB of CONTINUATION.
         std::string b =
             H2Start() + H2Frame(kHeaders, 0, 1, GrpcRequestHeaders(probe));
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
  cases->push_back(
      {"grpc_length_prefix_4GiB", [addr, probe] {
         std::string msg = std::string("\x00", 1) + Be32(0xffffffffu) + "x";
         return H2Exchange(
             addr, H2Start() +
                       H2Frame(kHeaders, 0x4, 1, GrpcRequestHeaders(probe)) +
                       H2Frame(kData, 0x1, 1, msg));
       }});
  cases->push_back(
      {"grpc_compressed_without_encoding", [addr, probe] {
         std::string msg = std::string("\x01", 1) + Be32(4) + "zzzz";
         return H2Exchange(
             addr, H2Start() +
                       H2Frame(kHeaders, 0x4, 1, GrpcRequestHeaders(probe)) +
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
                      return FromStatus(
                          RawCall(NewChannel(addr), probe, {""}, o).status);
                    }});
  cases->push_back({"metadata_5000_entries", [addr, probe] {
                      RawCallOptions o;
                      for (int i = 0; i < 5000; ++i) {
                        o.metadata.push_back({absl::StrCat("x-h-", i), "v"});
                      }
                      return FromStatus(
                          RawCall(NewChannel(addr), probe, {""}, o).status);
                    }});
  cases->push_back(
      {"unknown_method", [addr, service] {
         auto r = RawCall(NewChannel(addr),
                          absl::StrCat("/", service, "/NoSuchMethod"), {""});
         CHECK(r.status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
         return FromStatus(r.status);
       }});
  cases->push_back(
      {"unknown_service", [addr] {
         auto r = RawCall(NewChannel(addr), "/hymcache.v9.Nope/Get", {""});
         CHECK(r.status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
         return FromStatus(r.status);
       }});
  cases->push_back(
      {"deadline_zero_calls", [addr, service, methods] {
         auto ch = NewChannel(addr);
         Outcome o;
         for (const std::string& m : methods) {
           for (absl::Duration t : {absl::ZeroDuration(), absl::Microseconds(1),
                                    absl::Microseconds(300)}) {
             RawCallOptions opt;
             opt.timeout = t;
             o |= FromStatus(
                 RawCall(ch, absl::StrCat("/", service, "/", m), {""}, opt)
                     .status);
           }
         }
         return o;
       }});
  cases->push_back(
      {"cancelled_calls", [addr, service, methods] {
         auto ch = NewChannel(addr);
         Outcome o;
         for (const std::string& m : methods) {
           for (int i = 0; i < 5; ++i) {
             RawCallOptions opt;
             opt.cancel = true;
             o |= FromStatus(
                 RawCall(ch, absl::StrCat("/", service, "/", m), {""}, opt)
                     .status);
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
                          if (what != "unknown_fields" &&
                              what != "wrong_wire_type" &&
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

std::string EncodeFrame(wire::FrameType type,
                        const std::vector<wire::OpDesc>& ops,
                        uint64_t payload_bytes, const std::string& payload,
                        uint64_t request_id) {
  std::string b(wire::kHeaderBytes + ops.size() * wire::kOpBytes, '\0');
  wire::FrameHeader h;
  h.type = type;
  h.op_count = static_cast<uint16_t>(ops.size());
  h.request_id = request_id;
  h.payload_bytes = payload_bytes;
  wire::EncodeHeader(h, reinterpret_cast<uint8_t*>(b.data()));
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::EncodeOp(ops[i], reinterpret_cast<uint8_t*>(b.data()) +
                               wire::kHeaderBytes + i * wire::kOpBytes);
  }
  if (wire::CarriesCapabilities(type)) {
    // The capability table: each op's (zero, so refused, unless the case
    // copied one from the master).
    std::string caps(ops.size() * wire::kCapBytes, '\0');
    for (size_t i = 0; i < ops.size(); ++i) {
      wire::EncodeCapability(
          ops[i].cap,
          reinterpret_cast<uint8_t*>(caps.data()) + i * wire::kCapBytes);
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
  a.set_proof(
      NodeProof(HmacSha256(key), purpose, name, id, incarnation, a.unix_ms()));
  return a;
}

std::string Session(uint64_t id) {
  std::string s(wire::kSessionBytes, '\0');
  wire::EncodeSession(id, reinterpret_cast<uint8_t*>(s.data()));
  return s;
}

// The server's next frame; nullopt-like error when it closed instead.
absl::StatusOr<Response> ReadFrame(int fd, absl::Duration within) {
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
    r.ops.push_back(wire::DecodeOp(
        reinterpret_cast<const uint8_t*>(table.data()) + i * wire::kOpBytes));
  }
  if (h->payload_bytes > (64u << 20))
    return absl::DataLossError("huge payload");
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
                     bool expect_error_frame, wire::FrameType expect_type) {
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

std::vector<std::string> Keys(size_t n, const std::string& model) {
  KeyNamespace ns;
  ns.model = model;
  BlockKeyBuilder b(ns, 16);
  std::vector<int32_t> tokens(n * 16);
  std::iota(tokens.begin(), tokens.end(), 1);
  return b.Keys(tokens);
}

}  // namespace hostile
}  // namespace hymcache
