// lookup_bench: per-key BatchLookup latency and throughput of the master
// through real gRPC on loopback.
//
//   bazel run -c opt //tools/bench:lookup_bench
//   bazel run -c opt //tools/bench:lookup_bench -- --objects=1000000 --seconds=3
//
// Starts a master (RocksDB in a temp dir, 127.0.0.1:0) in a child process
// (--master_in_process: in this one, beside the client threads),
// registers a fake storage node through the stub (one large region; no
// storage daemon: nothing is read or written, the master only keeps
// metadata), commits `objects` objects of `key_bytes`-byte random keys
// through PutStart/PutCommit, then for every batch size x client thread
// count x mode runs BatchLookup calls of `batch` random stored keys for
// `seconds` seconds. Each client thread has its own channel (its own TCP
// connection), like separate engine processes. Mode "plain" is a lookup
// (shared lock in the master), "for_read" a lookup before a load (touches
// and leases the hits; exclusive lock).
//
// Prints a markdown table: batch size, threads, mode, µs per call (p50 and
// p99), µs per key (p50 / batch) and keys/s, each row the best of `trials`
// trials by keys/s (other load on the machine only slows a trial). Every call
// must report all its keys as hits; misses are counted and make the exit
// status 1.
//
// --transports: how the lookups travel, side by side in the same run:
// "unary" (a BatchLookup call each), "stream" (request/response messages
// over one LookupStream per client thread, opened before the timing,
// blocking Write then Read), "stream_async" (the same stream driven by the
// thread's own CompletionQueue with the write and the read in flight
// together: what the client SDK does). Default: unary.
//
// --redis: the side-by-side baseline. Starts redis-server (Debian's
// redis-server package; --redis_server names the binary) on a free loopback
// port without persistence, stores the same keys with a 40-byte value each
// (about a Location), and times MGET of the same `batch` keys per call from
// the same client threads, each with its own connection, one call in flight
// per connection (as redis-benchmark -P 1), through a minimal RESP client
// here; its rows follow each batch/threads group, with the ratio of
// HyMCache's calls/s to Redis's. The same comparison with Redis's own tool:
//   redis-benchmark -p PORT -c 8 -n 200000 -P 1 MGET k1 ... k32
#include <arpa/inet.h>
#include <fcntl.h>
#include <gflags/gflags.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/grpc_master_client.h"
#include "client/master_client.h"
#include "common/cli.h"
#include "common/grpc_polling.h"
#include "common/net.h"
#include "common/security.h"
#include "common/thread.h"
#include "master/master_server.h"
#include "master/master_service.h"
#include "master/proving_heartbeat.h"
#include "proto/master.grpc.pb.h"
#include "tools/bench/lookup_bench.h"

DEFINE_uint64(objects, 100000, "objects committed before the lookups");
DEFINE_uint32(key_bytes, 32, "bytes per key (random binary)");
DEFINE_string(batch_sizes, "1,8,32,128,1024", "keys per BatchLookup call");
DEFINE_string(threads, "1,4", "client thread counts");
DEFINE_string(modes, "plain,for_read", "plain and/or for_read lookups");
DEFINE_string(transports, "unary",
              "how the lookups travel, any of: unary (a BatchLookup call "
              "each), stream (request/response messages over one open "
              "LookupStream per client thread, blocking Write then Read), "
              "stream_async (the same stream driven by the thread's own "
              "CompletionQueue, Write and Read in flight together)");
DEFINE_bool(packed, true,
            "unary and stream transports ask for packed answers "
            "(BatchLookupRequest.packed; the SDK always does)");
DEFINE_double(seconds, 1.0, "timed seconds per trial");
DEFINE_bool(compare_capabilities, false,
            "also time every row with the master's capability signing "
            "turned off (a bench-only switch), side by side");
DEFINE_int32(trials, 3,
             "trials per row; the row shows the one with the most keys/s "
             "(the least disturbed on a shared machine)");
DEFINE_string(db_path, "", "master RocksDB dir (default: a temp dir)");
DEFINE_bool(auth, false,
            "run the master with identities: every lookup carries an "
            "engine's bearer token and is checked (docs/security.md)");
DEFINE_bool(redis, false,
            "also time Redis MGET of the same keys (redis-server started "
            "here on a free loopback port) and print the ratios");
