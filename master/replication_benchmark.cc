// The cost of standby replication on the leader, and the standby's lag.
//
//   bazel run -c opt //master:replication_benchmark -- [--seconds=3]
//       [--threads=4] [--keys=4] [--reps=2] [--dir=/tmp/hym-repl]
//
// A MasterService over a RocksDB store (as the daemon runs it: no fsync per
// write, the log kept for followers) takes PutStart + PutCommit of --keys
// 64 KiB blocks per put from --threads threads for --seconds, in three
// modes, side by side, --reps times (each rep starts with the next mode):
//   off:   no replication;
//   async: a ReplicaFollower (in this process, over loopback gRPC) follows
//          the leader; commits do not wait for it. A sampler reads the
//          leader's lag report every millisecond;
//   sync:  the same follower; every PutCommit is followed by
//          WaitReplicated(the store's latest sequence), as a leader that
//          acknowledges a commit only once a standby holds it.
// Prints per run "mode=... puts_per_s=... commit_p50_us=... commit_p99_us=..."
// (commit = PutCommit, plus the wait in sync mode), the async lag
// percentiles (sequences and microseconds), then the ratios of each mode's
// total throughput to off's.
//
// Caveat: the follower shares the machine (and its cores) with the leader
// and the load; on separate hosts the sync wait adds a network round trip
// instead of CPU contention.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/fake_clock.h"
#include "common/thread.h"
#include "master/master_service.h"
#include "master/metadata_store.h"
#include "master/proving_heartbeat.h"
#include "master/replica_follower.h"
#include "master/replication_source.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;

struct Flags {
  double seconds = 3;
  int threads = 4;
  int keys = 4;
  int reps = 2;
  std::string dir = "/tmp/hym-repl-bench";
};

enum class Mode { kOff, kAsync, kSync };
const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kOff:
      return "off";
    case Mode::kAsync:
      return "async";
    case Mode::kSync:
      return "sync";
  }
  return "?";
}

struct Result {
  uint64_t puts = 0;
  double seconds = 0;
  std::vector<int64_t> commit_us;
  std::vector<uint64_t> lag_seq;
  std::vector<int64_t> lag_us;
  double drain_ms = 0;  // async: until the follower held everything
};

template <typename T>
T Pct(std::vector<T> v, double p) {
  if (v.empty()) return T();
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

void Die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

// One client thread of RunOnce: PutStart + PutCommit of --keys blocks
// until `stop`, each commit's latency (with sync: until the standby holds
// it) into `commit_us`.
void PutUntilStopped(const Flags& flags, Mode mode, int t, MasterService* m,
                     ReplicationSource* source, RocksDbMetadataStore* raw_store,
                     const std::atomic<bool>& stop, std::atomic<uint64_t>& puts,
                     std::vector<int64_t>* commit_us) {
  for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
    v1::PutStartRequest req;
    for (int k = 0; k < flags.keys; ++k) {
      req.add_keys(absl::StrCat("t", t, "/", i, "/", k));
      req.add_lengths(64 * 1024);
    }
    auto r = m->PutStart(req);
    Die(r.status(), "PutStart");
    v1::PutCommitRequest c;
    c.set_put_id(r->put_id());
    const absl::Time t0 = absl::Now();
    Die(m->PutCommit(c).status(), "PutCommit");
    if (mode == Mode::kSync) {
      Die(source->WaitReplicated(raw_store->LatestSequence(),
                                 absl::Now() + absl::Seconds(10)),
          "WaitReplicated");
    }
    commit_us->push_back(absl::ToInt64Microseconds(absl::Now() - t0));
    puts.fetch_add(1, std::memory_order_relaxed);
  }
}

