// get_bench: GET throughput of HyMCache on one host against the limit of
// its data plane, measured side by side in one run:
//   --transport=tcp  vs a raw loopback TCP socket moving the same blocks;
//   --transport=shm  vs memcpy of the same blocks (same-host shared memory:
//                    the node's memory mapped into the client);
//   --transport=rdma vs the raw socket (needs an RDMA device, e.g. Soft-RoCE
//                    in tests/vmtest, where it measures correctness, not
//                    speed).
//
//   bazel run -c opt //tools/bench:get_bench -- --block_mib=16 --blocks=16 --rounds=8
//   bazel run -c opt //tools/bench:get_bench -- --transport=shm
//   (in tests/vmtest) get_bench --transport=rdma --compare_rdma_access
//   bazel run -c opt //tools/bench:get_bench -- --busy_core --processes=separate
//
// Starts a master and a storage node (DRAM device) on 127.0.0.1, stores
// `blocks` blocks, then times `rounds` Gets of all of them (one batch per
// Get). The baseline is one TCP stream on loopback where a server answers
// each 1-byte request with a block from memory: the same request/response
// shape with no protocol, index or bounds checks, and the same socket
// options as the node's data plane (--send_buffer_bytes on the serving side).
//
// --processes=one runs master, storage node and client in this process;
// --processes=separate runs the real daemons (//master:hymcache-master,
// //storage_node:hymcache-storage, from this binary's runfiles or
// --master_binary / --storage_binary) as child processes on port 0, as
// deployed, and the baseline's server in a child process too.
//
// --busy_core keeps one extra process busy-looping (pinned with --busy_cpu)
// from the first trial to the last, so that every timed phase of both the
// baseline and the GET runs beside it: a serving host is never idle, and
// the data plane must not depend on a free core.
//
// Each trial also reports the context switches (voluntary and not, of every
// thread of the client, node and master or baseline server; not the busy
// process) per GiB moved: the hand-offs the data path needs.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/cli.h"
#include "common/net.h"
#include "common/thread.h"
#include "master/master_server.h"
#include "storage_node/dataplane/rdma_plane.h"
#include "storage_node/storage_node.h"
#include "tests/daemon.h"

DEFINE_uint64(block_mib, 16, "block size in MiB");
DEFINE_uint64(block_kib, 0, "block size in KiB (overrides --block_mib when set)");
DEFINE_int32(blocks, 16, "blocks per Get");
DEFINE_int32(rounds, 8, "timed Gets");
DEFINE_int32(trials, 3, "alternating trials of each measurement");
DEFINE_string(db_path, "", "master RocksDB dir (default: a temp dir)");
DEFINE_string(transport, "tcp", "client transport: tcp, shm, rdma or auto");
DEFINE_string(processes, "one",
              "one: master, storage node and client in this process; "
              "separate: the master and storage daemons as child processes");
DEFINE_string(master_binary, "",
              "--processes=separate: hymcache-master (default: runfiles)");
DEFINE_string(storage_binary, "",
              "--processes=separate: hymcache-storage (default: runfiles)");
DEFINE_bool(busy_core, false,
            "keep one process busy-looping through the timed phases");
DEFINE_int32(busy_cpu, -1,
             "--busy_core: pin the busy process to this CPU (-1: unpinned)");
DEFINE_int32(send_buffer_bytes, hymcache::kDataSendBufferBytes,
             "send buffer of the node's data-plane connections and of the "
             "baseline's server (0: the kernel's autotuning)");
DEFINE_string(child_role, "",
              "internal: run as the busy process (busy) or as the "
              "baseline's server on descriptor 3 (raw_server)");
DEFINE_int32(child_parent, 0, "internal: the bench's pid");
DEFINE_bool(compare_capability_checks, false,
            "--processes=one: also time every trial's GETs with the node's "
            "capability checks turned off (a bench-only switch), side by "
            "side");

DEFINE_bool(compare_rdma_access, false,
            "--transport=rdma --processes=one: also time every trial's GETs "
            "with each of the node's RDMA access modes (memory windows per "
            "object, registrations per object, whole-area keys), each with a "
            "fresh client, side by side");

