#include "tools/crashtest/crashtest_impl.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/thread.h"
#include "tools/crashtest/block_data.h"

namespace hymcache::crashtest {

// ---------------------------------------------------------------------------
// Faults

absl::Status CrashTest::Impl::RestartDaemon(size_t i, const char* why) {
  const absl::Time t0 = absl::Now();
  absl::Status s = cluster_->Restart(i);
  if (!s.ok()) {
    Log(absl::StrCat("RESTART FAILED: ", cluster_->name(i), " (", why,
                     "): ", s.ToString()));
    return absl::InternalError(absl::StrCat(
        "could not restart ", cluster_->name(i), ": ", s.message()));
  }
  ready_at_[i] = absl::Now();
  expected_up_[i] = true;
  Log(absl::StrCat("restarted ", cluster_->name(i), " (", why, ") in ",
                   absl::FormatDuration(absl::Now() - t0)));
  return absl::OkStatus();
}

absl::Status CrashTest::Impl::WatchFor(absl::Duration d) {
  const absl::Time until = absl::Now() + d;
  while (true) {
    for (size_t i = 0; i < cluster_->size(); ++i) {
      if (!expected_up_[i]) continue;
      std::string how;
      if (cluster_->Alive(i, &how)) continue;
      // Exited by itself: a crash (a sanitizer report, an abort). It lost
      // its state like a killed daemon.
      kill_counts_[i].fetch_add(1);
      {
        MutexLock l(&mu_);
        ++report_.daemon_crashes;
        report_.failures.push_back(
            absl::StrCat(cluster_->name(i), " exited by itself (", how,
                         "), see ", cluster_->log_path(i)));
      }
      Log(absl::StrCat("DAEMON CRASH: ", cluster_->name(i), " exited (", how,
                       "); log ", cluster_->log_path(i)));
      expected_up_[i] = false;
      RETURN_IF_ERROR(RestartDaemon(i, "after a crash"));
    }
    const absl::Time now = absl::Now();
    if (now >= until) return absl::OkStatus();
    absl::SleepFor(std::min(until - now, absl::Milliseconds(50)));
  }
}

absl::Status CrashTest::Impl::KillLoop() {
  auto uniform = [this](absl::Duration lo, absl::Duration hi) {
    const int64_t a = absl::ToInt64Microseconds(lo);
    const int64_t b = absl::ToInt64Microseconds(hi);
    return absl::Microseconds(
        std::uniform_int_distribution<int64_t>(a, b)(kill_rng_));
  };
  for (int k = 1; k <= options_.kills; ++k) {
    RETURN_IF_ERROR(
        WatchFor(uniform(options_.min_kill_gap, options_.max_kill_gap)));
    const size_t victim = std::uniform_int_distribution<size_t>(
        0, cluster_->size() - 1)(kill_rng_);
    const absl::Duration down =
        uniform(absl::ZeroDuration(), options_.max_down_time);
    if (options_.audit_reads >= 0) Audit();
    kill_counts_[victim].fetch_add(1);
    expected_up_[victim] = false;
    absl::Status s = cluster_->Kill(victim);
    if (!s.ok()) {
      // It had exited by itself just now: WatchFor's report, late.
      Log(absl::StrCat("kill of ", cluster_->name(victim), ": ", s.ToString()));
    }
    {
      MutexLock l(&mu_);
      ++report_.kills;
      ++report_.kills_by_daemon[cluster_->name(victim)];
    }
    CrashTestReport so_far;
    {
      MutexLock l(&mu_);
      so_far = report_;
    }
    Log(absl::StrCat(
        "kill ", k, "/", options_.kills, ": SIGKILL ", cluster_->name(victim),
        ", down for ", absl::FormatDuration(down), " (loads=", so_far.loads,
        " stores=", so_far.stores, " verified=", so_far.blocks_verified,
        " wrong=", so_far.wrong_blocks, ")"));
    RETURN_IF_ERROR(WatchFor(down));
    RETURN_IF_ERROR(RestartDaemon(victim, "after a kill"));
  }
  return absl::OkStatus();
}

}  // namespace hymcache::crashtest
