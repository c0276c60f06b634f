// reconcile_bench: how long a storage node holding N objects takes to
// reconcile with the master (master/master_service_reconcile.cc),
// and what that costs concurrent lookups.
//
//   bazel run -c opt //tools/bench:reconcile_bench -- --objects=1000000
//
// Starts a master and a DRAM storage node in-process (real gRPC, real
// RocksDB), stores --objects objects of --object_bytes through the SDK in
// batches, then measures:
//   1. an anti-entropy round: the node streams every extent, the master
//      compares it with its listings (node-side time from its own log line,
//      end to end from the request to the completed round);
//   2. a master restart: from the new process starting (loading N listings)
//      until the node's objects are served again (the node re-registers and
//      reconciles before it is served);
// while a thread issues BatchLookups of 64 keys and records the slowest
// (the comparison runs under the master's lock).
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/cli.h"
#include "common/thread.h"
#include "master/master_server.h"
#include "proto/storage.grpc.pb.h"
#include "storage_node/storage_node.h"

DEFINE_uint64(objects, 1000000, "objects the node holds");
DEFINE_uint64(object_bytes, 64, "bytes per object");
DEFINE_uint32(batch, 1024, "objects per Put");
DEFINE_string(dir, "/tmp/hymcache-reconcile-bench", "scratch directory (wiped)");

namespace hymcache {
namespace {

namespace v1 = ::hymcache::v1;

std::string Key(uint64_t i) { return absl::StrCat("reconcile-bench-", i); }

// Slowest BatchLookup seen while running.
class LookupProbe {
 public:
  explicit LookupProbe(Client* client) : client_(client) {
    thread_ = Thread("lookup-probe", [this] { Loop(); });
  }
  ~LookupProbe() { Stop(); }
  void Stop() {
    stop_ = true;
    thread_.Join();
  }
  absl::Duration Reset() {
    absl::Duration d = absl::Nanoseconds(max_ns_.exchange(0));
    return d;
  }
  uint64_t calls() const { return calls_; }
  // Calls that returned an error (their time still counts above).
  uint64_t failed() const { return failed_; }

 private:
  void Loop() {
    std::vector<std::string> keys;
    uint64_t i = 0;
    while (!stop_) {
      keys.clear();
      for (int k = 0; k < 64; ++k) keys.push_back(Key((i++ * 7919) % FLAGS_objects));
      const absl::Time t = absl::Now();
      CallOptions o;
      o.deadline = absl::Now() + absl::Seconds(30);
      if (!client_->BatchLookup(keys, o).ok()) ++failed_;
      const int64_t ns = absl::ToInt64Nanoseconds(absl::Now() - t);
      int64_t prev = max_ns_.load();
      while (ns > prev && !max_ns_.compare_exchange_weak(prev, ns)) {
      }
      ++calls_;
    }
  }
  Client* const client_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> max_ns_{0};
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> failed_{0};
  Thread thread_;
};

// The node's stats; an error if its control service does not answer.
absl::StatusOr<v1::StorageStatsResponse> NodeStats(
    v1::StorageControl::Stub* stub) {
  grpc::ClientContext ctx;
  v1::StorageStatsResponse st;
  grpc::Status s = stub->GetStats(&ctx, v1::StorageStatsRequest(), &st);
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("storage GetStats: ", s.error_message()));
  }
  return st;
}

