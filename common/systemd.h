// SystemdNotifier: systemd's service notification protocol (sd_notify(3))
// for a daemon run as a Type=notify unit with a watchdog:
//
//   auto notifier = SystemdNotifier::Create({.alive = ...});  // early in main
//   ... start serving ...
//   notifier->Ready("serving on 10.0.0.5:50051");   // READY=1 + STATUS=
//   ... SIGTERM ...
//   notifier->Stopping("shutting down");              // STOPPING=1 + STATUS=
//
// With WatchdogSec= set, systemd passes WATCHDOG_USEC; a "sd-watchdog"
// thread then sends WATCHDOG=1 every half of it, but only while `alive`
// says the daemon still answers (the daemons probe their own gRPC server),
// so a wedged daemon is restarted. Not under systemd (no NOTIFY_SOCKET)
// every call does nothing. libsystemd reads NOTIFY_SOCKET, WATCHDOG_USEC
// and WATCHDOG_PID itself: that is systemd's protocol, not configuration.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/thread.h"

namespace hymcache {

struct SystemdNotifierOptions {
  // Asked before each watchdog ping, with a deadline of a quarter of the
  // watchdog interval; a non-OK answer skips the ping (and is logged).
  // Called on the "sd-watchdog" thread. Default: null, always alive.
  std::function<absl::Status(absl::Duration timeout)> alive;
};

class SystemdNotifier {
 public:
  // Never fails: without systemd the notifier does nothing. Starts the
  // watchdog thread when systemd asks for pings.
  static std::unique_ptr<SystemdNotifier> Create(
      SystemdNotifierOptions options);
  // Stops the watchdog thread.
  ~SystemdNotifier();
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;

  // Whether a notification socket is set (the daemon runs under systemd).
  bool enabled() const { return enabled_; }
  // Half of WatchdogSec (the ping period), or zero without a watchdog.
  absl::Duration watchdog_period() const { return period_; }

  // READY=1 with STATUS=`status`: start-up is complete.
  void Ready(const std::string& status);
  // STOPPING=1 with STATUS=`status`: shutting down. Stops the pings too
  // (systemd's stop timeout applies from here).
  void Stopping(const std::string& status);
  // STATUS=`status`: a line `systemctl status` shows.
  void Status(const std::string& status);

 private:
  SystemdNotifier() = default;
  void Send(const std::string& state);
  void WatchdogLoop();

  // Constant after Create.
  SystemdNotifierOptions options_;
  bool enabled_ = false;
  absl::Duration period_ = absl::ZeroDuration();
  Thread watchdog_;

  Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hymcache
