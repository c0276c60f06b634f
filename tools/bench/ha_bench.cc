// ha_bench: the steady-state cost of master HA (docs/ha.md), side by side
// in one run: Put and BatchLookup throughput of a plain master ("off")
// against the leader of two masters elected through etcd, whose standby
// follows it asynchronously ("async"), acknowledges every commit before
// the client hears of it ("sync"), or is asked by the client whether it
// holds each commit before the put counts ("confirm": the client's side is
// the SDK's, client/standby_confirmer.h).
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
//   lookup: BatchLookup of --batch random keys the puts committed (packed
//           answers, as the SDK's, unless --nopacked), for --seconds, once
//           every master is idle again (--settle_s: the standby's index
//           snapshot that the puts set off runs first).
// Modes run in turn, --reps times (each rep rotates the order). Prints one
// row per run and then, per mode, the best rep's puts/s and lookups/s and
// their ratio to off's. In sync mode it also prints the leader's
// replication_sync_commits and replication_sync_timeouts; in confirm mode
// the client's WaitApplied calls, timeouts and commits not confirmed.
//
// --restart_objects=N instead times the recovery from losing every master
// at once (issue 30: "all masters restarted at once with 1M objects:
// serving within 2 s"): an async pair commits N objects (puts of 1,000
// keys), the bench waits until the standby holds them all, SIGKILLs both
// masters together, restarts both on their stores and their addresses (as
// systemd or a StatefulSet would; --restart_on_new_ports: on new ones, as
// after moving to other hosts) and polls both with BatchLookups of 32 of
// the committed keys; it prints the milliseconds from the restart to the
// first lookup that finds every key (which includes the dead leader's term
// ending: at once where a restarted master finds its own address in the
// leader key, else when its lease runs out, --lease_ttl_s=1), --reps times,
// each rep once with the masters' --preload_index (the default) and once
// without:
//   bazel run -c opt //tools/bench:ha_bench -- --restart_objects=1000000
// --failover_objects=N does the same but kills only the leader: the time
// from the kill until the standby serves every sampled key.
//
// --modes=off,async:2,async compares the stream's batch delay
// (--replication_async_delay_ms) at 2 ms with the default.
//
// Each run's row has the puts' latency (PutStart + PutCommit, p50 and
// p99). A synchronous commit waits for the standby, so with one put in
// flight per thread sync keeps the leader less busy than off does, and
// the throughput ratio measures the round trip, not the leader's cost.
// --put_depth=N keeps N puts in flight per thread (gRPC's callback API)
// so that every mode saturates the leader: docs/ha.md measures the floor
// with --threads=4 --put_depth=128 --leader_cpu=0. --lookup_depth=N does
// the same for the lookups (docs/ha.md: --lookup_depth=16): with one in
// flight per thread their rate follows the round trip through the
// clients' core, which the standby and etcd share on a small machine.
// Each row also has the bench's own CPU per lookup and the other masters'
// share of a core during the lookups, and per put the bench's CPU and the
// other masters'. --lookup_stream sends the lookups as
// the SDK does, as messages of one LookupStream per thread, and
// --client_poll_strategy=poll polls as the SDK does by default.
//
// Mode "redis" is the baseline of issue 30's "lookups stay >= 0.5x Redis
// MGET-32": the lookup phase's load as MGETs to redis-server on the
// leader's CPU (--redis_server, --redis_keys; no put phase), and a last
// table of each mode's lookups against it.
//
// --modes=events_off,off compares a plain master that keeps no KV events
// (--event_log_capacity=0) with one that does (the default): the cost of
// publishing them. A mode ending in /events_off is that mode with no
// events (--modes=async/events_off,async: their cost with HA on).
//
// Caveat: the standby and etcd share this machine (and its cores) with the
// leader and the load; --leader_cpu=N gives the first master (the leader,
// and mode off's master) CPU N to itself and puts everything else on the
// other CPUs, as if the leader had a host of its own.
#include <gflags/gflags.h>
#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/standby_confirmer.h"
#include "common/cli.h"
#include "common/grpc_polling.h"
#include "common/mutex.h"
#include "common/thread.h"
#include "master/proving_heartbeat.h"
#include "proto/master.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/daemon.h"
#include "tests/etcd_cluster.h"
#include "tools/bench/ha_bench_chains.h"
#include "tools/bench/redis_baseline.h"

DEFINE_string(modes, "off,async,sync",
              "modes to compare (off first: the base): off, async, sync, "
              "confirm; async:MS and confirm:MS set the stream's batch "
              "delay (--replication_async_delay_ms, "
              "--replication_confirm_delay_ms)");
DEFINE_int32(threads, 4, "client threads (one connection each)");
DEFINE_double(seconds, 3, "timed seconds per phase");
DEFINE_int32(reps, 2, "repetitions of every mode");
DEFINE_int32(put_depth, 1,
             "puts each client thread keeps in flight (above 1: gRPC's "
             "callback API, a chain of PutStart and PutCommit per slot): "
             "enough for a mode whose commits wait (sync) to keep the "
             "leader as busy as off does, without a thread per call");
DEFINE_int32(put_keys, 4, "keys per put");
DEFINE_int32(lookup_depth, 1,
             "lookups each client thread keeps in flight (above 1: gRPC's "
             "callback API): enough to keep the leader as busy in every "
             "mode, whatever else shares the clients' cores");
DEFINE_int32(batch, 32, "keys per BatchLookup");
DEFINE_string(dir, "", "daemon data (default: a new /tmp directory)");
DEFINE_string(master_binary, "", "hymcache-master (default: from runfiles)");
DEFINE_string(master_flags, "",
              "more flags for every master, space-separated (e.g. "
              "\"--grpc_poll_strategy=poll --rpc_threads=2\")");
