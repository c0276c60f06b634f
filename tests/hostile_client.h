// Hostile clients (tests/hostile_client_test.cc): what the case tables
// share. The constants and bounds of the runs, a case and its outcome, raw
// TCP, HTTP/2 and gRPC calls with hand-made bytes, data-plane frames, and the
// cluster of real daemons the cases are thrown at. The cases themselves are
// in hostile_client_master_cases.cc (the master's gRPC port) and
// hostile_client_node_cases.cc (the node's control, data and shm ports).
#pragma once

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

#include <dirent.h>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
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
#include "common/eventually.h"
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
namespace hostile {

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

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed);
std::string RandomString(size_t n, uint64_t seed);
// The process's resident memory and open descriptors (/proc).
int64_t RssBytes(pid_t pid);
int OpenFds(pid_t pid);

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

Socket Dial(const std::string& addr);
// Best effort: the server may close while we still send.
bool Send(int fd, const std::string& b);
// Reads what the server sends until it closes the connection or `within`
// passes without a close.
struct Drained {
  bool closed = false;
  std::string data;
};
Drained Drain(int fd, absl::Duration within, size_t max_bytes = 1 << 20);

// ---------------------------------------------------------------- gRPC

std::shared_ptr<grpc::Channel> NewChannel(const std::string& addr);
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
                      const RawCallOptions& opt = {});
std::string Ser(const google::protobuf::Message& m);
Outcome FromStatus(const grpc::Status& s);
// The cases every gRPC port gets: raw bytes, HTTP/2 abuse (floods, resets,
// oversized frames), malformed protos for each of `methods` of `service`.
void AddGrpcPortCases(std::vector<Case>* cases, const std::string& addr,
                      const std::string& service,
                      const std::vector<std::string>& methods,
                      const std::function<void()>& healthy);

// ---------------------------------------------------------------- data plane

std::string EncodeFrame(wire::FrameType type,
                        const std::vector<wire::OpDesc>& ops,
                        uint64_t payload_bytes, const std::string& payload = "",
                        uint64_t request_id = 42);
wire::Capability ToWire(const pb::Capability& c);
// A node's proof of its key for the master's node RPCs.
pb::NodeAuth Auth(const std::string& key, const char* purpose,
                  const std::string& name, uint32_t id, uint64_t incarnation);
std::string Session(uint64_t id);
struct Response {
  wire::FrameHeader h;
  std::vector<wire::OpDesc> ops;
  std::string payload;
};
// The server's next frame; an error when it closed instead.
absl::StatusOr<Response> ReadFrame(int fd, absl::Duration within = kSlack);
// Writes `slot` (a PutStart slot with its write capability) over the
// node's TCP data plane at `addr`, as a client does, and returns the write
// receipt the node answers with.
std::string WriteForReceipt(const std::string& addr, const pb::PutSlot& slot);
// The reason a master's refusal carries (common/status_reason.h).
StatusReason ReasonOfGrpc(const grpc::Status& s);
// Sends `bytes` on a fresh connection and classifies the answer: a kError
// frame (then the server must close), or a response whose ops carry
// statuses; `expect_error_frame` requires the former.
Outcome DataExchange(const std::string& addr, const std::string& bytes,
                     bool expect_error_frame,
                     wire::FrameType expect_type = wire::FrameType::kError);

// ---------------------------------------------------------------- cluster

struct Blocks {
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> data;
};

std::vector<std::string> Keys(size_t n, const std::string& model);

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
      flags.insert(
          flags.end(),
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
    control_stub =
        pb::StorageControl::NewStub(NewChannel(node.control_address));
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
    const bool alive = testing::Eventually(
        [&] {
          pb::ListNodesResponse r;
          grpc::ClientContext ctx;
          if (!master_stub->ListNodes(&ctx, {}, &r).ok()) return false;
          for (const auto& n : r.nodes()) {
            if (n.alive() && n.data_address() == node.data_address) {
              info = n;
              return true;
            }
          }
          return false;
        },
        absl::Seconds(60));
    if (!alive) FAIL("the storage node never became alive");
  }

  // A hybrid node's small write buffer may refuse a write for a moment.
  void PutOrRetry(Client& c, const Blocks& b) {
    std::vector<ConstBuffer> in;
    for (const auto& d : b.data) in.push_back({d.data(), d.size()});
    REQUIRE(testing::Eventually(
        [&] {
          auto r = c.Put(b.keys, in);
          INFO(r.status().ToString());
          REQUIRE(r.ok());
          if (r->stored + r->skipped == b.keys.size()) return true;
          for (const auto& e : r->errors) {
            INFO(e.ToString());
            REQUIRE(
                (e.ok() || e.code() == absl::StatusCode::kResourceExhausted));
          }
          return false;
        },
        kSlack));
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
        std::printf("hostile-client %s/%s took %s\n", port.c_str(),
                    c.name.c_str(), absl::FormatDuration(took).c_str());
      }
    }
    t.Print();
  }

  // Waits until the daemon's descriptors are back near `baseline` (closed
  // connections are reaped asynchronously).
  void RequireFdsSettle(pid_t pid, int baseline, const char* who) {
    int now = OpenFds(pid);
    testing::Eventually(
        [&] {
          now = OpenFds(pid);
          return now <= baseline + 16;
        },
        kSlack);
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

inline const std::vector<std::string> kMasterMethods = {
    "ListNodes",      "GetStats",   "RegisterNode",   "Heartbeat",
    "DeregisterNode", "PutStart",   "PutCommit",      "PutAbort",
    "BatchLookup",    "Remove",     "BeginReconcile", "ReconcileNode",
    "ReportMissing",  "ListObjects"};
inline const std::vector<std::string> kControlMethods = {
    "GetStats", "ListExtents", "RequestReconcile"};

// ---------------------------------------------------------------- cases

pb::RegisterNodeRequest FakeNode(const std::string& name);
std::vector<Case> MasterSemanticCases(Cluster& c);
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
    *d.mutable_auth() =
        Auth(key, "deregister", reg.name(), id, reg.incarnation());
    pb::DeregisterNodeResponse dr;
    grpc::ClientContext ctx;
    c.master_stub->DeregisterNode(&ctx, d, &dr);
  }

  uint64_t Begin() {
    pb::BeginReconcileRequest r;
    r.set_node_id(id);
    r.set_incarnation(reg.incarnation());
    *r.mutable_auth() =
        Auth(key, "reconcile", reg.name(), id, reg.incarnation());
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
    *r.mutable_auth() =
        Auth(key, "reconcile", reg.name(), id, reg.incarnation());
    return r;
  }
  // The stream's outcome; the listing must survive every one of them.
  grpc::Status Stream(const std::vector<std::string>& messages,
                      RawCallOptions opt = {}) {
    grpc::Status s =
        RawCall(c.master_ch, "/hymcache.v1.MasterService/ReconcileNode",
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
std::vector<Case> ReconcileCases(Cluster& c, FakeReconcile& f);
std::vector<Case> ControlCases(Cluster& c);
std::vector<Case> DataCases(Cluster& c);
std::vector<Case> ShmCases(Cluster& c);

}  // namespace hostile
}  // namespace hymcache
