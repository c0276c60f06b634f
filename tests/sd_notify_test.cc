// The daemons speak systemd's notification protocol as a Type=notify unit
// with a watchdog expects: started with NOTIFY_SOCKET pointing at a socket
// of this test (as systemd starts them), they send READY=1 once serving,
// WATCHDOG=1 pings at half of WATCHDOG_USEC, and STOPPING=1 on SIGTERM.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "catch2/catch.hpp"
#include "common/test_notify_socket.h"
#include "tests/daemon.h"

namespace hymcache::testing {
namespace {

std::vector<std::string> SystemdEnv(const NotifySocket& sock) {
  return {"NOTIFY_SOCKET=" + sock.name(), "WATCHDOG_USEC=200000"};
}

bool ExitedZero(absl::StatusOr<int> status) {
  return status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
}

// READY=1 (with the serving status), pings, then STOPPING=1 after SIGTERM.
void CheckLifecycle(NotifySocket& sock, Daemon& d, const std::string& ready) {
  CHECK(sock.WaitFor("READY=1", absl::Seconds(20)));
  CHECK(absl::StrContains(sock.received().back(), ready));
  // Nothing said READY before start-up was done: the first status is
  // "starting".
  REQUIRE(!sock.received().empty());
  CHECK(sock.received().front() == "STATUS=starting");
  // 100 ms pings: three arrive well within the watchdog's patience.
  for (int i = 0; i < 3; ++i) {
    CHECK(sock.WaitFor("WATCHDOG=1", absl::Seconds(10)));
  }
  REQUIRE(kill(d.pid(), SIGTERM) == 0);
  CHECK(sock.WaitFor("STOPPING=1", absl::Seconds(20)));
  CHECK(ExitedZero(d.Stop(SIGTERM)));
}

TEST_CASE("master: READY=1, watchdog pings, STOPPING=1") {
  NotifySocket sock;
  REQUIRE(sock.ok());
  auto d = Daemon::Start(RunfilePath("master/hymcache-master"),
                         {"--db_path=" + TempDir("master"),
                          "--listen=127.0.0.1:0", "--logtostderr"},
                         absl::Seconds(30), SystemdEnv(sock));
  REQUIRE(d.ok());
  const std::string address =
      d->ready_line().substr(std::string("hymcache-master listening on ").size());
  CheckLifecycle(sock, *d, "STATUS=serving on " + address);
}

TEST_CASE("storage node: READY=1, watchdog pings, STOPPING=1") {
  auto m = MasterProcess::Start(TempDir("master"), "127.0.0.1:0");
  REQUIRE(m.ok());
  NotifySocket sock;
  REQUIRE(sock.ok());
  auto d = Daemon::Start(
      RunfilePath("storage_node/hymcache-storage"),
      {"--master=" + m->address, "--name=n1", "--data_port=0",
       "--control_port=0", "--dram_bytes=16M", "--rdma=off", "--logtostderr"},
      absl::Seconds(30), SystemdEnv(sock));
  REQUIRE(d.ok());
  CheckLifecycle(sock, *d,
                 "STATUS=serving data=" + Field(d->ready_line(), "data"));
  CHECK(ExitedZero(m->daemon.Stop(SIGTERM)));
}

}  // namespace
}  // namespace hymcache::testing