namespace hymcache {
namespace {

const char* g_argv0 = "";

// Starts this binary again as a helper process (--child_role) with `args`;
// `fd`, if >= 0, becomes the child's descriptor 3. Spawned, not forked, so
// that the bench's buffers are not made copy-on-write meanwhile.
pid_t SpawnSelf(std::vector<std::string> args, int fd) {
  args.insert(args.begin(), "get_bench");
  args.push_back(absl::StrCat("--child_parent=", getpid()));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  // From a copy above 3, so that the dup2 is never a no-op that would leave
  // close-on-exec set.
  const int high = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 10) : -1;
  if (high >= 0) posix_spawn_file_actions_adddup2(&fa, high, 3);
  pid_t pid = -1;
  int rc = (fd >= 0 && high < 0)
               ? -1
               : posix_spawn(&pid, "/proc/self/exe", &fa, nullptr,
                             argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (high >= 0) close(high);
  return rc == 0 ? pid : -1;
}

void StopChild(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// A process that spins on a CPU for as long as this object lives.
class BusyProcess {
 public:
  explicit BusyProcess(int cpu)
      : pid_(SpawnSelf({"--child_role=busy",
                        absl::StrCat("--busy_cpu=", cpu)},
                       -1)) {}
  ~BusyProcess() { StopChild(pid_); }
  BusyProcess(const BusyProcess&) = delete;
  BusyProcess& operator=(const BusyProcess&) = delete;

 private:
  const pid_t pid_;
};

// Context switches so far of every thread of `pid`.
uint64_t ContextSwitches(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  uint64_t total = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream status(absl::StrCat(dir, "/", e->d_name, "/status"));
    std::string line;
    while (std::getline(status, line)) {
      if (!absl::StrContains(line, "ctxt_switches:")) continue;
      uint64_t n = 0;
      if (absl::SimpleAtoi(line.substr(line.find(':') + 1), &n)) total += n;
    }
  }
  closedir(d);
  return total;
}

uint64_t ContextSwitches(const std::vector<pid_t>& pids) {
  uint64_t total = 0;
  for (pid_t p : pids) total += ContextSwitches(p);
  return total;
}

struct Rate {
  double gbps = 0;
  double switches_per_gib = 0;
};

Rate MakeRate(double bytes, absl::Duration d, uint64_t switches) {
  return Rate{bytes / absl::ToDoubleSeconds(d) / 1e9,
              static_cast<double>(switches) / (bytes / (1 << 30))};
}

// The baseline's server: accepts one connection and answers each 1-byte
// request with the next of `blocks` blocks.
void ServeRaw(int listen_fd, size_t block, int blocks) {
  std::vector<std::vector<char>> src(blocks, std::vector<char>(block, 'x'));
  int fd = accept(listen_fd, nullptr, nullptr);
  if (fd < 0) return;
  Socket s(fd);
  TuneDataSocket(fd, FLAGS_send_buffer_bytes);
  char c;
  for (size_t i = 0; RecvAll(fd, &c, 1, absl::InfiniteFuture()).ok(); ++i) {
    const auto& b = src[i % src.size()];
    if (!SendAll(fd, b.data(), b.size(), absl::InfiniteFuture()).ok()) break;
  }
}

// One TCP stream: the client sends a 1-byte request, the server answers with
// the next block. Source and destination footprints match the GET run
// (`blocks` distinct blocks each side), so both pay the same memory traffic.
// With `separate`, the server runs in a child process.
Rate RawSocket(size_t block, int blocks, int rounds, bool separate) {
  auto ls = ListenTcp("127.0.0.1", 0);
  if (!ls.ok()) return {};
  int port = *LocalPort(ls->fd());
  Thread server;
  pid_t child = -1;
  if (separate) {
    child = SpawnSelf({"--child_role=raw_server",
                       absl::StrCat("--block_mib=", FLAGS_block_mib),
                       absl::StrCat("--block_kib=", FLAGS_block_kib),
                       absl::StrCat("--blocks=", blocks),
                       absl::StrCat("--send_buffer_bytes=",
                                    FLAGS_send_buffer_bytes)},
                      ls->fd());
    if (child < 0) return {};
  } else {
    server = Thread("raw-server", [&] { ServeRaw(ls->fd(), block, blocks); });
  }
  auto c = ConnectTcp(absl::StrCat("127.0.0.1:", port), absl::InfiniteFuture());
  if (!c.ok()) {
    StopChild(child);
    return {};
  }
  std::vector<std::vector<char>> dst(blocks, std::vector<char>(block));
  auto one = [&](int i) {
    char r = 'r';
    SendAll(c->fd(), &r, 1, absl::InfiniteFuture()).IgnoreError();
    RecvAll(c->fd(), dst[i].data(), block, absl::InfiniteFuture()).IgnoreError();
  };
  for (int i = 0; i < blocks; ++i) one(i);  // warm up
  std::vector<pid_t> pids = {getpid()};
  if (separate) pids.push_back(child);
  const uint64_t cs0 = ContextSwitches(pids);
  absl::Time t0 = absl::Now();
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < blocks; ++i) one(i);
  }
  absl::Duration spent = absl::Now() - t0;
  const uint64_t cs = ContextSwitches(pids) - cs0;
  c->Close();
  if (separate) {
    waitpid(child, nullptr, 0);  // it exits when the connection closes
  } else {
    server.Join();
  }
  return MakeRate(static_cast<double>(block) * blocks * rounds, spent, cs);
}

