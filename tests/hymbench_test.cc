// hymbench end to end: the real hymbench binary generates a multi-turn trace
// and replays it against real hymcache-master / hymcache-storage daemons on
// loopback.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "tests/cluster.h"
#include "tests/daemon.h"

namespace hymcache {
namespace {

using testing::MasterProcess;
using testing::RunCommand;
using testing::RunfilePath;
using testing::StorageProcess;
using testing::TempDir;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Run {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs the hymbench binary with `args`; stdout and stderr go to files in
// `dir`, read back into the result.
Run Hymbench(const std::string& dir, const std::vector<std::string>& args) {
  static int n = 0;
  const std::string out_path = absl::StrCat(dir, "/stdout-", n);
  const std::string err_path = absl::StrCat(dir, "/stderr-", n++);
  absl::StatusOr<int> st =
      RunCommand(RunfilePath("tools/hymbench/hymbench"), args, out_path,
                 err_path, absl::Minutes(5));
  REQUIRE(st.ok());
  const int status = *st;
  Run r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  return r;
}

// The infinite-cache ceiling of a JSONL trace, computed here independently
// of hymbench: leading hash_ids seen in any earlier request.
size_t CeilingHits(const std::string& trace, size_t* blocks) {
  std::istringstream in(trace);
  std::unordered_set<uint64_t> seen;
  size_t hits = 0;
  *blocks = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<uint64_t> ids = nlohmann::json::parse(line)["hash_ids"];
    size_t k = 0;
    while (k < ids.size() && seen.count(ids[k])) ++k;
    hits += k;
    *blocks += ids.size();
    seen.insert(ids.begin(), ids.end());
  }
  return hits;
}

// A master and one storage node (with ample room by default).
struct Cluster : testing::TestCluster {
  explicit Cluster(const std::string& dram_bytes = "268435456")
      : TestCluster("hymbench") {
    REQUIRE(StartMaster().ok());
    REQUIRE(AddNode("bench-node", {"--dram_bytes=" + dram_bytes}).ok());
    REQUIRE(Connect().ok());
    absl::Status alive = WaitAlive();
    INFO(alive.ToString());
    REQUIRE(alive.ok());
  }
};

const std::vector<std::string> kWorkload = {
    "--conversations=3", "--turns=4", "--system_prompt_tokens=600", "--user_tokens=700",
    "--output_tokens=200"};

std::vector<std::string> With(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_CASE("replaying a generated trace reaches the infinite-cache ceiling") {
  Cluster c;
  const std::string trace = c.dir + "/trace.jsonl";
  Run gen = Hymbench(c.dir, With({"gen", "--out=" + trace}, kWorkload));
  INFO(gen.err);
  REQUIRE(gen.exit_code == 0);
  size_t blocks = 0;
  const size_t ceiling = CeilingHits(ReadFile(trace), &blocks);
  REQUIRE(ceiling > 0);
  REQUIRE(ceiling < blocks);

  // `gen` to stdout writes the same trace.
  Run gen_stdout = Hymbench(c.dir, With({"gen"}, kWorkload));
  REQUIRE(gen_stdout.exit_code == 0);
  CHECK(gen_stdout.out == ReadFile(trace));

  Run ceil = Hymbench(c.dir, {"ceiling", "--trace=" + trace, "--json=" + c.dir + "/ceiling.json"});
  INFO(ceil.out << ceil.err);
  REQUIRE(ceil.exit_code == 0);
  auto cj = nlohmann::json::parse(ReadFile(c.dir + "/ceiling.json"));
  CHECK(cj["hits"] == ceiling);
  CHECK(cj["blocks"] == blocks);
  CHECK(ceil.out.find("infinite-cache ceiling hit ratio") != std::string::npos);

  // Sequential, each store finished before the next request: every block an
  // infinite cache would hold is loaded, and every loaded byte is checked.
  const std::string json = c.dir + "/report.json", csv = c.dir + "/report.csv";
  Run replay = Hymbench(c.dir, {"replay", "--master=" + c.master.address, "--trace=" + trace,
                                "--concurrency=1", "--wait_stores", "--verify",
                                "--block_bytes=64K", "--json=" + json, "--csv=" + csv,
                                "--progress_s=0"});
  INFO(replay.out << replay.err);
  REQUIRE(replay.exit_code == 0);
  CHECK(replay.out.find("turn 3") != std::string::npos);
  auto j = nlohmann::json::parse(ReadFile(json));
  CHECK(j["group_by"] == "turn");
  CHECK(j["groups"].size() == 4);
  const auto& all = j["overall"];
  CHECK(all["requests"] == 12);
  CHECK(all["blocks"] == blocks);
  CHECK(all["ceiling_hits"] == ceiling);
  CHECK(all["loaded"] == ceiling);
  CHECK(all["hit_prefix"] == ceiling);
  CHECK(all["prefix_hit_ratio"].get<double>() == Approx(all["ceiling_hit_ratio"].get<double>()));
  CHECK(all["loaded_bytes"] == ceiling * 65536);
  CHECK(all["stored"] == blocks - ceiling);  // each block stored once
  CHECK(all["refused"] == 0);
  CHECK(all["store_failed"] == 0);
  CHECK(all["load_errors"] == 0);
  CHECK(all["corrupt_blocks"] == 0);
  for (const auto& r : j["requests"]) CHECK(r["loaded"] == r["ceiling_hits"]);
  // Turn 0: only the shared system prompt's first block is reused.
  CHECK(j["groups"][0]["loaded"] == 2);
  // CSV: header, four turns, "all".
  std::istringstream lines(ReadFile(csv));
  std::string line;
  int rows = 0;
  while (std::getline(lines, line)) ++rows;
  CHECK(rows == 6);
}

TEST_CASE("concurrent synthetic replay stores everything it computes") {
  Cluster c;
  const std::vector<std::string> replay =
      With({"replay", "--master=" + c.master.address, "--synthetic", "--concurrency=2",
            "--prefetch=false", "--verify", "--block_bytes=32K", "--namespace=conc",
            "--progress_s=0.05", "--json=" + c.dir + "/first.json"},
           kWorkload);
  Run first = Hymbench(c.dir, replay);
  INFO(first.out << first.err);
  REQUIRE(first.exit_code == 0);
  CHECK(first.err.find("requests, hit") != std::string::npos);  // progress lines
  auto j = nlohmann::json::parse(ReadFile(c.dir + "/first.json"));
  CHECK(j["overall"]["requests"] == 12);
  CHECK(j["overall"]["loaded"] <= j["overall"]["ceiling_hits"]);
  CHECK(j["overall"]["corrupt_blocks"] == 0);
  CHECK(j["overall"]["refused"] == 0);

  // hymbench waits for its stores before exiting: a second run of the same
  // workload in the same namespace finds every block.
  std::vector<std::string> again = replay;
  again.push_back("--json=" + c.dir + "/second.json");
  Run second = Hymbench(c.dir, again);
  INFO(second.out << second.err);
  REQUIRE(second.exit_code == 0);
  auto k = nlohmann::json::parse(ReadFile(c.dir + "/second.json"));
  CHECK(k["overall"]["loaded"] == k["overall"]["blocks"]);
  CHECK(k["overall"]["stored"] == 0);
  CHECK(k["overall"]["corrupt_blocks"] == 0);
}

// Lost blocks (ceiling hits not loaded) of a report's "overall" or group:
// the reasons add up to the total, which is ceiling_hits - loaded.
size_t LostBlocks(const nlohmann::json& g) {
  size_t sum = 0;
  for (const auto& [reason, n] : g["lost"].items()) sum += n.get<size_t>();
  CHECK(sum == g["lost_blocks"].get<size_t>());
  CHECK(g["lost_blocks"] == g["ceiling_hits"].get<size_t>() - g["loaded"].get<size_t>());
  return sum;
}

TEST_CASE("a Mooncake-format trace gets a per-turn ladder from its prefix chains") {
  Cluster c;
  const std::string with_turns = c.dir + "/turns.jsonl", plain = c.dir + "/mooncake.jsonl";
  REQUIRE(Hymbench(c.dir, With({"gen", "--out=" + with_turns}, kWorkload)).exit_code == 0);
  REQUIRE(Hymbench(c.dir, With({"gen", "--turn_fields=false", "--out=" + plain}, kWorkload))
              .exit_code == 0);
  const std::string text = ReadFile(plain);
  REQUIRE(text.find("turn") == std::string::npos);
  REQUIRE(text.find("conversation") == std::string::npos);
  std::vector<nlohmann::json> want;
  std::istringstream in(ReadFile(with_turns));
  for (std::string line; std::getline(in, line);) want.push_back(nlohmann::json::parse(line));

  const std::string json = c.dir + "/mooncake.json";
  Run replay = Hymbench(c.dir, {"replay", "--master=" + c.master.address, "--trace=" + plain,
                                "--concurrency=1", "--wait_stores", "--verify",
                                "--block_bytes=64K", "--json=" + json, "--progress_s=0"});
  INFO(replay.out << replay.err);
  REQUIRE(replay.exit_code == 0);
  CHECK(replay.out.find("turn 3") != std::string::npos);
  CHECK(replay.out.find("lost blocks (ceiling hits not loaded): none") != std::string::npos);
  CHECK(replay.out.find("KV pool") != std::string::npos);
  auto j = nlohmann::json::parse(ReadFile(json));
  CHECK(j["group_by"] == "turn");
  REQUIRE(j["groups"].size() == 4);
  REQUIRE(j["requests"].size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(j["requests"][i]["turn"] == want[i]["turn"]);
    CHECK(j["requests"][i]["conversation"] == want[i]["conversation"]);
  }
  // The ladder: every turn reaches its ceiling, later turns reuse more.
  for (size_t t = 0; t < 4; ++t) {
    const auto& g = j["groups"][t];
    CHECK(g["label"] == "turn " + std::to_string(t));
    CHECK(g["requests"] == 3);
    CHECK(g["loaded"] == g["ceiling_hits"]);
    CHECK(LostBlocks(g) == 0);
    if (t > 0) {
      CHECK(g["load_gbps"].get<double>() > 0);
      CHECK(g["prefix_hit_ratio"].get<double>() >
            j["groups"][t - 1]["prefix_hit_ratio"].get<double>());
    }
  }
  CHECK(j["config"]["pool_bytes"] != "0");
  CHECK(j["config"]["pools_registered"] == "1 of 1");

  // Without inference the rows are windows of trace time.
  Run windows = Hymbench(c.dir, {"replay", "--master=" + c.master.address, "--trace=" + plain,
                                 "--infer_turns=false", "--store=false", "--block_bytes=64K",
                                 "--json=" + c.dir + "/windows.json", "--progress_s=0"});
  REQUIRE(windows.exit_code == 0);
  CHECK(nlohmann::json::parse(ReadFile(c.dir + "/windows.json"))["group_by"] == "window");
}

TEST_CASE("lost blocks are attributed: no room on a small node, a paused node") {
  SECTION("a node with room for a few blocks: admission or eviction") {
    Cluster c("1048576");  // 16 blocks of 64 KiB
    const std::string json = c.dir + "/small.json";
    Run replay = Hymbench(c.dir, With({"replay", "--master=" + c.master.address, "--synthetic",
                                       "--concurrency=1", "--wait_stores", "--verify",
                                       "--block_bytes=64K", "--json=" + json, "--progress_s=0"},
                                      kWorkload));
    INFO(replay.out << replay.err);
    REQUIRE(replay.exit_code == 0);
    CHECK(replay.out.find("lost blocks by reason") != std::string::npos);
    const auto all = nlohmann::json::parse(ReadFile(json))["overall"];
    INFO(all.dump());
    REQUIRE(LostBlocks(all) > 0);
    // Refused for lack of room, or stored and then evicted to make room.
    CHECK(all["lost"]["refused_no_room"].get<size_t>() +
              all["lost"]["refused_write_buffer"].get<size_t>() +
              all["lost"]["not_found"].get<size_t>() ==
          all["lost_blocks"]);
  }
  SECTION("a paused node: every hit is lost to the deadline or a node error") {
    Cluster c;
    const std::vector<std::string> replay = {
        "replay", "--master=" + c.master.address, "--trace=" + c.dir + "/t.jsonl",
        "--concurrency=1", "--block_bytes=64K", "--progress_s=0"};
    REQUIRE(Hymbench(c.dir, With({"gen", "--turn_fields=false", "--out=" + c.dir + "/t.jsonl",
                                  "--max_requests=6"},
                                 kWorkload))
                .exit_code == 0);
    REQUIRE(Hymbench(c.dir, With(replay, {"--wait_stores"})).exit_code == 0);
    REQUIRE(kill(c.nodes[0].daemon.pid(), SIGSTOP) == 0);
    Run paused = Hymbench(c.dir, With(replay, {"--store=false", "--load_timeout_ms=300",
                                               "--json=" + c.dir + "/paused.json"}));
    REQUIRE(kill(c.nodes[0].daemon.pid(), SIGCONT) == 0);
    INFO(paused.out << paused.err);
    const auto all = nlohmann::json::parse(ReadFile(c.dir + "/paused.json"))["overall"];
    INFO(all.dump());
    CHECK(all["loaded"] == 0);
    REQUIRE(LostBlocks(all) == all["ceiling_hits"]);
    CHECK(all["lost_blocks"].get<size_t>() > 0);
    CHECK(all["lost"]["deadline"].get<size_t>() + all["lost"]["node_error"].get<size_t>() ==
          all["lost_blocks"]);
  }
}

// The first bytes of a PNG file, with its header chunk.
bool IsPng(const std::string& path) {
  const std::string head = ReadFile(path).substr(0, 16);
  return head.size() == 16 && head.substr(0, 8) == "\x89PNG\r\n\x1a\n" &&
         head.substr(12, 4) == "IHDR";
}

TEST_CASE("replay --plot and plot: PNGs per turn, prefetch on vs off") {
  Cluster c;
  const std::vector<std::string> replay = With(
      {"replay", "--master=" + c.master.address, "--synthetic", "--wait_stores",
       "--block_bytes=32K", "--progress_s=0"},
      kWorkload);
  // Without --json, the report goes to DIR/hymbench.json.
  const std::string on_dir = c.dir + "/on";
  Run on = Hymbench(c.dir, With(replay, {"--namespace=on", "--prefetch=true",
                                         "--plot=" + on_dir}));
  INFO(on.out << on.err);
  REQUIRE(on.exit_code == 0);
  auto j = nlohmann::json::parse(ReadFile(on_dir + "/hymbench.json"));
  CHECK(j["config"]["prefetch"] == "true");
  CHECK(j["groups"].size() == 4);
  CHECK(IsPng(on_dir + "/hymbench_hit_ratio.png"));
  CHECK(IsPng(on_dir + "/hymbench_load_gbps.png"));

  const std::string off_json = c.dir + "/off.json";
  Run off = Hymbench(c.dir, With(replay, {"--namespace=off", "--prefetch=false",
                                          "--json=" + off_json, "--plot=" + c.dir + "/off"}));
  INFO(off.out << off.err);
  REQUIRE(off.exit_code == 0);
  CHECK(IsPng(c.dir + "/off/hymbench_load_gbps.png"));

  // Both runs in one pair of plots.
  const std::string both = c.dir + "/both";
  Run plot = Hymbench(c.dir, {"plot", "--json=" + on_dir + "/hymbench.json," + off_json,
                              "--plot=" + both});
  INFO(plot.err);
  REQUIRE(plot.exit_code == 0);
  CHECK(IsPng(both + "/hymbench_hit_ratio.png"));
  CHECK(IsPng(both + "/hymbench_load_gbps.png"));

  // A file that is not a replay report: exit 2, the file and what is wrong.
  const std::string ceiling = c.dir + "/ceiling.json";
  std::ofstream(ceiling) << "{\"requests\": 3, \"blocks\": 9, \"hits\": 2}\n";
  Run bad = Hymbench(c.dir, {"plot", "--json=" + ceiling, "--plot=" + c.dir + "/bad"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find(ceiling + ": \"groups\" missing") != std::string::npos);
  CHECK(Hymbench(c.dir, {"plot", "--json=" + off_json}).exit_code == 2);
  Run no_python = Hymbench(c.dir, {"plot", "--json=" + off_json, "--plot=" + both,
                                   "--python=" + c.dir + "/no-python"});
  CHECK(no_python.exit_code == 1);
  CHECK(no_python.err.find("cannot run") != std::string::npos);
}

TEST_CASE("hymbench fails clearly on bad input") {
  struct {
    std::string dir = TempDir("hymbench-bad");
  } c;
  const std::string trace = c.dir + "/bad.jsonl";
  std::ofstream(trace) << "{\"timestamp\": 0, \"input_length\": 10, \"hash_ids\": [1]}\n"
                       << "{\"timestamp\": 1, \"input_length\": 10, \"hash_ids\": [1, 2]}\n";
  Run bad = Hymbench(c.dir, {"replay", "--master=127.0.0.1:1", "--trace=" + trace});
  CHECK(bad.exit_code == 1);
  CHECK(bad.err.find("bad.jsonl:2: hash_ids has 2 entries") != std::string::npos);

  Run missing = Hymbench(c.dir, {"ceiling", "--trace=" + c.dir + "/none.jsonl"});
  CHECK(missing.exit_code == 1);
  CHECK(missing.err.find("cannot open trace") != std::string::npos);

  Run usage = Hymbench(c.dir, {"replay", "--master=127.0.0.1:1", "--synthetic",
                               "--block_bytes=lots"});
  CHECK(usage.exit_code == 2);
  CHECK(usage.err.find("bad --block_bytes") != std::string::npos);
  CHECK(Hymbench(c.dir, {"frobnicate"}).exit_code == 2);
  CHECK(Hymbench(c.dir, {"ceiling"}).exit_code == 2);

  Run down = Hymbench(c.dir, {"replay", "--master=127.0.0.1:1", "--synthetic"});
  CHECK(down.exit_code == 1);
  CHECK(down.err.find("cannot reach the master") != std::string::npos);
}

}  // namespace
}  // namespace hymcache