Result RunOnce(const Flags& flags, Mode mode, int rep) {
  const std::string base =
      absl::StrCat(flags.dir, "/", ModeName(mode), "-", rep);
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base);
  RocksDbMetadataStoreOptions so;
  so.path = base + "/leader";
  so.keep_wal_seconds = 3600;
  auto store = RocksDbMetadataStore::Create(so);
  Die(store.status(), "leader store");
  RocksDbMetadataStore* raw_store = store->get();

  std::unique_ptr<ReplicationSource> source;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<ReplicaFollower> follower;
  if (mode != Mode::kOff) {
    ReplicationSourceOptions o;
    o.store = raw_store;
    // As the daemon: async streams gather 2 ms of writes per message
    // (MasterReplicationOptions::async_batch_delay); sync sends at once.
    if (mode == Mode::kAsync) o.batch_delay = absl::Milliseconds(2);
    auto src = ReplicationSource::Create(o);
    Die(src.status(), "source");
    source = std::move(src).value();
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(source.get());
    server = b.BuildAndStart();
    ReplicaFollowerOptions fo;
    fo.leader = absl::StrCat("127.0.0.1:", port);
    fo.store.path = base + "/standby";
    auto f = ReplicaFollower::Create(fo);
    Die(f.status(), "follower");
    follower = std::move(f).value();
  }

  FakeClock clock;  // nodes never time out, puts never expire
  MasterServiceOptions mo;
  mo.clock = &clock;
  mo.max_pending_share_per_caller = 1.0;
  // The master alone: its node holds no bytes and signs no receipts.
  mo.require_write_receipts = false;
  auto svc = MasterService::Create(mo, std::move(store).value());
  Die(svc.status(), "master");
  const v1::RegisterNodeRequest reg = MetadataOnlyNodeRequest("bench-node");
  auto registered = (*svc)->RegisterNode(reg);
  Die(registered.status(), "register");
  Die((*svc)
          ->Heartbeat(ProvingHeartbeat(reg, *registered, clock.Now()))
          .status(),
      "heartbeat");
  if (follower != nullptr) {
    Die(source->WaitReplicated(raw_store->LatestSequence(),
                               absl::Now() + absl::Seconds(30)),
        "initial copy");
  }

  Result result;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> puts{0};
  std::vector<std::vector<int64_t>> commit_us(flags.threads);
  std::vector<Thread> threads;
  Thread sampler;
  if (mode == Mode::kAsync) {
    sampler = Thread("repl-sampler", [&] {
      while (!stop.load()) {
        ReplicationSource::Stats s = source->GetStats();
        if (!s.followers.empty()) {
          result.lag_seq.push_back(s.followers[0].lag_sequences);
          result.lag_us.push_back(
              absl::ToInt64Microseconds(s.followers[0].lag_time));
        }
        absl::SleepFor(absl::Milliseconds(1));
      }
    });
  }
  const absl::Time start = absl::Now();
  for (int t = 0; t < flags.threads; ++t) {
    threads.emplace_back("repl-bench", [&, t] {
      PutUntilStopped(flags, mode, t, svc->get(), source.get(), raw_store, stop,
                      puts, &commit_us[t]);
    });
  }
  absl::SleepFor(absl::Seconds(flags.seconds));
  stop.store(true);
  for (Thread& th : threads) th.Join();
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  sampler.Join();
  result.puts = puts.load();
  for (auto& v : commit_us) {
    result.commit_us.insert(result.commit_us.end(), v.begin(), v.end());
  }
  if (follower != nullptr) {
    const absl::Time d0 = absl::Now();
    Die(follower->WaitApplied(raw_store->LatestSequence(),
                              absl::Now() + absl::Seconds(60)),
        "drain");
    result.drain_ms = absl::ToDoubleMilliseconds(absl::Now() - d0);
    Die(follower->Stop(), "follower stop");
    source->Shutdown();
    server->Shutdown();
  }
  svc->reset();
  std::filesystem::remove_all(base);
  return result;
}

int Main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strncmp(a, "--seconds=", 10) == 0) {
      flags.seconds = std::atof(a + 10);
    } else if (std::strncmp(a, "--threads=", 10) == 0) {
      flags.threads = std::atoi(a + 10);
    } else if (std::strncmp(a, "--keys=", 7) == 0) {
      flags.keys = std::atoi(a + 7);
    } else if (std::strncmp(a, "--reps=", 7) == 0) {
      flags.reps = std::atoi(a + 7);
    } else if (std::strncmp(a, "--dir=", 6) == 0) {
      flags.dir = a + 6;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a);
      return 2;
    }
  }
  std::printf("threads=%d keys_per_put=%d seconds=%.1f reps=%d\n",
              flags.threads, flags.keys, flags.seconds, flags.reps);
  const Mode modes[] = {Mode::kOff, Mode::kAsync, Mode::kSync};
  double total_puts[3] = {0, 0, 0};
  double total_seconds[3] = {0, 0, 0};
  for (int rep = 0; rep < flags.reps; ++rep) {
    for (int k = 0; k < 3; ++k) {
      const int mi = (k + rep) % 3;  // each mode first in turn
      Result r = RunOnce(flags, modes[mi], rep);
      total_puts[mi] += r.puts;
      total_seconds[mi] += r.seconds;
      std::printf(
          "rep=%d mode=%s puts_per_s=%.0f commit_p50_us=%lld "
          "commit_p99_us=%lld",
          rep, ModeName(modes[mi]), r.puts / r.seconds,
          static_cast<long long>(Pct(r.commit_us, 0.5)),
          static_cast<long long>(Pct(r.commit_us, 0.99)));
      if (modes[mi] == Mode::kAsync) {
        std::printf(
            " lag_seq_p50=%llu lag_seq_p99=%llu lag_seq_max=%llu "
            "lag_us_p50=%lld lag_us_p99=%lld lag_us_max=%lld samples=%zu",
            static_cast<unsigned long long>(Pct(r.lag_seq, 0.5)),
            static_cast<unsigned long long>(Pct(r.lag_seq, 0.99)),
            static_cast<unsigned long long>(Pct(r.lag_seq, 1.0)),
            static_cast<long long>(Pct(r.lag_us, 0.5)),
            static_cast<long long>(Pct(r.lag_us, 0.99)),
            static_cast<long long>(Pct(r.lag_us, 1.0)), r.lag_us.size());
      }
      if (modes[mi] != Mode::kOff) {
        std::printf(" drain_ms=%.1f", r.drain_ms);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  const double off = total_puts[0] / total_seconds[0];
  std::printf("ratio async/off=%.3f sync/off=%.3f\n",
              total_puts[1] / total_seconds[1] / off,
              total_puts[2] / total_seconds[2] / off);
  return 0;
}

}  // namespace
}  // namespace master
}  // namespace hymcache

int main(int argc, char** argv) { return hymcache::master::Main(argc, argv); }