DEFINE_string(redis_server, "redis-server", "the redis-server binary");
DEFINE_bool(deadlock_detection, false,
            "leave Abseil's mutex deadlock detector on (Debian's default; "
            "the daemons turn it off)");
DEFINE_bool(master_in_process, false,
            "run the master in this process beside the client threads "
            "(default: a child process, as Redis and as a real master are)");
DEFINE_uint32(master_rpc_threads, hymcache::MasterOptions().rpc_threads,
              "the master's rpc_threads (completion-queue pollers)");
DEFINE_string(client_poll_strategy, "auto",
              "gRPC's poll strategy in the client process(es) "
              "(common/grpc_polling.h: \"poll\" or \"epoll1\"; \"\": gRPC's "
              "default; \"auto\": the SDK's default, ClientOptions); the "
              "master's process keeps gRPC's default");
DEFINE_string(master_poll_strategy, "",
              "gRPC's poll strategy in the master's process (hymcache-master "
              "--grpc_poll_strategy; not with --master_in_process)");
DEFINE_bool(client_processes, false,
            "run each client (HyMCache's and Redis's) in a process of its "
            "own, as separate engines are, instead of a thread of this one "
            "(gRPC's default poller hands completions between the threads "
            "of one process)");
// Set by this program when it runs itself as one client of
// --client_processes; not for the command line.
DEFINE_string(worker, "", "internal: run as one client process (hym|redis)");
DEFINE_string(worker_target, "",
              "internal: the master's address or Redis's port");
DEFINE_int32(worker_batch, 32, "internal: keys per call");
DEFINE_bool(worker_for_read, false, "internal: for_read lookups");
DEFINE_string(worker_transport, "unary", "internal: the transport");
DEFINE_int32(worker_seed, 0, "internal: the client's random seed");
DEFINE_string(tls_dir, "",
              "serve and dial over TLS with the certificates of "
              "tests/make_test_certs.sh DIR (server.pem/key, ca.pem)");

namespace hymcache::lookup_bench {
namespace {

namespace v1 = ::hymcache::v1;

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(part, &v) && v > 0) out.push_back(v);
  }
  return out;
}

// TLS and the token of the lookups' channels (Main sets them).
hymcache::ChannelSecurity g_security;

std::unique_ptr<v1::MasterService::Stub> Dial(
    const std::string& address, int channel_id,
    const hymcache::ChannelSecurity& security = g_security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // Distinct args: gRPC would otherwise share one connection between the
  // threads' channels.
  args.SetInt("hymcache.bench_channel", channel_id);
  auto channel = hymcache::CreateChannel(address, security, args);
  if (!channel.ok()) {
    std::fprintf(stderr, "dial: %s\n", channel.status().ToString().c_str());
    std::exit(1);
  }
  return v1::MasterService::NewStub(*channel);
}

std::vector<std::string> MakeKeys(size_t n, size_t bytes) {
  std::mt19937_64 rng(42);
  std::vector<std::string> keys(n, std::string(bytes, '\0'));
  for (auto& k : keys) {
    for (size_t i = 0; i < bytes; i += 8) {
      uint64_t v = rng();
      std::memcpy(&k[i], &v, std::min<size_t>(8, bytes - i));
    }
  }
  return keys;
}

bool Commit(v1::MasterService::Stub* stub, const HmacSha256& node_key,
            const std::vector<std::string>& keys) {
  constexpr size_t kPerPut = 1024;  // the master's default max_batch_keys
  for (size_t start = 0; start < keys.size(); start += kPerPut) {
    v1::PutStartRequest req;
    for (size_t i = start; i < std::min(keys.size(), start + kPerPut); ++i) {
      req.add_keys(keys[i]);
      req.add_lengths(4096);
    }
    v1::PutStartResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub->PutStart(&ctx, req, &resp);
    if (!s.ok() || resp.put_id() == 0) {
      std::fprintf(stderr, "PutStart: %s\n", s.error_message().c_str());
      return false;
    }
    v1::PutCommitRequest commit;
    commit.set_put_id(resp.put_id());
    // The receipts the (metadata-only) node would have given for the bytes.
    master::AddWriteReceipts(resp, node_key, &commit);
    v1::PutCommitResponse done;
    grpc::ClientContext ctx2;
    s = stub->PutCommit(&ctx2, commit, &done);
    if (!s.ok() || done.committed() != static_cast<uint32_t>(req.keys_size())) {
      std::fprintf(stderr, "PutCommit: %s\n", s.error_message().c_str());
      return false;
    }
  }
  return true;
}

