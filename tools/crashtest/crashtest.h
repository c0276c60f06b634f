// CrashTest: a Jepsen-style crash test of a whole HyMCache cluster.
//
// Runs a master and storage nodes (DRAM and hybrid) as child processes
// (Cluster), drives a multi-turn KV-cache workload through the real SDK
// from several concurrent conversations, and meanwhile SIGKILLs and
// restarts random daemons at seeded random moments. Every block's bytes are
// a function of its key (block_data.h), so every loaded byte is checked.
//
// What it checks (CrashTestReport):
//  - wrong bytes: a Load/Get never returns bytes other than the key's own
//    (a miss or an error is fine);
//  - deadlines: no client call returns more than `max_overrun` after its
//    deadline (a Store after its timeout);
//  - live-node durability: a block whose Store committed on a node that
//    was never killed since (the master may be killed any number of times)
//    and that cannot have been evicted, and every block before it in its
//    chain likewise (a block after a lost one is unreachable: the master
//    may drop it), is still listed and served, at audits before each kill
//    and after recovery. Eviction is ruled out per node by accounting:
//    the master evicts on a node only when no alive node has room for a
//    put, and it allocates best-fit from coalesced free space, so a node
//    whose allocations by this test (every block ever placed there, rounded
//    up to the alignment, plus puts whose node is unknown; for a DRAM node,
//    since it last restarted empty) stay within its capacity never needed
//    to evict. Blocks on nodes past that bound are "unverifiable", never
//    "lost";
//  - recovery: after the last restart, once every node is alive again and
//    `recovery_wait` has passed (a reconciliation round), every key the
//    test stored that the master lists must load with the right bytes
//    (listed-but-unreadable keys are stale listings);
//  - daemons never exit by themselves, and stop cleanly on SIGTERM at the
//    end;
//  - `hymctl fsck` finds the master's listings and the nodes' extents
//    consistent after recovery (RunFsck, the fsck hook).
//
// Thread safety: a CrashTest runs once, from one thread, which must live
// until Run returns (the daemons die with it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/cluster.h"

namespace hymcache::crashtest {

struct CrashTestOptions {
  // The cluster: binaries, work_dir (required), nodes, extra daemon flags.
  testing::RestartableClusterOptions cluster;
  // hymctl binary for the fsck hook. Required with fsck or fsck_repair.
  std::string hymctl_binary;
  // File holding the bearer token of the workload's client and of hymctl
  // fsck (an admin's: admins may also load and store), for daemons run with
  // --auth_tokens_file (pass it, and the nodes' --token_file, through the
  // cluster's extra daemon flags). "" sends none. Default: "".
  std::string token_file;

  // Seed of every random choice (kill moments and victims, conversations).
  // Default: 1.
  uint64_t seed = 1;

  // --- Workload ---
  // Concurrent conversations (one thread each). Default: 4.
  int conversations = 4;
  // Turns per conversation: uniform in [1, max_turns]. Default: 8.
  int max_turns = 8;
  // Blocks each turn appends: uniform in [1, max_new_blocks]. Default: 3.
  int max_new_blocks = 3;
  // Conversations open with one of `system_prompts` shared prefixes of
  // `system_prompt_blocks` blocks. Default: 3 prompts of 2 blocks.
  int system_prompts = 3;
  int system_prompt_blocks = 2;
  // Block lengths, derived from the key, uniform in this range (not a
  // multiple of anything). Default: 16 KiB .. 64 KiB.
  uint64_t min_block_bytes = 16 << 10;
  uint64_t max_block_bytes = 64 << 10;
  // Pause between a conversation's turns. Default: 20 ms.
  absl::Duration think_time = absl::Milliseconds(20);
  // Think-time hints, as an engine sends them: after each turn but the
  // last, Client::HintNextTurn of the conversation's chain (hybrid nodes
  // stage it, the master keeps it recent); after the last,
  // HintConversationEnded (the nodes drop it, the master evicts its own
  // blocks first). Advice: the checks are the same. Default: false.
  bool hints = false;
  // Deadline of each Load, and timeout of each Store. Default: 2 s each.
  absl::Duration load_deadline = absl::Seconds(2);
  // The workload client's ClientOptions of the same names.
  std::string client_poll_strategy;
  int master_connections = 1;
  absl::Duration store_timeout = absl::Seconds(2);
  // A call returning later than this past its deadline fails the run.
  // Default: 1 s.
  absl::Duration max_overrun = absl::Seconds(1);

