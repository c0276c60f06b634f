// Hostile clients: malformed and malicious input thrown at every port of the
// real daemons (the master's gRPC port, the storage node's control gRPC port,
// its TCP data port and its same-host shared-memory socket), each kind a named
// case in a table. After every case the daemons must still be running and
// answer a correct request (a Put and a Get through the client SDK, compared
// byte for byte, plus a block stored before the first case); at the end their
// memory (VmRSS) and descriptors must not have grown beyond a generous bound.
// A one-line summary per port is printed: kinds thrown, kinds answered with an
// error, connections closed by the server.
//
// The harness and the case tables: tests/hostile_client.h and its .cc files.
#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/hostile_client.h"

namespace hymcache {
namespace hostile {
namespace {

// ---------------------------------------------------------------- runs

struct Baseline {
  int64_t master_rss, node_rss;
  int master_fds, node_fds;
};

Baseline Measure(Cluster& c) {
  return {RssBytes(c.master.daemon.pid()), RssBytes(c.node.daemon.pid()),
          OpenFds(c.master.daemon.pid()), OpenFds(c.node.daemon.pid())};
}

void RequireBounded(Cluster& c, const Baseline& before) {
  c.RequireFdsSettle(c.master.daemon.pid(), before.master_fds, "master");
  c.RequireFdsSettle(c.node.daemon.pid(), before.node_fds, "node");
  Baseline after = Measure(c);
  std::printf("hostile-client rss master %.1f -> %.1f MiB, node %.1f -> %.1f MiB\n",
              before.master_rss / 1048576.0, after.master_rss / 1048576.0,
              before.node_rss / 1048576.0, after.node_rss / 1048576.0);
  if (kCheckRss) {
    CHECK(after.master_rss - before.master_rss < kRssBoundBytes);
    CHECK(after.node_rss - before.node_rss < kRssBoundBytes);
  }
}

// Both daemons stop on SIGTERM and exit 0 (under ASan: no leak either).
void RequireCleanExit(Cluster& c) {
  for (testing::Daemon* d : {&c.node.daemon, &c.master.daemon}) {
    absl::StatusOr<int> st = d->Stop(SIGTERM);
    REQUIRE(st.ok());
    CHECK(WIFEXITED(*st));
    CHECK(WEXITSTATUS(*st) == 0);
  }
}

// Warm-up: correct requests, and the HTTP/2 floods on both gRPC ports once.
// gRPC's buffers and the allocator's per-thread arenas grow to a working
// size on the first floods (the master's RSS rose by ~20 MiB, then stayed
// level over six more rounds of each): that is not growth to measure.
void WarmUp(Cluster& c) {
  for (int i = 0; i < 5; ++i) c.Healthy();
  c.Healthy(/*shm=*/true);
  for (const std::string& addr : {c.master.address, c.node.control_address}) {
    std::vector<Case> cases;
    AddGrpcPortCases(&cases, addr, "hymcache.v1.MasterService", {"ListNodes"},
                     c.HealthyFn());
    for (const Case& k : cases) {
      if (k.name == "h2_ping_flood" || k.name == "h2_rapid_reset") k.run();
    }
  }
}

TEST_CASE("hostile clients on every port of a DRAM node's cluster") {
  signal(SIGPIPE, SIG_IGN);
  Cluster c(/*hybrid_node=*/false);
  WarmUp(c);
  const Baseline before = Measure(c);
  const absl::Time start = absl::Now();

  std::vector<Case> master_cases;
  AddGrpcPortCases(&master_cases, c.master.address, "hymcache.v1.MasterService",
                   kMasterMethods, c.HealthyFn());
  for (Case& k : MasterSemanticCases(c)) master_cases.push_back(std::move(k));
  {
    FakeReconcile fake(c);
    for (Case& k : ReconcileCases(c, fake)) master_cases.push_back(std::move(k));
    c.Run("master-grpc", master_cases);
  }

  std::vector<Case> control_cases;
  AddGrpcPortCases(&control_cases, c.node.control_address, "hymcache.v1.StorageControl",
                   kControlMethods, c.HealthyFn());
  for (Case& k : ControlCases(c)) control_cases.push_back(std::move(k));
  c.Run("node-control-grpc", control_cases);

  c.Run("node-data-tcp", DataCases(c));
  std::vector<Case> shm = ShmCases(c);
  REQUIRE(!shm.empty());
  c.Run("node-shm-socket", shm, /*shm_check=*/true);

  RequireBounded(c, before);
  std::printf("hostile-client dram run took %s\n",
              absl::FormatDuration(absl::Now() - start).c_str());
  RequireCleanExit(c);
}

TEST_CASE("hostile clients on a hybrid node's data plane and sockets") {
  signal(SIGPIPE, SIG_IGN);
  Cluster c(/*hybrid_node=*/true);
  WarmUp(c);
  const Baseline before = Measure(c);
  c.Run("hybrid-data-tcp", DataCases(c));
  std::vector<Case> shm = ShmCases(c);
  REQUIRE(!shm.empty());
  c.Run("hybrid-shm-socket", shm, /*shm_check=*/true);
  c.Run("hybrid-control-grpc", ControlCases(c));
  RequireBounded(c, before);
  RequireCleanExit(c);
}

}  // namespace
}  // namespace hostile
}  // namespace hymcache