// This host's name, as the SDK sends it with every lookup.
const std::string& ReaderHost() {
  static const std::string* host = new std::string(DefaultHostName());
  return *host;
}

// The client SDK's view of the master (what Client::Create makes) over
// `connections` connections of its own.
std::unique_ptr<MasterClient> NewSdkClient(const std::string &address,
                                           int connections, int *next_channel) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < connections; ++i) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetInt("hymcache.bench_channel", (*next_channel)++);
    auto channel = hymcache::CreateChannel(address, g_security, args);
    if (!channel.ok()) {
      std::fprintf(stderr, "dial: %s\n", channel.status().ToString().c_str());
      std::exit(1);
    }
    channels.push_back(*channel);
  }
  // As Client::Create: every lookup names this host (ClientOptions::host).
  return NewGrpcMasterClient(channels, {.reader_host = DefaultHostName()});
}

// --client_poll_strategy, in a client process before its first channel.
bool ApplyClientPollStrategy() {
  if (FLAGS_client_poll_strategy.empty()) return true;
  if (FLAGS_client_poll_strategy == "auto") {
    PreferGrpcPollStrategy("poll");  // as Client::Create does by default
    return true;
  }
  absl::Status s = SetGrpcPollStrategy(FLAGS_client_poll_strategy);
  if (!s.ok())
    std::fprintf(stderr, "--client_poll_strategy: %s\n", s.ToString().c_str());
  return s.ok();
}

// One client thread's way to the master: a BatchLookup per call, or
// messages over one open LookupStream.
class Caller {
 public:
  // `sdk`: the client SDK's MasterClient, for Transport::kSdk.
  Caller(v1::MasterService::Stub *stub, Transport transport,
         MasterClient *sdk = nullptr)
      : stub_(stub), transport_(transport), sdk_(sdk) {
    if (transport_ == Transport::kStream) {
      sync_ = stub_->LookupStream(&stream_ctx_);
    } else if (transport_ == Transport::kStreamAsync) {
      async_ = stub_->PrepareAsyncLookupStream(&stream_ctx_, &cq_);
      async_->StartCall(&cq_);
      broken_ = !Await(1);
    }
  }
  ~Caller() {
    if (sync_ != nullptr) {
      sync_->WritesDone();
      sync_->Finish().ok();
    }
    if (async_ != nullptr) {
      if (!broken_) {
        async_->WritesDone(&cq_);
        broken_ = !Await(1);
      }
      grpc::Status s;
      async_->Finish(&s, &cq_);
      Await(1);
      cq_.Shutdown();
      void* tag;
      bool ok;
      while (cq_.Next(&tag, &ok)) {
      }
    }
  }

  grpc::Status Call(const v1::BatchLookupRequest& req,
                    v1::BatchLookupResponse* resp) {
    switch (transport_) {
      case Transport::kUnary: {
        grpc::ClientContext ctx;
        return stub_->BatchLookup(&ctx, req, resp);
      }
      case Transport::kStream:
        if (!sync_->Write(req) || !sync_->Read(resp)) return Broken();
        return grpc::Status::OK;
      case Transport::kStreamAsync:
        if (broken_) return Broken();
        async_->Write(req, &cq_);
        async_->Read(resp, &cq_);
        if (!Await(2)) {
          broken_ = true;
          return Broken();
        }
        return grpc::Status::OK;
      case Transport::kSdk:
        return grpc::Status(grpc::StatusCode::INTERNAL, "use CallSdk");
    }
    return grpc::Status::OK;
  }

  MasterClient *sdk() const { return sdk_; }

 private:
  // Waits for `n` events on the thread's queue; whether all were ok.
  bool Await(int n) {
    bool all = true;
    for (int i = 0; i < n; ++i) {
      void* tag;
      bool ok = false;
      if (!cq_.Next(&tag, &ok)) return false;
      all = all && ok;
    }
    return all;
  }
  grpc::Status Broken() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "LookupStream: the stream ended");
  }

  v1::MasterService::Stub* const stub_;
  const Transport transport_;
  MasterClient *const sdk_;
  grpc::ClientContext stream_ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::BatchLookupRequest,
                                           v1::BatchLookupResponse>>
      sync_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::BatchLookupRequest,
                                                v1::BatchLookupResponse>>
      async_;
  bool broken_ = false;
};

