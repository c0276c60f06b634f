#include "common/daemon.h"

#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "catch2/catch.hpp"
#include "common/grpc_polling.h"
#include "common/stats.h"
#include "common/systemd.h"
#include "common/test_log_capture.h"
#include "common/test_notify_socket.h"

namespace hymcache {
namespace {

using testing::LogCapture;
using testing::NotifySocket;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name + "." +
         std::to_string(getpid());
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

// Whether `security` admits `token` as an admin.
bool Admits(const ServerSecurity& security, const std::string& token) {
  return security.authenticator()
      ->CheckCredentials("Bearer " + token, {}, Role::kAdmin, "Test")
      .ok();
}

TEST_CASE("DaemonOptions: a non-loopback listen host needs identities or "
          "insecure, and so does metrics_listen") {
  DaemonOptions o;
  CHECK(o.Validate("master", "127.0.0.1").ok());
  absl::Status open = o.Validate("master", "0.0.0.0");
  CHECK(absl::IsInvalidArgument(open));
  CHECK(absl::StartsWith(open.message(), "master"));
  o.insecure = true;
  CHECK(o.Validate("master", "0.0.0.0").ok());

  DaemonOptions m;
  m.metrics_listen = "0.0.0.0:0";
  absl::Status metrics = m.Validate("storage node", "127.0.0.1");
  CHECK(absl::IsInvalidArgument(metrics));
  CHECK(absl::StrContains(metrics.message(), "storage node: metrics_listen"));
  m.auth_tokens_file = "/some/file";
  CHECK(m.Validate("storage node", "127.0.0.1").ok());
  m.metrics_listen = "no-port";
  CHECK(absl::IsInvalidArgument(m.Validate("storage node", "127.0.0.1")));

  DaemonOptions tls;
  tls.tls.cert_file = "cert.pem";  // without a key
  absl::Status bad_tls = tls.Validate("master", "127.0.0.1");
  CHECK(absl::IsInvalidArgument(bad_tls));
  CHECK(absl::StartsWith(bad_tls.message(), "master: "));
}

TEST_CASE("VisitBuildInfo exports build_info only for a build that says "
          "its version") {
  DaemonOptions o;
  auto build_info = [](const FlatStatsVisitor& v) {
    std::vector<std::pair<std::string, double>> out;
    for (const auto& [name, value] : v.values()) {
      if (absl::StartsWith(name, "build_info")) out.emplace_back(name, value);
    }
    return out;
  };
  FlatStatsVisitor none;
  VisitBuildInfo(o, &none);
  CHECK(build_info(none).empty());
  o.build_version = "1.2.3";
  o.build_commit = "abc";
  FlatStatsVisitor v;
  VisitBuildInfo(o, &v);
  REQUIRE(build_info(v).size() == 1);
  CHECK(build_info(v)[0].first ==
        "build_info{version=\"1.2.3\",commit=\"abc\"}");
  CHECK(build_info(v)[0].second == 1);
}

TEST_CASE("VisitBuildInfo exports the poll strategy once gRPC runs") {
  grpc::CompletionQueue cq;  // gRPC runs from here on
  const std::string strategy = GrpcPollStrategyInUse();
  REQUIRE_FALSE(strategy.empty());
  FlatStatsVisitor v;
  VisitBuildInfo(DaemonOptions(), &v);
  REQUIRE(v.values().size() == 1);
  CHECK(v.values()[0].first ==
        absl::StrCat("grpc_poll_strategy{strategy=\"", strategy, "\"}"));
  CHECK(v.values()[0].second == 1);
}

TEST_CASE("ServerSecurity: a reload picks up a new tokens file; an invalid "
          "one keeps the old identities and is logged") {
  const std::string path = TempPath("daemon_tokens");
  Write(path, IdentityLine(Role::kAdmin, "-", "alice", "tok-old") + "\n");
  DaemonOptions o;
  o.auth_tokens_file = path;
  LogCapture log;
  auto security = ServerSecurity::Create(o, "testd", "127.0.0.1");
  REQUIRE(security.ok());
  CHECK((*security)->identities() == 1);
  CHECK(Admits(**security, "tok-old"));
  CHECK(log.Count("testd: 1 identities from " + path) == 1);

  Write(path, IdentityLine(Role::kAdmin, "-", "bob", "tok-new") + "\n" +
                  IdentityLine(Role::kAdmin, "-", "carol", "tok-2") + "\n");
  REQUIRE((*security)->Reload().ok());
  CHECK((*security)->identities() == 2);
  CHECK(Admits(**security, "tok-new"));
  CHECK(!Admits(**security, "tok-old"));
  CHECK(log.Count("testd: reloaded 2 identities") == 1);

  Write(path, "admin - dave not-a-credential\n");
  absl::Status bad = (*security)->Reload();
  CHECK(absl::IsInvalidArgument(bad));
  CHECK((*security)->identities() == 2);
  CHECK(Admits(**security, "tok-new"));
  CHECK(log.Count("testd: identities not reloaded (the old ones stay)") == 1);
  std::remove(path.c_str());
}

TEST_CASE("ServerSecurity logs the identities' warnings at start and after "
          "each reload") {
  const std::string path = TempPath("daemon_unbound");
  // A node identity without nodes= may act as any node: a warning.
  Write(path, IdentityLine(Role::kNode, "-", "node-a", "tok-node") + "\n");
  DaemonOptions o;
  o.auth_tokens_file = path;
  LogCapture log;
  auto security = ServerSecurity::Create(o, "testd", "127.0.0.1");
  REQUIRE(security.ok());
  CHECK(log.Count("not bound to node names") == 1);
  REQUIRE((*security)->ReloadIdentities().ok());
  CHECK(log.Count("not bound to node names") == 2);
  // Bound: the warning is gone after the next reload.
  Write(path, IdentityLine(Role::kNode, "-", "node-a", "tok-node",
                           {"node-a"}) +
                  "\n");
  REQUIRE((*security)->ReloadIdentities().ok());
  CHECK(log.Count("not bound to node names") == 2);
  std::remove(path.c_str());
}

TEST_CASE("ServerSecurity without identities or TLS reloads nothing and "
          "says protected mode on loopback, a warning elsewhere") {
  DaemonOptions o;
  LogCapture log;
  auto loopback = ServerSecurity::Create(o, "testd", "127.0.0.1");
  REQUIRE(loopback.ok());
  CHECK((*loopback)->authenticator() == nullptr);
  CHECK((*loopback)->credentials() != nullptr);
  CHECK((*loopback)->Reload().ok());
  CHECK(log.Count("testd: protected mode") == 1);
  auto open = ServerSecurity::Create(o, "testd", "0.0.0.0");
  REQUIRE(open.ok());
  CHECK(log.Count("testd: no identities and --insecure") == 1);
}

TEST_CASE("ServerSecurity does not start on TLS files that do not read") {
  DaemonOptions o;
  o.tls.cert_file = TempPath("daemon_missing_cert.pem");
  o.tls.key_file = TempPath("daemon_missing_key.pem");
  CHECK(!ServerSecurity::Create(o, "testd", "127.0.0.1").ok());
}

// Environment as systemd sets it for a Type=notify unit.
struct NotifyEnv {
  explicit NotifyEnv(const std::string& socket) {
    setenv("NOTIFY_SOCKET", socket.c_str(), 1);
    unsetenv("WATCHDOG_USEC");
  }
  ~NotifyEnv() { unsetenv("NOTIFY_SOCKET"); }
};

// Restores the calling thread's signal mask (DaemonSignals blocks for good).
struct SavedSignalMask {
  SavedSignalMask() { pthread_sigmask(SIG_BLOCK, nullptr, &mask); }
  ~SavedSignalMask() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  sigset_t mask;
};

// What a daemon's main() sets up, in a test: a systemd socket in
// NOTIFY_SOCKET and the stop and reload signals blocked (the mask restored
// after). Signals raised in this thread stay pending until WaitForStop
// takes them: the tests run single-threaded, without races or sleeps.
struct SignalRig {
  SignalRig() { REQUIRE(sock.ok()); }
  NotifySocket sock;
  NotifyEnv env{sock.name()};
  SavedSignalMask saved;
  DaemonSignals signals;
};

TEST_CASE(
    "DaemonSignals: SIGHUP reloads a new tokens file and tells "
    "systemd; a bad file keeps the old identities; SIGTERM stops") {
  SignalRig rig;
  auto notifier = SystemdNotifier::Create({});
  CHECK(rig.sock.Next(absl::Seconds(5)) == "STATUS=starting");

  const std::string path = TempPath("daemon_signal_tokens");
  Write(path, IdentityLine(Role::kAdmin, "-", "alice", "tok-old") + "\n");
  DaemonOptions o;
  o.auth_tokens_file = path;
  auto security = ServerSecurity::Create(o, "testd", "127.0.0.1");
  REQUIRE(security.ok());

  // A good file, then SIGTERM raised by the reload itself, once it ran.
  Write(path, IdentityLine(Role::kAdmin, "-", "bob", "tok-new") + "\n");
  REQUIRE(raise(SIGHUP) == 0);
  int sig = rig.signals.WaitForStop(notifier.get(), "serving on here", [&] {
    absl::Status s = (*security)->Reload();
    raise(SIGTERM);
    return s;
  });
  CHECK(sig == SIGTERM);
  CHECK(rig.signals.reloads() == 1);
  CHECK(Admits(**security, "tok-new"));
  CHECK(!Admits(**security, "tok-old"));
  CHECK(rig.sock.Next(absl::Seconds(5)) ==
        "STATUS=serving on here; identities reloaded");

  // A file that does not parse: the old identities stay; systemd says so.
  Write(path, "engine\n");
  REQUIRE(raise(SIGHUP) == 0);
  sig = rig.signals.WaitForStop(notifier.get(), "serving on here", [&] {
    absl::Status s = (*security)->Reload();
    raise(SIGINT);
    return s;
  });
  CHECK(sig == SIGINT);
  CHECK(rig.signals.reloads() == 2);
  CHECK(Admits(**security, "tok-new"));
  const std::string status = rig.sock.Next(absl::Seconds(5));
  CHECK(absl::StartsWith(
      status,
      "STATUS=reload failed (the old identities and certificates stay): "
      "INVALID_ARGUMENT"));
  std::remove(path.c_str());
}

// What ServeUntilStopped drives, counting the calls it gets in `calls`
// (which outlives it).
struct Calls {
  int reloads = 0;
  int shutdowns = 0;
  int destroyed = 0;
};
struct CountingServer {
  explicit CountingServer(Calls* c) : calls(c) {}
  ~CountingServer() { ++calls->destroyed; }
  absl::Status CheckAlive(absl::Duration) { return absl::OkStatus(); }
  absl::Status Reload() {
    ++calls->reloads;
    raise(SIGTERM);  // stop once the reload ran (pending until WaitForStop)
    return absl::OkStatus();
  }
  void Shutdown() {
    CHECK(calls->destroyed == 0);
    ++calls->shutdowns;
  }
  Calls* calls;
};

TEST_CASE(
    "ServeUntilStopped: READY=1 with the server's status, SIGHUP "
    "reloads, SIGTERM says STOPPING=1 and shuts the server down") {
  SignalRig rig;
  Calls calls;
  REQUIRE(raise(SIGHUP) == 0);
  const int code = ServeUntilStopped(
      rig.signals, "loading", "shutting down",
      [&]() -> absl::StatusOr<ServingDaemon> {
        return ServingDaemonOf(std::make_unique<CountingServer>(&calls),
                               "serving on here");
      });
  CHECK(code == 0);
  CHECK(rig.signals.reloads() == 1);
  CHECK(calls.reloads == 1);
  CHECK(calls.shutdowns == 1);
  CHECK(calls.destroyed == 1);  // the server goes with the ServingDaemon
  CHECK(rig.sock.Next(absl::Seconds(5)) == "STATUS=starting");
  CHECK(rig.sock.Next(absl::Seconds(5)) == "STATUS=loading");
  CHECK(rig.sock.Next(absl::Seconds(5)) == "READY=1\nSTATUS=serving on here");
  CHECK(rig.sock.Next(absl::Seconds(5)) ==
        "STATUS=serving on here; identities reloaded");
  CHECK(rig.sock.Next(absl::Seconds(5)) == "STOPPING=1\nSTATUS=shutting down");
}

TEST_CASE(
    "ServeUntilStopped: a server that cannot start exits 1 and says "
    "why in the unit's status") {
  SignalRig rig;
  const int code =
      ServeUntilStopped(rig.signals, "loading", "shutting down",
                        []() -> absl::StatusOr<ServingDaemon> {
                          return absl::UnavailableError("port taken");
                        });
  CHECK(code == 1);
  CHECK(rig.sock.Next(absl::Seconds(5)) == "STATUS=starting");
  CHECK(rig.sock.Next(absl::Seconds(5)) == "STATUS=loading");
  CHECK(rig.sock.Next(absl::Seconds(5)) == "STATUS=UNAVAILABLE: port taken");
}

}  // namespace
}  // namespace hymcache
