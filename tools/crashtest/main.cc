// crashtest: kills and restarts the daemons of a HyMCache cluster under a
// multi-turn workload and checks that no byte is ever wrong, no call
// outlives its deadline and the cluster converges afterwards. See
// tools/crashtest/crashtest.h for what is checked.
//
//   bazel run //tools/crashtest -- --kills=20 --seed=7
//   bazel run -c opt //tools/crashtest -- --kills=1000
//
// Prints progress on stderr and one summary line on stdout; exits 0 when
// every check passed, 1 when one failed, 2 on bad flags, 3 when the run
// could not be carried out (the cluster did not start or restart).
#include <gflags/gflags.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/options.h"
#include "common/bytes.h"
#include "common/cli.h"
#include "tools/crashtest/crashtest.h"

DEFINE_uint64(seed, 1, "seed of the kill schedule and the workload");
DEFINE_int32(kills, 20, "SIGKILLs of a random daemon (master or node)");
DEFINE_int32(min_kill_gap_ms, 1000,
             "least time between a restart and the next kill");
DEFINE_int32(max_kill_gap_ms, 4000,
             "most time between a restart and the next kill");
DEFINE_int32(max_down_ms, 1000, "a killed daemon stays down up to this long");
DEFINE_int32(masters, 1,
             "masters; more than one: master HA through a 1-member etcd "
             "(/usr/bin/etcd), and every kill is of the leader (docs/ha.md)");
DEFINE_int32(lease_ttl_s, 1, "HA: the masters' --lease_ttl_s");
DEFINE_string(replication, "sync", "HA: the masters' --replication");
DEFINE_int32(max_failover_ms, 0,
             "HA: fail when the first lookup or put after a leader kill "
             "takes longer (0: no bound)");

DEFINE_int32(conversations, 4, "concurrent conversations (threads)");
DEFINE_int32(max_turns, 8, "turns per conversation: 1..max_turns");
DEFINE_int32(max_new_blocks, 3, "blocks a turn appends: 1..max_new_blocks");
DEFINE_int32(system_prompts, 3,
             "shared system prompts conversations open with");
DEFINE_int32(system_prompt_blocks, 2, "blocks of each system prompt");
DEFINE_string(min_block_bytes, "16K",
              "smallest block (lengths derive from keys)");
DEFINE_string(max_block_bytes, "64K", "largest block");
DEFINE_int32(think_ms, 20, "pause between a conversation's turns");
DEFINE_bool(hints, false,
            "think-time hints: HintNextTurn after each turn, "
            "HintConversationEnded after a conversation's last");
DEFINE_int32(load_deadline_ms, 2000, "deadline of each Load");
DEFINE_string(client_poll_strategy,
              hymcache::ClientOptions().grpc_poll_strategy,
              "the workload client's gRPC poll strategy "
              "(ClientOptions::grpc_poll_strategy; default: the SDK's)");
DEFINE_int32(master_connections, hymcache::ClientOptions().master_connections,
             "the workload client's ClientOptions::master_connections "
             "(default: the SDK's)");
DEFINE_int32(store_timeout_ms, 2000, "timeout of each Store");
DEFINE_int32(max_overrun_ms, 1000,
             "fail when a call returns later than this past its deadline");

DEFINE_int32(dram_nodes, 1, "storage nodes with --device=dram");
DEFINE_int32(hybrid_nodes, 1, "storage nodes with --device=hybrid");
DEFINE_string(dram_bytes, "128M", "DRAM of each dram node");
DEFINE_string(hybrid_capacity_bytes, "32M",
              "capacity file of each hybrid node");
DEFINE_string(staging_bytes, "4M", "hybrid nodes: DRAM staging window");
DEFINE_string(write_buffer_bytes, "2M", "hybrid nodes: DRAM write buffer");
DEFINE_int32(node_timeout_ms, 3000, "master: a node silent this long is dead");
DEFINE_int32(heartbeat_interval_ms, 500,
             "master: heartbeat period of the nodes");
DEFINE_string(master_args, "",
              "extra flags for every master run, space-separated");
DEFINE_string(storage_args, "",
              "extra flags for every storage-node run, space-separated");

DEFINE_int32(audit_reads, 50,
             "before each kill, check that blocks on never-killed nodes are "
             "listed and read this many of them (-1: no audits)");
DEFINE_int32(recovery_wait_ms, 5000,
             "after the workload, once every node is alive again: time for "
             "the cluster to converge (a reconciliation round) before the "
             "final checks");
DEFINE_int32(
    alive_timeout_ms, 120000,
    "most time to wait for every node to be alive after the last restart");
DEFINE_bool(require_clean_recovery, true,
            "fail when keys are listed but unreadable after recovery (or "
            "fsck is not clean)");
DEFINE_bool(require_live_node_durability, true,
            "fail when a block committed on a node that was never killed "
            "since (and never full enough to evict) is no longer served");
DEFINE_bool(node_same_ports, true,
            "restart storage nodes on the ports of their first run (false: "
            "new ports each run)");
DEFINE_bool(fsck, true,
            "run `hymctl fsck` after recovery; with --require_clean_recovery "
            "it must find the cluster consistent");