// memcpy of `blocks` distinct blocks into `blocks` distinct buffers, the
// same footprint as the GET run.
Rate Memcpy(size_t block, int blocks, int rounds) {
  std::vector<std::vector<char>> src(blocks, std::vector<char>(block, 'x'));
  std::vector<std::vector<char>> dst(blocks, std::vector<char>(block));
  for (int i = 0; i < blocks; ++i) memcpy(dst[i].data(), src[i].data(), block);
  absl::Time t0 = absl::Now();
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < blocks; ++i) {
      memcpy(dst[i].data(), src[i].data(), block);
    }
  }
  absl::Duration spent = absl::Now() - t0;
  volatile char sink = dst[blocks - 1][block - 1];
  (void)sink;
  return MakeRate(static_cast<double>(block) * blocks * rounds, spent, 0);
}

// `rel` (e.g. "master/hymcache-master") in this binary's runfiles: beside
// argv[0] when run from bazel-bin, the working directory under `bazel run`.
std::string Runfile(const std::string& rel) {
  std::vector<std::string> roots;
  if (const char* dir = getenv("RUNFILES_DIR")) {
    roots.push_back(absl::StrCat(dir, "/hymcache/"));
  }
  roots.push_back(absl::StrCat(g_argv0, ".runfiles/hymcache/"));
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) roots.push_back(absl::StrCat(std::string(self, n), ".runfiles/hymcache/"));
  roots.push_back("");
  for (const std::string& root : roots) {
    std::string path = root + rel;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return rel;
}

// A master and one storage node, in this process or as daemons.
struct Cluster {
  std::string master_address;
  // --processes=one.
  std::unique_ptr<MasterServer> master;
  std::unique_ptr<StorageNode> node;
  // --processes=separate.
  testing::Daemon master_process;
  testing::Daemon storage_process;

  // The processes serving a GET besides this one.
  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    if (master_process.running()) out.push_back(master_process.pid());
    if (storage_process.running()) out.push_back(storage_process.pid());
    return out;
  }

  void Stop() {
    if (node != nullptr) node->Shutdown();
    if (master != nullptr) master->Shutdown();
    if (storage_process.running()) storage_process.Stop(SIGTERM).IgnoreError();
    if (master_process.running()) master_process.Stop(SIGTERM).IgnoreError();
  }
};

absl::Status StartInProcess(uint64_t dram_bytes, const std::string& db,
                            Cluster* c) {
  MasterOptions mo;
  mo.db_path = db;
  // One trusted caller stores nearly the whole node in one put.
  mo.service.max_pending_share_per_caller = 1.0;
  auto master = MasterServer::Create(mo);
  if (!master.ok()) return master.status();
  c->master = std::move(*master);
  c->master_address = c->master->address();
  StorageNodeOptions so;
  so.master_address = c->master_address;
  so.dram()->capacity_bytes = dram_bytes;
  so.data.send_buffer_bytes = FLAGS_send_buffer_bytes;
  auto node = StorageNode::Create(so);
  if (!node.ok()) return node.status();
  c->node = std::move(*node);
  if (!c->node->WaitRegistered(absl::Now() + absl::Seconds(10))) {
    return absl::DeadlineExceededError("storage node did not register");
  }
  return absl::OkStatus();
}

