#include "tools/crashtest/crashtest.h"

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/block_key.h"
#include "client/client.h"
#include "common/mutex.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/thread.h"
#include "tools/crashtest/block_data.h"

namespace hymcache::crashtest {

absl::Status CrashTestOptions::Validate() const {
  RETURN_IF_ERROR(cluster.Validate());
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("CrashTestOptions: " + what);
  };
  if (conversations < 1) return bad("conversations must be >= 1");
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

// Allocation unit of the storage nodes (their --alignment default).
constexpr uint64_t kAlignment = 4096;
// Examples of each anomaly written to the log.
constexpr int kMaxExamples = 10;

uint64_t RoundUp(uint64_t n) {
  return (n + kAlignment - 1) / kAlignment * kAlignment;
}

int64_t UnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

// A short printable form of a block key.
std::string Hex(const std::string& key) { return KeyToHex(key).substr(0, 16); }

}  // namespace

class CrashTest::Impl {
 public:
  explicit Impl(const CrashTestOptions& options)
      : options_(options),
        keys_(KeyNamespace{.model = "hymcache-crashtest",
                           .dtype = "bytes",
                           .layout = "generated",
                           .salt = absl::StrCat("seed=", options.seed)},
              /*block_tokens=*/16) {}

  absl::StatusOr<CrashTestReport> Run(std::ostream& log);

 private:
  // --- What the test knows about each key it gave to a Store. ---
  struct KeyRecord {
    uint64_t length = 0;
    // Whether a Store reported it stored (kStored), and where: the daemon
    // index of the node, and that node's kill count when that Store began.
    bool committed = false;
    int node = -1;
    // Every daemon's kill count when that Store began.
    std::vector<uint64_t> kills_at_store;
    // The block before this one in its chain ("" for a chain's first).
    std::string parent;
    // When that Store began and returned.
    absl::Time store_began;
    absl::Time store_returned;
  };
  // Bytes of every allocation this test may have caused on a node (see
  // crashtest.h, live-node durability), in total and per epoch of the node
  // (its kill count: a DRAM node starts empty in each).
  struct Placement {
    uint64_t total = 0;
    std::map<uint64_t, uint64_t> by_epoch;
  };
  struct Conversation {
    std::vector<std::string> keys;
    std::vector<uint64_t> lengths;
  };
  struct Anomalies {
    int wrong = 0;
    int overrun = 0;
    int lost = 0;
    int stale = 0;
  };