int Main() {
  if (FLAGS_objects == 0 || FLAGS_batch == 0) {
    LOG(ERROR) << "--objects and --batch must be at least 1";
    return 2;
  }
  std::filesystem::remove_all(FLAGS_dir);
  std::filesystem::create_directories(FLAGS_dir);
  MasterOptions mo;
  mo.db_path = FLAGS_dir + "/master";
  mo.service.heartbeat_interval = absl::Milliseconds(100);
  mo.service.reconcile_interval = absl::ZeroDuration();  // rounds on request only
  auto master = MasterServer::Create(mo);
  if (!master.ok()) {
    LOG(ERROR) << master.status();
    return 1;
  }
  const std::string address = (*master)->address();
  mo.listen_address = address;  // a restart comes back on the same port

  StorageNodeOptions so;
  so.master_address = address;
  so.dram()->alignment = 64;
  so.dram()->capacity_bytes = std::max<uint64_t>(
      uint64_t{64} << 20,
      FLAGS_objects * ((FLAGS_object_bytes + 63) / 64 * 64) * 5 / 4);
  so.rpc_timeout = absl::Seconds(30);
  auto node = StorageNode::Create(so);
  if (!node.ok() ||
      !(*node)->WaitRegistered(absl::Now() + absl::Seconds(30))) {
    LOG(ERROR) << "storage node: " << node.status();
    return 1;
  }
  ClientOptions co;
  co.master_address = address;
  co.default_deadline = absl::Seconds(60);
  auto client = Client::Create(co);
  if (!client.ok()) return 1;

  // Fill.
  const absl::Time fill_start = absl::Now();
  std::vector<uint8_t> bytes(FLAGS_object_bytes, 0x5a);
  for (uint64_t begin = 0; begin < FLAGS_objects; begin += FLAGS_batch) {
    const uint64_t n = std::min<uint64_t>(FLAGS_batch, FLAGS_objects - begin);
    std::vector<std::string> keys;
    std::vector<ConstBuffer> in;
    for (uint64_t i = begin; i < begin + n; ++i) {
      keys.push_back(Key(i));
      in.push_back({bytes.data(), bytes.size()});
    }
    auto r = (*client)->Put(keys, in);
    if (!r.ok() || r->stored != n) {
      LOG(ERROR) << "fill failed at " << begin << ": "
                 << (r.ok() ? absl::StrCat(r->stored, " stored") : r.status().ToString());
      return 1;
    }
  }
  std::printf("filled %llu objects of %llu B in %.1f s\n",
              static_cast<unsigned long long>(FLAGS_objects),
              static_cast<unsigned long long>(FLAGS_object_bytes),
              absl::ToDoubleSeconds(absl::Now() - fill_start));

  auto control = v1::StorageControl::NewStub(grpc::CreateChannel(
      (*node)->control_address(), grpc::InsecureChannelCredentials()));
  LookupProbe probe(client->get());
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Duration quiet_max = probe.Reset();

  // 1. One anti-entropy round.
  absl::StatusOr<v1::StorageStatsResponse> st = NodeStats(control.get());
  if (!st.ok()) {
    LOG(ERROR) << st.status();
    return 1;
  }
  uint64_t before = st->reconciliations();
  {
    grpc::ClientContext ctx;
    v1::RequestReconcileResponse asked;
    grpc::Status s = control->RequestReconcile(
        &ctx, v1::RequestReconcileRequest(), &asked);
    if (!s.ok()) {
      LOG(ERROR) << "RequestReconcile: " << s.error_message();
      return 1;
    }
  }
  const absl::Time t1 = absl::Now();
  do {
    absl::SleepFor(absl::Milliseconds(5));
    st = NodeStats(control.get());
    if (!st.ok()) {
      LOG(ERROR) << st.status();
      return 1;
    }
  } while (st->reconciliations() <= before &&
           absl::Now() - t1 < absl::Minutes(5));
  const absl::Duration round = absl::Now() - t1;
  const absl::Duration round_max = probe.Reset();
  if (st->reconciliations() <= before) {
    LOG(ERROR) << "the anti-entropy round did not complete in 5 minutes";
    return 1;
  }
  if (probe.calls() == probe.failed()) {
    LOG(ERROR) << "every one of " << probe.calls()
               << " probe BatchLookups failed (or none ran)";
    return 1;
  }
  std::printf(
      "anti-entropy round: %.2f s from request to completion (includes up "
      "to one 100 ms heartbeat wait); node: %s\n"
      "  slowest 64-key BatchLookup: %.1f ms during the round, %.1f ms "
      "before it\n",
      absl::ToDoubleSeconds(round), st->last_reconcile().c_str(),
      absl::ToDoubleMilliseconds(round_max),
      absl::ToDoubleMilliseconds(quiet_max));

  // 2. Master restart: load, re-registration, reconciliation, served.
  probe.Stop();
  (*master)->Shutdown();
  master->reset();
  const absl::Time t2 = absl::Now();
  auto again = MasterServer::Create(mo);
  if (!again.ok()) {
    LOG(ERROR) << again.status();
    return 1;
  }
  const absl::Duration load = absl::Now() - t2;
  while (true) {
    auto look = (*client)->BatchLookup({Key(FLAGS_objects / 2)});
    if (look.ok() && look->hit_prefix == 1) break;
    if (absl::Now() - t2 > absl::Minutes(5)) {
      LOG(ERROR) << "node never served again";
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  const absl::Duration served = absl::Now() - t2;
  st = NodeStats(control.get());
  if (!st.ok()) {
    LOG(ERROR) << st.status();
    return 1;
  }
  std::printf(
      "master restart: loaded in %.2f s, node's objects served again after "
      "%.2f s (re-register + reconcile); node: %s\n",
      absl::ToDoubleSeconds(load), absl::ToDoubleSeconds(served),
      st->last_reconcile().c_str());
  (*node)->Shutdown();
  (*again)->Shutdown();
  return 0;
}

}  // namespace
}  // namespace hymcache

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "reconcile_bench",
       .usage = "reconcile_bench: how long a storage node holding N objects "
                "takes to reconcile with the master, and what that costs "
                "concurrent lookups",
       .main_file = __FILE__},
      &argc, &argv);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  return hymcache::Main();
}