DEFINE_uint64(failover_objects, 0,
              "as --restart_objects, but SIGKILL only the leader and time "
              "until the standby serves the committed keys");
DEFINE_uint64(restart_objects, 0,
              "instead of --modes: commit this many objects on an async pair, "
              "SIGKILL both masters at once, restart both and time until one "
              "serves lookups of them");
DEFINE_int32(leader_cpu, -1,
             "pin the first master (the one leading, and the single master "
             "of mode off) to this CPU and everything else (the bench's "
             "clients, the standby, etcd) to the other CPUs, as if the "
             "leader had a host of its own (--restart_objects: the first "
             "master again when restarted); -1: no pinning");
DEFINE_bool(lookup_stream, false,
            "lookups as messages of one LookupStream per client thread (what "
            "the SDK sends), one in flight, instead of unary BatchLookups; "
            "not with --lookup_depth above 1");
DEFINE_bool(packed, true,
            "lookups ask for packed answers (BatchLookupRequest.packed; the "
            "SDK always does)");
DEFINE_string(client_poll_strategy, "",
              "gRPC's poll strategy in this process, the clients' "
              "(common/grpc_polling.h): \"\" gRPC's default, \"poll\" (the "
              "SDK's default), \"epoll1\"; the masters keep their own");
DEFINE_string(redis_server, "redis-server",
              "mode redis: the redis-server binary (Debian's package)");
DEFINE_uint64(redis_keys, 200000,
              "mode redis: keys stored before the lookups (about as many as "
              "the other modes' puts commit in 3 s)");
DEFINE_double(settle_s, 20,
              "before the lookup phase, wait up to this long until every "
              "master of the mode is idle (under 2% of a core in two 250 ms "
              "windows in a row): what the puts left behind (the standby's "
              "index snapshot, on this machine's shared cores) then does not "
              "overlap the lookups; 0: start them at once");
DEFINE_bool(restart_on_new_ports, false,
            "with --restart_objects: restart the masters on new ports "
            "instead of their own addresses");

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
  std::vector<std::vector<std::string>> args;  // of each master
  std::string leader;                          // masters[0]
  std::string standby;                         // masters[1] (HA modes)
};

