#include "tools/crashtest/crashtest.h"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/leader_election.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/thread.h"
#include "tools/crashtest/block_data.h"
#include "tools/crashtest/crashtest_impl.h"

namespace hymcache::crashtest {

absl::Status CrashTestOptions::Validate() const {
  RETURN_IF_ERROR(cluster.Validate());
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("CrashTestOptions: " + what);
  };
  if (conversations < 1) return bad("conversations must be >= 1");
  if (standby_wait <= absl::ZeroDuration() ||
      max_failover < absl::ZeroDuration()) {
    return bad("standby_wait must be > 0, max_failover >= 0");
  }
  if (max_turns < 1) return bad("max_turns must be >= 1");
  if (max_new_blocks < 1) return bad("max_new_blocks must be >= 1");
  if (system_prompts < 1 || system_prompt_blocks < 0) {
    return bad("system_prompts must be >= 1, system_prompt_blocks >= 0");
  }
  // Block keys are 32 bytes (BlockKeyBuilder), embedded in every block.
  if (min_block_bytes < kBlockHeaderBytes + 32 ||
      max_block_bytes < min_block_bytes) {
    return bad(absl::StrCat("block bytes must satisfy ", kBlockHeaderBytes + 32,
                            " <= min_block_bytes <= max_block_bytes"));
  }
  if (think_time < absl::ZeroDuration()) return bad("think_time < 0");
  if (load_deadline <= absl::ZeroDuration() ||
      store_timeout <= absl::ZeroDuration()) {
    return bad("load_deadline and store_timeout must be positive");
  }
  if (max_overrun < absl::ZeroDuration()) return bad("max_overrun < 0");
  if (kills < 0) return bad("kills must be >= 0");
  if (audit_reads < -1) return bad("audit_reads must be >= -1");
  if (min_kill_gap < absl::ZeroDuration() || max_kill_gap < min_kill_gap) {
    return bad("want 0 <= min_kill_gap <= max_kill_gap");
  }
  if (max_down_time < absl::ZeroDuration()) return bad("max_down_time < 0");
  if (recovery_wait < absl::ZeroDuration()) return bad("recovery_wait < 0");
  if ((fsck || fsck_repair) && hymctl_binary.empty()) {
    return bad("fsck needs hymctl_binary");
  }
  return absl::OkStatus();
}

std::string CrashTestReport::SummaryLine() const {
  std::vector<std::string> by;
  for (const auto& [name, n] : kills_by_daemon) {
    by.push_back(absl::StrCat(name, "=", n));
  }
  return absl::StrCat(
      "crashtest: kills=", kills, " (", absl::StrJoin(by, " "), ")",
      " operations=", operations(), " blocks_verified=", blocks_verified,
      " wrong_bytes=", wrong_bytes, " wrong_blocks=", wrong_blocks,
      " deadline_overruns=", deadline_overruns,
      " max_overrun_ms=", absl::ToInt64Milliseconds(max_overrun),
      " lost_on_live_node=", lost_on_live_node, "/", live_node_checked,
      " lost_on_killed_node=", lost_on_killed_node,
      " stale_listings=", stale_listings, " fsck=",
      !fsck_ran    ? std::string("off")
      : fsck_clean ? std::string("clean")
                   : std::string("INCONSISTENT"),
      " repaired=", repaired < 0 ? std::string("n/a") : absl::StrCat(repaired),
      " unreachable_tails=", unreachable_tails, " evictions>=", evictions_seen,
      " daemon_crashes=", daemon_crashes, " unclean_stops=", unclean_stops,
      " time_s=", absl::ToInt64Seconds(run_time), " result=",
      passed() ? "PASS"
               : absl::StrCat("FAIL(", absl::StrJoin(failures, "; "), ")"));
}

namespace {

// "p50 X ms, p99 Y ms, max Z ms" of `v` (nearest rank).
std::string Percentiles(std::vector<absl::Duration> v) {
  std::sort(v.begin(), v.end());
  auto at = [&v](double q) {
    size_t rank = static_cast<size_t>(std::ceil(q * v.size()));
    return absl::ToInt64Milliseconds(v[std::max<size_t>(rank, 1) - 1]);
  };
  return absl::StrCat("p50 ", at(0.5), " ms, p99 ", at(0.99), " ms, max ",
                      at(1.0), " ms");
}

}  // namespace