  // Tallies an outcome (see CrashTestReport::outcomes).
  void CountOutcome(const std::string& kind, const absl::Status& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs one line with the time since the start.
  void Log(const std::string& line);

  // Counts a call that returned at `returned` against `deadline`.
  void NoteCall(const char* what, absl::Time deadline, absl::Time returned);
  // Checks loaded blocks; returns whether all were right.
  bool VerifyLoaded(const char* what, const std::vector<std::string>& keys,
                    const std::vector<uint64_t>& lengths, size_t from,
                    size_t to, const std::vector<uint64_t>& got_lengths,
                    const uint8_t* buffers, size_t stride);

  // Cluster bring-up: waits until every node is alive with a heartbeat
  // later than `after`, and learns node ids and capacities.
  absl::Status WaitNodesAlive(absl::Time after, absl::Duration timeout);

  // The workload.
  void ConversationLoop(int slot);
  void AppendBlocks(Conversation& c, size_t count, std::mt19937_64& rng);
  void RunTurn(Conversation& c, std::vector<uint8_t>& scratch);
  // `parent`: the block before keys[0] in its chain.
  void RecordStore(const std::vector<std::string>& keys,
                   const std::vector<uint64_t>& lengths,
                   const std::string& parent,
                   const absl::StatusOr<PutResult>& result,
                   const std::vector<uint64_t>& kills_at_start,
                   const std::vector<uint64_t>& kills_at_end, absl::Time began);
  // Charges `bytes` allocated on node `i` (or on every node, i < 0) by a
  // Store that ran while the node's epoch went from `from` to `to`.
  void Charge(int i, uint64_t bytes, const std::vector<uint64_t>& from,
              const std::vector<uint64_t>& to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The most bytes this test may have had allocated on node `i` while it
  // held what it held during epoch `epoch`.
  static uint64_t Bound(const Placement& p, bool keeps_objects, uint64_t epoch);
  bool Stopping();
  // Sleeps `d`; returns early (false) when the workload stops.
  bool SleepUnlessStopping(absl::Duration d);

  // Polls the master's stats (evictions).
  void MonitorLoop();

  // The fault schedule, on the calling (owner) thread.
  absl::Status KillLoop();
  // Waits `d` while watching the daemons expected up; restarts one that
  // exited by itself. Errors: a restart failed.
  absl::Status WatchFor(absl::Duration d);
  absl::Status RestartDaemon(size_t i, const char* why);

  // After the workload: recovery, fsck, the final reads.
  absl::Status Recover();
  // ==== HOOK: hymctl fsck ====
  void RunFsck(bool repair);
  void FinalChecks();

  // Blocks that must be served now: committed on a node not killed since
  // their Store began, whose allocations by this test (plus `slack`) stay
  // within its capacity (so it never evicted).
  struct MustServe {
    std::string key;
    uint64_t length;
    int node;
    absl::Time store_began;
    absl::Time store_returned;
  };
  std::vector<MustServe> MustBeServed(uint64_t slack);
  // Mid-run: every block that must be served is listed, and a sample of
  // them loads. Run before each kill.
  void Audit();
  void ReportLost(const char* when, const MustServe& m,
                  const std::string& what);
  // Whether each key is listed (BatchLookup, retried).
  absl::StatusOr<LookupResult> Listed(const std::vector<std::string>& keys);
  enum class Read { kServed, kNotListed, kUnreadable };
  // Gets one key (retrying transient errors) and checks its bytes.
  Read ReadKey(const std::string& key, uint64_t length, std::string* why);
  void StopDaemons();

  std::vector<uint64_t> KillCounts() const;

  const CrashTestOptions options_;
  const BlockKeyBuilder keys_;
  const absl::Time start_ = absl::Now();

  // Set up by Run before any thread starts; then written only by the owner
  // thread while no workload thread runs.
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<Client> client_;
  std::ostream* log_ = nullptr;
  // Kills (and crashes) per daemon index; bumped before the signal.
  std::unique_ptr<std::atomic<uint64_t>[]> kill_counts_;
  // Master node id -> daemon index.
  absl::flat_hash_map<uint32_t, int> index_of_node_;
  // Per daemon index: the usable capacity the master registered.
  std::vector<uint64_t> capacity_;
  // Owner thread only.
  std::vector<absl::Time> ready_at_;  // last (re)start of each daemon
  std::vector<bool> expected_up_;
  std::mt19937_64 kill_rng_;
  std::mt19937_64 audit_rng_;

  Mutex log_mu_;

  Mutex stop_mu_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;

  Mutex mu_;
  CrashTestReport report_ ABSL_GUARDED_BY(mu_);
  Anomalies examples_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, KeyRecord> ledger_ ABSL_GUARDED_BY(mu_);
  // Keys counted in report_.lost_on_live_node.
  absl::flat_hash_set<std::string> lost_keys_ ABSL_GUARDED_BY(mu_);
  // Every conversation's chain (for unreachable tails).
  std::vector<std::vector<std::string>> chains_ ABSL_GUARDED_BY(mu_);
  // Per daemon index.
  std::vector<Placement> placed_ ABSL_GUARDED_BY(mu_);
  // Evictions: the last value polled from the current master and the sum
  // of the last values of earlier masters.
  uint64_t evicted_last_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evicted_base_ ABSL_GUARDED_BY(mu_) = 0;
};

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

absl::Status CrashTest::Impl::WaitNodesAlive(absl::Time after,
                                             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  while (true) {
    CallOptions call;
    call.deadline = absl::Now() + absl::Seconds(2);
    absl::StatusOr<ClusterStatus> st = client_->GetClusterStatus(call);
    NoteCall("GetClusterStatus", call.deadline, absl::Now());
    {
      MutexLock l(&mu_);
      ++report_.other_calls;
    }
    if (st.ok()) {
      size_t ready = 0;
      for (const NodeStatus& n : st->nodes) {
        const int i = cluster_->IndexOf(n.name);
        if (i <= 0) continue;
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
      if (ready == cluster_->size() - 1) return absl::OkStatus();
      last = absl::StrCat(ready, " of ", cluster_->size() - 1,
                          " nodes alive and heard from");
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

// ---------------------------------------------------------------------------
// Workload

bool CrashTest::Impl::Stopping() {
  MutexLock l(&stop_mu_);
  return stop_;
}

bool CrashTest::Impl::SleepUnlessStopping(absl::Duration d) {
  MutexLock l(&stop_mu_);
  return !stop_mu_.AwaitWithDeadline(absl::Condition(&stop_), absl::Now() + d);
}

void CrashTest::Impl::AppendBlocks(Conversation& c, size_t count,
                                   std::mt19937_64& rng) {
  for (size_t k = 0; k < count; ++k) {
    const size_t index = c.keys.size();
    std::vector<int32_t> tokens(keys_.block_tokens());
    // The first blocks are a shared system prompt (same tokens, same keys
    // in every conversation opening with it); the rest are the
    // conversation's own.
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() & 0x7fffffff);
    const std::string parent = index == 0 ? std::string() : c.keys.back();
    std::string key = keys_.NextKey(parent, tokens);
    c.lengths.push_back(
        BlockLength(key, options_.min_block_bytes, options_.max_block_bytes));
    c.keys.push_back(std::move(key));
  }
}

void CrashTest::Impl::ConversationLoop(int slot) {
  std::mt19937_64 rng(options_.seed * 0x9e3779b97f4a7c15ULL + slot + 1);
  std::vector<uint8_t> scratch;
  while (!Stopping()) {
    Conversation c;
    const int turns =
        std::uniform_int_distribution<int>(1, options_.max_turns)(rng);
    const int prompt =
        std::uniform_int_distribution<int>(0, options_.system_prompts - 1)(rng);
    {
      // System prompt blocks: tokens from the prompt's own generator.
      std::mt19937_64 prompt_rng(options_.seed * 31 + prompt);
      AppendBlocks(c, options_.system_prompt_blocks, prompt_rng);
    }
    size_t chain = 0;
    {
      MutexLock l(&mu_);
      chain = chains_.size();
      chains_.emplace_back();
    }
    for (int t = 0; t < turns && !Stopping(); ++t) {
      AppendBlocks(
          c,
          std::uniform_int_distribution<int>(1, options_.max_new_blocks)(rng),
          rng);
      {
        MutexLock l(&mu_);
        chains_[chain] = c.keys;
      }
      RunTurn(c, scratch);
      if (!SleepUnlessStopping(options_.think_time)) break;
    }
  }
}

void CrashTest::Impl::RunTurn(Conversation& c, std::vector<uint8_t>& scratch) {
  const size_t n = c.keys.size();
  // Every buffer holds the largest block, so that a wrong object of another
  // length is loaded (and caught) rather than refused.
  const size_t stride = options_.max_block_bytes;
  scratch.assign(n * stride, 0xA5);
  std::vector<MutableBuffer> bufs(n);
  for (size_t i = 0; i < n; ++i)
    bufs[i] = {scratch.data() + i * stride, stride};

  LoadOptions lo;
  lo.deadline = absl::Now() + options_.load_deadline;
  absl::StatusOr<LoadResult> r = client_->Load(c.keys, bufs, lo);
  NoteCall("Load", lo.deadline, absl::Now());
  size_t loaded = 0;
  if (r.ok()) {
    loaded = r->loaded;
    VerifyLoaded("Load", c.keys, c.lengths, 0, loaded, r->lengths,
                 scratch.data(), stride);
  }
  {
    MutexLock l(&mu_);
    ++report_.loads;
    if (!r.ok()) {
      ++report_.load_errors;
      CountOutcome("Load failed:", r.status());
    } else {
      report_.blocks_loaded += loaded;
      if (r->hit_prefix > loaded && absl::IsNotFound(r->stop_reason)) {
        ++report_.refused_reads;
      }
      if (loaded < n) {
        CountOutcome(r->hit_prefix > loaded ? "Load stopped at a hit:"
                                            : "Load stopped at a miss:",
                     r->stop_reason);
      }
    }
  }
  if (loaded == n) return;

  // Recompute the rest and store it, chained to the loaded prefix.
  std::vector<std::string> keys(c.keys.begin() + loaded, c.keys.end());
  std::vector<uint64_t> lengths(c.lengths.begin() + loaded, c.lengths.end());
  std::vector<std::vector<uint8_t>> data(keys.size());
  std::vector<ConstBuffer> in(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    data[i].resize(lengths[i]);
    FillBlock(keys[i], lengths[i], data[i].data());
    in[i] = {data[i].data(), data[i].size()};
  }
  StoreOptions so;
  if (loaded > 0) so.parent_key = c.keys[loaded - 1];
  so.deadline = absl::Now() + options_.store_timeout;
  const absl::Time started = absl::Now();
  const std::vector<uint64_t> kills_at_start = KillCounts();
  std::shared_ptr<StoreHandle> h = client_->Store(keys, in, so);
  // The handle must finish before `data` goes; a Store that outlives its
  // timeout by far is an overrun, and still waited for.
  absl::StatusOr<PutResult> res =
      h->Wait(started + options_.store_timeout + options_.max_overrun +
              absl::Seconds(30));
  if (!res.ok() && !h->Done()) res = h->Wait();
  NoteCall("Store", started + options_.store_timeout, absl::Now());
  RecordStore(keys, lengths, so.parent_key, res, kills_at_start, KillCounts(),
              started);
}

void CrashTest::Impl::RecordStore(const std::vector<std::string>& keys,
                                  const std::vector<uint64_t>& lengths,
                                  const std::string& parent,
                                  const absl::StatusOr<PutResult>& result,
                                  const std::vector<uint64_t>& kills_at_start,
                                  const std::vector<uint64_t>& kills_at_end,
                                  absl::Time began) {
  const absl::Time returned = absl::Now();
  MutexLock l(&mu_);
  ++report_.stores;
  uint64_t total = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    KeyRecord& rec = ledger_[keys[i]];
    rec.length = lengths[i];
    rec.parent = i == 0 ? parent : keys[i - 1];
    total += RoundUp(lengths[i]);
  }
  auto charge_all = [&] { Charge(-1, total, kills_at_start, kills_at_end); };
  if (!result.ok()) {
    report_.store_failed += keys.size();
    CountOutcome("Store call failed:", result.status());
    // Unavailable: the master was unreachable or died mid-call (its pending
    // puts died with it); InvalidArgument, FailedPrecondition (the parent is
    // not stored) and ResourceExhausted allocate nothing. Anything else (a
    // deadline) may have left an allocation on some node until the put expires.
    const absl::StatusCode code = result.status().code();
    if (code != absl::StatusCode::kUnavailable &&
        code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kFailedPrecondition &&
        code != absl::StatusCode::kResourceExhausted) {
      charge_all();
    }
    return;
  }
  const PutResult& r = *result;
  int node = -1;
  if (r.node_id != 0) {
    auto it = index_of_node_.find(r.node_id);
    if (it != index_of_node_.end()) node = it->second;
  }
  uint64_t placed = 0;
  bool unknown_placement = false;
  for (size_t i = 0; i < keys.size(); ++i) {
    switch (r.outcomes[i]) {
      case PutOutcome::kStored: {
        ++report_.blocks_stored;
        placed += RoundUp(lengths[i]);
        KeyRecord& rec = ledger_[keys[i]];
        rec.committed = true;
        rec.node = node;
        rec.kills_at_store = kills_at_start;
        rec.store_began = began;
        rec.store_returned = returned;
        break;
      }
      case PutOutcome::kAlreadyStored:
      case PutOutcome::kInProgress:
        break;
      case PutOutcome::kFailed:
        if (absl::IsResourceExhausted(r.errors[i])) {
          ++report_.store_refused;
        } else {
          ++report_.store_failed;
        }
        CountOutcome("Store key failed:", r.errors[i]);
        // Allocated on the put's node and freed again, or not allocated.
        if (node >= 0) {
          placed += RoundUp(lengths[i]);
        } else if (!absl::IsResourceExhausted(r.errors[i]) &&
                   !absl::IsUnavailable(r.errors[i])) {
          unknown_placement = true;
        }
        break;
    }
  }
  if (node >= 0) Charge(node, placed, kills_at_start, kills_at_end);
  if (r.node_id != 0 && node < 0) charge_all();  // a node we do not know
  if (unknown_placement) charge_all();
}

void CrashTest::Impl::Charge(int i, uint64_t bytes,
                             const std::vector<uint64_t>& from,
                             const std::vector<uint64_t>& to) {
  for (size_t k = 1; k < placed_.size(); ++k) {
    if (i >= 0 && static_cast<size_t>(i) != k) continue;
    placed_[k].total += bytes;
    // The allocation was made in one of the epochs the Store spanned.
    for (uint64_t e = from[k]; e <= to[k]; ++e) placed_[k].by_epoch[e] += bytes;
  }
}

uint64_t CrashTest::Impl::Bound(const Placement& p, bool keeps_objects,
                                uint64_t epoch) {
  if (keeps_objects) return p.total;
  auto it = p.by_epoch.find(epoch);
  return it == p.by_epoch.end() ? 0 : it->second;
}

void CrashTest::Impl::MonitorLoop() {
  while (SleepUnlessStopping(absl::Milliseconds(250))) {
    CallOptions call;
    call.deadline = absl::Now() + absl::Seconds(2);
    absl::StatusOr<ClusterStatus> st = client_->GetClusterStatus(call);
    NoteCall("GetClusterStatus", call.deadline, absl::Now());
    MutexLock l(&mu_);
    ++report_.other_calls;
    if (!st.ok()) continue;
    // A smaller count is a new master: its predecessor's last count stays.
    if (st->evicted_objects < evicted_last_) evicted_base_ += evicted_last_;
    evicted_last_ = st->evicted_objects;
  }
}

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

// ---------------------------------------------------------------------------
// Recovery and the final checks

absl::Status CrashTest::Impl::Recover() {
  // Nodes must have talked to the current master after both their own and
  // the master's last start.
  absl::Time after = ready_at_[0];
  for (absl::Time t : ready_at_) after = std::max(after, t);
  const absl::Time t0 = absl::Now();
  RETURN_IF_ERROR(WaitNodesAlive(after, options_.alive_timeout));
  Log(absl::StrCat("every node alive ", absl::FormatDuration(absl::Now() - t0),
                   " after the last restart; waiting ",
                   absl::FormatDuration(options_.recovery_wait),
                   " for the cluster to converge"));
  RETURN_IF_ERROR(WatchFor(options_.recovery_wait));
  return absl::OkStatus();
}

// ==== HOOK: hymctl fsck ====
// After recovery: `hymctl fsck` compares the master's listings with every
// node's extents (tools/hymctl/fsck.h) and must find them consistent. With
// `repair`, `hymctl fsck --repair` fixes what it finds (after the final
// reads, so that those measure what the cluster converged to by itself);
// what it fixed is the summary's "repaired".
void CrashTest::Impl::RunFsck(bool repair) {
  const std::string out_path =
      cluster_->log_path(0) + (repair ? ".fsck-repair.json" : ".fsck.json");
  const std::string err_path = cluster_->log_path(0) + ".fsck.log";
  std::vector<std::string> args = {"--master=" + cluster_->master_address(),
                                   "--json"};
  if (!options_.token_file.empty()) {
    args.push_back("--token_file=" + options_.token_file);
  }
  if (repair) args.push_back("--repair");
  args.push_back("fsck");
  const absl::Time t0 = absl::Now();
  absl::StatusOr<int> st = RunCommand(options_.hymctl_binary, args, out_path,
                                      err_path, absl::Seconds(300));
  std::string verdict;
  bool consistent = false;
  int64_t repaired = -1;
  std::map<std::string, uint64_t> findings;
  if (!st.ok()) {
    verdict = st.status().ToString();
  } else {
    std::ifstream in(out_path);
    nlohmann::json j =
        nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("consistent")) {
      verdict = absl::StrCat(DescribeWaitStatus(*st), ", no JSON verdict");
    } else {
      consistent = j["consistent"].get<bool>();
      if (j.contains("findings") && j["findings"].is_array()) {
        for (const auto& f : j["findings"]) {
          ++findings[f.value("kind", std::string("?"))];
        }
      }
      if (repair && j.contains("repair")) {
        repaired = j["repair"].value("listings_dropped", int64_t{0});
      }
      std::vector<std::string> kinds;
      for (const auto& [k, n] : findings)
        kinds.push_back(absl::StrCat(k, "=", n));
      verdict = absl::StrCat(
          consistent ? "consistent" : "INCONSISTENT", kinds.empty() ? "" : " (",
          absl::StrJoin(kinds, " "), kinds.empty() ? "" : ")");
      if (repaired >= 0)
        absl::StrAppend(&verdict, ", listings dropped ", repaired);
    }
  }
  Log(absl::StrCat("hymctl ", absl::StrJoin(args, " "), ": ", verdict, " in ",
                   absl::FormatDuration(absl::Now() - t0), " (", out_path,
                   ")"));
  MutexLock l(&mu_);
  if (repair) {
    report_.repaired = repaired;
    return;
  }
  report_.fsck_ran = true;
  report_.fsck_clean = consistent;
  report_.fsck_findings = std::move(findings);
}

absl::StatusOr<LookupResult> CrashTest::Impl::Listed(
    const std::vector<std::string>& keys) {
  if (keys.empty()) return LookupResult();
  absl::StatusOr<LookupResult> look = absl::UnavailableError("not run");
  for (int attempt = 0; attempt < 5 && !look.ok(); ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(500));
    CallOptions call;
    call.deadline = absl::Now() + absl::Seconds(10);
    look = client_->BatchLookup(keys, call);
    NoteCall("BatchLookup", call.deadline, absl::Now());
    MutexLock l(&mu_);
    ++report_.other_calls;
  }
  return look;
}

CrashTest::Impl::Read CrashTest::Impl::ReadKey(const std::string& key,
                                               uint64_t length,
                                               std::string* why) {
  const size_t stride = options_.max_block_bytes;
  std::vector<uint8_t> buf(stride);
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(250));
    std::fill(buf.begin(), buf.end(), 0xA5);
    MutableBuffer mb{buf.data(), buf.size()};
    CallOptions call;
    call.deadline = absl::Now() + absl::Seconds(5);
    absl::StatusOr<LoadResult> g = client_->Get(
        absl::MakeConstSpan(&key, 1), absl::MakeConstSpan(&mb, 1), call);
    NoteCall("Get", call.deadline, absl::Now());
    {
      MutexLock l(&mu_);
      ++report_.other_calls;
    }
    if (g.ok() && g->loaded == 1) {
      // Served; wrong bytes are counted (and fail the run) separately.
      VerifyLoaded("Get", {key}, {length}, 0, 1, g->lengths, buf.data(),
                   stride);
      return Read::kServed;
    }
    *why = g.ok() ? g->stop_reason.ToString() : g.status().ToString();
    // NotFound is an answer (not listed, or the node refused the read);
    // other errors may pass.
    if (g.ok() && absl::IsNotFound(g->stop_reason)) {
      return g->hit_prefix == 0 ? Read::kNotListed : Read::kUnreadable;
    }
  }
  return Read::kUnreadable;
}

