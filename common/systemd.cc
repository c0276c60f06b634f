#include "common/systemd.h"

#include <systemd/sd-daemon.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "glog/logging.h"

namespace hymcache {
namespace {

// STATUS= is one line.
std::string OneLine(const std::string& s) {
  return absl::StrReplaceAll(s, {{"\n", " "}});
}

}  // namespace

std::unique_ptr<SystemdNotifier> SystemdNotifier::Create(
    SystemdNotifierOptions options) {
  std::unique_ptr<SystemdNotifier> n(new SystemdNotifier);
  n->options_ = std::move(options);
  // sd_booted() says nothing about us; the notify socket does: sd_notify
  // returns 0 without one.
  n->enabled_ = sd_notify(0, "STATUS=starting") > 0;
  uint64_t usec = 0;
  if (n->enabled_ && sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
    n->period_ = absl::Microseconds(static_cast<int64_t>(usec)) / 2;
    SystemdNotifier* raw = n.get();
    n->watchdog_ = Thread("sd-watchdog", [raw] { raw->WatchdogLoop(); });
    LOG(INFO) << "systemd watchdog: a ping every "
              << absl::FormatDuration(n->period_);
  }
  return n;
}

SystemdNotifier::~SystemdNotifier() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  watchdog_.Join();
}

void SystemdNotifier::Send(const std::string& state) {
  if (!enabled_) return;
  const int r = sd_notify(0, state.c_str());
  if (r < 0) {
    LOG_EVERY_N(WARNING, 100) << "sd_notify: " << std::strerror(-r);
  }
}

void SystemdNotifier::Ready(const std::string& status) {
  Send(absl::StrCat("READY=1\nSTATUS=", OneLine(status)));
}

void SystemdNotifier::Stopping(const std::string& status) {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  Send(absl::StrCat("STOPPING=1\nSTATUS=", OneLine(status)));
}

void SystemdNotifier::Status(const std::string& status) {
  Send(absl::StrCat("STATUS=", OneLine(status)));
}

void SystemdNotifier::WatchdogLoop() {
  while (true) {
    absl::Status alive = options_.alive ? options_.alive(period_ / 2)
                                        : absl::OkStatus();
    if (alive.ok()) {
      Send("WATCHDOG=1");
    } else {
      LOG_EVERY_N(WARNING, 10)
          << "systemd watchdog: not pinging, the daemon does not answer: "
          << alive;
    }
    MutexLock l(&mu_);
    const absl::Time next = absl::Now() + period_;
    while (!stopping_ && absl::Now() < next) {
      cv_.WaitWithDeadline(&mu_, next);
    }
    if (stopping_) return;
  }
}

}  // namespace hymcache