DEFINE_bool(fsck_repair, false,
            "after the final reads, run `hymctl fsck --repair` (the summary's "
            "repaired)");
DEFINE_int32(reconcile_interval_ms, 2000,
             "master: period of each node's background reconciliation (-1: "
             "leave the master's default)");

DEFINE_string(
    work_dir, "",
    "daemon data (master RocksDB, capacity files); default: a new "
    "directory under TEST_TMPDIR or /tmp, removed after a passing run");
DEFINE_string(daemon_log_dir, "", "daemon logs (default: work_dir)");
DEFINE_string(master_binary, "", "hymcache-master (default: from runfiles)");
DEFINE_string(storage_binary, "", "hymcache-storage (default: from runfiles)");
DEFINE_string(token_file, "",
              "bearer token (an admin's) of the workload's client and of "
              "hymctl fsck, for daemons given --auth_tokens_file through "
              "--master_args / --storage_args (docs/security.md)");
DEFINE_string(hymctl_binary, "", "hymctl for --fsck (default: from runfiles)");

namespace {

std::vector<std::string> Words(const std::string& s) {
  return absl::StrSplit(s, ' ', absl::SkipEmpty());
}

bool Bytes(const std::string& flag, const std::string& value, uint64_t* out) {
  if (hymcache::ParseBytes(value, out)) return true;
  std::cerr << "crashtest: bad --" << flag << " '" << value
            << "' (want e.g. 65536, 64K, 32M)\n";
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "crashtest",
       .usage = "crashtest [--kills=20] [--seed=1] ...: SIGKILL and restart "
                "HyMCache daemons under a workload; check bytes, deadlines "
                "and recovery",
       .main_file = __FILE__},
      &argc, &argv);
  signal(SIGPIPE, SIG_IGN);

  hymcache::crashtest::CrashTestOptions o;
  hymcache::testing::RestartableClusterOptions& c = o.cluster;
  c.master_binary =
      FLAGS_master_binary.empty()
          ? hymcache::testing::BinaryRunfile(argv[0], "master/hymcache-master")
          : FLAGS_master_binary;
  c.storage_binary = FLAGS_storage_binary.empty()
                         ? hymcache::testing::BinaryRunfile(
                               argv[0], "storage_node/hymcache-storage")
                         : FLAGS_storage_binary;
  o.token_file = FLAGS_token_file;
  o.hymctl_binary =
      FLAGS_hymctl_binary.empty()
          ? hymcache::testing::BinaryRunfile(argv[0], "tools/hymctl/hymctl")
          : FLAGS_hymctl_binary;
  if (c.master_binary.empty() || c.storage_binary.empty()) {
    std::cerr << "crashtest: daemon binaries not found in the runfiles; pass "
                 "--master_binary and --storage_binary\n";
    return 2;
  }
  bool own_work_dir = false;
  c.work_dir = FLAGS_work_dir;
  if (c.work_dir.empty()) {
    const char* tmp = getenv("TEST_TMPDIR");
    c.work_dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                              "/hymcache-crashtest-", getpid());
    own_work_dir = true;
  }
  c.log_dir = FLAGS_daemon_log_dir;
  uint64_t dram = 0, hybrid = 0, staging = 0, wbuf = 0;
  if (!Bytes("dram_bytes", FLAGS_dram_bytes, &dram) ||
      !Bytes("hybrid_capacity_bytes", FLAGS_hybrid_capacity_bytes, &hybrid) ||
      !Bytes("staging_bytes", FLAGS_staging_bytes, &staging) ||
      !Bytes("write_buffer_bytes", FLAGS_write_buffer_bytes, &wbuf) ||
      !Bytes("min_block_bytes", FLAGS_min_block_bytes, &o.min_block_bytes) ||
      !Bytes("max_block_bytes", FLAGS_max_block_bytes, &o.max_block_bytes)) {
    return 2;
  }
  using Device = hymcache::testing::StorageNodeSpec::Device;
  for (int i = 0; i < FLAGS_dram_nodes; ++i) {
    c.nodes.push_back({absl::StrCat("dram-", i), Device::kDram, dram});
  }
  for (int i = 0; i < FLAGS_hybrid_nodes; ++i) {
    c.nodes.push_back(
        {absl::StrCat("hybrid-", i), Device::kHybrid, hybrid, staging, wbuf});
  }
  c.master_args = {
      absl::StrCat("--node_timeout_ms=", FLAGS_node_timeout_ms),
      absl::StrCat("--heartbeat_interval_ms=", FLAGS_heartbeat_interval_ms)};
  if (FLAGS_reconcile_interval_ms >= 0) {
    c.master_args.push_back(
        absl::StrCat("--reconcile_interval_ms=", FLAGS_reconcile_interval_ms));
  }
  c.masters = FLAGS_masters;
  if (c.masters > 1) {
    c.master_args.push_back(absl::StrCat("--lease_ttl_s=", FLAGS_lease_ttl_s));
    c.master_args.push_back("--replication=" + FLAGS_replication);
  }
  o.max_failover = absl::Milliseconds(FLAGS_max_failover_ms);
  for (std::string& w : Words(FLAGS_master_args)) c.master_args.push_back(w);
  c.storage_args = Words(FLAGS_storage_args);

  o.seed = FLAGS_seed;
  o.conversations = FLAGS_conversations;
  o.max_turns = FLAGS_max_turns;
  o.max_new_blocks = FLAGS_max_new_blocks;
  o.system_prompts = FLAGS_system_prompts;
  o.system_prompt_blocks = FLAGS_system_prompt_blocks;
  o.think_time = absl::Milliseconds(FLAGS_think_ms);
  o.hints = FLAGS_hints;
  o.load_deadline = absl::Milliseconds(FLAGS_load_deadline_ms);
  o.client_poll_strategy = FLAGS_client_poll_strategy;
  o.master_connections = FLAGS_master_connections;
  o.store_timeout = absl::Milliseconds(FLAGS_store_timeout_ms);
  o.max_overrun = absl::Milliseconds(FLAGS_max_overrun_ms);