absl::Status StartDaemons(uint64_t dram_bytes, const std::string& db,
                          Cluster* c) {
  const std::string master_bin = FLAGS_master_binary.empty()
                                     ? Runfile("master/hymcache-master")
                                     : FLAGS_master_binary;
  const std::string storage_bin = FLAGS_storage_binary.empty()
                                      ? Runfile("storage_node/hymcache-storage")
                                      : FLAGS_storage_binary;
  auto m = testing::Daemon::Start(
      master_bin,
      {"--db_path=" + db, "--listen=127.0.0.1:0", "--minloglevel=1",
       // One trusted caller stores nearly the whole node in one put.
       "--max_pending_share_per_caller=1"},
      absl::Seconds(30));
  if (!m.ok()) return m.status();
  const std::string prefix = "hymcache-master listening on ";
  if (!absl::StartsWith(m->ready_line(), prefix)) {
    return absl::InternalError("unexpected master line: " + m->ready_line());
  }
  c->master_address = m->ready_line().substr(prefix.size());
  c->master_process = std::move(*m);
  auto s = testing::Daemon::Start(
      storage_bin,
      {"--master=" + c->master_address, "--name=get-bench", "--data_port=0",
       "--control_port=0", absl::StrCat("--dram_bytes=", dram_bytes),
       "--rdma=off",
       absl::StrCat("--data_send_buffer_bytes=", FLAGS_send_buffer_bytes),
       "--minloglevel=1"},
      absl::Seconds(30));
  if (!s.ok()) return s.status();
  c->storage_process = std::move(*s);
  return absl::OkStatus();
}

