// Fuzzes the storage node's gRPC control service (StorageControl: GetStats,
// ListExtents, RequestReconcile) as a hostile client meets it: a real
// StorageNode (DRAM device) registered with a real in-process master, both
// on loopback, and the input as a sequence of calls made through gRPC's
// generic stub, so the node parses the fuzzed request bytes itself. Calls
// name the three methods, an unknown one, or send several messages / cancel
// early (a unary method given a stream).
//
// The cluster is made once per process (a master and a node take ~100 ms to
// start) and holds a few stored objects; the service is read-only apart
// from RequestReconcile, so a finding still replays from its input alone.
//
// Besides crashes, sanitizer reports, leaks and hangs (every call has a
// deadline; a call that outlives it fails the input), it checks that
//   - an OK GetStats answer parses and names this node;
//   - an OK ListExtents stream parses, has no page above the page size
//     asked for (4096 for 0, at most 65536) and lists every stored object exactly once;
//   - a request the node cannot parse is refused, never answered OK;
//   - an unknown method is UNIMPLEMENTED;
//   - the node answers a well-formed GetStats after the input.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "fuzz/fuzz_input.h"
#include "glog/logging.h"
#include "master/master_server.h"
#include "proto/storage.grpc.pb.h"
#include "storage_node/storage_node.h"