// User + system CPU seconds of process `pid` so far; 0 if unreadable.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name, which ends with the last ')'.
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::vector<std::string> f =
      absl::StrSplit(stat.substr(paren + 2), ' ', absl::SkipEmpty());
  uint64_t utime = 0, stime = 0;  // fields 14 and 15 of proc(5)
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) ||
      !absl::SimpleAtoi(f[12], &stime)) {
    return 0;
  }
  return static_cast<double>(utime + stime) /
         static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Runs `measure` and sets the row's server_cpu_us from `pid`'s CPU time
// (`warmup` calls per thread beside the timed ones).
template <typename F>
Row WithServerCpu(pid_t pid, int warmup, F measure) {
  const double before = pid > 0 ? CpuSeconds(pid) : 0;
  Row row = measure();
  const uint64_t calls = row.calls + static_cast<uint64_t>(warmup) * row.threads;
  if (pid > 0 && calls > 0) {
    row.server_cpu_us = (CpuSeconds(pid) - before) * 1e6 / calls;
  }
  return row;
}

// One BatchLookup of `batch` consecutive stored keys from a random start;
// its microseconds. Misses and failures go to `tally`.
double TimedLookup(Caller *caller, const std::vector<std::string> &keys,
                   int batch, bool for_read, std::mt19937_64 &rng,
                   Tally *tally) {
  if (caller->sdk() != nullptr) {
    const size_t start = rng() % (keys.size() - batch + 1);
    absl::Time t0 = absl::Now();
    absl::StatusOr<LookupBatch> r = caller->sdk()->Lookup(
        absl::MakeConstSpan(keys).subspan(start, batch),
        for_read ? LookupIntent::kRead : LookupIntent::kPeek,
        absl::Now() + absl::Seconds(10));
    double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
    if (!r.ok()) {
      if (tally->errors.fetch_add(1, std::memory_order_relaxed) == 0) {
        std::fprintf(stderr, "Lookup: %s\n", r.status().ToString().c_str());
      }
    } else {
      const uint64_t found = std::count(r->found.begin(), r->found.end(), true);
      tally->misses.fetch_add(batch - found, std::memory_order_relaxed);
    }
    return us;
  }
  v1::BatchLookupRequest req;
  req.set_for_read(for_read);
  req.set_packed(FLAGS_packed);
  req.set_reader_host(ReaderHost());  // as the SDK's requests carry it
  const size_t start = rng() % (keys.size() - batch + 1);
  for (int i = 0; i < batch; ++i) req.add_keys(keys[start + i]);
  v1::BatchLookupResponse resp;
  absl::Time t0 = absl::Now();
  grpc::Status s = caller->Call(req, &resp);
  double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
  if (!s.ok()) {
    if (tally->errors.fetch_add(1, std::memory_order_relaxed) == 0) {
      std::fprintf(stderr, "BatchLookup: %s\n", s.error_message().c_str());
    }
  } else if (resp.hit_prefix_length() != static_cast<uint32_t>(batch)) {
    tally->misses.fetch_add(batch - resp.hit_prefix_length(),
                            std::memory_order_relaxed);
  }
  return us;
}