std::string CrashTestReport::FailoverLine() const {
  if (failover_lookup.empty()) return "";
  std::string etcd;
  if (failover_key_gone.size() == failover_lookup.size() &&
      failover_elected.size() == failover_lookup.size()) {
    etcd =
        absl::StrCat("; kill->leader key gone ", Percentiles(failover_key_gone),
                     "; kill->new leader ", Percentiles(failover_elected));
  }
  return absl::StrCat(
      "crashtest: failover: ", failover_lookup.size(),
      " leader kills; kill->first lookup ", Percentiles(failover_lookup),
      "; kill->first put ", Percentiles(failover_put), etcd,
      "; terms_ended=", terms_ended, " sync_timeouts>=", sync_timeouts);
}

void CrashTest::Impl::Log(const std::string& line) {
  MutexLock l(&log_mu_);
  char stamp[32];
  snprintf(stamp, sizeof(stamp), "[%8.3f] ",
           absl::ToDoubleSeconds(absl::Now() - start_));
  *log_ << stamp << line << std::endl;
}

void CrashTest::Impl::CountOutcome(const std::string& kind,
                                   const absl::Status& s) {
  const std::string key =
      absl::StrCat(kind, " ", absl::StatusCodeToString(s.code()));
  if (report_.outcomes[key]++ == 0) {
    report_.outcome_examples[key] = std::string(s.message());
  }
}