  // --- Faults ---
  // SIGKILLs, each of a daemon chosen uniformly (the master or a node).
  // Default: 20.
  int kills = 20;
  // Time between one restart and the next kill: uniform in this range.
  // Default: 1 s .. 4 s.
  absl::Duration min_kill_gap = absl::Seconds(1);
  absl::Duration max_kill_gap = absl::Seconds(4);
  // How long a killed daemon stays down: uniform in [0, max_down_time].
  // Default: 1 s.
  absl::Duration max_down_time = absl::Seconds(1);

  // --- Master HA (cluster.masters > 1) ---
  // Every kill is of the master that leads (etcd's leader key). Before it
  // the test waits, up to standby_wait, until a standby is past its full
  // copy of the leader's store (so that with --replication=sync every
  // commit acknowledged since is held by a standby) and puts a probe key;
  // after it, probes measure the time from the kill to the first
  // successful BatchLookup (finding that key) and the first successful Put
  // (CrashTestReport::failover_*). A failover slower than
  // max_failover fails the run (zero: no bound). Defaults: 60 s, zero.
  absl::Duration standby_wait = absl::Seconds(60);
  absl::Duration max_failover = absl::ZeroDuration();

  // Before each kill, check that every block that must still be served (see
  // live-node durability above) is listed, and read this many of them
  // (-1: no audits). Default: 50.
  int audit_reads = 50;

  // --- Recovery ---
  // After the workload stops and every node is alive again: time given to
  // the cluster to converge (one reconciliation round) before the checks.
  // Default: 5 s.
  absl::Duration recovery_wait = absl::Seconds(5);
  // Bound on waiting for every node to be alive after the last restart.
  // Default: 120 s.
  absl::Duration alive_timeout = absl::Seconds(120);
  // Fail the run when keys are listed but unreadable after recovery, when a
  // listed block follows an unlisted one in its chain (an unreachable tail),
  // or when fsck, if it runs, is not clean. Default: true.
  bool require_clean_recovery = true;
  // Fail the run when a block that must still be served (see live-node
  // durability above) is not. Default: true.
  bool require_live_node_durability = true;
  // Run `hymctl fsck` after recovery (fsck_repair: also `hymctl fsck
  // --repair` after the final reads); needs hymctl_binary. Default: true,
  // false.
  bool fsck = true;
  bool fsck_repair = false;
  // Bound on each daemon's graceful stop at the end. Default: 60 s.
  absl::Duration stop_timeout = absl::Seconds(60);

  absl::Status Validate() const;
};

// What a run saw. Counts are blocks unless named otherwise.
struct CrashTestReport {
  // Kills per daemon name, and in total.
  std::map<std::string, uint64_t> kills_by_daemon;
  uint64_t kills = 0;
  // Client calls made by the workload and the final checks.
  uint64_t loads = 0;
  uint64_t stores = 0;
  uint64_t other_calls = 0;  // lookups, gets and status polls
  uint64_t operations() const { return loads + stores + other_calls; }
  // Blocks whose bytes were checked after a Load or Get.
  uint64_t blocks_verified = 0;
  uint64_t bytes_verified = 0;
  // Blocks that came back with wrong bytes (or length), and the bytes.
  uint64_t wrong_blocks = 0;
  uint64_t wrong_bytes = 0;
  // Of those, blocks that were another key's block.
  uint64_t swapped_blocks = 0;
  // Calls that returned more than max_overrun past their deadline, and the
  // largest lateness seen (any call).
  uint64_t deadline_overruns = 0;
  absl::Duration max_overrun = absl::ZeroDuration();
  std::string max_overrun_call;  // which call that was
  // Workload outcomes.
  uint64_t blocks_loaded = 0;  // by workload Loads
  uint64_t blocks_stored = 0;  // committed (kStored)
  uint64_t store_refused = 0;  // refused for room (ResourceExhausted)
  uint64_t store_failed = 0;   // other per-key failures
  uint64_t load_errors = 0;    // Loads failing as a whole
  uint64_t refused_reads = 0;  // during the run: listed, the node refused
  // Why Loads stopped short and Store keys failed: "Load NOT_FOUND" etc. ->
  // count, and the first message of each kind.
  std::map<std::string, uint64_t> outcomes;
  std::map<std::string, std::string> outcome_examples;
  // Evicted objects the master reported (sum over its incarnations of the
  // last value polled; a lower bound).
  uint64_t evictions_seen = 0;

