// hymctl's on-call commands against real daemons: drain / undrain, forget,
// inspect, top, version, help; every --json output parsed and checked.
#include <signal.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/daemon.h"
#include "tools/hymctl/hymctl.h"

namespace hymcache {
namespace {

using nlohmann::json;
using testing::MasterProcess;
using testing::StorageProcess;
using testing::TempDir;

struct Ctl {
  std::string master;
  // Runs hymctl; `out` gets stdout and stderr.
  int Run(std::vector<std::string> args, std::string* out,
          hymctl::Options o = {}) const {
    o.master_address = master;
    std::ostringstream os, es;
    const int rc = hymctl::Run(o, args, os, es);
    *out = os.str() + es.str();
    return rc;
  }
  // Runs hymctl --json and parses what it printed.
  json Json(std::vector<std::string> args, int want_rc = 0,
            hymctl::Options o = {}) const {
    o.json = true;
    std::string out;
    const int rc = Run(args, &out, o);
    INFO(out);
    CHECK(rc == want_rc);
    return json::parse(out);
  }
};

// A master and two nodes; node "a" is DRAM, node "b" DRAM or hybrid.
struct TwoNodes {
  std::string dir = TempDir("oncall");
  MasterProcess master;
  StorageProcess a, b;
  Ctl ctl;

