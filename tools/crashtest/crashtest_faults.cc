#include "tools/crashtest/crashtest_impl.h"

#include <sys/wait.h>

#include <grpcpp/grpcpp.h>
#include <algorithm>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/leader_election.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/thread.h"
#include "proto/master.grpc.pb.h"
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
      const int st = cluster_->exit_status(i);
      if (cluster_->masters() > 1 && cluster_->is_master(i) && WIFEXITED(st) &&
          WEXITSTATUS(st) == 3) {
        // An HA master whose term ended exits 3 (master/master_ha.h); its
        // supervisor starts it again as a standby.
        {
          MutexLock l(&mu_);
          ++report_.terms_ended;
        }
        Log(absl::StrCat(cluster_->name(i), " ended its term (exit 3)"));
        expected_up_[i] = false;
        RETURN_IF_ERROR(RestartDaemon(i, "after its term ended"));
        continue;
      }
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
    const bool ha = cluster_->masters() > 1;
    size_t victim = 0;
    if (ha) {
      // The leader, with a standby past its copy, and a probe key committed
      // (held by that standby) right before the kill: the lookups after it
      // must find it. Fresh, so that no eviction (the nodes fill up under
      // the workload) can have taken it. Again if the leader changed
      // meanwhile (a term can end under load).
      const absl::Time give_up = absl::Now() + options_.standby_wait;
      while (true) {
        ASSIGN_OR_RETURN(victim, CaughtUpLeader());
        if (PutProbe(2 * k, {.deadline = absl::Now() + absl::Seconds(2)})) {
          absl::StatusOr<size_t> now = LeaderIndex();
          if (now.ok() && *now == victim) break;
        }
        if (absl::Now() >= give_up) {
          return absl::UnavailableError(absl::StrCat(
              "master HA: no probe put before kill ", k, " within ",
              absl::FormatDuration(options_.standby_wait)));
        }
        RETURN_IF_ERROR(WatchFor(absl::Milliseconds(100)));
      }
    } else {
      victim = std::uniform_int_distribution<size_t>(
          0, cluster_->size() - 1)(kill_rng_);
    }
    const absl::Duration down =
        uniform(absl::ZeroDuration(), options_.max_down_time);
    if (options_.audit_reads >= 0) Audit();
    kill_counts_[victim].fetch_add(1);
    expected_up_[victim] = false;
    const absl::Time killed = absl::Now();
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
    if (ha) RETURN_IF_ERROR(MeasureFailover(killed, k));
    RETURN_IF_ERROR(WatchFor(down));
    RETURN_IF_ERROR(RestartDaemon(victim, "after a kill"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Master HA: leader kills

absl::StatusOr<size_t> CrashTest::Impl::LeaderIndex() {
  const std::string key =
      MasterLeaderKey(testing::RestartableCluster::kHaCluster);
  const absl::Time deadline = absl::Now() + options_.standby_wait;
  std::string last;
  while (true) {
    auto l = ReadLeader(etcd_.get(), key);
    if (l.ok() && l->has_value()) {
      for (size_t i = 0; i < cluster_->masters(); ++i) {
        if (cluster_->address(i) == (*l)->candidate) return i;
      }
      last = absl::StrCat("the leader key names ", (*l)->candidate,
                          ", not one of ", cluster_->master_address());
    } else {
      last = l.ok() ? "no leader" : l.status().ToString();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("master HA: no leader found: ", last));
    }
    RETURN_IF_ERROR(WatchFor(absl::Milliseconds(50)));
  }
}

absl::StatusOr<size_t> CrashTest::Impl::CaughtUpLeader() {
  std::string token;
  if (!options_.token_file.empty()) {
    ASSIGN_OR_RETURN(token, ReadTokenFile(options_.token_file));
  }
  const absl::Time deadline = absl::Now() + options_.standby_wait;
  std::string last;
  while (true) {
    // Who leads may change while the test waits (a term can end under
    // load): ask etcd each time.
    ASSIGN_OR_RETURN(const size_t leader, LeaderIndex());
    auto stub = v1::MasterService::NewStub(grpc::CreateChannel(
        cluster_->address(leader), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::GetStatsRequest req;
    v1::GetStatsResponse resp;
    grpc::Status st = stub->GetStats(&ctx, req, &resp);
    if (st.ok()) {
      auto stat = [&resp](const char* name) {
        auto it = resp.stats().find(name);
        return it == resp.stats().end() ? -1.0 : it->second;
      };
      const double followers = stat("replication_followers");
      const double latest = stat("replication_latest_sequence");
      const double lag = stat("replication_lag_sequences");
      // With no standby past its copy the lag is the latest sequence
      // (master_replication.h).
      if (followers >= 1 && (latest <= 0 || lag < latest)) {
        if (const double t = stat("replication_sync_timeouts"); t > 0) {
          MutexLock l(&mu_);
          report_.sync_timeouts += static_cast<uint64_t>(t);
        }
        return leader;
      }
      last = absl::StrCat(cluster_->name(leader), ": followers ", followers,
                          ", lag ", lag, " of ", latest);
    } else {
      last = absl::StrCat(cluster_->name(leader), ": ", st.error_message());
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "master HA: no leader with a standby past its copy within ",
          absl::FormatDuration(options_.standby_wait), ": ", last));
    }
    RETURN_IF_ERROR(WatchFor(absl::Milliseconds(100)));
  }
}

bool CrashTest::Impl::PutProbe(int n, const CallOptions& call,
                               std::string* why) {
  const std::string key = absl::StrCat("crashtest-ha-probe-", n);
  std::vector<uint8_t> data(4096, static_cast<uint8_t>(n));
  const std::vector<std::string> keys = {key};
  const std::vector<ConstBuffer> in = {{data.data(), data.size()}};
  auto p = client_->Put(keys, in, call);
  bool stored = p.ok() && p->stored == 1;
  if (!stored) {
    // An attempt whose answer missed its deadline may have committed.
    auto l = client_->BatchLookup(keys, call);
    stored = l.ok() && l->found.size() == 1 && l->found[0];
  }
  if (!stored && why != nullptr) {
    *why = !p.ok()              ? p.status().ToString()
           : p->skipped > 0     ? "skipped (a put of the key in progress)"
           : !p->errors[0].ok() ? p->errors[0].ToString()
                                : "not stored";
  }
  if (!stored) return false;
  if (probe_keys_.empty() || probe_keys_.back() != key) {
    probe_keys_.push_back(key);
    const std::vector<uint64_t> kills = KillCounts();
    MutexLock l(&mu_);
    Charge(-1, RoundUp(data.size()), kills, kills);
  }
  return true;
}

absl::Status CrashTest::Impl::MeasureFailover(absl::Time killed, int kill) {
  // The probe key committed right before the kill.
  const std::vector<std::string> before = {probe_keys_.back()};
  // Lookups here, puts on a thread of their own: a put attempt may take
  // its whole deadline, and must not delay the lookups' measurement.
  std::optional<absl::Duration> lookup, put;
  std::string last_lookup;
  // What each failed put attempt got, as it changed (the putter's; read
  // after it is joined): why a slow failover was slow.
  std::vector<std::string> put_story;
  const absl::Time give_up = killed + absl::Seconds(60);
  Thread putter("ct-put-probe", [&] {
    while (absl::Now() < give_up) {
      std::string why;
      if (PutProbe(2 * kill + 1, {.deadline = absl::Now() + absl::Seconds(1)},
                   &why)) {
        put = absl::Now() - killed;
        return;
      }
      if (put_story.empty() ||
          !absl::EndsWith(put_story.back(), absl::StrCat(": ", why))) {
        put_story.push_back(
            absl::StrCat("+", absl::ToInt64Milliseconds(absl::Now() - killed),
                         " ms: ", why));
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  });
  uint64_t calls = 0;
  while (absl::Now() < give_up) {
    ++calls;
    auto l = client_->BatchLookup(before,
                                  {.deadline = absl::Now() + absl::Seconds(1)});
    if (l.ok() && l->found == std::vector<bool>(before.size(), true)) {
      lookup = absl::Now() - killed;
      break;
    }
    last_lookup =
        l.ok() ? absl::StrCat("found ", l->hit_prefix, " of ", before.size())
               : l.status().ToString();
    // As a supervisor would, meanwhile: restart a master whose term ended
    // (exit 3), or the cluster may be left with no master at all.
    RETURN_IF_ERROR(WatchFor(absl::Milliseconds(10)));
  }
  putter.Join();
  {
    MutexLock l(&mu_);
    report_.other_calls += calls;
  }
  if (!lookup || !put) {
    MutexLock l(&mu_);
    report_.failures.push_back(
        absl::StrCat("master HA: kill ", kill, ": no successful ",
                     !lookup ? "lookup" : "put",
                     " within 60 s (last lookup: ", last_lookup, ")"));
    return absl::OkStatus();
  }
  // The watch's view of the same takeover (its events may trail the
  // probe's success by a moment).
  std::optional<absl::Duration> gone, elected;
  const absl::Time watch_until = absl::Now() + absl::Seconds(5);
  while (true) {
    {
      MutexLock l(&mu_);
      for (const auto& [at, deleted] : leader_events_) {
        if (at < killed) continue;
        if (deleted && !gone) gone = at - killed;
        if (!deleted && gone && !elected) elected = at - killed;
      }
    }
    if ((gone && elected) || absl::Now() >= watch_until) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  Log(absl::StrCat(
      "failover ", kill, ": leader key gone (lease expired or revoked) after ",
      gone ? absl::StrCat(absl::ToInt64Milliseconds(*gone)) : "?",
      " ms, new leader after ",
      elected ? absl::StrCat(absl::ToInt64Milliseconds(*elected)) : "?",
      " ms, first lookup after ", absl::ToInt64Milliseconds(*lookup),
      " ms, first put after ", absl::ToInt64Milliseconds(*put), " ms"));
  MutexLock l(&mu_);
  if (gone && elected) {
    report_.failover_key_gone.push_back(*gone);
    report_.failover_elected.push_back(*elected);
  }
  report_.failover_lookup.push_back(*lookup);
  report_.failover_put.push_back(*put);
  const absl::Duration worst = std::max(*lookup, *put);
  if (options_.max_failover > absl::ZeroDuration() &&
      worst > options_.max_failover) {
    report_.failures.push_back(absl::StrCat(
        "master HA: kill ", kill, ": failover took ",
        absl::FormatDuration(worst), " (bound ",
        absl::FormatDuration(options_.max_failover),
        "); the put attempts got: ", absl::StrJoin(put_story, "; ")));
  }
  return absl::OkStatus();
}

}  // namespace hymcache::crashtest