// Waits until the master lists a live node.
absl::Status WaitForNode(Client& client) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    auto st = client.GetClusterStatus();
    if (st.ok()) {
      for (const NodeStatus& n : st->nodes) {
        if (n.alive) return absl::OkStatus();
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError("no storage node registered");
}

int Main() {
  size_t block = FLAGS_block_kib > 0 ? FLAGS_block_kib << 10 : FLAGS_block_mib << 20;
  TransportKind kind;
  if (FLAGS_transport == "tcp") {
    kind = TransportKind::kTcp;
  } else if (FLAGS_transport == "shm") {
    kind = TransportKind::kShm;
  } else if (FLAGS_transport == "rdma") {
    kind = TransportKind::kRdma;
  } else if (FLAGS_transport == "auto") {
    kind = TransportKind::kAuto;
  } else {
    fprintf(stderr, "bad --transport %s\n", FLAGS_transport.c_str());
    return 2;
  }
  if (FLAGS_processes != "one" && FLAGS_processes != "separate") {
    fprintf(stderr, "bad --processes %s (want one or separate)\n",
            FLAGS_processes.c_str());
    return 2;
  }
  if (FLAGS_blocks < 1 || FLAGS_rounds < 1 || FLAGS_trials < 1 || block == 0) {
    fprintf(stderr, "--blocks, --rounds, --trials and the block size must be "
            "at least 1\n");
    return 2;
  }
  const bool separate = FLAGS_processes == "separate";
  const bool vs_memcpy = kind == TransportKind::kShm || kind == TransportKind::kAuto;
  const char* baseline = vs_memcpy ? "memcpy" : "raw loopback socket";
  std::string db = FLAGS_db_path.empty()
                       ? absl::StrCat("/tmp/hymcache-get-bench-", getpid())
                       : FLAGS_db_path;
  const uint64_t dram_bytes = block * FLAGS_blocks + (64 << 20);
  Cluster cluster;
  absl::Status up = separate ? StartDaemons(dram_bytes, db, &cluster)
                             : StartInProcess(dram_bytes, db, &cluster);
  if (!up.ok()) {
    fprintf(stderr, "cluster did not come up: %s\n", up.ToString().c_str());
    cluster.Stop();
    return 1;
  }
  ClientOptions co;
  co.master_address = cluster.master_address;
  co.transport = kind;
  auto client = Client::Create(co);
  if (!client.ok()) {
    fprintf(stderr, "client: %s\n", client.status().ToString().c_str());
    cluster.Stop();
    return 1;
  }
  if (absl::Status s = WaitForNode(**client); !s.ok()) {
    fprintf(stderr, "%s\n", s.ToString().c_str());
    cluster.Stop();
    return 1;
  }
  std::vector<std::string> keys;
  std::vector<std::vector<char>> data(FLAGS_blocks, std::vector<char>(block));
  std::vector<ConstBuffer> in;
  std::vector<MutableBuffer> out;
  std::vector<std::vector<char>> dst(FLAGS_blocks, std::vector<char>(block));
  for (int i = 0; i < FLAGS_blocks; ++i) {
    keys.push_back(absl::StrCat("bench-", i));
    memset(data[i].data(), 'a' + i % 26, block);
    in.push_back({data[i].data(), block});
    out.push_back({dst[i].data(), block});
  }
  auto put = (*client)->Put(keys, in);
  if (!put.ok() || put->stored != keys.size()) {
    fprintf(stderr, "put failed\n");
    cluster.Stop();
    return 1;
  }
  (*client)->Get(keys, out).IgnoreError();  // warm up
  printf("block=%zu KiB blocks/get=%d rounds=%d trials=%d transport=%s "
         "processes=%s busy_core=%s send_buffer=%d\n",
         block >> 10, FLAGS_blocks, FLAGS_rounds, FLAGS_trials,
         FLAGS_transport.c_str(), FLAGS_processes.c_str(),
         FLAGS_busy_core
             ? (FLAGS_busy_cpu < 0 ? "unpinned"
                                   : absl::StrCat("cpu", FLAGS_busy_cpu).c_str())
             : "no",
         FLAGS_send_buffer_bytes);
  std::unique_ptr<BusyProcess> busy;
  if (FLAGS_busy_core) {
    busy = std::make_unique<BusyProcess>(FLAGS_busy_cpu);
    absl::SleepFor(absl::Milliseconds(200));  // let it take its core
  }
  std::vector<pid_t> get_pids = cluster.pids();
  get_pids.push_back(getpid());
  bool ok = true;
  double best_get = 0, best_raw = 0, best_unchecked = 0;
  // --compare_capability_checks: the same GETs without the node's checks,
  // before the checked ones on odd trials and after them on even ones.
  auto unchecked_gets = [&]() {
    cluster.node->SetSkipCapabilityChecksForTest(true);
    absl::Time u0 = absl::Now();
    size_t unchecked = 0;
    for (int r = 0; r < FLAGS_rounds; ++r) {
      auto g = (*client)->Get(keys, out);
      if (g.ok()) unchecked += g->loaded;
    }
    const Rate off =
        MakeRate(static_cast<double>(block) * unchecked, absl::Now() - u0, 0);
    cluster.node->SetSkipCapabilityChecksForTest(false);
    return off;
  };
  const bool compare =
      FLAGS_compare_capability_checks && cluster.node != nullptr;
  for (int trial = 0; trial < FLAGS_trials; ++trial) {
    Rate off;
    if (compare && trial % 2 == 1) off = unchecked_gets();
    const uint64_t cs0 = ContextSwitches(get_pids);
    absl::Time t0 = absl::Now();
    size_t loaded = 0;
    for (int r = 0; r < FLAGS_rounds; ++r) {
      auto g = (*client)->Get(keys, out);
      if (g.ok()) loaded += g->loaded;
    }
    absl::Duration spent = absl::Now() - t0;
    const Rate get = MakeRate(static_cast<double>(block) * loaded, spent,
                              ContextSwitches(get_pids) - cs0);
    ok = ok && loaded == static_cast<size_t>(FLAGS_rounds) * keys.size();
    for (int i = 0; i < FLAGS_blocks && ok; ++i) ok = dst[i] == data[i];
    if (compare) {
      if (trial % 2 == 0) off = unchecked_gets();
      printf("trial %d: GET with capability checks %6.2f GB/s, without "
             "%6.2f GB/s (%.3fx)\n",
             trial, get.gbps, off.gbps, get.gbps / off.gbps);
      best_unchecked = std::max(best_unchecked, off.gbps);
    }
    const Rate raw =
        vs_memcpy ? Memcpy(block, FLAGS_blocks, FLAGS_rounds)
                  : RawSocket(block, FLAGS_blocks, FLAGS_rounds, separate);
    printf("trial %d: %s %6.2f GB/s (%5.0f cs/GiB), hymcache GET (%s) "
           "%6.2f GB/s (%5.0f cs/GiB) (%.2fx)\n",
           trial, baseline, raw.gbps, raw.switches_per_gib,
           FLAGS_transport.c_str(), get.gbps, get.switches_per_gib,
           get.gbps / raw.gbps);
    fflush(stdout);
    best_get = std::max(best_get, get.gbps);
    best_raw = std::max(best_raw, raw.gbps);
  }
  if (FLAGS_compare_rdma_access && cluster.node != nullptr &&
      cluster.node->rdma_plane_for_test() != nullptr) {
    // Per mode, a fresh client (a queue pair keeps the mode it was accepted
    // with); the modes in a rotating order per trial.
    storage::RdmaPlane* plane = cluster.node->rdma_plane_for_test();
    const storage::RdmaAccess original = plane->access();
    const storage::RdmaAccess modes[] = {storage::RdmaAccess::kWindows,
                                         storage::RdmaAccess::kRegistrations,
                                         storage::RdmaAccess::kWholeArea};
    double best[3] = {0, 0, 0};
    for (int trial = 0; trial < FLAGS_trials; ++trial) {
      double gbps[3] = {0, 0, 0};
      for (int k = 0; k < 3; ++k) {
        const int m = (trial + k) % 3;
        // A mode that cannot be measured fails the run (its rate would
        // read 0, not "missing").
        if (absl::Status s = plane->SetAccessForTest(modes[m]); !s.ok()) {
          fprintf(stderr, "RDMA access mode %d: %s\n", m, s.ToString().c_str());
          ok = false;
          continue;
        }
        auto c = Client::Create(co);
        if (!c.ok()) {
          fprintf(stderr, "client: %s\n", c.status().ToString().c_str());
          ok = false;
          continue;
        }
        (*c)->Get(keys, out).IgnoreError();  // connects
        absl::Time t0 = absl::Now();
        size_t loaded = 0;
        for (int r = 0; r < FLAGS_rounds; ++r) {
          auto g = (*c)->Get(keys, out);
          if (g.ok()) loaded += g->loaded;
        }
        gbps[m] = MakeRate(static_cast<double>(block) * loaded,
                           absl::Now() - t0, 0)
                      .gbps;
        ok = ok && loaded == static_cast<size_t>(FLAGS_rounds) * keys.size();
        for (int i = 0; i < FLAGS_blocks && ok; ++i) ok = dst[i] == data[i];
        best[m] = std::max(best[m], gbps[m]);
      }
      printf("trial %d: RDMA GET, windows %6.3f GB/s, registrations %6.3f "
             "GB/s, whole-area keys %6.3f GB/s (%.3fx, %.3fx of whole-area)\n",
             trial, gbps[0], gbps[1], gbps[2], gbps[0] / gbps[2],
             gbps[1] / gbps[2]);
      fflush(stdout);
    }
    printf("best: RDMA GET, windows %6.3f GB/s, registrations %6.3f GB/s, "
           "whole-area keys %6.3f GB/s (%.3fx, %.3fx)\n",
           best[0], best[1], best[2], best[0] / best[2], best[1] / best[2]);
    plane->SetAccessForTest(original).IgnoreError();
  }
  busy.reset();
  if (best_unchecked > 0) {
    printf("best: GET with capability checks %6.2f GB/s, without %6.2f GB/s "
           "(%.3fx)\n",
           best_get, best_unchecked, best_get / best_unchecked);
  }
  printf("best: %s %6.2f GB/s, hymcache GET (%s) %6.2f GB/s  (%.2fx)%s\n",
         baseline, best_raw, FLAGS_transport.c_str(), best_get,
         best_get / best_raw, ok ? "" : "  DATA MISMATCH");
  client->reset();
  cluster.Stop();
  if (FLAGS_db_path.empty()) {
    // The master's directory and the index snapshot beside it.
    std::error_code ec;
    for (const std::string& p : {db, db + ".snapshot"}) {
      std::filesystem::remove_all(p, ec);
      if (ec)
        fprintf(stderr, "could not remove %s: %s\n", p.c_str(),
                ec.message().c_str());
    }
  }
  return ok ? 0 : 1;
}

// The helper processes of SpawnSelf.
int ChildMain() {
  // Die with the bench, even if it crashes.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != FLAGS_child_parent) return 1;
  if (FLAGS_child_role == "busy") {
    if (FLAGS_busy_cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(FLAGS_busy_cpu, &set);
      sched_setaffinity(0, sizeof(set), &set);
    }
    while (true) asm volatile("" ::: "memory");
  }
  if (FLAGS_child_role == "raw_server") {
    size_t block =
        FLAGS_block_kib > 0 ? FLAGS_block_kib << 10 : FLAGS_block_mib << 20;
    ServeRaw(3, block, FLAGS_blocks);
    return 0;
  }
  return 2;
}

}  // namespace
}  // namespace hymcache

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "get_bench",
       .usage = "get_bench: GET throughput of HyMCache on one host against the "
                "limit of its data plane",
       .main_file = __FILE__},
      &argc, &argv);
  if (!FLAGS_child_role.empty()) return hymcache::ChildMain();
  hymcache::g_argv0 = argv[0];
  return hymcache::Main();
}
