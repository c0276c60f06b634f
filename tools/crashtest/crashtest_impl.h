// The private half of CrashTest (crashtest.h): the Impl class behind it,
// which crashtest.cc (bring-up, run, stop), crashtest_workload.cc (the
// conversations and the stats monitor), crashtest_faults.cc (the kill
// schedule) and crashtest_checks.cc (audits, recovery, fsck, the final
// reads) implement together.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/block_key.h"
#include "client/client.h"
#include "common/etcd_client.h"
#include "common/mutex.h"
#include "tests/cluster.h"
#include "tools/crashtest/crashtest.h"

namespace hymcache::crashtest {

// Allocation unit of the storage nodes (their --alignment default).
inline constexpr uint64_t kAlignment = 4096;
// Examples of each anomaly written to the log.
inline constexpr int kMaxExamples = 10;

inline uint64_t RoundUp(uint64_t n) {
  return (n + kAlignment - 1) / kAlignment * kAlignment;
}

inline int64_t UnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

// A short printable form of a block key.
inline std::string Hex(const std::string& key) {
  return KeyToHex(key).substr(0, 16);
}

class CrashTest::Impl {
 public:
  explicit Impl(const CrashTestOptions& options)
      : options_(options),
        keys_(KeyNamespace{.model = "hymcache-crashtest",
                           .dtype = "bytes",
                           .layout = "generated",
                           .salt = absl::StrCat("seed=", options.seed)},
              /*block_tokens=*/16) {}

  // The leader watch first: its callback uses mu_, declared after it.
  ~Impl() { leader_watch_.reset(); }

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

  // One GetClusterStatus with a 2 s deadline, counted as a call.
  absl::StatusOr<ClusterStatus> PollClusterStatus();
  // Polls the master's stats (evictions).
  void MonitorLoop();

  // The fault schedule, on the calling (owner) thread.
  absl::Status KillLoop();
  // Waits `d` while watching the daemons expected up; restarts one that
  // exited by itself. Errors: a restart failed.
  absl::Status WatchFor(absl::Duration d);
  absl::Status RestartDaemon(size_t i, const char* why);
  // Master HA (crashtest_faults.cc): the index of the master that leads.
  absl::StatusOr<size_t> LeaderIndex();
  // Waits until the master that leads serves with a standby past its copy
  // (CrashTestOptions::standby_wait); returns its index and adds its sync
  // timeouts to the report.
  absl::StatusOr<size_t> CaughtUpLeader();
  // After the kill at `killed`: probes until a lookup and a put succeed.
  absl::Status MeasureFailover(absl::Time killed, int kill);
  // Puts probe key `n` (4 KiB; charged to every node) with `call`; whether
  // it is stored (or was by an earlier attempt).
  bool PutProbe(int n, const CallOptions& call, std::string* why = nullptr);

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
  std::unique_ptr<testing::RestartableCluster> cluster_;
  std::unique_ptr<Client> client_;
  // Master HA: etcd (who leads) and the probe keys stored so far.
  std::unique_ptr<EtcdClient> etcd_;
  std::vector<std::string> probe_keys_;
  // Watches the leader key: when each change reached this process.
  std::unique_ptr<EtcdWatcher> leader_watch_;
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
  // Master HA: (arrival, deleted) of each leader-key change.
  std::vector<std::pair<absl::Time, bool>> leader_events_ ABSL_GUARDED_BY(mu_);
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

}  // namespace hymcache::crashtest
