// ha_bench: the steady-state cost of master HA (docs/ha.md), side by side
// in one run: Put and BatchLookup throughput of a plain master ("off")
// against the leader of two masters elected through etcd, whose standby
// follows it asynchronously ("async") or acknowledges every commit before
// the client hears of it ("sync").
//
//   bazel run -c opt //tools/bench:ha_bench -- [--modes=off,async,sync]
//       [--threads=4] [--seconds=3] [--reps=2]
//
// Each mode starts its daemons afresh (real hymcache-master processes; HA:
// a 1-member etcd from Debian's etcd-server, two masters with --etcd on
// separate --db_path, the bench waits until the standby is past its full
// copy), registers a fake storage node through the stub (as lookup_bench:
// one large region, no storage daemon: the master keeps metadata only),
// then, --threads client threads each with its own connection to the
// leader:
//   put:    PutStart + PutCommit of --put_keys 4 KiB keys per put, for
//           --seconds;
//   lookup: BatchLookup of --batch random keys the puts committed, for
//           --seconds.
// Modes run in turn, --reps times (each rep rotates the order). Prints one
// row per run and then, per mode, the best rep's puts/s and lookups/s and
// their ratio to off's. In sync mode it also prints the leader's
// replication_sync_commits and replication_sync_timeouts.
//
// Caveat: the standby and etcd share this machine (and its cores) with the
// leader and the load.
#include <gflags/gflags.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cli.h"
#include "common/thread.h"
#include "master/proving_heartbeat.h"
#include "proto/master.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/daemon.h"
#include "tests/etcd_cluster.h"

DEFINE_string(modes, "off,async,sync",
              "modes to compare (off first: the base)");
DEFINE_int32(threads, 4, "client threads (one connection each)");
DEFINE_double(seconds, 3, "timed seconds per phase");
DEFINE_int32(reps, 2, "repetitions of every mode");
DEFINE_int32(put_keys, 4, "keys per put");
DEFINE_int32(batch, 32, "keys per BatchLookup");
DEFINE_string(dir, "", "daemon data (default: a new /tmp directory)");
DEFINE_string(master_binary, "", "hymcache-master (default: from runfiles)");