bool Wait(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

// The address in a master's "standing by on HOST:PORT" line.
absl::StatusOr<std::string> StandbyAddress(const Daemon& d) {
  const std::string prefix = "hymcache-master standing by on ";
  if (d.ready_line().rfind(prefix, 0) != 0) {
    return absl::InternalError("unexpected master line: " + d.ready_line());
  }
  return d.ready_line().substr(prefix.size());
}

// Daemon::Start of master `index` (0: the one that leads first), on
// --leader_cpu when that is set and index is 0 (taskset execs the master:
// the pid is the master's).
absl::StatusOr<Daemon> StartMaster(const std::string& binary,
                                   const std::vector<std::string>& args,
                                   int index) {
  if (FLAGS_leader_cpu < 0 || index != 0) return Daemon::Start(binary, args);
  std::vector<std::string> pinned = {"-c", absl::StrCat(FLAGS_leader_cpu),
                                     binary};
  pinned.insert(pinned.end(), args.begin(), args.end());
  return Daemon::Start("/usr/bin/taskset", pinned);
}

// --leader_cpu: this process (and what it starts later: etcd, the standby)
// on every CPU but the leader's.
absl::Status PinAwayFromLeaderCpu() {
  if (FLAGS_leader_cpu < 0) return absl::OkStatus();
  cpu_set_t set;
  CPU_ZERO(&set);
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (FLAGS_leader_cpu >= cpus || cpus < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--leader_cpu=", FLAGS_leader_cpu, " needs two or more CPUs (", cpus,
        " online) and one of them"));
  }
  for (long c = 0; c < cpus; ++c) {
    if (c != FLAGS_leader_cpu) CPU_SET(c, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::InternalError(
        absl::StrCat("sched_setaffinity: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Rig> StartRig(const std::string& binary,
                             const std::string& mode_name,
                             const std::string& dir,
                             const std::vector<std::string>& ha_flags = {}) {
  Rig rig;
  std::vector<std::string> common = {"--listen=127.0.0.1:0",
                                     "--node_timeout_ms=3600000"};
  absl::string_view mode_view = mode_name;
  if (absl::ConsumeSuffix(&mode_view, "/events_off")) {
    common.push_back("--event_log_capacity=0");
  }
  const std::string mode(mode_view);
  for (absl::string_view f :
       absl::StrSplit(FLAGS_master_flags, ' ', absl::SkipEmpty())) {
    common.emplace_back(f);
  }
  if (mode == "off" || mode == "events_off") {
    std::vector<std::string> args = common;
    args.push_back("--db_path=" + dir + "/m0");
    // The KV events' cost (docs/deployment.md): a plain master keeping
    // none.
    if (mode == "events_off") args.push_back("--event_log_capacity=0");
    auto d = StartMaster(binary, args, 0);
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
    // "async:MS": async with the stream's batch delay at MS.
    const std::vector<std::string> parts = absl::StrSplit(mode, ':');
    args.push_back("--replication=" + parts[0]);
    if (parts.size() > 1) {
      args.push_back(
          absl::StrCat("--replication_", parts[0], "_delay_ms=", parts[1]));
    }
    args.insert(args.end(), ha_flags.begin(), ha_flags.end());
    rig.args.push_back(args);
    auto d = StartMaster(binary, args, i);
    if (!d.ok()) return d.status();
    auto address = StandbyAddress(*d);
    if (!address.ok()) return address.status();
    addresses.push_back(*address);
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
  rig.standby = addresses[1];
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
  // CPU time (user + system) of the leader's process per operation: its
  // own cost, whatever the standby and etcd take from the shared cores.
  double leader_cpu_us_per_put = 0;
  double leader_cpu_us_per_lookup = 0;
  // This process's CPU per lookup (the clients', and the SDK confirmer's
  // threads in confirm modes) and the other masters' share of a core
  // during the lookup phase.
  double client_cpu_us_per_lookup = 0;
  double standby_cpu_share = 0;
  // The same per put: this process's CPU, and the other masters'.
  double client_cpu_us_per_put = 0;
  double standby_cpu_us_per_put = 0;
  // From the end of the put phase until every master was idle (--settle_s).
  absl::Duration settled;
  // PutStart + PutCommit, as the client sees it.
  absl::Duration put_p50;
  absl::Duration put_p99;
  std::map<std::string, double> stats;
};

// User + system CPU seconds `pid` has used (/proc/PID/stat); 0 if unknown.
double CpuSeconds(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(f, line)) return 0;
  // Fields after the command (which may hold spaces) start after ")".
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields =
      absl::StrSplit(line.substr(close + 2), ' ', absl::SkipEmpty());
  // utime and stime are fields 14 and 15 of the whole line: 12 and 13
  // after the state (field 3).
  if (fields.size() < 13) return 0;
  double ticks = 0;
  for (int i : {11, 12}) {
    double v = 0;
    if (!absl::SimpleAtod(fields[i], &v)) return 0;
    ticks += v;
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Waits until every process of `pids` uses under 2% of a core in two
// 250 ms windows in a row, or `limit` has passed; how long that took.
absl::Duration Settle(const std::vector<pid_t>& pids, absl::Duration limit) {
  const absl::Time start = absl::Now();
  constexpr absl::Duration kWindow = absl::Milliseconds(250);
  int quiet = 0;
  while (quiet < 2 && absl::Now() - start < limit) {
    std::vector<double> before;
    for (pid_t p : pids) before.push_back(CpuSeconds(p));
    absl::SleepFor(kWindow);
    bool idle = true;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (CpuSeconds(pids[i]) - before[i] >
          0.02 * absl::ToDoubleSeconds(kWindow))
        idle = false;
    }
    quiet = idle ? quiet + 1 : 0;
  }
  return absl::Now() - start;
}

// Mode "redis", the baseline of issue 30's "lookups stay >= 0.5x Redis
// MGET-32": redis-server (no persistence) on --leader_cpu as the leader
// would be, --redis_keys keys of about the puts' length stored with a
// 40-byte value each, then the lookup phase's load as MGETs of --batch
// random keys: --threads connections, --lookup_depth MGETs in flight on
// each (pipelined). No put phase.
absl::StatusOr<Result> RunRedis() {
  bench::RedisServer redis;
  if (!redis.Start(FLAGS_redis_server, FLAGS_leader_cpu)) {
    return absl::UnavailableError(absl::StrCat(
        "mode redis: cannot start ", FLAGS_redis_server,
        " (tools/setup.sh --test installs Debian's redis-server)"));
  }
  std::vector<std::string> keys;
  keys.reserve(FLAGS_redis_keys);
  for (uint64_t i = 0; i < FLAGS_redis_keys; ++i) {
    keys.push_back(absl::StrCat("redis-t", i % 4, "-c", i % 128, "-", i / 512,
                                "-", i % 4));
  }
  if (!bench::LoadRedis(redis.port(), keys)) {
    return absl::InternalError("mode redis: cannot store the keys");
  }
  Result r;
  const double server_cpu0 = CpuSeconds(redis.pid());
  const double client_cpu0 = CpuSeconds(getpid());
  const bench::MgetLoad load =
      bench::RunMgets(redis.port(), keys, FLAGS_batch, FLAGS_threads,
                      FLAGS_lookup_depth, FLAGS_seconds);
  if (load.errors > 0 || load.misses > 0 || load.calls == 0) {
    return absl::InternalError(
        absl::StrCat("mode redis: ", load.errors, " failed connections, ",
                     load.misses, " keys missed, ", load.calls, " MGETs"));
  }
  r.lookups_per_s = static_cast<double>(load.calls) / load.seconds;
  r.leader_cpu_us_per_lookup = (CpuSeconds(redis.pid()) - server_cpu0) * 1e6 /
                               static_cast<double>(load.calls);
  r.client_cpu_us_per_lookup = (CpuSeconds(getpid()) - client_cpu0) * 1e6 /
                               static_cast<double>(load.calls);
  return r;
}

absl::StatusOr<Result> RunMode(const std::string& binary,
                               const std::string& mode,
                               const std::string& dir) {
  if (mode == "redis") return RunRedis();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto rig = StartRig(binary, mode, dir);
  if (!rig.ok()) return rig.status();
  auto admin = Dial(rig->leader, 0);
  const std::optional<HmacSha256> node_key = RegisterFakeNode(admin.get());
  if (!node_key) return absl::InternalError("cannot register the fake node");
  auto confirmer = StandbyConfirmer::Create(
      {.dial = [](const std::string& address)
           -> absl::StatusOr<std::shared_ptr<grpc::Channel>> {
        return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
      }});
  if (!confirmer.ok()) return confirmer.status();
  const int threads = FLAGS_threads;
  std::vector<std::vector<std::string>> keys(threads);
  std::vector<std::vector<absl::Duration>> put_times(threads);
  std::atomic<uint64_t> puts{0}, failures{0};
  Mutex error_mu;
  std::string first_error ABSL_GUARDED_BY(error_mu);
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
  const pid_t leader_pid = rig->masters[0].pid();
  auto others_cpu = [&] {
    double sum = 0;
    for (size_t i = 1; i < rig->masters.size(); ++i)
      sum += CpuSeconds(rig->masters[i].pid());
    return sum;
  };
  double cpu0 = CpuSeconds(leader_pid);
  double client_cpu0 = CpuSeconds(getpid());
  double others_cpu0 = others_cpu();
  absl::Time t0 = absl::Now();
  phase([&](int t, v1::MasterService::Stub* stub, absl::Time end) {
    if (FLAGS_put_depth > 1) {
      // Safe to destroy once Wait returns, unlike a mutex the last chain
      // may still be unlocking.
      absl::BlockingCounter running(FLAGS_put_depth);
      std::vector<std::unique_ptr<bench::PutChain>> chains;
      for (int c = 0; c < FLAGS_put_depth; ++c) {
        chains.push_back(std::make_unique<bench::PutChain>(
            stub, &*node_key, confirmer->get(), FLAGS_put_keys,
            absl::StrCat(mode, "-t", t, "-c", c, "-"), end,
            [&running] { running.DecrementCount(); }));
      }
      for (auto& c : chains) c->Start();
      running.Wait();
      for (auto& c : chains) {
        puts.fetch_add(c->puts);
        failures.fetch_add(c->failures);
        keys[t].insert(keys[t].end(), c->keys.begin(), c->keys.end());
        put_times[t].insert(put_times[t].end(), c->times.begin(),
                            c->times.end());
      }
      return;
    }
    uint64_t n = 0;
    while (absl::Now() < end) {
      v1::PutStartRequest req;
      for (int k = 0; k < FLAGS_put_keys; ++k) {
        req.add_keys(absl::StrCat(mode, "-t", t, "-", n, "-", k));
        req.add_lengths(4096);
      }
      ++n;
      const absl::Time started = absl::Now();
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
          done.committed() != static_cast<uint32_t>(FLAGS_put_keys) ||
          !(*confirmer)
               ->Confirm(done, absl::Now() + bench::kConfirmTimeout)
               .ok()) {
        failures.fetch_add(1);
        continue;
      }
      puts.fetch_add(1);
      put_times[t].push_back(absl::Now() - started);
      for (const std::string& k : req.keys()) keys[t].push_back(k);
    }
  });
  r.puts_per_s = puts.load() / absl::ToDoubleSeconds(absl::Now() - t0);
  if (puts.load() > 0) {
    r.leader_cpu_us_per_put = (CpuSeconds(leader_pid) - cpu0) * 1e6 /
                              static_cast<double>(puts.load());
    r.client_cpu_us_per_put = (CpuSeconds(getpid()) - client_cpu0) * 1e6 /
                              static_cast<double>(puts.load());
    r.standby_cpu_us_per_put =
        (others_cpu() - others_cpu0) * 1e6 / static_cast<double>(puts.load());
  }
  {
    std::vector<absl::Duration> times;
    for (auto& v : put_times) times.insert(times.end(), v.begin(), v.end());
    std::sort(times.begin(), times.end());
    if (!times.empty()) {
      r.put_p50 = times[times.size() / 2];
      r.put_p99 = times[times.size() * 99 / 100];
    }
  }
  std::vector<std::string> all;
  for (auto& v : keys) all.insert(all.end(), v.begin(), v.end());
  if (all.size() < static_cast<size_t>(FLAGS_batch)) {
    return absl::InternalError(absl::StrCat(mode, ": only ", all.size(),
                                            " keys committed (",
                                            failures.load(), " failed puts)"));
  }
  std::atomic<uint64_t> lookups{0}, misses{0};
  if (FLAGS_settle_s > 0) {
    std::vector<pid_t> pids;
    for (const Daemon& m : rig->masters) pids.push_back(m.pid());
    r.settled = Settle(pids, absl::Seconds(FLAGS_settle_s));
  }
  // Counts `n` failed lookups; the first failure's message is kept.
  auto failed = [&](uint64_t n, const std::string& message) {
    if (n > 0 && failures.fetch_add(n) == 0) {
      MutexLock l(&error_mu);
      first_error = message;
    }
  };
  client_cpu0 = CpuSeconds(getpid());
  others_cpu0 = others_cpu();
  cpu0 = CpuSeconds(leader_pid);
  t0 = absl::Now();
  phase([&](int t, v1::MasterService::Stub* stub, absl::Time end) {
    if (FLAGS_lookup_depth > 1) {
      absl::BlockingCounter running(FLAGS_lookup_depth);
      std::vector<std::unique_ptr<bench::LookupChain>> chains;
      for (int c = 0; c < FLAGS_lookup_depth; ++c) {
        chains.push_back(std::make_unique<bench::LookupChain>(
            stub, &all, FLAGS_batch, FLAGS_packed,
            static_cast<uint64_t>(t) * 1000003 + c, end,
            [&running] { running.DecrementCount(); }));
      }
      for (auto& c : chains) c->Start();
      running.Wait();
      for (auto& c : chains) {
        lookups.fetch_add(c->lookups);
        misses.fetch_add(c->misses);
        failed(c->failures, c->first_error);
      }
      return;
    }
    std::mt19937_64 rng(t);
    // --lookup_stream: one LookupStream for the thread's lookups.
    grpc::ClientContext stream_ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::BatchLookupRequest,
                                             v1::BatchLookupResponse>>
        stream;
    if (FLAGS_lookup_stream) stream = stub->LookupStream(&stream_ctx);
    while (absl::Now() < end) {
      v1::BatchLookupRequest req;
      bench::FillLookup(all, FLAGS_batch, FLAGS_packed, &rng, &req);
      v1::BatchLookupResponse resp;
      grpc::ClientContext ctx;
      grpc::Status st;
      if (stream == nullptr) {
        st = stub->BatchLookup(&ctx, req, &resp);
      } else if (!stream->Write(req) || !stream->Read(&resp)) {
        st = stream->Finish();
        stream.reset();  // finished: nothing more to send or close
        failed(1, st.ok() ? "the lookup stream ended" : st.error_message());
        break;
      }
      if (!st.ok()) {
        failed(1, st.error_message());
        continue;
      }
      lookups.fetch_add(1);
      misses.fetch_add(bench::MissesOf(resp));
    }
    if (stream != nullptr && stream->WritesDone()) {
      const grpc::Status st = stream->Finish();
      if (!st.ok()) failed(1, st.error_message());
    }
  });
  const double lookup_s = absl::ToDoubleSeconds(absl::Now() - t0);
  r.lookups_per_s = lookups.load() / lookup_s;
  r.standby_cpu_share = (others_cpu() - others_cpu0) / lookup_s;
  if (lookups.load() > 0) {
    r.leader_cpu_us_per_lookup = (CpuSeconds(leader_pid) - cpu0) * 1e6 /
                                 static_cast<double>(lookups.load());
    r.client_cpu_us_per_lookup = (CpuSeconds(getpid()) - client_cpu0) * 1e6 /
                                 static_cast<double>(lookups.load());
  }
  r.stats = Stats(admin.get());
  const StandbyConfirmer::Stats confirms = (*confirmer)->GetStats();
  r.stats["client_confirm_waits_sent"] = confirms.waits_sent;
  r.stats["client_confirm_timeouts"] = confirms.timeouts;
  r.stats["client_confirm_unreachable"] = confirms.unreachable;
  r.stats["client_commits_not_confirmed"] = confirms.commits_not_confirmed;
  if (misses.load() > 0 || failures.load() > 0) {
    MutexLock l(&error_mu);
    return absl::InternalError(
        absl::StrCat(mode, ": ", misses.load(), " misses, ", failures.load(),
                     " failed calls (first: ", first_error, ")"));
  }
  return r;
}

// Commits `objects` keys "r-<put>-<k>" through `address` in puts of 1,000
// keys from --threads threads, with the write receipts of the node whose
// key is `node_key`; the keys of the first put.
absl::StatusOr<std::vector<std::string>> CommitMany(
    const std::string& address, uint64_t objects, const HmacSha256& node_key,
    std::vector<v1::Location>* extents) {
  constexpr uint64_t kPerPut = 1000;
  std::atomic<uint64_t> next{0}, failures{0};
  std::vector<std::vector<v1::Location>> placed(FLAGS_threads);
  std::vector<Thread> ts;
  for (int t = 0; t < FLAGS_threads; ++t) {
    ts.emplace_back(absl::StrCat("fill-", t), [&, t] {
      auto stub = Dial(address, 100 + t);
      for (uint64_t i = next.fetch_add(1); i * kPerPut < objects;
           i = next.fetch_add(1)) {
        v1::PutStartRequest req;
        const uint64_t n = std::min(kPerPut, objects - i * kPerPut);
        for (uint64_t k = 0; k < n; ++k) {
          req.add_keys(absl::StrCat("r-", i, "-", k));
          req.add_lengths(4096);
        }
        v1::PutStartResponse resp;
        grpc::ClientContext ctx;
        v1::PutCommitResponse done;
        grpc::ClientContext ctx2;
        v1::PutCommitRequest commit;
        if (!stub->PutStart(&ctx, req, &resp).ok() || resp.put_id() == 0 ||
            (commit.set_put_id(resp.put_id()),
             master::AddWriteReceipts(resp, node_key, &commit),
             !stub->PutCommit(&ctx2, commit, &done).ok()) ||
            done.committed() != n) {
          failures.fetch_add(1);
          continue;
        }
        for (const v1::PutSlot& slot : resp.slots()) {
          placed[t].push_back(slot.location());
          placed[t].back().clear_node_id();
        }
      }
    });
  }
  for (Thread& th : ts) th.Join();
  for (auto& v : placed) extents->insert(extents->end(), v.begin(), v.end());
  std::sort(extents->begin(), extents->end(),
            [](const v1::Location& a, const v1::Location& b) {
              return std::make_pair(a.region_id(), a.addr()) <
                     std::make_pair(b.region_id(), b.addr());
            });
  if (failures.load() > 0) {
    return absl::InternalError(
        absl::StrCat(failures.load(), " puts of the fill failed"));
  }
  std::vector<std::string> first;
  for (int k = 0; k < FLAGS_batch; ++k)
    first.push_back(absl::StrCat("r-0-", k));
  return first;
}

// OK when a BatchLookup of `keys` at `address` finds every one.
absl::Status FindsAll(v1::MasterService::Stub* stub,
                      const std::vector<std::string>& keys) {
  v1::BatchLookupRequest req;
  for (const std::string& k : keys) req.add_keys(k);
  v1::BatchLookupResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
  grpc::Status s = stub->BatchLookup(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("BatchLookup: ", s.error_message()));
  }
  int found = 0;
  for (const auto& e : resp.results()) found += e.found() ? 1 : 0;
  if (found != static_cast<int>(keys.size())) {
    return absl::NotFoundError(
        absl::StrCat("BatchLookup found ", found, " of ", keys.size()));
  }
  return absl::OkStatus();
}

// What the fake node `reg` does first when it finds a new master, as a
// storage node does: a proving heartbeat, and registering again when the
// master asks (with the proof of the key it holds, `answer` then
// updated). Sets *reconcile when the master asks for the node's
// reconciliation (as after its restart: Reconcile).
absl::Status Rejoin(v1::MasterService::Stub* stub,
                    const v1::RegisterNodeRequest& reg,
                    v1::RegisterNodeResponse* answer, bool* reconcile_out) {
  v1::HeartbeatResponse hb;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::Status s =
        stub->Heartbeat(&ctx, master::ProvingHeartbeat(reg, *answer), &hb);
    if (!s.ok()) {
      return absl::UnavailableError("Heartbeat: " + s.error_message());
    }
  }
  bool reconcile = hb.reconcile();
  if (hb.reregister()) {
    v1::RegisterNodeRequest again = reg;
    *again.mutable_auth() =
        master::ProvingAuth("register", reg, answer->node_key(), 0);
    v1::RegisterNodeResponse renewed;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::Status s = stub->RegisterNode(&ctx, again, &renewed);
    if (!s.ok()) {
      return absl::UnavailableError("RegisterNode: " + s.error_message());
    }
    *answer = renewed;
    reconcile = renewed.reconcile();
    grpc::ClientContext ctx2;
    ctx2.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    s = stub->Heartbeat(&ctx2, master::ProvingHeartbeat(reg, *answer), &hb);
    if (!s.ok()) {
      return absl::UnavailableError("Heartbeat: " + s.error_message());
    }
    reconcile = reconcile || hb.reconcile();
  }
  *reconcile_out = reconcile;
  return absl::OkStatus();
}

// The fake node's reconciliation with the master it rejoined: its
// `extents` streamed as a node streams its extent table, from a thread of
// its own (a node's objects are served meanwhile; it takes placements
// after).
absl::Status Reconcile(v1::MasterService::Stub* stub,
                       const v1::RegisterNodeRequest& reg,
                       const v1::RegisterNodeResponse& answer,
                       const std::vector<v1::Location>& extents) {
  const v1::RegisterNodeResponse* const a = &answer;
  const uint32_t id = answer.node_id();
  v1::BeginReconcileRequest begin;
  begin.set_node_id(id);
  begin.set_incarnation(reg.incarnation());
  *begin.mutable_auth() =
      master::ProvingAuth("reconcile", reg, a->node_key(), id);
  v1::BeginReconcileResponse begun;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub->BeginReconcile(&ctx, begin, &begun);
    if (!s.ok()) {
      return absl::UnavailableError("BeginReconcile: " + s.error_message());
    }
  }
  grpc::ClientContext ctx;
  v1::ReconcileNodeResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::ReconcileNodeRequest>> w =
      stub->ReconcileNode(&ctx, &resp);
  constexpr size_t kChunk = 65536;  // the master's limit per message
  size_t i = 0;
  do {
    v1::ReconcileNodeRequest req;
    if (i == 0) {
      req.set_node_id(id);
      req.set_incarnation(reg.incarnation());
      req.set_epoch(begun.epoch());
      *req.mutable_auth() =
          master::ProvingAuth("reconcile", reg, a->node_key(), id);
    }
    const size_t end = std::min(extents.size(), i + kChunk);
    for (; i < end; ++i) *req.add_extents() = extents[i];
    req.set_last(i == extents.size());
    if (!w->Write(req)) break;  // Finish says why
  } while (i < extents.size());
  w->WritesDone();
  grpc::Status s = w->Finish();
  if (!s.ok()) {
    return absl::UnavailableError("ReconcileNode: " + s.error_message());
  }
  if (resp.matched() != extents.size()) {
    return absl::InternalError(absl::StrCat(
        "reconciliation matched ", resp.matched(), " of ", extents.size(),
        " extents (", resp.dropped_listings(), " listings dropped)"));
  }
  return absl::OkStatus();
}

// --restart_objects: milliseconds from restarting both killed masters to
// the first lookup that finds every sampled key.
absl::StatusOr<double> RunRestartAll(const std::string& binary,
                                     const std::string& dir, uint64_t objects,
                                     bool preload, bool kill_all) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto rig =
      StartRig(binary, "async", dir,
               {preload ? "--preload_index=true" : "--preload_index=false"});
  if (!rig.ok()) return rig.status();
  auto admin = Dial(rig->leader, 0);
  const v1::RegisterNodeRequest reg =
      master::MetadataOnlyNodeRequest("bench-node");
  v1::RegisterNodeResponse registered;
  {
    grpc::ClientContext ctx;
    grpc::Status s = admin->RegisterNode(&ctx, reg, &registered);
    if (!s.ok())
      return absl::UnavailableError("RegisterNode: " + s.error_message());
  }
  {
    bool reconcile = false;
    absl::Status s = Rejoin(admin.get(), reg, &registered, &reconcile);
    if (s.ok() && reconcile) s = Reconcile(admin.get(), reg, registered, {});
    if (!s.ok()) return s;
  }
  const absl::Time fill0 = absl::Now();
  std::vector<v1::Location> extents;
  auto sample = CommitMany(rig->leader, objects,
                           HmacSha256(registered.node_key()), &extents);
  if (!sample.ok()) return sample.status();
  std::printf("ha_bench: %llu objects committed in %.1f s\n",
              static_cast<unsigned long long>(objects),
              absl::ToDoubleSeconds(absl::Now() - fill0));
  if (!Wait(
          [&] {
            std::map<std::string, double> st = Stats(admin.get());
            return st.count("replication_lag_sequences") == 1 &&
                   st["replication_lag_sequences"] == 0;
          },
          absl::Seconds(300))) {
    return absl::DeadlineExceededError("the standby never caught up");
  }
  std::vector<Daemon> restarted;
  std::vector<std::unique_ptr<v1::MasterService::Stub>> stubs;
  absl::Time t0;
  if (!kill_all) {
    // --failover_objects: the leader only; the standby takes over.
    stubs.push_back(Dial(rig->standby, 300));
    absl::StatusOr<int> killed = rig->masters[0].Stop(SIGKILL);
    if (!killed.ok()) return killed.status();
    t0 = absl::Now();
  } else {
    for (Daemon& m : rig->masters) {
      absl::StatusOr<int> killed = m.Stop(SIGKILL);
      if (!killed.ok()) return killed.status();
    }
    t0 = absl::Now();
    for (size_t i = 0; i < rig->args.size(); ++i) {
      std::vector<std::string> args = rig->args[i];
      if (!FLAGS_restart_on_new_ports) {
        args.push_back("--listen=" + (i == 0 ? rig->leader : rig->standby));
      }
      auto d = StartMaster(binary, args, static_cast<int>(i));
      if (!d.ok()) return d.status();
      auto address = StandbyAddress(*d);
      if (!address.ok()) return address.status();
      stubs.push_back(Dial(*address, 200 + static_cast<int>(i)));
      restarted.push_back(std::move(*d));
    }
  }
  // The fake node heartbeats (with the proof of its key) to whichever
  // master answers, as a node does after losing its master: a lookup lists
  // only nodes that proved their key to this master.
  // Its reconciliation runs beside the lookups, as a node's does.
  std::vector<bool> proven(stubs.size(), false);
  std::vector<std::string> last_error(stubs.size(), "not tried");
  std::vector<Thread> reconciling;
  std::vector<absl::Status> reconciled(stubs.size());
  std::vector<v1::RegisterNodeResponse> answers(stubs.size(), registered);
  absl::Time served;
  if (!Wait(
          [&] {
            for (size_t i = 0; i < stubs.size(); ++i) {
              v1::MasterService::Stub* stub = stubs[i].get();
              if (!proven[i]) {
                bool reconcile = false;
                absl::Status p = Rejoin(stub, reg, &answers[i], &reconcile);
                proven[i] = p.ok();
                if (!p.ok()) last_error[i] = p.ToString();
                if (p.ok() && reconcile) {
                  reconciling.emplace_back("bench-reconcile", [&, i, stub] {
                    reconciled[i] = Reconcile(stub, reg, answers[i], extents);
                  });
                }
              }
              if (!proven[i]) continue;
              absl::Status found = FindsAll(stub, *sample);
              if (found.ok()) {
                served = absl::Now();
                return true;
              }
              last_error[i] = found.ToString();
            }
            return false;
          },
          absl::Seconds(120))) {
    return absl::DeadlineExceededError(absl::StrCat(
        "no restarted master served the committed keys within 120 s; last: ",
        absl::StrJoin(last_error, "; ")));
  }
  // Every reconciliation must also have matched every extent.
  for (Thread& t : reconciling) t.Join();
  for (const absl::Status& s : reconciled) {
    if (!s.ok()) return s;
  }
  return absl::ToDoubleMilliseconds(served - t0);
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
  if (FLAGS_lookup_stream && FLAGS_lookup_depth > 1) {
    std::fprintf(stderr,
                 "ha_bench: --lookup_stream sends one lookup at a time; "
                 "drop it or --lookup_depth\n");
    return 2;
  }
  const std::string dir =
      FLAGS_dir.empty() ? absl::StrCat("/tmp/hymcache-ha-bench-", getpid())
                        : FLAGS_dir;
  if (FLAGS_restart_objects > 0 || FLAGS_failover_objects > 0) {
    // Side by side: each rep runs the standbys with and without
    // --preload_index, in alternating order.
    const bool kill_all = FLAGS_restart_objects > 0;
    const uint64_t objects =
        kill_all ? FLAGS_restart_objects : FLAGS_failover_objects;
    const char* what = kill_all ? "restart_all" : "failover";
    std::map<bool, std::vector<double>> ms;
    for (int rep = 0; rep < FLAGS_reps; ++rep) {
      for (int k = 0; k < 2; ++k) {
        const bool preload = (k + rep) % 2 == 0;
        auto r =
            RunRestartAll(binary, dir + "/restart", objects, preload, kill_all);
        if (!r.ok()) {
          std::fprintf(stderr, "ha_bench: %s\n", r.status().ToString().c_str());
          return 1;
        }
        std::printf("%s: rep=%d preload_index=%d serving_after_ms=%.0f\n", what,
                    rep, preload, *r);
        std::fflush(stdout);
        ms[preload].push_back(*r);
      }
    }
    std::filesystem::remove_all(dir);
    const double with = *std::max_element(ms[true].begin(), ms[true].end());
    const double without =
        *std::max_element(ms[false].begin(), ms[false].end());
    std::printf(
        "%s: objects=%llu masters=2 lease_ttl_s=1 "
        "serving_after_ms max=%.0f (without preload_index: max=%.0f, "
        "ratio %.2f)\n",
        what, static_cast<unsigned long long>(objects), with, without,
        with / without);
    return 0;
  }
  std::map<std::string, Result> best;
  std::map<std::string, std::vector<double>> cpu_put, cpu_lookup;
  std::map<std::string, std::vector<double>> puts_by_rep, lookups_by_rep;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  for (int rep = 0; rep < FLAGS_reps; ++rep) {
    for (size_t i = 0; i < modes.size(); ++i) {
      const std::string& mode = modes[(i + rep) % modes.size()];
      auto r = RunMode(binary, mode, dir + "/" + mode);
      if (!r.ok()) {
        std::fprintf(stderr, "ha_bench: %s\n", r.status().ToString().c_str());
        return 1;
      }
      std::printf(
          "rep=%d mode=%s puts_per_s=%.0f lookups_per_s=%.0f "
          "leader_cpu_us_per_put=%.1f leader_cpu_us_per_lookup=%.1f "
          "put_p50_ms=%.2f put_p99_ms=%.2f settled_ms=%.0f "
          "client_cpu_us_per_lookup=%.1f standby_cpu_during_lookups=%.0f%% "
          "client_cpu_us_per_put=%.1f standby_cpu_us_per_put=%.1f",
          rep, mode.c_str(), r->puts_per_s, r->lookups_per_s,
          r->leader_cpu_us_per_put, r->leader_cpu_us_per_lookup,
          absl::ToDoubleMilliseconds(r->put_p50),
          absl::ToDoubleMilliseconds(r->put_p99),
          absl::ToDoubleMilliseconds(r->settled), r->client_cpu_us_per_lookup,
          r->standby_cpu_share * 100, r->client_cpu_us_per_put,
          r->standby_cpu_us_per_put);
      if (absl::StartsWith(mode, "sync")) {
        std::printf(
            " sync_commits=%.0f sync_timeouts=%.0f batches_sent=%.0f "
            "messages_sent=%.0f",
            r->stats["replication_sync_commits"],
            r->stats["replication_sync_timeouts"],
            r->stats["replication_batches_sent"],
            r->stats["replication_messages_sent"]);
      }
      if (absl::StartsWith(mode, "confirm")) {
        std::printf(
            " confirm_commits=%.0f waits_sent=%.0f timeouts=%.0f "
            "unreachable=%.0f not_confirmed=%.0f messages_sent=%.0f",
            r->stats["replication_confirm_commits"],
            r->stats["client_confirm_waits_sent"],
            r->stats["client_confirm_timeouts"],
            r->stats["client_confirm_unreachable"],
            r->stats["client_commits_not_confirmed"],
            r->stats["replication_messages_sent"]);
      }
      std::printf("\n");
      std::fflush(stdout);
      Result& b = best[mode];
      b.puts_per_s = std::max(b.puts_per_s, r->puts_per_s);
      b.lookups_per_s = std::max(b.lookups_per_s, r->lookups_per_s);
      puts_by_rep[mode].push_back(r->puts_per_s);
      lookups_by_rep[mode].push_back(r->lookups_per_s);
      cpu_put[mode].push_back(r->leader_cpu_us_per_put);
      cpu_lookup[mode].push_back(r->leader_cpu_us_per_lookup);
    }
  }
  std::filesystem::remove_all(dir);
  const Result& base = best[modes[0]];
  std::printf(
      "\nthreads=%d put_depth=%d put_keys=%d batch=%d packed=%d seconds=%.1f "
      "(best of %d)\n",
      FLAGS_threads, FLAGS_put_depth, FLAGS_put_keys, FLAGS_batch, FLAGS_packed,
      FLAGS_seconds, FLAGS_reps);
  for (const std::string& m : modes) {
    const Result& r = best[m];
    std::printf(
        "%-6s puts/s %8.0f (%.2fx)  lookups/s %8.0f (%.2fx)\n", m.c_str(),
        r.puts_per_s, base.puts_per_s > 0 ? r.puts_per_s / base.puts_per_s : 0,
        r.lookups_per_s,
        base.lookups_per_s > 0 ? r.lookups_per_s / base.lookups_per_s : 0);
  }
  // Each rep's ratio to the same rep's base, whose conditions it shared
  // most closely (the modes of a rep run back to back).
  std::printf("per-rep ratios to %s (median of %d reps)\n", modes[0].c_str(),
              FLAGS_reps);
  for (const std::string& m : modes) {
    std::vector<double> puts, lookups;
    for (int rep = 0; rep < FLAGS_reps; ++rep) {
      const double bp = puts_by_rep[modes[0]][rep];
      const double bl = lookups_by_rep[modes[0]][rep];
      puts.push_back(bp > 0 ? puts_by_rep[m][rep] / bp : 0);
      lookups.push_back(bl > 0 ? lookups_by_rep[m][rep] / bl : 0);
    }
    std::printf("%-6s puts %.2fx  lookups %.2fx\n", m.c_str(), median(puts),
                median(lookups));
  }
  // The leader's own cost, apart from what the standby and etcd take from
  // the shared cores: off's CPU per op / this mode's (1.00x: no cost).
  std::printf("leader CPU per op (median of %d reps; ratio = %s's / mode's)\n",
              FLAGS_reps, modes[0].c_str());
  const double base_put = median(cpu_put[modes[0]]);
  const double base_lookup = median(cpu_lookup[modes[0]]);
  for (const std::string& m : modes) {
    const double put = median(cpu_put[m]);
    const double lookup = median(cpu_lookup[m]);
    std::printf("%-6s put %7.1f us (%.2fx)  lookup %7.1f us (%.2fx)\n",
                m.c_str(), put, put > 0 ? base_put / put : 0, lookup,
                lookup > 0 ? base_lookup / lookup : 0);
  }
  // Issue 30's "lookups stay >= 0.5x Redis MGET-32": each mode's lookups
  // against the Redis baseline's (mode redis), best and per rep.
  if (lookups_by_rep.count("redis") != 0) {
    std::printf("lookups against redis (best; median of %d reps)\n",
                FLAGS_reps);
    const double redis_best = best["redis"].lookups_per_s;
    for (const std::string& m : modes) {
      if (m == "redis") continue;
      std::vector<double> ratios;
      for (int rep = 0; rep < FLAGS_reps; ++rep) {
        const double rl = lookups_by_rep["redis"][rep];
        ratios.push_back(rl > 0 ? lookups_by_rep[m][rep] / rl : 0);
      }
      std::printf("%-6s lookups %.2fx redis (per rep %.2fx)\n", m.c_str(),
                  redis_best > 0 ? best[m].lookups_per_s / redis_best : 0,
                  median(ratios));
    }
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
  if (absl::Status s = hymcache::ApplyGrpcPollStrategyChoice(
          FLAGS_client_poll_strategy, "poll");
      !s.ok()) {
    std::fprintf(stderr, "ha_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  // gRPC reads the strategy when it starts: start it now (a channel kept
  // for the process's life), then let the daemons started later choose
  // their own.
  static const auto* const started = new std::shared_ptr<grpc::Channel>(
      grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()));
  (void)started;
  hymcache::RestoreGrpcPollStrategyEnvironment();
  if (absl::Status s = hymcache::PinAwayFromLeaderCpu(); !s.ok()) {
    std::fprintf(stderr, "ha_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  return hymcache::Main(argv[0]);
}