std::vector<CrashTest::Impl::MustServe> CrashTest::Impl::MustBeServed(
    uint64_t slack) {
  const std::vector<uint64_t> kills = KillCounts();
  std::vector<MustServe> out;
  MutexLock l(&mu_);
  // Whether `rec` is still where its Store put it, as far as this test can
  // tell: its node was not killed since `since` (kill counts when a Store
  // began) and never needed to evict.
  auto kept = [&](const KeyRecord& rec, const std::vector<uint64_t>& since)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                    if (!rec.committed || rec.node < 0) return false;
                    const uint64_t epoch = rec.kills_at_store[rec.node];
                    if (kills[rec.node] != epoch ||
                        kills[rec.node] != since[rec.node]) {
                      return false;
                    }
                    return Bound(placed_[rec.node],
                                 cluster_->keeps_objects(rec.node), epoch) +
                               slack <=
                           capacity_[rec.node];
                  };
  for (const auto& [key, rec] : ledger_) {
    if (!kept(rec, rec.kills_at_store)) continue;
    // Every block before it in its chain must be kept too: a block after a
    // lost one is unreachable, and the master may drop it.
    bool chain_kept = true;
    std::string parent = rec.parent;
    for (int depth = 0; chain_kept && !parent.empty(); ++depth) {
      auto it = ledger_.find(parent);
      chain_kept = depth < 1024 && it != ledger_.end() &&
                   kept(it->second, rec.kills_at_store);
      if (chain_kept) parent = it->second.parent;
    }
    if (!chain_kept) continue;
    out.push_back(
        {key, rec.length, rec.node, rec.store_began, rec.store_returned});
  }
  std::sort(out.begin(), out.end(), [](const MustServe& a, const MustServe& b) {
    return a.key < b.key;
  });
  return out;
}