namespace hymcache {
namespace {

namespace v1 = ::hymcache::v1;
using testing::Daemon;

std::unique_ptr<v1::MasterService::Stub> Dial(const std::string& address,
                                              int channel_id) {
  grpc::ChannelArguments args;
  // Distinct args: a connection per thread.
  args.SetInt("hymcache.bench_channel", channel_id);
  return v1::MasterService::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
}

std::map<std::string, double> Stats(v1::MasterService::Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::GetStatsResponse resp;
  if (!stub->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok()) return {};
  return {resp.stats().begin(), resp.stats().end()};
}

// The daemons of one mode; the leader's address.
struct Rig {
  std::unique_ptr<testing::EtcdCluster> etcd;
  std::vector<Daemon> masters;
  std::string leader;
};

bool Wait(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

absl::StatusOr<Rig> StartRig(const std::string& binary, const std::string& mode,
                             const std::string& dir) {
  Rig rig;
  std::vector<std::string> common = {"--listen=127.0.0.1:0",
                                     "--node_timeout_ms=3600000"};
  if (mode == "off") {
    std::vector<std::string> args = common;
    args.push_back("--db_path=" + dir + "/m0");
    auto d = Daemon::Start(binary, args);
    if (!d.ok()) return d.status();
    auto address = testing::ParseMasterReadyLine(d->ready_line());
    if (!address.ok()) return address.status();
    rig.leader = *address;
    rig.masters.push_back(std::move(*d));
    return rig;
  }
  auto etcd = testing::EtcdCluster::Start({.members = 1});
  if (!etcd.ok()) return etcd.status();
  rig.etcd = std::move(*etcd);
  std::vector<std::string> addresses;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> args = common;
    args.push_back(absl::StrCat("--db_path=", dir, "/m", i));
    args.push_back("--etcd=" + absl::StrJoin(rig.etcd->endpoints(), ","));
    args.push_back("--cluster=bench");
    args.push_back("--lease_ttl_s=1");
    args.push_back("--replication=" + mode);
    auto d = Daemon::Start(binary, args);
    if (!d.ok()) return d.status();
    const std::string prefix = "hymcache-master standing by on ";
    if (d->ready_line().rfind(prefix, 0) != 0) {
      return absl::InternalError("unexpected master line: " + d->ready_line());
    }
    addresses.push_back(d->ready_line().substr(prefix.size()));
    rig.masters.push_back(std::move(*d));
    if (i == 0) {
      // The first master leads once it serves.
      auto stub = Dial(addresses[0], 1000);
      if (!Wait([&] { return !Stats(stub.get()).empty(); },
                absl::Seconds(30))) {
        return absl::DeadlineExceededError("the first master never led");
      }
    }
  }
  rig.leader = addresses[0];
  auto stub = Dial(rig.leader, 1001);
  // The standby past its full copy.
  if (!Wait([&] { return Stats(stub.get())["replication_followers"] >= 1; },
            absl::Seconds(30))) {
    return absl::DeadlineExceededError("the standby never followed");
  }
  return rig;
}

// The fake node's key (it signs the write receipts of the puts), or
// nullopt after printing why it could not register.
std::optional<HmacSha256> RegisterFakeNode(v1::MasterService::Stub* stub) {
  absl::StatusOr<std::string> key = master::RegisterProvenNode(
      stub, master::MetadataOnlyNodeRequest("bench-node"));
  if (!key.ok()) {
    std::fprintf(stderr, "%s\n", key.status().ToString().c_str());
    return std::nullopt;
  }
  return HmacSha256(*key);
}

struct Result {
  double puts_per_s = 0;
  double lookups_per_s = 0;
  std::map<std::string, double> stats;
};

absl::StatusOr<Result> RunMode(const std::string& binary,
                               const std::string& mode,
                               const std::string& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto rig = StartRig(binary, mode, dir);
  if (!rig.ok()) return rig.status();
  auto admin = Dial(rig->leader, 0);
  const std::optional<HmacSha256> node_key = RegisterFakeNode(admin.get());
  if (!node_key) return absl::InternalError("cannot register the fake node");
  const int threads = FLAGS_threads;
  std::vector<std::vector<std::string>> keys(threads);
  std::atomic<uint64_t> puts{0}, failures{0};
  auto phase = [&](const std::function<void(int, v1::MasterService::Stub*,
                                            absl::Time)>& body) {
    std::vector<std::unique_ptr<v1::MasterService::Stub>> stubs;
    for (int t = 0; t < threads; ++t)
      stubs.push_back(Dial(rig->leader, 10 + t));
    const absl::Time end = absl::Now() + absl::Seconds(FLAGS_seconds);
    std::vector<Thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back(absl::StrCat("bench-", t),
                      [&, t] { body(t, stubs[t].get(), end); });
    }
    for (Thread& th : ts) th.Join();
  };
  Result r;
  absl::Time t0 = absl::Now();
  phase([&](int t, v1::MasterService::Stub* stub, absl::Time end) {
    uint64_t n = 0;
    while (absl::Now() < end) {
      v1::PutStartRequest req;
      for (int k = 0; k < FLAGS_put_keys; ++k) {
        req.add_keys(absl::StrCat(mode, "-t", t, "-", n, "-", k));
        req.add_lengths(4096);
      }
      ++n;
      v1::PutStartResponse resp;
      grpc::ClientContext ctx;
      if (!stub->PutStart(&ctx, req, &resp).ok() || resp.put_id() == 0) {
        failures.fetch_add(1);
        continue;
      }
      v1::PutCommitRequest commit;
      commit.set_put_id(resp.put_id());
      // What the node would have given the client for the bytes.
      master::AddWriteReceipts(resp, *node_key, &commit);
      v1::PutCommitResponse done;
      grpc::ClientContext ctx2;
      if (!stub->PutCommit(&ctx2, commit, &done).ok() ||
          done.committed() != static_cast<uint32_t>(FLAGS_put_keys)) {
        failures.fetch_add(1);
        continue;
      }
      puts.fetch_add(1);
      for (const std::string& k : req.keys()) keys[t].push_back(k);
    }
  });
  r.puts_per_s = puts.load() / absl::ToDoubleSeconds(absl::Now() - t0);
  std::vector<std::string> all;
  for (auto& v : keys) all.insert(all.end(), v.begin(), v.end());
  if (all.size() < static_cast<size_t>(FLAGS_batch)) {
    return absl::InternalError(absl::StrCat(mode, ": only ", all.size(),
                                            " keys committed (",
                                            failures.load(), " failed puts)"));
  }
  std::atomic<uint64_t> lookups{0}, misses{0};
  t0 = absl::Now();
  phase([&](int t, v1::MasterService::Stub* stub, absl::Time end) {
    std::mt19937_64 rng(t);
    std::uniform_int_distribution<size_t> pick(0, all.size() - 1);
    while (absl::Now() < end) {
      v1::BatchLookupRequest req;
      for (int k = 0; k < FLAGS_batch; ++k) req.add_keys(all[pick(rng)]);
      v1::BatchLookupResponse resp;
      grpc::ClientContext ctx;
      if (!stub->BatchLookup(&ctx, req, &resp).ok()) {
        failures.fetch_add(1);
        continue;
      }
      lookups.fetch_add(1);
      for (const auto& e : resp.results()) {
        if (!e.found()) misses.fetch_add(1);
      }
    }
  });
  r.lookups_per_s = lookups.load() / absl::ToDoubleSeconds(absl::Now() - t0);
  r.stats = Stats(admin.get());
  if (misses.load() > 0 || failures.load() > 0) {
    return absl::InternalError(absl::StrCat(mode, ": ", misses.load(),
                                            " misses, ", failures.load(),
                                            " failed calls"));
  }
  return r;
}

int Main(const char* argv0) {
  const std::string binary =
      FLAGS_master_binary.empty()
          ? testing::BinaryRunfile(argv0, "master/hymcache-master")
          : FLAGS_master_binary;
  if (binary.empty()) {
    std::fprintf(stderr,
                 "ha_bench: hymcache-master not found; pass --master_binary\n");
    return 2;
  }
  const std::vector<std::string> modes =
      absl::StrSplit(FLAGS_modes, ',', absl::SkipEmpty());
  const std::string dir =
      FLAGS_dir.empty() ? absl::StrCat("/tmp/hymcache-ha-bench-", getpid())
                        : FLAGS_dir;
  std::map<std::string, Result> best;
  for (int rep = 0; rep < FLAGS_reps; ++rep) {
    for (size_t i = 0; i < modes.size(); ++i) {
      const std::string& mode = modes[(i + rep) % modes.size()];
      auto r = RunMode(binary, mode, dir + "/" + mode);
      if (!r.ok()) {
        std::fprintf(stderr, "ha_bench: %s\n", r.status().ToString().c_str());
        return 1;
      }
      std::printf("rep=%d mode=%s puts_per_s=%.0f lookups_per_s=%.0f", rep,
                  mode.c_str(), r->puts_per_s, r->lookups_per_s);
      if (mode == "sync") {
        std::printf(" sync_commits=%.0f sync_timeouts=%.0f",
                    r->stats["replication_sync_commits"],
                    r->stats["replication_sync_timeouts"]);
      }
      std::printf("\n");
      std::fflush(stdout);
      Result& b = best[mode];
      b.puts_per_s = std::max(b.puts_per_s, r->puts_per_s);
      b.lookups_per_s = std::max(b.lookups_per_s, r->lookups_per_s);
    }
  }
  std::filesystem::remove_all(dir);
  const Result& base = best[modes[0]];
  std::printf("\nthreads=%d put_keys=%d batch=%d seconds=%.1f (best of %d)\n",
              FLAGS_threads, FLAGS_put_keys, FLAGS_batch, FLAGS_seconds,
              FLAGS_reps);
  for (const std::string& m : modes) {
    const Result& r = best[m];
    std::printf(
        "%-6s puts/s %8.0f (%.2fx)  lookups/s %8.0f (%.2fx)\n", m.c_str(),
        r.puts_per_s, base.puts_per_s > 0 ? r.puts_per_s / base.puts_per_s : 0,
        r.lookups_per_s,
        base.lookups_per_s > 0 ? r.lookups_per_s / base.lookups_per_s : 0);
  }
  return 0;
}

}  // namespace
}  // namespace hymcache

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "ha_bench",
       .usage = "ha_bench [--modes=off,async,sync] [--threads=4] "
                "[--seconds=3]: Put and BatchLookup throughput with master "
                "HA off and on, side by side",
       .main_file = __FILE__},
      &argc, &argv);
  return hymcache::Main(argv[0]);
}