Row Measure(const std::string &address, const std::vector<std::string> &keys,
            int batch, int threads, bool for_read, Transport transport,
            int *next_channel) {
  Row row{batch, threads, for_read, transport};
  row.caps = true;
  Tally tally;
  if (FLAGS_client_processes) {
    if (!RunProcesses(
            threads, "hym",
            {"--worker_target=" + address,
             absl::StrCat("--worker_batch=", batch),
             absl::StrCat("--worker_for_read=", for_read),
             absl::StrCat("--worker_transport=", TransportName(transport))},
            &row, &tally)) {
      std::fprintf(stderr, "lookup clients: a client process failed\n");
      ++tally.errors;
    }
  } else {
    std::vector<std::unique_ptr<v1::MasterService::Stub>> stubs;
    std::vector<std::unique_ptr<Caller>> callers;
    // kSdk: one SDK MasterClient for all threads, as in one engine process,
    // with a connection per thread (ClientOptions::master_connections).
    std::unique_ptr<MasterClient> sdk;
    if (transport == Transport::kSdk)
      sdk = NewSdkClient(address, threads, next_channel);
    for (int t = 0; t < threads; ++t) {
      stubs.push_back(Dial(address, (*next_channel)++));
      callers.push_back(
          std::make_unique<Caller>(stubs.back().get(), transport, sdk.get()));
    }
    // Warm-up: connect every channel and fault in the paths.
    for (int t = 0; t < threads; ++t) {
      std::mt19937_64 rng(t);
      for (int i = 0; i < kWarmupCalls; ++i) {
        TimedLookup(callers[t].get(), keys, batch, for_read, rng, &tally);
      }
    }
    std::vector<std::mt19937_64> rngs;
    for (int t = 0; t < threads; ++t) rngs.emplace_back(1000 + t);
    RunThreads(
        threads, "lookup-bench",
        [&](int t) {
          return TimedLookup(callers[t].get(), keys, batch, for_read, rngs[t],
                             &tally);
        },
        &row);
  }
  row.misses = tally.misses.load();
  row.errors = tally.errors.load();
  return row;
}

// --worker: one client process of --client_processes. Connects, warms up,
// writes 'R' to stdout, waits for a byte on stdin, times its calls for
// --seconds and writes a WorkerReport with their latencies.
int WorkerMain() {
  const std::vector<std::string> keys =
      MakeKeys(FLAGS_objects, FLAGS_key_bytes);
  const int batch = FLAGS_worker_batch;
  if (batch <= 0 || static_cast<uint64_t>(batch) > keys.size()) return 2;
  Tally tally;
  std::mt19937_64 rng(FLAGS_worker_seed);
  std::unique_ptr<MasterClient> sdk;
  std::unique_ptr<v1::MasterService::Stub> stub;
  std::unique_ptr<Caller> caller;
  Resp resp;
  std::function<double()> call;
  if (FLAGS_worker == "hym") {
    Transport transport = Transport::kUnary;
    bool known = false;
    for (Transport x : kTransports) {
      if (FLAGS_worker_transport == TransportName(x)) {
        transport = x;
        known = true;
      }
    }
    if (!known || !ApplyClientPollStrategy()) return 2;
    int next_channel = 1;
    if (transport == Transport::kSdk) {
      sdk = NewSdkClient(FLAGS_worker_target, 1, &next_channel);
    }
    stub = Dial(FLAGS_worker_target, 0);
    caller = std::make_unique<Caller>(stub.get(), transport, sdk.get());
    call = [&] {
      return TimedLookup(caller.get(), keys, batch, FLAGS_worker_for_read, rng,
                         &tally);
    };
  } else if (FLAGS_worker == "redis") {
    int port = 0;
    if (!absl::SimpleAtoi(FLAGS_worker_target, &port) || !resp.Connect(port)) {
      return 1;
    }
    call = [&] { return TimedMget(&resp, keys, batch, rng, &tally); };
  } else {
    return 2;
  }
  for (int i = 0; i < kWarmupCalls; ++i) call();
  char go = 0;
  if (!WriteAll(STDOUT_FILENO, "R", 1) || !ReadAll(STDIN_FILENO, &go, 1)) {
    return 1;
  }
  std::vector<double> lat;
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(FLAGS_seconds);
  while (absl::Now() < end) lat.push_back(call());
  const WorkerReport rep{lat.size(), tally.misses.load(), tally.errors.load(),
                         absl::ToDoubleSeconds(absl::Now() - start)};
  return WriteAll(STDOUT_FILENO, &rep, sizeof(rep)) &&
                 WriteAll(STDOUT_FILENO, lat.data(),
                          lat.size() * sizeof(double))
             ? 0
             : 1;
}