void CrashTest::Impl::ReportLost(const char* when, const MustServe& m,
                                 const std::string& what) {
  bool print = false;
  {
    MutexLock l(&mu_);
    if (!lost_keys_.insert(m.key).second)
      return;  // counted by an earlier check
    ++report_.lost_on_live_node;
    ++report_.lost_by_node[cluster_->name(m.node)];
    print = examples_.lost++ < kMaxExamples;
  }
  if (print) {
    Log(absl::StrCat(
        "LOST ON A LIVE NODE (", when, "): key ", KeyToHex(m.key),
        " committed on ", cluster_->name(m.node), " by a Store run from ",
        absl::ToDoubleSeconds(m.store_began - start_), " s to ",
        absl::ToDoubleSeconds(m.store_returned - start_),
        " s; the node was never killed since and never full enough to evict; ",
        what));
  }
}

void CrashTest::Impl::Audit() {
  // Stores in flight may add one chain per conversation to a node meanwhile.
  const uint64_t chain_blocks =
      options_.system_prompt_blocks +
      static_cast<uint64_t>(options_.max_turns) * options_.max_new_blocks;
  const uint64_t slack =
      options_.conversations * chain_blocks * RoundUp(options_.max_block_bytes);
  std::vector<MustServe> must = MustBeServed(slack);
  if (must.empty()) return;
  std::vector<std::string> keys;
  for (const MustServe& m : must) keys.push_back(m.key);
  absl::StatusOr<LookupResult> listed = Listed(keys);
  if (!listed.ok()) {
    Log("audit skipped: BatchLookup failed: " + listed.status().ToString());
    return;
  }
  // A miss may be a node the master briefly thinks dead (late heartbeats):
  // look again for a while before calling it lost.
  std::vector<size_t> missing;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!listed->found[i]) missing.push_back(i);
  }
  for (int round = 0; round < 8 && !missing.empty(); ++round) {
    absl::SleepFor(absl::Milliseconds(500));
    std::vector<std::string> again;
    for (size_t i : missing) again.push_back(keys[i]);
    absl::StatusOr<LookupResult> l2 = Listed(again);
    if (!l2.ok()) continue;
    std::vector<size_t> still;
    for (size_t j = 0; j < missing.size(); ++j) {
      if (!l2->found[j]) still.push_back(missing[j]);
    }
    missing = std::move(still);
  }
  for (size_t i : missing) ReportLost("audit", must[i], "is no longer listed");

  // Read a sample of the listed ones.
  std::vector<size_t> found;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (std::find(missing.begin(), missing.end(), i) == missing.end())
      found.push_back(i);
  }
  std::shuffle(found.begin(), found.end(), audit_rng_);
  if (found.size() > static_cast<size_t>(options_.audit_reads)) {
    found.resize(options_.audit_reads);
  }
  for (size_t i : found) {
    std::string why;
    const Read r = ReadKey(keys[i], must[i].length, &why);
    if (r == Read::kServed) continue;
    ReportLost("audit", must[i],
               r == Read::kNotListed ? "is no longer listed"
                                     : "is listed but unreadable: " + why);
  }
  MutexLock l(&mu_);
  ++report_.audits;
  report_.live_node_checked += keys.size();
  report_.audit_reads += found.size();
}