std::vector<uint64_t> CrashTest::Impl::KillCounts() const {
  std::vector<uint64_t> out(cluster_->size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = kill_counts_[i].load();
  return out;
}

void CrashTest::Impl::NoteCall(const char* what, absl::Time deadline,
                               absl::Time returned) {
  const absl::Duration late = returned - deadline;
  bool report = false;
  {
    MutexLock l(&mu_);
    if (late > report_.max_overrun) {
      report_.max_overrun = late;
      report_.max_overrun_call = what;
    }
    if (late > options_.max_overrun) {
      ++report_.deadline_overruns;
      report = examples_.overrun++ < kMaxExamples;
    }
  }
  if (report) {
    Log(absl::StrCat("DEADLINE OVERRUN: ", what, " returned ",
                     absl::FormatDuration(late), " after its deadline"));
  }
}

bool CrashTest::Impl::VerifyLoaded(const char* what,
                                   const std::vector<std::string>& keys,
                                   const std::vector<uint64_t>& lengths,
                                   size_t from, size_t to,
                                   const std::vector<uint64_t>& got_lengths,
                                   const uint8_t* buffers, size_t stride) {
  struct Wrong {
    size_t index;
    uint64_t got;
    BlockCheck check;
  };
  std::vector<Wrong> wrong;
  uint64_t bytes = 0;
  for (size_t i = from; i < to; ++i) {
    const uint64_t got = got_lengths[i - from];
    // A length beyond the buffer cannot have been written; count it wrong.
    const uint64_t readable = std::min<uint64_t>(got, stride);
    BlockCheck c = CheckBlock(keys[i], lengths[i],
                              buffers + (i - from) * stride, readable);
    c.wrong_bytes += got - readable;
    bytes += got;
    if (c.wrong_bytes != 0) wrong.push_back({i, got, std::move(c)});
  }
  std::vector<std::string> lines;
  {
    MutexLock l(&mu_);
    report_.blocks_verified += to - from;
    report_.bytes_verified += bytes;
    for (const Wrong& w : wrong) {
      ++report_.wrong_blocks;
      report_.wrong_bytes += w.check.wrong_bytes;
      if (!w.check.other_key.empty()) ++report_.swapped_blocks;
      if (examples_.wrong++ >= kMaxExamples) continue;
      auto describe = [this](const std::string& key) {
        auto it = ledger_.find(key);
        if (it == ledger_.end()) return std::string("never stored");
        if (!it->second.committed)
          return std::string("never reported committed");
        return absl::StrCat("committed on ",
                            it->second.node >= 0
                                ? cluster_->name(it->second.node)
                                : std::string("?"));
      };
      std::string line = absl::StrCat(
          "WRONG BYTES: ", what, " key ", Hex(keys[w.index]), " (block ",
          w.index, ", ", describe(keys[w.index]), "): ", w.check.wrong_bytes,
          " of ", lengths[w.index], " bytes wrong, length ", w.got);
      if (!w.check.other_key.empty()) {
        absl::StrAppend(&line, "; it holds the block of key ",
                        Hex(w.check.other_key), " (",
                        describe(w.check.other_key), ")");
      }
      lines.push_back(std::move(line));
    }
  }
  for (const std::string& line : lines) Log(line);
  return wrong.empty();
}

absl::StatusOr<ClusterStatus> CrashTest::Impl::PollClusterStatus() {
  CallOptions call;
  call.deadline = absl::Now() + absl::Seconds(2);
  absl::StatusOr<ClusterStatus> st = client_->GetClusterStatus(call);
  NoteCall("GetClusterStatus", call.deadline, absl::Now());
  MutexLock l(&mu_);
  ++report_.other_calls;
  return st;
}

absl::Status CrashTest::Impl::WaitNodesAlive(absl::Time after,
                                             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  while (true) {
    absl::StatusOr<ClusterStatus> st = PollClusterStatus();
    if (st.ok()) {
      size_t ready = 0;
      for (const NodeStatus& n : st->nodes) {
        const int i = cluster_->IndexOf(n.name);
        if (i < static_cast<int>(cluster_->first_node())) continue;
        // A heartbeat (or registration) after `after`: the node itself
        // talked to this master, not a listing the master loaded at start.
        if (n.alive && n.last_heartbeat_unix_ms > UnixMs(after)) ++ready;
        if (index_of_node_.count(n.node_id) == 0) {
          index_of_node_[n.node_id] = i;
          const uint64_t usable =
              std::min(n.capacity_bytes, cluster_->capacity_bytes(i)) /
              kAlignment * kAlignment;
          capacity_[i] = usable;
        }
      }
      const size_t nodes = cluster_->size() - cluster_->first_node();
      if (ready == nodes) return absl::OkStatus();
      last = absl::StrCat(ready, " of ", nodes, " nodes alive and heard from");
    } else {
      last = st.status().ToString();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("nodes not all alive after ",
                       absl::FormatDuration(timeout), ": ", last));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

void CrashTest::Impl::StopDaemons() {
  // Nodes first (they deregister or flush), the master last.
  for (size_t k = cluster_->size(); k-- > 0;) {
    std::string how;
    if (!cluster_->Alive(k, &how)) {
      if (expected_up_[k]) {
        MutexLock l(&mu_);
        ++report_.daemon_crashes;
        report_.failures.push_back(
            absl::StrCat(cluster_->name(k), " exited by itself (", how, ")"));
      }
      continue;
    }
    const absl::Time t0 = absl::Now();
    absl::StatusOr<int> st = cluster_->Terminate(k, options_.stop_timeout);
    const bool clean = st.ok() && WIFEXITED(*st) && WEXITSTATUS(*st) == 0;
    Log(absl::StrCat(
        "SIGTERM ", cluster_->name(k), ": ",
        st.ok() ? testing::DescribeWaitStatus(*st) : st.status().ToString(),
        " after ", absl::FormatDuration(absl::Now() - t0)));
    if (!clean) {
      MutexLock l(&mu_);
      ++report_.unclean_stops;
      report_.failures.push_back(absl::StrCat(
          cluster_->name(k), " did not stop cleanly on SIGTERM (",
          st.ok() ? testing::DescribeWaitStatus(*st) : st.status().ToString(),
          "), see ", cluster_->log_path(k)));
    }
  }
}

absl::StatusOr<CrashTestReport> CrashTest::Impl::Run(std::ostream& log) {
  log_ = &log;
  kill_rng_.seed(options_.seed);
  audit_rng_.seed(options_.seed + 1);
  Log(absl::StrCat("starting the cluster in ", options_.cluster.work_dir));
  ASSIGN_OR_RETURN(cluster_,
                   testing::RestartableCluster::Create(options_.cluster));
  const size_t n = cluster_->size();
  kill_counts_ = std::make_unique<std::atomic<uint64_t>[]>(n);
  for (size_t i = 0; i < n; ++i) kill_counts_[i] = 0;
  capacity_.assign(n, 0);
  ready_at_.assign(n, absl::Now());
  expected_up_.assign(n, true);
  {
    MutexLock l(&mu_);
    placed_.assign(n, Placement());
    for (size_t i = 0; i < n; ++i)
      report_.kills_by_daemon[cluster_->name(i)] = 0;
  }
  ClientOptions co;
  co.master_address = cluster_->master_address();
  co.default_deadline = options_.load_deadline;
  co.store_threads = options_.conversations;
  co.grpc_poll_strategy = options_.client_poll_strategy;
  co.master_connections = options_.master_connections;
  if (!options_.token_file.empty()) {
    ASSIGN_OR_RETURN(co.auth_token, ReadTokenFile(options_.token_file));
  }
  ASSIGN_OR_RETURN(client_, Client::Create(co));
  if (cluster_->masters() > 1) {
    ASSIGN_OR_RETURN(
        etcd_, EtcdClient::Create({.endpoints = cluster_->etcd_endpoints()}));
    EtcdWatchOptions w;
    w.key = MasterLeaderKey(testing::RestartableCluster::kHaCluster);
    w.thread_name = "ct-leader-watch";
    ASSIGN_OR_RETURN(leader_watch_,
                     etcd_->Watch(w, [this](absl::StatusOr<EtcdWatchBatch> b) {
                       if (!b.ok()) return;
                       const absl::Time now = absl::Now();
                       MutexLock l(&mu_);
                       for (const mvccpb::Event& ev : b->events) {
                         leader_events_.emplace_back(
                             now, ev.type() == mvccpb::Event::DELETE);
                       }
                     }));
  }
  RETURN_IF_ERROR(WaitNodesAlive(start_, absl::Seconds(60)));
  Log(absl::StrCat("cluster up: master ", cluster_->master_address(), ", ",
                   n - cluster_->first_node(), " nodes; ",
                   options_.conversations, " conversations, ", options_.kills,
                   " kills, seed ", options_.seed));

  std::vector<Thread> threads;
  for (int i = 0; i < options_.conversations; ++i) {
    threads.emplace_back(absl::StrCat("ct-conv-", i),
                         [this, i] { ConversationLoop(i); });
  }
  Thread monitor("ct-monitor", [this] { MonitorLoop(); });

  absl::Status faults = KillLoop();
  {
    MutexLock l(&stop_mu_);
    stop_ = true;
  }
  for (Thread& t : threads) t.Join();
  monitor.Join();
  RETURN_IF_ERROR(faults);
  Log("workload stopped");

  absl::Status recovered = Recover();
  if (!recovered.ok()) {
    MutexLock l(&mu_);
    report_.failures.push_back("recovery: " + recovered.ToString());
  } else {
    if (options_.fsck) RunFsck(/*repair=*/false);
    FinalChecks();
    if (options_.fsck_repair) RunFsck(/*repair=*/true);
  }
  StopDaemons();
  client_.reset();

  MutexLock l(&mu_);
  report_.failed_starts = cluster_->failed_starts();
  report_.evictions_seen = evicted_base_ + evicted_last_;
  report_.run_time = absl::Now() - start_;
  CrashTestReport& r = report_;
  if (r.wrong_bytes > 0 || r.wrong_blocks > 0) {
    r.failures.push_back(
        absl::StrCat(r.wrong_blocks, " blocks with wrong bytes"));
  }
  if (r.deadline_overruns > 0) {
    r.failures.push_back(absl::StrCat(
        r.deadline_overruns, " calls overran their deadline by more than ",
        absl::FormatDuration(options_.max_overrun)));
  }
  if (options_.require_live_node_durability && r.lost_on_live_node > 0) {
    r.failures.push_back(absl::StrCat(
        r.lost_on_live_node, " committed blocks lost on never-killed nodes"));
  }
  if (options_.require_clean_recovery) {
    if (r.stale_listings > 0) {
      r.failures.push_back(absl::StrCat(
          r.stale_listings, " keys listed but unreadable after recovery"));
    }
    if (r.unreachable_tails > 0) {
      r.failures.push_back(absl::StrCat(
          r.unreachable_tails,
          " listed blocks after an unlisted one in their chain"));
    }
    if (r.fsck_ran && !r.fsck_clean) {
      r.failures.push_back("hymctl fsck found the cluster inconsistent");
    }
  }
  return r;
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CrashTest>> CrashTest::Create(
    const CrashTestOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<CrashTest>(
      new CrashTest(std::make_unique<Impl>(options)));
}

CrashTest::CrashTest(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CrashTest::~CrashTest() = default;

absl::StatusOr<CrashTestReport> CrashTest::Run(std::ostream& log) {
  return impl_->Run(log);
}

}  // namespace hymcache::crashtest