  explicit TwoNodes(bool hybrid_b = false) {
    // A short node timeout: a killed node is dead within seconds.
    auto m = MasterProcess::Start(
        dir + "/master", "127.0.0.1:0",
        {"--node_timeout_ms=3000", "--heartbeat_interval_ms=200"});
    REQUIRE(m.ok());
    master = std::move(*m);
    ctl.master = master.address;
    auto na = StorageProcess::Start(master.address, "a", {"--dram_bytes=64M"});
    REQUIRE(na.ok());
    a = std::move(*na);
    std::vector<std::string> fb = {"--dram_bytes=64M"};
    if (hybrid_b) {
      fb = {"--device=hybrid", "--capacity_path=" + dir + "/capacity.dat",
            "--capacity_bytes=64M", "--staging_bytes=8M",
            "--write_buffer_bytes=4M", "--io_queue_depth=16"};
    }
    auto nb = StorageProcess::Start(master.address, "b", fb);
    REQUIRE(nb.ok());
    b = std::move(*nb);
    json st;
    for (int i = 0; i < 400; ++i) {
      st = ctl.Json({"status"});
      int alive = 0;
      for (const auto& n : st["nodes"]) alive += n["alive"] == true ? 1 : 0;
      if (alive == 2) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL("nodes never became alive: " << st.dump());
  }
  uint32_t Id(const std::string& name) const {
    const json st = ctl.Json({"status"});
    for (const auto& n : st["nodes"]) {
      if (n["name"] == name) return n["node_id"].get<uint32_t>();
    }
    FAIL("no node " << name);
    return 0;
  }
  std::string File(const std::string& name, size_t size, char fill) const {
    const std::string f = dir + "/" + name;
    std::ofstream(f, std::ios::binary) << std::string(size, fill);
    return f;
  }
  // Puts `key` (8 KiB of `fill`); returns the node it landed on.
  uint32_t Put(const std::string& key, char fill = 'x') const {
    json j = ctl.Json({"put", key, File("in-" + key, 8192, fill)});
    CHECK(j["result"] == "stored");
    return j["node_id"].get<uint32_t>();
  }
  std::string Get(const std::string& key) const {
    const std::string f = dir + "/out-" + key;
    std::string out;
    if (ctl.Run({"get", key, f}, &out) != 0) return "error: " + out;
    std::ifstream in(f, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)),
                       std::istreambuf_iterator<char>());
  }
};

json NodeOf(const json& status, uint32_t id) {
  for (const auto& n : status["nodes"]) {
    if (n["node_id"] == id) return n;
  }
  return json();
}

void CheckFits80(const std::string& text) {
  for (const auto& line : absl::StrSplit(text, '\n')) {
    INFO(std::string(line));
    CHECK(line.size() <= 80);
  }
}

TEST_CASE("drain: no new puts land on the node, reads go on; undrain restores placement") {
  TwoNodes c;
  const uint32_t x = c.Put("before");
  const uint32_t y = x == c.Id("a") ? c.Id("b") : c.Id("a");
  const std::string x_name = x == c.Id("a") ? "a" : "b";

  json d = c.ctl.Json({"drain", x_name});
  CHECK(d["node_id"] == x);
  CHECK(d["draining"] == true);
  CHECK(d["changed"] == true);
  CHECK(d["objects"] == 1);
  // By id as well; already so.
  CHECK(c.ctl.Json({"drain", std::to_string(x)})["changed"] == false);

  json st = c.ctl.Json({"status"});
  CHECK(NodeOf(st, x)["state"] == "DRAINING");
  CHECK(NodeOf(st, x)["draining"] == true);
  CHECK(NodeOf(st, x)["alive"] == true);
  CHECK(NodeOf(st, y)["state"] == "alive");
  std::string out;
  REQUIRE(c.ctl.Run({"status"}, &out) == 0);
  CHECK(out.find("DRAINING") != std::string::npos);
  CheckFits80(out);

  // Every new put goes to the other node (round robin would alternate).
  for (int i = 0; i < 6; ++i) {
    CHECK(c.Put("during" + std::to_string(i)) == y);
  }
  // The drained node's key is still served, byte for byte.
  CHECK(c.Get("before") == std::string(8192, 'x'));
  json look = c.ctl.Json({"lookup", "before"});
  CHECK(look["results"][0]["found"] == true);
  CHECK(look["results"][0]["node_id"] == x);
  CHECK(look["results"][0]["key_encoding"] == "text");
  json in = c.ctl.Json({"inspect", "before"});
  CHECK(in["node"]["state"] == "DRAINING");

  // --wait reports what remains at the timeout.
  hymctl::Options wait;
  wait.wait = true;
  wait.timeout_seconds = 0.5;
  json w = c.ctl.Json({"drain", x_name}, 1, wait);
  CHECK(w["drained"] == false);
  CHECK(w["objects"] == 1);

  // Undrain: placements alternate again.
  json u = c.ctl.Json({"undrain", x_name});
  CHECK(u["draining"] == false);
  CHECK(u["changed"] == true);
  CHECK(NodeOf(c.ctl.Json({"status"}), x)["state"] == "alive");
  std::vector<std::string> on_x = {"before"};
  for (int i = 0; i < 6; ++i) {
    const std::string k = "after" + std::to_string(i);
    if (c.Put(k) == x) on_x.push_back(k);
  }
  CHECK(on_x.size() >= 3);

  // Drained and emptied: --wait returns as soon as the node holds nothing.
  c.ctl.Json({"drain", x_name});
  std::vector<std::string> rm = {"rm"};
  rm.insert(rm.end(), on_x.begin(), on_x.end());
  c.ctl.Json(rm);
  wait.timeout_seconds = 10;
  const absl::Time start = absl::Now();
  json done = c.ctl.Json({"drain", x_name}, 0, wait);
  CHECK(done["drained"] == true);
  CHECK(done["objects"] == 0);
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(c.Put("last") == y);

  // Usage and unknown nodes.
  CHECK(c.ctl.Run({"drain"}, &out) == 2);
  CHECK(c.ctl.Run({"undrain", "nope"}, &out) == 1);
  CHECK(out.find("no node named 'nope'") != std::string::npos);
}

TEST_CASE("forget: a dead node's keys are gone from lookups and listings") {
  TwoNodes c;
  const uint32_t a = c.Id("a");
  const uint32_t b = c.Id("b");
  // Everything on a: b drained meanwhile.
  c.ctl.Json({"drain", "b"});
  for (const char* k : {"k1", "k2", "k3"}) CHECK(c.Put(k) == a);
  c.ctl.Json({"undrain", "b"});

  // An alive node is not forgotten.
  std::string out;
  CHECK(c.ctl.Run({"forget", "a"}, &out) == 1);
  CHECK(out.find("FAILED_PRECONDITION") != std::string::npos);

  REQUIRE(c.a.daemon.Stop(SIGKILL).ok());
  json st;
  for (int i = 0; i < 200; ++i) {
    st = c.ctl.Json({"status"});
    if (NodeOf(st, a)["state"] == "DEAD") break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  REQUIRE(NodeOf(st, a)["state"] == "DEAD");
  // Dead: lookups miss, but the master still lists the keys on it.
  CHECK(c.ctl.Json({"lookup", "k1"})["results"][0]["found"] == false);
  json in = c.ctl.Json({"inspect", "k1"});
  CHECK(in["found"] == true);
  CHECK(in["node"]["alive"] == false);
  CHECK(in["node"]["state"] == "DEAD");
  CHECK(st["objects"] == 3);

  json f = c.ctl.Json({"forget", std::to_string(a)});
  CHECK(f["node_id"] == a);
  CHECK(f["name"] == "a");
  CHECK(f["objects_removed"] == 3);

  st = c.ctl.Json({"status"});
  CHECK(st["nodes"].size() == 1);
  CHECK(st["objects"] == 0);
  for (const char* k : {"k1", "k2", "k3"}) {
    INFO(k);
    json gone = c.ctl.Json({"inspect", k}, 1);
    CHECK(gone["found"] == false);
    CHECK(c.ctl.Json({"lookup", k})["results"][0]["found"] == false);
  }
  // The keys can be stored again, on the node that is left.
  CHECK(c.Put("k1", 'y') == b);
  CHECK(c.Get("k1") == std::string(8192, 'y'));
  // The alias of old.
  CHECK(c.ctl.Run({"node", "forget", "a"}, &out) == 1);
  CHECK(out.find("no node named 'a'") != std::string::npos);
}

TEST_CASE("inspect, top, version and help") {
  TwoNodes c(/*hybrid_b=*/true);
  const uint32_t b = c.Id("b");
  // A binary key, given in hex.
  hymctl::Options hex;
  hex.hex_keys = true;
  json p = c.ctl.Json({"put", "00ff41", c.File("bin", 4096, 'q')}, 0, hex);
  CHECK(p["key"] == "00ff41");
  CHECK(p["key_encoding"] == "hex");
  json in = c.ctl.Json({"inspect", "00ff41"}, 0, hex);
  CHECK(in["found"] == true);
  CHECK(in["key"] == "00ff41");
  CHECK(in["key_encoding"] == "hex");
  CHECK(in["tenant"] == "default");
  CHECK(in["location"]["length"] == 4096);
  CHECK(in["location"]["generation"].get<uint64_t>() > 0);
  CHECK(in["node"]["state"] == "alive");
  CHECK(in["last_read_unix_ms"] == 0);
  CHECK(in["leased"] == false);
  CHECK(in["chain"]["children"] == 0);
  CHECK(in["chain"]["unreachable"] == false);
  CHECK_FALSE(in["chain"].contains("parent_key"));
  CHECK(in["put_in_progress"] == false);
  // A read (get) is recent use and leases the key.
  const int64_t before_read = absl::ToUnixMillis(absl::Now());
  std::string out;
  hex.json = false;
  REQUIRE(c.ctl.Run({"get", "00ff41", c.dir + "/bin.out"}, &out, hex) == 0);
  in = c.ctl.Json({"inspect", "00ff41"}, 0, hex);
  CHECK(in["last_read_unix_ms"].get<int64_t>() >= before_read - 1000);
  CHECK(in["leased"] == true);
  REQUIRE(c.ctl.Run({"inspect", "00ff41"}, &out, hex) == 0);
  CHECK(out.find("leased") != std::string::npos);
  CHECK(c.ctl.Json({"inspect", "absent"}, 1)["found"] == false);
  CHECK(c.ctl.Run({"inspect"}, &out) == 2);

  // top: reads on the hybrid node while it samples.
  c.ctl.Json({"drain", "a"});
  for (int i = 0; i < 4; ++i) CHECK(c.Put("hot" + std::to_string(i)) == b);
  c.ctl.Json({"undrain", "a"});
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, bad_reads{0};
  std::thread reader([&] {  // no Catch2 assertions off the test's thread
    int i = 0;
    while (!stop.load()) {
      const std::string k = "hot" + std::to_string(i++ % 4);
      if (c.Get(k) != std::string(8192, 'x')) ++bad_reads;
      ++reads;
    }
  });
  hymctl::Options top;
  top.iterations = 1;
  top.interval_seconds = 0.5;
  json t = c.ctl.Json({"top"}, 0, top);
  stop = true;
  reader.join();
  CHECK(reads.load() > 0);
  CHECK(bad_reads.load() == 0);
  CHECK(t["interval_seconds"].get<double>() >= 0.5);
  REQUIRE(t["nodes"].size() == 2);
  for (const auto& n : t["nodes"]) {
    INFO(n.dump());
    CHECK(n["state"] == "alive");
    CHECK(n["reads_per_s"].is_number());
    if (n["node_id"] == b) {
      CHECK(n["reads_per_s"].get<double>() > 0);
      CHECK(n["read_bytes_per_s"].get<double>() >= 8192);
      CHECK(n["hit_ratio"].is_number());
      CHECK(n["staging_occupancy"].is_number());
      CHECK(n["flush_bytes_per_s"].is_number());
      CHECK(n["objects"].get<uint64_t>() >= 4);
    } else {
      CHECK(n["hit_ratio"].is_null());  // DRAM
    }
  }
  top.iterations = 2;
  top.interval_seconds = 0.1;
  REQUIRE(c.ctl.Run({"top"}, &out, top) == 0);
  CHECK(out.find("RD/s") != std::string::npos);
  CheckFits80(out);
  top.interval_seconds = 0;
  CHECK(c.ctl.Run({"top"}, &out, top) == 2);

  // status: narrow fits 80 columns; wide has the addresses.
  REQUIRE(c.ctl.Run({"status"}, &out) == 0);
  CheckFits80(out);
  CHECK(out.find(c.b.data_address) == std::string::npos);
  hymctl::Options wide;
  wide.wide = true;
  REQUIRE(c.ctl.Run({"status"}, &out, wide) == 0);
  CHECK(out.find(c.b.data_address) != std::string::npos);
  CHECK(out.find(c.b.control_address) != std::string::npos);

  // version and help.
  hymctl::Options v;
  v.version = "1.2.3-test";
  CHECK(c.ctl.Json({"version"}, 0, v)["hymctl"] == "1.2.3-test");
  REQUIRE(c.ctl.Run({"help"}, &out) == 0);
  for (const char* cmd :
       {"status", "stats", "top", "version", "drain", "undrain", "forget",
        "inspect", "fsck", "put", "get", "lookup", "rm", "tenant", "token",
        "help"}) {
    INFO(cmd);
    CHECK(out.find(std::string("\n  ") + cmd + " ") != std::string::npos);
  }
  CheckFits80(out);

  // The binary: HYMCACHE_MASTER is the default master, --master wins;
  // --help lists the commands first.
  const std::string bin = testing::RunfilePath("tools/hymctl/hymctl");
  auto env = testing::Daemon::Start(
      "/usr/bin/env", {"HYMCACHE_MASTER=" + c.master.address, bin, "status"});
  REQUIRE(env.ok());
  CHECK(env->ready_line().rfind("NODE  NAME", 0) == 0);
  auto flag_wins = testing::Daemon::Start(
      "/usr/bin/env", {"HYMCACHE_MASTER=127.0.0.1:1", bin,
                       "--master=" + c.master.address, "status"});
  REQUIRE(flag_wins.ok());
  CHECK(flag_wins->ready_line().rfind("NODE  NAME", 0) == 0);
  auto unreachable = testing::Daemon::Start(
      "/usr/bin/env",
      {"HYMCACHE_MASTER=127.0.0.1:1", bin, "--timeout=1", "status"});
  CHECK(unreachable.status().code() == absl::StatusCode::kUnavailable);
  auto help = testing::Run(bin, {"--help"});
  REQUIRE(help.ok());
  CHECK(help->output.find("usage: hymctl") != std::string::npos);
  CHECK(help->output.find("drain NODE") != std::string::npos);
  CHECK(help->output.find("--iterations") != std::string::npos);
}

}  // namespace
}  // namespace hymcache
