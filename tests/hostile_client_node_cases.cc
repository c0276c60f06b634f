// Hostile clients: the cases for a storage node's control gRPC port, its
// TCP data plane and its same-host shared-memory socket
// (tests/hostile_client.h).
#include "tests/hostile_client.h"

namespace hymcache {
namespace hostile {

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
                   o |= FromStatus(
                       RawCall(NewChannel(c.node.control_address),
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
                   REQUIRE(
                       c.control_stub->RequestReconcile(&ctx, {}, &resp).ok());
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
  auto raw_header = [](uint32_t magic, uint8_t version, uint8_t type,
                       uint16_t ops, uint64_t payload, uint32_t reserved = 0) {
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
                 return DataExchange(addr, raw_header(0xdeadbeef, 1, 6, 0, 0),
                                     true);
               }});
  v.push_back({"bad_version", [=] {
                 return DataExchange(
                     addr, raw_header(wire::kMagic, 99, 6, 0, 0), true);
               }});
  v.push_back({"unknown_type", [=] {
                 return DataExchange(
                     addr, raw_header(wire::kMagic, wire::kVersion, 200, 0, 0),
                     true);
               }});
  v.push_back({"type_zero", [=] {
                 return DataExchange(
                     addr, raw_header(wire::kMagic, wire::kVersion, 0, 0, 0),
                     true);
               }});
  v.push_back({"reserved_bits_set", [=] {
                 return DataExchange(
                     addr, raw_header(wire::kMagic, wire::kVersion, 6, 0, 0, 1),
                     true);
               }});
  v.push_back({"op_count_over_max", [=] {
                 return DataExchange(addr,
                                     raw_header(wire::kMagic, wire::kVersion,
                                                uint8_t(FT::kReadRequest),
                                                wire::kMaxOps + 1, 0),
                                     true);
               }});
  v.push_back({"op_count_65535", [=] {
                 return DataExchange(
                     addr,
                     raw_header(wire::kMagic, wire::kVersion,
                                uint8_t(FT::kReadRequest), 65535, 0),
                     true);
               }});
  v.push_back({"read_with_no_ops", [=] {
                 return DataExchange(addr, EncodeFrame(FT::kReadRequest, {}, 0),
                                     true);
               }});
  for (FT t :
       {FT::kReadResponse, FT::kWriteResponse, FT::kPong, FT::kError,
        FT::kPrefetchResponse, FT::kAcquireResponse, FT::kWriteBeginResponse,
        FT::kWriteCommitResponse, FT::kRdmaConnectResponse}) {
    v.push_back({absl::StrCat("response_type_as_request_", int(t)), [=] {
                   return DataExchange(addr, EncodeFrame(t, {}, 0), true);
                 }});
  }
  v.push_back({"length_0", [=] {
                 return DataExchange(
                     addr,
                     EncodeFrame(FT::kReadRequest, {op(region, 0, 0, 1)}, 0),
                     true);
               }});
  v.push_back({"length_over_max_object", [=] {
                 return DataExchange(
                     addr,
                     EncodeFrame(FT::kReadRequest,
                                 {op(region, 0, wire::kMaxObjectBytes + 1, 1)},
                                 0),
                     true);
               }});
  v.push_back({"addr_plus_length_overflows", [=] {
                 return DataExchange(
                     addr,
                     EncodeFrame(FT::kReadRequest,
                                 {op(region, ~uint64_t{0} - 10, 4096, 1)}, 0),
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
                 Outcome o =
                     DataExchange(addr,
                                  EncodeFrame(FT::kWriteRequest,
                                              {op(region, capacity, 4096, 1),
                                               op(region + 77, 0, 4096, 1)},
                                              payload.size(), payload),
                                  false, FT::kWriteResponse);
                 CHECK(o.error);
                 return o;
               }});
  v.push_back(
      {"write_generation_over_ceiling", [=] {
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
                 ops.push_back(op(region, known.addr, known.length - 1,
                                  known.generation));
                 ops.push_back(op(region, known.addr + 1, known.length - 1,
                                  known.generation));
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
                 return DataExchange(addr,
                                     EncodeFrame(FT::kReadRequest, ops, 0),
                                     false, FT::kReadResponse);
               }});
  v.push_back(
      {"session_payload_wrong_size", [=] {
         Outcome o = DataExchange(
             addr, EncodeFrame(FT::kReadRequest, {known}, 7, "1234567"), true);
         o |= DataExchange(
             addr, EncodeFrame(FT::kPrefetchRequest, {known}, 9, "123456789"),
             true);
         o |= DataExchange(addr, EncodeFrame(FT::kReleaseRequest, {}, 0), true);
         o |= DataExchange(addr, EncodeFrame(FT::kAcquireRequest, {known}, 0),
                           true);
         return o;
       }});
  v.push_back(
      {"payload_bytes_huge", [=] {
         Outcome o = DataExchange(
             addr,
             EncodeFrame(FT::kWriteRequest, {op(region, 0, 4096, 1)},
                         uint64_t{1} << 63),
             true);
         o |= DataExchange(addr,
                           EncodeFrame(FT::kWriteRequest,
                                       {op(region, 0, 4096, 1)}, ~uint64_t{0}),
                           true);
         o |= DataExchange(addr, EncodeFrame(FT::kPing, {}, uint64_t{1} << 40),
                           true);
         o |= DataExchange(
             addr, EncodeFrame(FT::kRdmaConnectRequest, {}, 1 << 20), true);
         return o;
       }});
  v.push_back({"payload_bytes_short_of_lengths", [=] {
                 // payload_bytes says 100, the op 4096.
                 return DataExchange(
                     addr,
                     EncodeFrame(FT::kWriteRequest, {op(region, 0, 4096, 1)},
                                 100, std::string(100, 'x')),
                     true);
               }});
  v.push_back({"write_payload_short_then_close", [=] {
                 auto put = allocate("hostile-short-write");
                 {
                   Socket s = Dial(addr);
                   Send(s.fd(), EncodeFrame(FT::kWriteRequest, {slot_op(put)},
                                            4096, std::string(1000, 'x')));
                 }
                 abort_put(put.put_id());
                 store_again("hostile-short-write");
                 return Outcome{};
               }});
  v.push_back({"write_payload_short_then_stall", [=] {
                 // The server gives up after io_timeout and closes.
                 auto put = allocate("hostile-stalled-write");
                 Socket s = Dial(addr);
                 Send(s.fd(), EncodeFrame(FT::kWriteRequest, {slot_op(put)},
                                          4096, std::string(1000, 'x')));
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
                   Send(s.fd(),
                        EncodeFrame(FT::kWriteBeginRequest, {slot_op(put)}, 0));
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
                 Outcome o =
                     DataExchange(addr,
                                  EncodeFrame(FT::kWriteCommitRequest,
                                              {known, op(region, 0, 1, 1)}, 0),
                                  false, FT::kWriteCommitResponse);
                 CHECK(o.error);
                 return o;
               }});
  v.push_back({"release_never_acquired", [=] {
                 Outcome o =
                     DataExchange(addr,
                                  EncodeFrame(FT::kReleaseRequest,
                                              {known, op(region, 0, 1, 1)}, 8,
                                              Session(12345)),
                                  false, FT::kReleaseResponse);
                 CHECK(o.error);
                 o |= DataExchange(
                     addr, EncodeFrame(FT::kReleaseRequest, {}, 8, Session(0)),
                     false, FT::kReleaseResponse);
                 return o;
               }});
  v.push_back({"acquire_and_prefetch_unknown", [=] {
                 Outcome o = DataExchange(
                     addr,
                     EncodeFrame(FT::kAcquireRequest,
                                 {op(region, 0, 4096, 999999)}, 8, Session(0)),
                     false, FT::kAcquireResponse);
                 o |= DataExchange(
                     addr,
                     EncodeFrame(FT::kPrefetchRequest,
                                 {op(region, 0, 4096, 999999)}, 8, Session(7)),
                     false, FT::kPrefetchResponse);
                 CHECK(o.error);
                 return o;
               }});
  v.push_back({"acquire_then_disconnect", [=] {
                 Socket s = Dial(addr);
                 Send(s.fd(),
                      EncodeFrame(FT::kAcquireRequest, {known}, 8, Session(0)));
                 auto r = ReadFrame(s.fd());
                 REQUIRE(r.ok());
                 REQUIRE(r->h.type == FT::kAcquireResponse);
                 return Outcome{r->ops[0].status != 0, false};
               }});
  v.push_back({"rdma_connect_garbage", [=] {
                 return DataExchange(addr,
                                     EncodeFrame(FT::kRdmaConnectRequest, {},
                                                 300, RandomString(300, 5)),
                                     true);
               }});
  v.push_back({"truncated_header_then_close", [=] {
                 Socket s = Dial(addr);
                 Send(s.fd(), EncodeFrame(FT::kPing, {}, 0).substr(0, 13));
                 return Outcome{};
               }});
  v.push_back(
      {"truncated_op_table_then_close", [=] {
         Socket s = Dial(addr);
         Send(s.fd(),
              EncodeFrame(FT::kReadRequest, {known, known}, 0).substr(0, 50));
         return Outcome{};
       }});
  v.push_back(
      {"frame_split_in_1_byte_writes", [=, &c] {
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
                 for (int i = 0; i < 100; ++i)
                   b += EncodeFrame(FT::kPing, {}, 0);
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
  v.push_back(
      {"slowloris_and_idle", [=] {
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
                     Send(socks[i].fd(),
                          EncodeFrame(FT::kPing, {}, 0).substr(0, 5));
                   }
                 }
                 // Every slot comes back.
                 uint64_t open = 0;
                 testing::Eventually(
                     [&] {
                       open = c.NodeOpenConnections();
                       return open <= before;
                     },
                     kSlack);
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
                 for (size_t n :
                      {size_t{0}, size_t{1}, size_t{65536}, size_t{200000}}) {
                   Socket s = dial();
                   // Non-blocking: what the socket buffer takes.
                   const std::string b(n, 'q');
                   ::send(s.fd(), b.data(), b.size(),
                          MSG_DONTWAIT | MSG_NOSIGNAL);
                   o.closed |= Drain(s.fd(), kSlack).closed;
                 }
                 return o;
               }});
  v.push_back(
      {"shm_random_fds", [dial] {
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
                 for (auto& s : socks)
                   closed += Drain(s.fd(), kSlack).closed ? 1 : 0;
                 CHECK(closed == 50);
                 return Outcome{false, true};
               }});
  return v;
}

}  // namespace hostile
}  // namespace hymcache