void CrashTest::Impl::FinalChecks() {
  std::vector<std::string> keys;
  absl::flat_hash_map<std::string, KeyRecord> ledger;
  std::vector<std::vector<std::string>> chains;
  {
    MutexLock l(&mu_);
    ledger = ledger_;
    chains = chains_;
  }
  keys.reserve(ledger.size());
  for (const auto& [k, rec] : ledger) keys.push_back(k);
  std::sort(keys.begin(), keys.end());

  // 1. What the master lists.
  absl::StatusOr<LookupResult> found = Listed(keys);
  if (!found.ok()) {
    Log("final BatchLookup failed: " + found.status().ToString());
    MutexLock l(&mu_);
    report_.failures.push_back("final BatchLookup failed: " +
                               found.status().ToString());
    return;
  }
  std::vector<bool> listed = found->found;

  // 2. Read every listed key (one Get per key: a stale listing must not
  // hide the keys after it).
  std::vector<bool> served(keys.size(), false);
  uint64_t n_listed = 0, n_readable = 0, n_stale = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!listed[i]) continue;
    ++n_listed;
    const KeyRecord& rec = ledger[keys[i]];
    std::string why;
    const Read r = ReadKey(keys[i], rec.length, &why);
    if (r == Read::kServed) {
      served[i] = true;
      ++n_readable;
      continue;
    }
    if (r == Read::kNotListed) {
      listed[i] = false;  // dropped since the lookup
      --n_listed;
      continue;
    }
    ++n_stale;
    bool print = false;
    {
      MutexLock l(&mu_);
      print = examples_.stale++ < kMaxExamples;
    }
    if (print) {
      Log(absl::StrCat(
          "STALE LISTING: key ", Hex(keys[i]),
          " is listed but unreadable: ", why,
          rec.committed
              ? absl::StrCat(" (committed on ",
                             rec.node >= 0 ? cluster_->name(rec.node) : "?",
                             ")")
              : " (never reported committed)"));
    }
  }

  // 3. Committed blocks: still served where they must be.
  absl::flat_hash_map<std::string, size_t> index;
  for (size_t i = 0; i < keys.size(); ++i) index[keys[i]] = i;
  const std::vector<MustServe> must = MustBeServed(0);
  for (const MustServe& m : must) {
    const size_t i = index.at(m.key);
    if (served[i]) continue;
    ReportLost("after recovery", m,
               listed[i] ? "is listed but unreadable" : "is no longer listed");
  }
  const std::vector<uint64_t> kills = KillCounts();
  uint64_t unverifiable = 0, maybe_evicted = 0, lost_killed = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyRecord& rec = ledger[keys[i]];
    if (!rec.committed) continue;
    if (rec.node >= 0 && kills[rec.node] != rec.kills_at_store[rec.node]) {
      if (!served[i]) ++lost_killed;
      continue;
    }
    if (std::binary_search(must.begin(), must.end(),
                           MustServe{keys[i], 0, 0, absl::Time(), absl::Time()},
                           [](const MustServe& a, const MustServe& b) {
                             return a.key < b.key;
                           })) {
      continue;
    }
    ++unverifiable;
    if (!served[i]) ++maybe_evicted;
  }

  // 4. Unreachable tails: listed blocks after an unlisted one in a chain,
  // by where the missing block was (last) committed: on the tail's node,
  // on another node, or nowhere (a Store that failed for it).
  absl::flat_hash_map<std::string, int> tails;  // key -> kind
  enum { kSameNode, kOtherNode, kNeverCommitted };
  for (const auto& chain : chains) {
    const KeyRecord* gap = nullptr;
    bool broken = false;
    for (const std::string& k : chain) {
      auto it = index.find(k);
      const bool l = it != index.end() && listed[it->second];
      if (!l) {
        if (!broken) {
          auto r = ledger.find(k);
          gap = r == ledger.end() ? nullptr : &r->second;
        }
        broken = true;
      } else if (broken) {
        int kind = kNeverCommitted;
        if (gap != nullptr && gap->committed && gap->node >= 0) {
          auto n = index_of_node_.find(found->locations[it->second].node_id);
          kind = n != index_of_node_.end() && n->second == gap->node
                     ? kSameNode
                     : kOtherNode;
        }
        tails.emplace(k, kind);
      }
    }
  }
  uint64_t tail_kinds[3] = {0, 0, 0};
  for (const auto& [k, kind] : tails) ++tail_kinds[kind];
  if (!tails.empty()) {
    Log(absl::StrCat("unreachable tails: ", tails.size(),
                     " listed blocks after an unlisted one in their chain; "
                     "the missing block was on the same node for ",
                     tail_kinds[kSameNode], ", on another node for ",
                     tail_kinds[kOtherNode], ", never committed for ",
                     tail_kinds[kNeverCommitted]));
  }

  std::vector<Placement> placed;
  {
    MutexLock l(&mu_);
    placed = placed_;
  }
  for (size_t i = 1; i < cluster_->size(); ++i) {
    std::vector<std::string> epochs;
    for (const auto& [e, b] : placed[i].by_epoch) {
      epochs.push_back(absl::StrCat(b >> 20, b > capacity_[i] ? "!" : ""));
    }
    Log(absl::StrCat(
        cluster_->name(i), ": ", kills[i], " kills, capacity ",
        capacity_[i] >> 20, " MiB, ", placed[i].total >> 20,
        " MiB placed by this test; per epoch with stores (MiB, ! = "
        "may have evicted): ",
        absl::StrJoin(epochs, " ")));
  }
  MutexLock l(&mu_);
  report_.keys_stored = keys.size();
  report_.keys_listed = n_listed;
  report_.keys_readable = n_readable;
  report_.stale_listings = n_stale;
  report_.live_node_checked += must.size();
  report_.live_node_unverifiable = unverifiable;
  report_.live_node_missing_maybe_evicted = maybe_evicted;
  report_.lost_on_killed_node = lost_killed;
  report_.unreachable_tails = tails.size();
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
    Log(absl::StrCat("SIGTERM ", cluster_->name(k), ": ",
                     st.ok() ? DescribeWaitStatus(*st) : st.status().ToString(),
                     " after ", absl::FormatDuration(absl::Now() - t0)));
    if (!clean) {
      MutexLock l(&mu_);
      ++report_.unclean_stops;
      report_.failures.push_back(absl::StrCat(
          cluster_->name(k), " did not stop cleanly on SIGTERM (",
          st.ok() ? DescribeWaitStatus(*st) : st.status().ToString(), "), see ",
          cluster_->log_path(k)));
    }
  }
}

absl::StatusOr<CrashTestReport> CrashTest::Impl::Run(std::ostream& log) {
  log_ = &log;
  kill_rng_.seed(options_.seed);
  audit_rng_.seed(options_.seed + 1);
  Log(absl::StrCat("starting the cluster in ", options_.cluster.work_dir));
  ASSIGN_OR_RETURN(cluster_, Cluster::Create(options_.cluster));
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
  RETURN_IF_ERROR(WaitNodesAlive(start_, absl::Seconds(60)));
  Log(absl::StrCat("cluster up: master ", cluster_->master_address(), ", ",
                   n - 1, " nodes; ", options_.conversations,
                   " conversations, ", options_.kills, " kills, seed ",
                   options_.seed));

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
