// The daemons' and hymctl's command line as an operator meets it: --help
// lists the project's flags (not the ~230 of librocksdb), --version the
// build stamp, --log_dir writes log files, and start-up refuses a DRAM
// device larger than the host or a capacity file larger than the free
// space of its filesystem unless --allow_overcommit.
#include <dirent.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/build_info.h"
#include "tests/daemon.h"

namespace hymcache::testing {
namespace {

const char* const kBinaries[] = {"master/hymcache-master",
                                 "storage_node/hymcache-storage",
                                 "tools/hymctl/hymctl"};

RunResult MustRun(const std::string& binary,
                  const std::vector<std::string>& args) {
  auto r = Run(RunfilePath(binary), args);
  REQUIRE(r.ok());
  return *r;
}

bool Exited(const RunResult& r, int code) {
  return WIFEXITED(r.status) && WEXITSTATUS(r.status) == code;
}

uint64_t MemTotal() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

TEST_CASE("--help lists the program's flags, grouped, not librocksdb's") {
  struct Case {
    const char* binary;
    std::vector<std::string> own;  // flags of its main.cc
    const char* group;
  };
  for (const Case& c :
       {Case{kBinaries[0], {"listen", "db_path", "node_timeout_ms"}, "Serving:"},
        Case{kBinaries[1], {"master", "dram_bytes", "allow_overcommit"},
             "Memory device:"},
        Case{kBinaries[2], {"master", "json", "token_file"}, "Connection:"}}) {
    INFO(c.binary);
    RunResult r = MustRun(c.binary, {"--help"});
    CHECK(Exited(r, 0));
    for (const std::string& f : c.own) {
      CHECK(r.output.find("\n  --" + f + " (") != std::string::npos);
    }
    CHECK(r.output.find(c.group) != std::string::npos);
    CHECK(r.output.find("default: ") != std::string::npos);
    // A librocksdb flag (tools/trace_analyzer_tool.cc) is not listed...
    CHECK(r.output.find("analyze_get") == std::string::npos);
    CHECK(r.output.size() < 16000);
    // ...though the daemons (which link librocksdb) have it: --helpfull
    // lists every flag.
    RunResult full = MustRun(c.binary, {"--helpfull"});
    CHECK(Exited(full, 1));  // gflags' exit code after --helpfull
    CHECK(full.output.find("    -" + c.own[0] + " (") != std::string::npos);
    if (c.binary != kBinaries[2]) {
      CHECK(full.output.find("analyze_get") != std::string::npos);
    }
  }
  // The daemons' logging flags, with the daemon default (stderr).
  RunResult master = MustRun(kBinaries[0], {"--help"});
  CHECK(master.output.find("--logtostderr (bool, default: true)") !=
        std::string::npos);
  CHECK(master.output.find("--log_dir (") != std::string::npos);
}

TEST_CASE("the tools' --help lists their own flags, not librocksdb's") {
  struct Case {
    const char* binary;
    std::vector<std::string> own;  // flags its main file defines
  };
  for (const Case& c :
       {Case{"tools/bench/device_bench", {"conversations", "window_mib"}},
        Case{"tools/bench/lookup_bench", {"objects", "batch_sizes"}},
        Case{"tools/crashtest/crashtest", {"kills", "seed"}},
        Case{"tools/hymbench/hymbench", {"trace"}}}) {
    INFO(c.binary);
    RunResult r = MustRun(c.binary, {"--help"});
    CHECK(Exited(r, 0));
    for (const std::string& f : c.own) {
      CHECK(r.output.find("\n  --" + f + " (") != std::string::npos);
    }
    // device_bench and lookup_bench link librocksdb (through the devices'
    // capacity tier and the master): its analyzer's flags stay out of --help.
    CHECK(r.output.find("analyze_get") == std::string::npos);
    CHECK(r.output.size() < 16000);
  }
}

TEST_CASE("--version prints version, commit and build time") {
  for (const char* binary : kBinaries) {
    INFO(binary);
    RunResult r = MustRun(binary, {"--version"});
    CHECK(Exited(r, 0));
    // The binary's stamp is the one this test was built with.
    const std::string name = binary + std::string(binary).rfind('/') + 1;
    CHECK(r.output == VersionLine(name) + "\n");
    CHECK(absl::StrContains(r.output, BuildInfo().version));
    CHECK(absl::StrContains(r.output, "commit "));
  }
}

TEST_CASE("a bad flag exits 2 with gflags' message") {
  const std::string flagfile = TempDir("flags") + "/bad.conf";
  {
    std::ofstream f(flagfile);
    f << "# a comment\n--no_such_flag_in_file=1\n";
  }
  for (const char* binary : kBinaries) {
    INFO(binary);
    RunResult r = MustRun(binary, {"--no_such_flag=1"});
    CHECK(Exited(r, 2));
    CHECK(absl::StrContains(r.output, "no_such_flag"));
    // Not a number, a missing --flagfile, a bad flag inside one.
    r = MustRun(binary, {"--v=abc"});
    CHECK(Exited(r, 2));
    CHECK(absl::StrContains(r.output, "abc"));
    r = MustRun(binary, {"--flagfile=/nonexistent/hymcache.conf"});
    CHECK(Exited(r, 2));
    r = MustRun(binary, {"--flagfile=" + flagfile});
    CHECK(Exited(r, 2));
    CHECK(absl::StrContains(r.output, "no_such_flag_in_file"));
  }
}

TEST_CASE("flag defaults come from the options structs; a bad choice "
          "exits 2 naming the good ones") {
  // The defaults as the libraries state them (StorageNodeOptions and its
  // parts, MasterOptions and its MasterServiceOptions).
  RunResult storage = MustRun(kBinaries[1], {"--help"});
  for (const char* line :
       {"--dram_bytes (string, default: \"1G\")",
        "--staging_bytes (string, default: \"256M\")",
        "--write_buffer_bytes (string, default: \"64M\")",
        "--prefetch_window_bytes (string, default: \"128M\")",
        "--io_engine (string, default: \"auto\")",
        "--rdma (string, default: \"auto\")",
        "--device (string, default: \"dram\")",
        "--shutdown_flush_timeout_ms (int32, default: 15000)",
        "--max_connections (int32, default: 8192)"}) {
    CHECK(absl::StrContains(storage.output, line));
  }
  RunResult master = MustRun(kBinaries[0], {"--help"});
  for (const char* line : {"--node_timeout_ms (int64, default: 10000)",
                           "--forget_dead_nodes_after_s (int64, default: "
                           "604800)",
                           "--max_eviction_scan (uint32, default: 16384)",
                           "--recency_batch (uint32, default: 16384)"}) {
    CHECK(absl::StrContains(master.output, line));
  }
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<std::string> hybrid = {
      "--device=hybrid", "--name=n", "--capacity_path=/nonexistent/cap",
      "--capacity_bytes=64M"};
  auto with = [&hybrid](std::string flag) {
    std::vector<std::string> args = hybrid;
    args.push_back(std::move(flag));
    return args;
  };
  for (const Case& c :
       {Case{{"--rdma=maybe"}, "bad --rdma 'maybe' (want off, auto or on)"},
        Case{{"--device=nvme"},
             "bad --device 'nvme' (want dram, hybrid or hybrid-lru)"},
        Case{with("--io_engine=aio"),
             "bad --io_engine 'aio' (want auto, io_uring or threadpool)"},
        Case{with("--io_submit=zz"),
             "bad --io_submit 'zz' (want auto, inline or async)"}}) {
    std::vector<std::string> args = {"--master=127.0.0.1:1", "--data_port=0",
                                     "--control_port=0"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    RunResult r = MustRun(kBinaries[1], args);
    INFO(r.output);
    CHECK(Exited(r, 2));
    CHECK(absl::StrContains(r.output, c.message));
  }
  // The master's new flags reach its options: Validate refuses a bad value.
  RunResult scan = MustRun(kBinaries[0], {"--db_path=" + TempDir("scan"),
                                          "--listen=127.0.0.1:0",
                                          "--max_eviction_scan=0"});
  CHECK(Exited(scan, 2));
  CHECK(absl::StrContains(scan.output, "max_eviction_scan"));
  // So do the eviction policy's (master/eviction_cost.h).
  CHECK(absl::StrContains(master.output,
                          "--eviction_policy (string, default: "
                          "\"lru\")"));
  RunResult policy =
      MustRun(kBinaries[0], {"--db_path=" + TempDir("policy"),
                             "--listen=127.0.0.1:0", "--eviction_policy=lfu"});
  CHECK(Exited(policy, 2));
  CHECK(absl::StrContains(policy.output,
                          "--eviction_policy: eviction policy "
                          "'lfu' (want lru or cost)"));
  RunResult pool = MustRun(
      kBinaries[0], {"--db_path=" + TempDir("pool"), "--listen=127.0.0.1:0",
                     "--eviction_policy=cost", "--eviction_cost_pool=0"});
  CHECK(Exited(pool, 2));
  CHECK(absl::StrContains(pool.output, "eviction_cost.pool"));
  RunResult horizon =
      MustRun(kBinaries[0],
              {"--db_path=" + TempDir("horizon"), "--listen=127.0.0.1:0",
               "--eviction_policy=cost", "--eviction_cost_turn_horizon_ms=10"});
  CHECK(Exited(horizon, 2));
  CHECK(absl::StrContains(horizon.output, "eviction_cost.turn_horizon"));
}

TEST_CASE("--log_dir writes glog files there; a missing one is refused") {
  const std::string dir = TempDir("logs");
  const std::string db = TempDir("db");
  // MasterProcess passes --logtostderr; start it without.
  auto d = Daemon::Start(RunfilePath(kBinaries[0]),
                         {"--db_path=" + db, "--listen=127.0.0.1:0",
                          "--log_dir=" + dir});
  REQUIRE(d.ok());
  auto status = d->Stop(SIGTERM);
  REQUIRE(status.ok());
  CHECK(WIFEXITED(*status));
  std::string info;
  DIR* dp = opendir(dir.c_str());
  REQUIRE(dp != nullptr);
  while (dirent* e = readdir(dp)) {
    const std::string n = e->d_name;
    if (absl::StartsWith(n, "hymcache-master.") && absl::StrContains(n, ".INFO.")) {
      std::ifstream in(dir + "/" + n);
      std::stringstream ss;
      ss << in.rdbuf();
      info = ss.str();
    }
  }
  closedir(dp);
  CHECK(absl::StrContains(info, "master serving on"));
  CHECK(absl::StrContains(info, "shutting down"));

  RunResult missing =
      MustRun(kBinaries[0], {"--db_path=" + db, "--listen=127.0.0.1:0",
                             "--log_dir=" + dir + "/nope"});
  CHECK(Exited(missing, 2));
  CHECK(absl::StrContains(missing.output, "not a writable directory"));
}

// Starts the storage node with `args`, checks it comes up, and stops it
// cleanly (exit 0 on SIGTERM).
void StartsAndStopsCleanly(const std::vector<std::string>& args) {
  auto d = Daemon::Start(RunfilePath(kBinaries[1]), args);
  REQUIRE(d.ok());
  CHECK(absl::StartsWith(d->ready_line(), "hymcache-storage data="));
  auto status = d->Stop(SIGTERM);
  REQUIRE(status.ok());
  CHECK(Exited(RunResult{*status, ""}, 0));
}

TEST_CASE("a DRAM device larger than the host is refused") {
  const uint64_t mem = MemTotal();
  REQUIRE(mem > 0);
  const std::string too_big = std::to_string(mem + (uint64_t{1} << 30));
  for (const std::string& bytes : {std::string("1T"), too_big}) {
    if (bytes == "1T" && mem >= (uint64_t{1} << 40)) continue;
    INFO(bytes);
    RunResult r = MustRun(kBinaries[1],
                          {"--master=127.0.0.1:1", "--data_port=0",
                           "--control_port=0", "--rdma=off",
                           "--dram_bytes=" + bytes});
    CHECK(Exited(r, 1));
    CHECK(absl::StrContains(r.output, "not enough memory"));
    CHECK(absl::StrContains(r.output, "--dram_bytes"));
    CHECK(absl::StrContains(r.output, std::to_string(mem)));
    CHECK(absl::StrContains(r.output, "--allow_overcommit"));
  }
  // With --allow_overcommit it starts (address space is reserved lazily),
  // with a warning, and stops cleanly.
  StartsAndStopsCleanly({"--master=127.0.0.1:1", "--data_port=0",
                         "--control_port=0", "--rdma=off", "--shm=false",
                         "--dram_bytes=" + too_big, "--allow_overcommit"});
}

TEST_CASE(
    "a hybrid device's DRAM larger than the host is refused, or started "
    "overcommitted without faulting it in") {
  const uint64_t mem = MemTotal();
  REQUIRE(mem > 0);
  const std::string dir = TempDir("overcommit");
  std::vector<std::string> args = {
      "--master=127.0.0.1:1",
      "--name=wide",
      "--data_port=0",
      "--control_port=0",
      "--rdma=off",
      "--shm=false",
      "--device=hybrid",
      "--capacity_path=" + dir + "/capacity",
      "--capacity_bytes=64M",
      "--staging_bytes=" + std::to_string(mem + (uint64_t{1} << 30)),
      "--write_buffer_bytes=16M",
      "--io_direct=false",
      "--node_key_file=" + dir + "/node.key"};
  RunResult r = MustRun(kBinaries[1], args);
  CHECK(Exited(r, 1));
  CHECK(absl::StrContains(r.output, "not enough memory"));
  CHECK(absl::StrContains(r.output, "--staging_bytes + --write_buffer_bytes"));
  // Faulting in more than the host has would get the node killed (or the
  // host thrashing) at start: --allow_overcommit leaves pages to first use.
  args.push_back("--allow_overcommit");
  StartsAndStopsCleanly(args);
}

TEST_CASE("a 10 TiB sparse capacity file on a smaller filesystem is refused") {
  const std::string dir = TempDir("capacity");
  struct statvfs vfs;
  REQUIRE(statvfs(dir.c_str(), &vfs) == 0);
  const uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  if (free_bytes >= (uint64_t{10} << 40)) {
    WARN("the test directory's filesystem has 10 TiB free; skipped");
    return;
  }
  const std::vector<std::string> args = {
      "--master=127.0.0.1:1", "--name=big", "--data_port=0",
      "--control_port=0", "--rdma=off", "--shm=false", "--device=hybrid",
      "--capacity_path=" + dir + "/capacity", "--capacity_bytes=10T",
      "--staging_bytes=16M", "--write_buffer_bytes=16M", "--io_direct=false",
      "--node_key_file=" + dir + "/node.key"};
  RunResult r = MustRun(kBinaries[1], args);
  CHECK(Exited(r, 1));
  CHECK(absl::StrContains(r.output, "not enough free space"));
  CHECK(absl::StrContains(r.output, "--allow_overcommit"));
  CHECK(absl::StrContains(r.output, std::to_string(uint64_t{10} << 40)));

  std::vector<std::string> over = args;
  over.push_back("--allow_overcommit");
  StartsAndStopsCleanly(over);
}

}  // namespace
}  // namespace hymcache::testing