  // After recovery.
  uint64_t keys_stored = 0;     // distinct keys any Store was given
  uint64_t keys_listed = 0;     // of those, BatchLookup found
  uint64_t keys_readable = 0;   // listed and loaded with the right bytes
  uint64_t stale_listings = 0;  // listed but unreadable
  uint64_t unreachable_tails =
      0;  // listed after an unlisted block of its chain
  // Committed blocks on nodes never killed since their Store began whose
  // node never needed to evict: checked (by the audits before each kill and
  // after recovery; a block counts once per check), and of those the
  // distinct blocks not served. Audits made, and blocks they read.
  uint64_t live_node_checked = 0;
  uint64_t lost_on_live_node = 0;
  uint64_t audits = 0;
  uint64_t audit_reads = 0;
  // lost_on_live_node per node name.
  std::map<std::string, uint64_t> lost_by_node;
  // After recovery: committed blocks whose node could have evicted (not
  // checked), and of those not served.
  uint64_t live_node_unverifiable = 0;
  uint64_t live_node_missing_maybe_evicted = 0;
  // Committed blocks on a node killed after their Store began that are no
  // longer served.
  uint64_t lost_on_killed_node = 0;
  // The fsck hook: whether it ran, its verdict and findings per kind, and
  // the listings `fsck --repair` dropped (-1: it did not run).
  bool fsck_ran = false;
  bool fsck_clean = false;
  std::map<std::string, uint64_t> fsck_findings;
  int64_t repaired = -1;

  // Master HA: per leader kill, the time from the kill to the first
  // successful lookup and put; leader terms that ended with the master
  // exiting (status 3, restarted as a supervisor would); commits a leader
  // answered at its sync timeout without a standby holding them (sum of
  // each leader's count polled before it was killed: a lower bound).
  std::vector<absl::Duration> failover_lookup;
  std::vector<absl::Duration> failover_put;
  // Of the same kills, the time until the dead leader's key was gone (its
  // lease expired, or a standby revoked it) and until a new leader's key
  // appeared, as this process's etcd watch saw them.
  std::vector<absl::Duration> failover_key_gone;
  std::vector<absl::Duration> failover_elected;
  uint64_t terms_ended = 0;
  uint64_t sync_timeouts = 0;

  // Daemons that exited by themselves, failed to start, or did not stop
  // cleanly on SIGTERM at the end (each described in `problems`).
  uint64_t daemon_crashes = 0;
  uint64_t unclean_stops = 0;
  uint64_t failed_starts = 0;
  absl::Duration run_time = absl::ZeroDuration();

  // Reasons the run failed (empty: passed).
  std::vector<std::string> failures;
  bool passed() const { return failures.empty(); }

  // One line: kills, operations, blocks verified, wrong bytes, lost on a
  // killed node, stale listings, repaired, and the verdict.
  std::string SummaryLine() const;
  // Master HA: "failover: N leader kills; lookup p50 .. p99 .. max ..;
  // put ..." ("" without leader kills).
  std::string FailoverLine() const;
};

class CrashTest {
 public:
  // Errors: InvalidArgument (options).
  static absl::StatusOr<std::unique_ptr<CrashTest>> Create(
      const CrashTestOptions& options);
  ~CrashTest();

  // Runs the whole test, logging progress to `log`. Errors: the cluster did
  // not start, or a daemon could not be restarted (the report so far is
  // lost: the run is void, not passed).
  absl::StatusOr<CrashTestReport> Run(std::ostream& log);

 private:
  class Impl;
  explicit CrashTest(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hymcache::crashtest