// The master under test: in this process (--master_in_process) or in a
// child forked before this process starts gRPC, which serves until Stop()
// (or this process's exit) closes the pipe it waits on.
class MasterProcess {
 public:
  ~MasterProcess() { Stop(); }
  bool Start(const MasterOptions& options) {
    if (FLAGS_master_in_process) {
      auto m = MasterServer::Create(options);
      if (!m.ok()) {
        std::fprintf(stderr, "master: %s\n", m.status().ToString().c_str());
        return false;
      }
      server_ = std::move(m).value();
      address_ = server_->address();
      return true;
    }
    int to_parent[2], to_child[2];
    if (pipe2(to_parent, O_CLOEXEC) != 0 || pipe2(to_child, O_CLOEXEC) != 0) {
      return false;
    }
    std::fflush(stdout);
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      close(to_parent[0]);
      close(to_child[1]);
      absl::StatusOr<std::unique_ptr<MasterServer>> m =
          absl::InvalidArgumentError("--master_poll_strategy");
      if (FLAGS_master_poll_strategy.empty() ||
          SetGrpcPollStrategy(FLAGS_master_poll_strategy).ok()) {
        m = MasterServer::Create(options);
      }
      const std::string line =
          m.ok() ? (*m)->address() + "\n"
                 : "error " + m.status().ToString() + "\n";
      if (write(to_parent[1], line.data(), line.size()) < 0) _exit(1);
      close(to_parent[1]);
      char c;
      while (read(to_child[0], &c, 1) > 0) {
      }
      if (m.ok()) (*m)->Shutdown();
      _exit(0);
    }
    close(to_parent[1]);
    close(to_child[0]);
    stop_fd_ = to_child[1];
    std::string line;
    char c;
    while (read(to_parent[0], &c, 1) == 1 && c != '\n') line += c;
    close(to_parent[0]);
    if (line.empty() || line.rfind("error ", 0) == 0) {
      std::fprintf(stderr, "master: %s\n",
                   line.empty() ? "child exited" : line.c_str());
      return false;
    }
    address_ = line;
    return true;
  }
  void Stop() {
    if (server_) server_->Shutdown();
    if (stop_fd_ >= 0) {
      close(stop_fd_);
      stop_fd_ = -1;
      waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& address() const { return address_; }
  // The child's pid; -1 when the master runs in this process.
  pid_t pid() const { return pid_; }
  // Null when the master runs in a child.
  MasterServer* in_process() { return server_.get(); }

 private:
  std::unique_ptr<MasterServer> server_;
  pid_t pid_ = -1;
  int stop_fd_ = -1;  // the child serves until this closes
  std::string address_;
};

int Main() {
  const std::vector<int> batches = ParseList(FLAGS_batch_sizes);
  const std::vector<int> thread_counts = ParseList(FLAGS_threads);
  std::vector<bool> modes;
  for (absl::string_view m : absl::StrSplit(FLAGS_modes, ',', absl::SkipEmpty())) {
    if (m == "plain") modes.push_back(false);
    if (m == "for_read") modes.push_back(true);
  }
  std::vector<Transport> transports;
  for (absl::string_view t :
       absl::StrSplit(FLAGS_transports, ',', absl::SkipEmpty())) {
    for (Transport x : kTransports) {
      if (t == TransportName(x)) transports.push_back(x);
    }
  }
  if (transports.empty()) {
    std::fprintf(stderr, "bad --transports\n");
    return 2;
  }
  if (batches.empty() || thread_counts.empty() || modes.empty() ||
      FLAGS_key_bytes == 0 || FLAGS_key_bytes > 256) {
    std::fprintf(stderr, "bad --batch_sizes, --threads, --modes or --key_bytes\n");
    return 2;
  }
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  if (FLAGS_objects < static_cast<uint64_t>(max_batch) || max_batch > 1024) {
    std::fprintf(stderr, "--objects must be >= the largest batch (<= 1024)\n");
    return 2;
  }
  if (FLAGS_client_processes && (FLAGS_auth || !FLAGS_tls_dir.empty())) {
    std::fprintf(stderr,
                 "--client_processes runs without --auth and --tls_dir\n");
    return 2;
  }
  if (FLAGS_compare_capabilities && !FLAGS_master_in_process) {
    std::fprintf(stderr, "--compare_capabilities needs --master_in_process\n");
    return 2;
  }

  const bool temp_db = FLAGS_db_path.empty();
  const std::string db =
      temp_db ? absl::StrCat("/tmp/hymcache-lookup-bench-", getpid())
              : FLAGS_db_path;
  MasterOptions mo;
  mo.db_path = db;
  // No heartbeats in this benchmark: keep the fake node alive throughout.
  mo.service.node_timeout = absl::Hours(1);
  mo.rpc_threads = FLAGS_master_rpc_threads;
  hymcache::ChannelSecurity node_security, admin_security;
  if (!FLAGS_tls_dir.empty()) {
    mo.tls.cert_file = FLAGS_tls_dir + "/server.pem";
    mo.tls.key_file = FLAGS_tls_dir + "/server.key";
    g_security.tls.ca_file = FLAGS_tls_dir + "/ca.pem";
  }
  node_security = admin_security = g_security;
  if (FLAGS_auth) {
    mo.auth_tokens_file = db + ".identities";
    const std::string engine = *hymcache::NewToken();
    node_security.token = *hymcache::NewToken();
    admin_security.token = *hymcache::NewToken();
    std::ofstream(mo.auth_tokens_file)
        << hymcache::IdentityLine(hymcache::Role::kEngine, "bench", "bench",
                                  engine)
        << "\n"
        << hymcache::IdentityLine(hymcache::Role::kNode, "", "node",
                                  node_security.token)
        << "\n"
        << hymcache::IdentityLine(hymcache::Role::kAdmin, "", "admin",
                                  admin_security.token)
        << "\n";
    g_security.token = engine;
  }
  MasterProcess master;
  if (!master.Start(mo)) return 1;
  // After the master's process forked off: it keeps gRPC's default.
  if (!ApplyClientPollStrategy()) return 2;
  const std::string address = master.address();
  int next_channel = 0;
  auto admin = Dial(address, next_channel++, admin_security);
  auto node = Dial(address, next_channel++, node_security);

  absl::StatusOr<std::string> node_key = master::RegisterProvenNode(
      node.get(), master::MetadataOnlyNodeRequest("bench-node"));
  if (!node_key.ok()) {
    std::fprintf(stderr, "%s\n", node_key.status().ToString().c_str());
    return 1;
  }

  const std::vector<std::string> keys = MakeKeys(FLAGS_objects, FLAGS_key_bytes);
  absl::Time t0 = absl::Now();
  if (!Commit(admin.get(), HmacSha256(*node_key), keys)) return 1;
  const double commit_s = absl::ToDoubleSeconds(absl::Now() - t0);
  v1::GetStatsResponse stats;
  {
    grpc::ClientContext ctx;
    admin->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok();
  }
  std::printf(
      "objects=%lu key_bytes=%u committed in %.2f s (%.0f objects/s); "
      "index %lu bytes/entry; best of %d x %.1f s per row; %s, %s; "
      "client gRPC poll strategy %s\n\n",
      static_cast<unsigned long>(stats.object_count()), FLAGS_key_bytes,
      commit_s, FLAGS_objects / commit_s,
      static_cast<unsigned long>(stats.index_bytes_per_entry()), FLAGS_trials,
      FLAGS_seconds, FLAGS_auth ? "bearer tokens checked" : "no authentication",
      FLAGS_tls_dir.empty() ? "plaintext" : "TLS",
      GrpcPollStrategyInUse().c_str());
  RedisServer redis;
  if (FLAGS_redis) {
    if (!redis.Start(FLAGS_redis_server) || !LoadRedis(redis.port(), keys)) {
      std::fprintf(stderr, "redis: cannot start %s or load the keys\n",
                   FLAGS_redis_server.c_str());
      return 1;
    }
    std::printf(
        "Redis baseline: %s on 127.0.0.1:%d (no persistence), "
        "MGET of the same keys, 40-byte values\n\n",
        FLAGS_redis_server.c_str(), redis.port());
  }
  std::printf("| batch | threads | mode | calls | µs/call p50 | µs/call p99 | "
              "µs/key (p50) | keys/s | calls/s | server CPU µs/call |\n");
  std::printf("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);
  uint64_t misses = 0, errors = 0, empty_rows = 0;
  for (int batch : batches) {
    for (int threads : thread_counts) {
      // The modes' trials alternate, so both see the same background load.
      std::vector<Row> best;
      for (bool for_read : modes) {
        for (Transport transport : transports) {
          best.push_back(Row{batch, threads, for_read, transport});
          if (FLAGS_compare_capabilities) {
            best.push_back(Row{batch, threads, for_read, transport});
            best.back().caps = false;
          }
        }
      }
      Row redis_best{batch, threads, false};
      for (int trial = 0; trial < std::max(1, FLAGS_trials); ++trial) {
        for (Row& r : best) {
          if (master.in_process() != nullptr) {
            master.in_process()->ServiceForTest()->SetSkipCapabilitiesForTest(
                !r.caps);
          }
          Row t = WithServerCpu(master.pid(), kWarmupCalls, [&] {
            return Measure(address, keys, batch, threads, r.for_read,
                           r.transport, &next_channel);
          });
          t.caps = r.caps;
          misses += t.misses;
          errors += t.errors;
          if (t.keys_per_s > r.keys_per_s) r = t;
        }
        if (FLAGS_redis) {
          Row t = WithServerCpu(redis.pid(), kWarmupCalls, [&] {
            return MeasureRedis(redis.port(), keys, batch, threads);
          });
          misses += t.misses;
          errors += t.errors;
          if (t.keys_per_s > redis_best.keys_per_s) redis_best = t;
        }
      }
      auto calls_per_s = [](const Row& r) { return r.keys_per_s / r.batch; };
      for (const Row& r : best) {
        if (r.calls == 0) ++empty_rows;
        std::string mode = absl::StrCat(
            r.for_read ? "for_read" : "plain",
            r.transport == Transport::kUnary
                ? ""
                : absl::StrCat(" ", TransportName(r.transport)),
            r.caps ? "" : " (no caps)");
        if (FLAGS_redis) {
          absl::StrAppend(&mode, " (", absl::StrFormat(
                                           "%.2f", calls_per_s(r) /
                                                       calls_per_s(redis_best)),
                          "x Redis)");
        }
        std::printf(
            "| %d | %d | %s | %lu | %.1f | %.1f | %.2f | %.0f | %.0f | %.1f |\n",
            r.batch, r.threads, mode.c_str(),
            static_cast<unsigned long>(r.calls), r.p50_us, r.p99_us,
            r.p50_us / r.batch, r.keys_per_s, calls_per_s(r), r.server_cpu_us);
      }
      if (FLAGS_redis) {
        const Row& r = redis_best;
        if (r.calls == 0) ++empty_rows;
        std::printf(
            "| %d | %d | Redis MGET | %lu | %.1f | %.1f | %.2f | %.0f | %.0f | "
            "%.1f |\n",
            r.batch, r.threads, static_cast<unsigned long>(r.calls), r.p50_us,
            r.p99_us, r.p50_us / r.batch, r.keys_per_s, calls_per_s(r),
            r.server_cpu_us);
      }
      std::fflush(stdout);
    }
  }
  if (misses || errors) {
    std::printf("\nERROR: %lu misses, %lu failed calls\n",
                static_cast<unsigned long>(misses),
                static_cast<unsigned long>(errors));
  }
  if (empty_rows > 0) {
    std::printf("\nERROR: %lu rows measured no calls\n",
                static_cast<unsigned long>(empty_rows));
  }
  master.Stop();
  if (temp_db) {
    std::error_code ec;
    std::filesystem::remove_all(db, ec);
    std::filesystem::remove(db + ".snapshot",
                            ec);  // the index snapshot beside it
  }
  if (FLAGS_auth) {
    std::error_code ec;
    std::filesystem::remove(mo.auth_tokens_file, ec);
  }
  return misses || errors || empty_rows ? 1 : 0;
}

}  // namespace

// Calls, p50 / p99 and keys/s of `row` from the threads' call latencies.
void Summarize(const std::vector<std::vector<double>>& lat, double secs,
               Row* row) {
  std::vector<double> all;
  for (const auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  row->calls = all.size();
  if (!all.empty()) {
    row->p50_us = all[all.size() / 2];
    row->p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  }
  row->keys_per_s = static_cast<double>(row->calls) * row->batch / secs;
}

}  // namespace hymcache::lookup_bench

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "lookup_bench",
       .usage = "lookup_bench: per-key BatchLookup latency and throughput of "
                "the master through real gRPC on loopback",
       .main_file = __FILE__},
      &argc, &argv);
  // As the daemons do (master/main.cc): Debian's Abseil checks lock order
  // on every absl::Mutex acquisition (gRPC's too), a debugging aid.
  if (!FLAGS_deadlock_detection) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  if (!FLAGS_worker.empty()) return hymcache::lookup_bench::WorkerMain();
  return hymcache::lookup_bench::Main();
}