#ifdef HYMCACHE_TSAN
  // Under ThreadSanitizer every daemon runs 5-15x slower on a small
  // machine: a call finishing 1-2 s late measures the sanitizer, not the
  // store. Wrong bytes, listings and fsck stay exact.
  if (gflags::GetCommandLineFlagInfoOrDie("max_overrun_ms").is_default) {
    o.max_overrun = absl::Seconds(5);
  }
#endif
  o.kills = FLAGS_kills;
  o.min_kill_gap = absl::Milliseconds(FLAGS_min_kill_gap_ms);
  o.max_kill_gap = absl::Milliseconds(FLAGS_max_kill_gap_ms);
  o.max_down_time = absl::Milliseconds(FLAGS_max_down_ms);
  o.audit_reads = FLAGS_audit_reads;
  o.recovery_wait = absl::Milliseconds(FLAGS_recovery_wait_ms);
  o.alive_timeout = absl::Milliseconds(FLAGS_alive_timeout_ms);
  o.require_clean_recovery = FLAGS_require_clean_recovery;
  o.require_live_node_durability = FLAGS_require_live_node_durability;
  c.node_same_ports = FLAGS_node_same_ports;
  o.fsck = FLAGS_fsck;
  o.fsck_repair = FLAGS_fsck_repair;

  auto test = hymcache::crashtest::CrashTest::Create(o);
  if (!test.ok()) {
    std::cerr << "crashtest: " << test.status().message() << "\n";
    return 2;
  }
  auto report = (*test)->Run(std::cerr);
  test->reset();
  if (!report.ok()) {
    std::cerr << "crashtest: run void: " << report.status() << " (logs in "
              << (c.log_dir.empty() ? c.work_dir : c.log_dir) << ")\n";
    return 3;
  }
  const auto& r = *report;
  std::cerr << "crashtest: loads=" << r.loads << " stores=" << r.stores
            << " other_calls=" << r.other_calls
            << " blocks_loaded=" << r.blocks_loaded
            << " blocks_stored=" << r.blocks_stored
            << " store_refused=" << r.store_refused
            << " store_failed=" << r.store_failed
            << " load_errors=" << r.load_errors
            << " refused_reads=" << r.refused_reads
            << " swapped_blocks=" << r.swapped_blocks
            << " latest_return=" << absl::FormatDuration(r.max_overrun)
            << " past its deadline ("
            << (r.max_overrun_call.empty() ? "none late" : r.max_overrun_call)
            << ")\n"
            << "crashtest: after recovery: keys_stored=" << r.keys_stored
            << " listed=" << r.keys_listed << " readable=" << r.keys_readable
            << " stale=" << r.stale_listings
            << " live_node_checked=" << r.live_node_checked
            << " (audits=" << r.audits << ", reads=" << r.audit_reads
            << ") live_node_unverifiable=" << r.live_node_unverifiable
            << " (missing, maybe evicted: " << r.live_node_missing_maybe_evicted
            << ") fsck="
            << (r.fsck_ran ? (r.fsck_clean ? "clean" : "NOT clean") : "off")
            << " failed_starts=" << r.failed_starts << "\n";
  for (const auto& [kind, count] : r.fsck_findings) {
    std::cerr << "crashtest:   fsck " << kind << ": " << count << "\n";
  }
  for (const auto& [node, count] : r.lost_by_node) {
    std::cerr << "crashtest:   lost on live node " << node << ": " << count
              << "\n";
  }
  for (const auto& [kind, count] : r.outcomes) {
    std::cerr << "crashtest:   " << kind << " x" << count << " (e.g. "
              << r.outcome_examples.at(kind) << ")\n";
  }
  if (!r.FailoverLine().empty()) std::cout << r.FailoverLine() << std::endl;
  std::cout << r.SummaryLine() << std::endl;
  if (r.passed() && own_work_dir) {
    std::error_code ec;
    std::filesystem::remove_all(c.work_dir, ec);
  } else {
    std::cerr << "crashtest: data and logs kept in " << c.work_dir << "\n";
  }
  return r.passed() ? 0 : 1;
}