namespace hymcache::storage {
namespace {

using fuzz::FuzzInput;

constexpr int kStoredObjects = 5;
constexpr char kNodeName[] = "fuzz-node";

struct Fixture {
  std::unique_ptr<MasterServer> master;
  std::unique_ptr<StorageNode> node;
  std::shared_ptr<grpc::Channel> channel;
};

Fixture* Make() {
  auto* f = new Fixture;
  char tmpl[] = "/tmp/hym-storage-control-fuzz-XXXXXX";
  const char* dir = mkdtemp(tmpl);
  CHECK(dir != nullptr);
  // The fixture lives as long as the fuzzer; its files go when it exits.
  static std::string* const made = new std::string(dir);
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(*made, ec);
  });
  MasterOptions mo;
  mo.db_path = std::string(dir) + "/master";
  mo.service.max_pending_share_per_caller = 1.0;
  auto master = MasterServer::Create(mo);
  CHECK(master.ok()) << master.status();
  f->master = std::move(*master);
  StorageNodeOptions so;
  so.master_address = f->master->address();
  so.node_name = kNodeName;
  so.dram()->capacity_bytes = 8 << 20;
  so.rdma = RdmaMode::kOff;
  auto node = StorageNode::Create(so);
  CHECK(node.ok()) << node.status();
  f->node = std::move(*node);
  CHECK(f->node->WaitRegistered(absl::Now() + absl::Seconds(30)));
  // A few objects for ListExtents to page through.
  ClientOptions co;
  co.master_address = f->master->address();
  co.transport = TransportKind::kTcp;
  auto client = Client::Create(co);
  CHECK(client.ok()) << client.status();
  std::string bytes(4096, 'x');
  std::vector<std::string> keys;
  std::vector<ConstBuffer> bufs;
  for (int i = 0; i < kStoredObjects; ++i) {
    keys.push_back(absl::StrCat("fuzz-key-", i));
    bufs.push_back({bytes.data(), bytes.size()});
  }
  // The master lists a node a moment before the node has applied its
  // registration: retry until the put lands.
  bool stored = false;
  for (int attempt = 0; attempt < 100 && !stored; ++attempt) {
    auto put = (*client)->Put(keys, bufs);
    stored = put.ok() && put->stored == kStoredObjects;
    if (!stored) absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(stored) << "could not store the fixture's objects";
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  f->channel = grpc::CreateCustomChannel(f->node->control_address(),
                                         grpc::InsecureChannelCredentials(),
                                         args);
  return f;
}

Fixture& Get() {
  static Fixture* f = Make();
  return *f;
}

struct CallResult {
  grpc::Status status;
  std::vector<std::string> messages;
  bool timed_out = false;
};

// Any call (unary or streaming) with the given request messages through the
// generic stub.
CallResult RawCall(const std::string& method,
                   const std::vector<std::string>& requests, bool cancel) {
  grpc::CompletionQueue cq;
  grpc::GenericStub stub(Get().channel);
  grpc::ClientContext ctx;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  ctx.set_deadline(absl::ToChronoTime(deadline));
  CallResult out;
  auto wait = [&] {
    void* tag;
    bool ok = false;
    CHECK(cq.Next(&tag, &ok));
    return ok;
  };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&ctx, method, &cq);
  call->StartCall(nullptr);
  bool ok = wait();
  for (const std::string& m : requests) {
    if (!ok) break;
    grpc::Slice slice(m);
    grpc::ByteBuffer bb(&slice, 1);
    call->Write(bb, nullptr);
    ok = wait();
  }
  if (cancel) {
    ctx.TryCancel();
  } else if (ok) {
    call->WritesDone(nullptr);
    wait();
  }
  while (true) {
    grpc::ByteBuffer r;
    call->Read(&r, nullptr);
    if (!wait()) break;
    std::vector<grpc::Slice> slices;
    std::string s;
    if (r.Dump(&slices).ok()) {
      for (const auto& sl : slices) {
        s.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
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
  out.timed_out = out.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  return out;
}

const char* const kMethods[] = {
    "/hymcache.v1.StorageControl/GetStats",
    "/hymcache.v1.StorageControl/ListExtents",
    "/hymcache.v1.StorageControl/RequestReconcile",
    "/hymcache.v1.StorageControl/Nope",
};

void CheckGetStats(const CallResult& r, bool parses) {
  if (!r.status.ok()) return;
  FUZZ_CHECK(parses) << "GetStats answered OK to a request it cannot parse";
  FUZZ_CHECK(r.messages.size() == 1) << r.messages.size() << " answers";
  v1::StorageStatsResponse resp;
  FUZZ_CHECK(resp.ParseFromString(r.messages[0]));
  FUZZ_CHECK(resp.name() == kNodeName) << resp.name();
}

void CheckListExtents(const CallResult& r, bool parses,
                      const v1::ListExtentsRequest& req) {
  if (!r.status.ok()) return;
  FUZZ_CHECK(parses) << "ListExtents answered OK to a request it cannot parse";
  // 0 asks for 4096; more than 65536 is served as 65536.
  const uint32_t page =
      req.page_size() == 0 ? 4096 : std::min<uint32_t>(req.page_size(), 65536);
  size_t total = 0;
  for (const std::string& m : r.messages) {
    v1::ListExtentsResponse resp;
    FUZZ_CHECK(resp.ParseFromString(m));
    FUZZ_CHECK(static_cast<uint32_t>(resp.extents_size()) <= page)
        << resp.extents_size() << " extents in a page of " << page;
    total += resp.extents_size();
  }
  FUZZ_CHECK(total == kStoredObjects) << total << " extents listed";
}

}  // namespace
}  // namespace hymcache::storage

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 2;
  hymcache::storage::Get();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hymcache::storage;
  hymcache::fuzz::FuzzInput in(data, size);
  for (int calls = 0; calls < 4 && !in.empty(); ++calls) {
    const uint8_t op = in.U8();
    const std::string method = kMethods[op % 4];
    const int messages = (op >> 2) % 3;  // 0, 1 or 2 request messages
    const bool cancel = (op & 0x20) != 0;
    std::vector<std::string> requests;
    for (int m = 0; m < messages; ++m) requests.push_back(in.String(64));
    CallResult r = RawCall(method, requests, cancel);
    FUZZ_CHECK(!r.timed_out) << method << " outlived its deadline";
    if (cancel || messages != 1) {
      // gRPC's callback handlers answer a unary call from its first
      // message (a second one is ignored); only liveness is checked.
      continue;
    }
    switch (op % 4) {
      case 0: {
        hymcache::v1::StorageStatsRequest req;
        CheckGetStats(r, req.ParseFromString(requests[0]));
        break;
      }
      case 1: {
        hymcache::v1::ListExtentsRequest req;
        const bool parses = req.ParseFromString(requests[0]);
        CheckListExtents(r, parses, req);
        break;
      }
      case 2: {
        hymcache::v1::RequestReconcileRequest req;
        if (r.status.ok()) {
          FUZZ_CHECK(req.ParseFromString(requests[0]))
              << "RequestReconcile answered OK to a request it cannot parse";
        }
        break;
      }
      default:
        FUZZ_CHECK(r.status.error_code() == grpc::StatusCode::UNIMPLEMENTED)
            << "an unknown method answered " << r.status.error_code();
    }
  }
  // Still serving.
  CallResult after = RawCall(kMethods[0], {""}, false);
  FUZZ_CHECK(after.status.ok()) << "GetStats after the input: "
                                << after.status.error_message();
  CheckGetStats(after, true);
  return 0;
}
