#include "common/systemd.h"

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "catch2/catch.hpp"
#include "common/test_notify_socket.h"

namespace hymcache {
namespace {

using testing::NotifySocket;

// The protocol's environment, as systemd sets it for the service (a test
// may set it; the library never reads it itself, libsystemd does).
struct SystemdEnv {
  SystemdEnv(const std::string& socket, const std::string& watchdog_usec) {
    setenv("NOTIFY_SOCKET", socket.c_str(), 1);
    if (watchdog_usec.empty()) {
      unsetenv("WATCHDOG_USEC");
    } else {
      setenv("WATCHDOG_USEC", watchdog_usec.c_str(), 1);
      setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
    }
  }
  ~SystemdEnv() {
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
  }
};

TEST_CASE("without NOTIFY_SOCKET the notifier does nothing") {
  unsetenv("NOTIFY_SOCKET");
  auto n = SystemdNotifier::Create({});
  CHECK(!n->enabled());
  CHECK(n->watchdog_period() == absl::ZeroDuration());
  n->Ready("x");
  n->Stopping("y");
}

TEST_CASE("READY=1, STATUS= and STOPPING=1 reach the socket") {
  NotifySocket sock;
  REQUIRE(sock.ok());
  SystemdEnv env(sock.name(), "");
  auto n = SystemdNotifier::Create({});
  CHECK(n->enabled());
  CHECK(n->watchdog_period() == absl::ZeroDuration());
  CHECK(sock.Next(absl::Seconds(5)) == "STATUS=starting");
  n->Ready("serving on 127.0.0.1:1\nsecond line");
  CHECK(sock.Next(absl::Seconds(5)) ==
        "READY=1\nSTATUS=serving on 127.0.0.1:1 second line");
  n->Status("busy");
  CHECK(sock.Next(absl::Seconds(5)) == "STATUS=busy");
  n->Stopping("bye");
  CHECK(sock.Next(absl::Seconds(5)) == "STOPPING=1\nSTATUS=bye");
}

TEST_CASE("watchdog pings at half of WATCHDOG_USEC, only while alive") {
  NotifySocket sock;
  REQUIRE(sock.ok());
  SystemdEnv env(sock.name(), "100000");  // 100 ms
  std::atomic<int> calls{0};
  std::atomic<int64_t> timeout_ms{-1};
  auto n = SystemdNotifier::Create(
      {.alive = [&](absl::Duration timeout) {
        timeout_ms = absl::ToInt64Milliseconds(timeout);
        // Wedged for the first three checks, then answering.
        return ++calls <= 3 ? absl::DeadlineExceededError("wedged")
                            : absl::OkStatus();
      }});
  CHECK(n->watchdog_period() == absl::Milliseconds(50));
  CHECK(sock.Next(absl::Seconds(5)) == "STATUS=starting");
  CHECK(sock.WaitFor("WATCHDOG=1", absl::Seconds(10)));
  // No ping went out for the failed checks.
  CHECK(calls.load() >= 4);
  CHECK(timeout_ms.load() == 25);
  CHECK(sock.WaitFor("WATCHDOG=1", absl::Seconds(10)));
  n->Stopping("bye");
  CHECK(sock.WaitFor("STOPPING=1", absl::Seconds(5)));
  n.reset();  // joins the watchdog thread
}

TEST_CASE("a WATCHDOG_PID of another process means no pings") {
  NotifySocket sock;
  REQUIRE(sock.ok());
  SystemdEnv env(sock.name(), "100000");
  setenv("WATCHDOG_PID", "1", 1);
  auto n = SystemdNotifier::Create({});
  CHECK(n->enabled());
  CHECK(n->watchdog_period() == absl::ZeroDuration());
}

}  // namespace
}  // namespace hymcache
