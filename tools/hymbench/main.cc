// hymbench: replays a request trace (Mooncake JSONL, or a synthetic
// multi-turn workload) against a live HyMCache cluster and reports prefix
// hit ratio vs the infinite-cache ceiling, load bandwidth and latency, and
// write admission, per turn or per window of trace time.
//
//   hymbench replay --master=HOST:PORT --trace=PATH [flags]
//   hymbench replay --master=HOST:PORT --synthetic --conversations=N --turns=T
//   hymbench gen --conversations=N --turns=T ... > trace.jsonl
//   hymbench ceiling --trace=PATH | --synthetic ...
//   hymbench plot --json=ON.json[,OFF.json] --plot=DIR
//
// Flags become TraceOptions / SyntheticOptions / ReplayOptions /
// ReportOptions here; all logic lives in the libraries of this package.
// Exit status: 0 success, 1 the run failed (unreachable cluster, every Load
// failed, a verification error, unwritable output), 2 bad usage.
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/bytes.h"
#include "common/cli.h"
#include "common/security.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "tools/hymbench/plot.h"
#include "tools/hymbench/replay.h"
#include "tools/hymbench/report.h"
#include "tools/hymbench/trace.h"

// Workload.
DEFINE_string(trace, "", "Mooncake JSONL trace to replay (replay, ceiling).");
DEFINE_bool(synthetic, false,
            "Use the synthetic multi-turn workload instead of --trace.");
DEFINE_uint64(max_requests, 0, "Use only the first N requests (0: all).");
DEFINE_int64(block_tokens, 512, "Tokens per KV block (trace hash_ids granularity).");
DEFINE_bool(check_block_count, true,
            "Reject trace lines whose hash_ids count != ceil(input_length / block_tokens).");
DEFINE_int32(conversations, 8, "Synthetic: conversations.");
DEFINE_int32(turns, 5, "Synthetic: turns per conversation.");
DEFINE_int64(system_prompt_tokens, 1024, "Synthetic: system prompt tokens.");
DEFINE_bool(shared_system_prompt, true,
            "Synthetic: all conversations share one system prompt.");
DEFINE_int64(user_tokens, 1024, "Synthetic: new user tokens per turn.");
DEFINE_int64(output_tokens, 256, "Synthetic: model output tokens per turn.");
DEFINE_double(turn_gap_ms, 1000, "Synthetic: trace time between turns of a conversation.");
DEFINE_string(out, "-", "gen: output file ('-': stdout).");
DEFINE_bool(turn_fields, true,
            "gen: write the \"conversation\" and \"turn\" fields (false: the plain "
            "Mooncake format, whose turns replay infers).");
DEFINE_bool(infer_turns, true,
            "Requests without a \"turn\" field (Mooncake traces) get a conversation and "
            "turn inferred from their hash_ids prefix chains, so that the report has a "
            "per-turn ladder. The rule: with full(p) = the full blocks of p "
            "(floor(input_length / block_tokens)), a request r continues an earlier "
            "request p when r's first full(p) hash_ids are p's and r's prompt is longer; "
            "its parent is the p with the most full blocks (the earliest one not yet "
            "continued, else the latest), and r is the parent's next turn; with no "
            "parent r starts a conversation at turn 0 (docs/performance.md).");

// Replay.
DEFINE_string(master, "127.0.0.1:50051", "Master gRPC address host:port.");
DEFINE_string(token_file, "",
              "File holding the bearer token (role engine) for the master.");
DEFINE_string(tls_ca, "", "PEM CA of the master's certificate (enables TLS).");
DEFINE_string(tls_cert, "", "PEM client certificate for mutual TLS.");
DEFINE_string(tls_key, "", "PEM private key of --tls_cert.");
DEFINE_string(block_bytes, "256K", "Bytes per KV block, e.g. 262144, 256K, 1M.");
DEFINE_int32(concurrency, 1, "Worker threads, each running one request at a time.");
DEFINE_string(time_scale, "max",
              "Replay time = trace time / this; 'max' or 0: as fast as possible.");
DEFINE_bool(prefetch, true, "LoadOptions.prefetch: stage each node's blocks ahead.");
DEFINE_bool(verify, false, "Check every loaded byte.");
DEFINE_bool(wait_stores, false,
            "Wait for each request's store before the worker's next request "
            "(deterministic hit ratios with --concurrency=1; not engine-like).");
DEFINE_bool(store, true,
            "Store each request's missing blocks after it (false: read-only "
            "replay of what the cluster holds).");
DEFINE_string(namespace, "hymbench", "Key namespace: runs in different namespaces share nothing.");
DEFINE_int64(load_timeout_ms, 0, "Deadline of each Load (0: the client's default, 10 s).");
DEFINE_int64(store_timeout_ms, 2000, "Each Store's deadline (StoreOptions.deadline), from its start.");
DEFINE_string(max_store_inflight, "2G",
              "Most request-buffer bytes held by unfinished stores; beyond it "
              "stores are dropped (0: no limit).");
DEFINE_int32(store_threads, 2, "ClientOptions.store_threads.");
DEFINE_string(transport, "tcp",
              "ClientOptions.transport: tcp, shm (same host), rdma or auto.");
DEFINE_int32(max_pending_stores, 64, "ClientOptions.max_pending_stores.");
DEFINE_int64(store_queue_wait_ms, 1000,
             "A store the client refuses because max_pending_stores are pending is "
             "retried every ms for up to this long (reaping finished stores) before "
             "its blocks count as refused_store_queue; 0: give up at once.");
DEFINE_string(pool_bytes, "0",
              "Each worker's KV pool (preallocated, pre-faulted, registered once); "
              "0: twice the largest request. A request larger than the pool is an error.");
DEFINE_bool(
    hint_next_turn, false,
    "After each request (once its store is done), send "
    "Client::HintNextTurn for its blocks, as an engine does when a turn "
    "is answered (think-time staging on hybrid nodes).");
DEFINE_int64(hint_hold_ms, 60000, "TurnHintOptions::hold of those hints.");
DEFINE_bool(
    hint_conversation_end, false,
    "After a conversation's last request in the trace (once its store is "
    "done), send Client::HintConversationEnded for its blocks instead, as an "
    "engine does when a session closes: the master evicts them first.");
DEFINE_string(hint_namespace, "",
              "Hints name the request's blocks in this namespace instead (a "
              "run there stored them; this one never reads them): every "
              "hint wrong, to measure wasted staging.");
DEFINE_bool(register_pool, true, "Register each worker's KV pool with Client::RegisterMemory.");
DEFINE_bool(check_cluster, true, "Fail fast unless the master answers and has a live node.");
DEFINE_double(progress_s, 1, "Progress line on stderr every N seconds (0: none).");

// Report.
DEFINE_string(group_by, "auto",
              "Report rows: auto (turn if every request has one, given or inferred; else "
              "window), turn, window.");
DEFINE_double(window_s, 60, "Window of trace time per report row (seconds).");
DEFINE_string(csv, "", "Write the report as CSV to this path.");
DEFINE_string(json, "",
              "Write the report (and per-request records) as JSON to this path. plot: the "
              "reports to plot, comma-separated.");
DEFINE_string(plot, "",
              "Write PNG plots of hit ratio and load bandwidth per turn to this directory "
              "(replay: of this run, via --json or DIR/hymbench.json; plot: of --json's "
              "reports, one line each, e.g. prefetch on vs off). Runs the plot script "
              "built into hymbench (tools/hymbench/plot.py) with --python.");
DEFINE_string(python, "/usr/bin/python3",
              "Python 3 with matplotlib for --plot (Debian: python3-matplotlib).");

namespace hymcache::hymbench {
namespace {

constexpr char kUsage[] =
    "hymbench replay --master=HOST:PORT --trace=PATH [--max_requests=N] "
    "[--block_bytes=256K] [--concurrency=1] [--time_scale=max] [--prefetch] "
    "[--verify] [--wait_stores] [--namespace=NS] [--csv=PATH] [--json=PATH] "
    "[--window_s=60] [--plot=DIR]\n"
    "  hymbench replay --master=HOST:PORT --synthetic --conversations=N --turns=T ...\n"
    "  hymbench gen --conversations=N --turns=T [--system_prompt_tokens] "
    "[--user_tokens] [--output_tokens] [--turn_gap_ms] [--turn_fields=false] > trace.jsonl\n"
    "  hymbench ceiling --trace=PATH | --synthetic ...\n"
    "  hymbench plot --json=ON.json[,OFF.json,...] --plot=DIR\n"
    "Reports are per turn: a trace's \"turn\" fields, or for a Mooncake trace turns "
    "inferred from its prefix chains (see --infer_turns); --group_by=window for "
    "windows of trace time. --plot=DIR writes hymbench_hit_ratio.png and "
    "hymbench_load_gbps.png per turn (replay: this run; plot: one line per report, "
    "labelled prefetch on/off from its config; docs/performance.md).";

int UsageError(const std::string& message) {
  std::cerr << "hymbench: " << message << "\nusage: " << kUsage << "\n";
  return 2;
}

int Fail(const std::string& message) {
  std::cerr << "hymbench: " << message << "\n";
  return 1;
}


SyntheticOptions SyntheticFromFlags() {
  SyntheticOptions o;
  o.conversations = FLAGS_conversations;
  o.turns = FLAGS_turns;
  o.system_prompt_tokens = FLAGS_system_prompt_tokens;
  o.shared_system_prompt = FLAGS_shared_system_prompt;
  o.user_tokens = FLAGS_user_tokens;
  o.output_tokens = FLAGS_output_tokens;
  o.turn_gap_ms = FLAGS_turn_gap_ms;
  o.block_tokens = FLAGS_block_tokens;
  return o;
}

// The workload of `replay` and `ceiling`.
absl::StatusOr<std::vector<Request>> LoadWorkload() {
  if (FLAGS_synthetic) {
    auto requests = GenerateSynthetic(SyntheticFromFlags());
    if (requests.ok() && FLAGS_max_requests > 0 && requests->size() > FLAGS_max_requests) {
      requests->resize(FLAGS_max_requests);
    }
    return requests;
  }
  TraceOptions o;
  o.max_requests = FLAGS_max_requests;
  o.block_tokens = FLAGS_block_tokens;
  o.check_block_count = FLAGS_check_block_count;
  auto requests = LoadTrace(FLAGS_trace, o);
  if (requests.ok() && FLAGS_infer_turns && FLAGS_block_tokens >= 1) {
    InferTurns(&*requests, FLAGS_block_tokens);
  }
  return requests;
}

// The workload of `replay` and `ceiling`: --trace or --synthetic. Returns
// the exit status on failure (2: bad flags, 1: unreadable trace), else 0.
int LoadRequests(std::vector<Request>* out) {
  if (FLAGS_synthetic == !FLAGS_trace.empty()) {
    return UsageError("give exactly one of --trace=PATH and --synthetic");
  }
  absl::StatusOr<std::vector<Request>> requests = LoadWorkload();
  if (!requests.ok()) {
    return FLAGS_synthetic ? UsageError(std::string(requests.status().message()))
                           : Fail(std::string(requests.status().message()));
  }
  *out = std::move(*requests);
  return 0;
}

int RunGen() {
  auto requests = GenerateSynthetic(SyntheticFromFlags());
  if (!requests.ok()) return UsageError(std::string(requests.status().message()));
  if (FLAGS_max_requests > 0 && requests->size() > FLAGS_max_requests) {
    requests->resize(FLAGS_max_requests);
  }
  if (!FLAGS_turn_fields) {
    for (Request& r : *requests) r.conversation = r.turn = -1;
  }
  if (FLAGS_out == "-") {
    WriteTrace(*requests, std::cout);
    std::cout.flush();
    return std::cout.good() ? 0 : Fail("cannot write to stdout");
  }
  std::ofstream out(FLAGS_out);
  if (!out.is_open()) return Fail(absl::StrCat("cannot open --out=", FLAGS_out));
  WriteTrace(*requests, out);
  out.close();
  return out.good() ? 0 : Fail(absl::StrCat("cannot write ", FLAGS_out));
}

int RunCeiling() {
  std::vector<Request> requests;
  if (int rc = LoadRequests(&requests); rc != 0) return rc;
  CeilingSummary c = ComputeCeiling(requests);
  std::cout << "requests " << c.requests << ", blocks " << c.blocks << ", ceiling hits "
            << c.hits << "\n"
            << "infinite-cache ceiling hit ratio " << absl::StrFormat("%.4f", c.hit_ratio())
            << "\n";
  if (!FLAGS_json.empty()) {
    std::ofstream out(FLAGS_json);
    out << absl::StrFormat(
        "{\"requests\": %d, \"blocks\": %d, \"hits\": %d, \"hit_ratio\": %.6f}\n",
        c.requests, c.blocks, c.hits, c.hit_ratio());
    out.close();
    if (!out.good()) return Fail(absl::StrCat("cannot write --json=", FLAGS_json));
  }
  return 0;
}

int RunPlot() {
  if (FLAGS_plot.empty()) return UsageError("plot: give --plot=DIR");
  PlotOptions po;
  po.python = FLAGS_python;
  po.out_dir = FLAGS_plot;
  po.reports = absl::StrSplit(FLAGS_json, ',', absl::SkipEmpty());
  if (po.reports.empty()) return UsageError("plot: give --json=REPORT.json[,REPORT2.json]");
  absl::Status s = WritePlots(po);
  if (s.ok()) return 0;
  return s.code() == absl::StatusCode::kInvalidArgument ? UsageError(std::string(s.message()))
                                                        : Fail(std::string(s.message()));
}

int RunReplay() {
  // Options first: a usage error should not wait for a trace or a cluster.
  ReplayOptions ro;
  ro.key_namespace = FLAGS_namespace;
  if (!ParseBytes(FLAGS_block_bytes, &ro.block_bytes)) {
    return UsageError(absl::StrCat("bad --block_bytes '", FLAGS_block_bytes,
                                   "' (want e.g. 262144, 256K, 1M)"));
  }
  ro.concurrency = FLAGS_concurrency;
  if (absl::AsciiStrToLower(FLAGS_time_scale) == "max") {
    ro.time_scale = 0;
  } else if (!absl::SimpleAtod(FLAGS_time_scale, &ro.time_scale)) {
    return UsageError(absl::StrCat("bad --time_scale '", FLAGS_time_scale,
                                   "' (want a number >= 0 or 'max')"));
  }
  ro.prefetch = FLAGS_prefetch;
  ro.verify = FLAGS_verify;
  ro.wait_stores = FLAGS_wait_stores;
  ro.store = FLAGS_store;
  ro.load_timeout = absl::Milliseconds(FLAGS_load_timeout_ms);
  ro.store_timeout = absl::Milliseconds(FLAGS_store_timeout_ms);
  if (!ParseBytes(FLAGS_max_store_inflight, &ro.max_store_bytes_in_flight)) {
    return UsageError(absl::StrCat("bad --max_store_inflight '", FLAGS_max_store_inflight, "'"));
  }
  ro.store_queue_wait = absl::Milliseconds(FLAGS_store_queue_wait_ms);
  if (!ParseBytes(FLAGS_pool_bytes, &ro.pool_bytes)) {
    return UsageError(absl::StrCat("bad --pool_bytes '", FLAGS_pool_bytes, "'"));
  }
  ro.register_pool = FLAGS_register_pool;
  ro.hint_next_turn = FLAGS_hint_next_turn;
  ro.hint_hold = absl::Milliseconds(FLAGS_hint_hold_ms);
  ro.hint_conversation_end = FLAGS_hint_conversation_end;
  ro.hint_namespace = FLAGS_hint_namespace;
  ro.progress_interval = absl::Seconds(FLAGS_progress_s);
  if (auto s = ro.Validate(); !s.ok()) return UsageError(std::string(s.message()));

  ReportOptions rep;
  if (FLAGS_group_by == "auto") {
    rep.group_by = GroupBy::kAuto;
  } else if (FLAGS_group_by == "turn") {
    rep.group_by = GroupBy::kTurn;
  } else if (FLAGS_group_by == "window") {
    rep.group_by = GroupBy::kWindow;
  } else {
    return UsageError(absl::StrCat("bad --group_by '", FLAGS_group_by,
                                   "' (want auto, turn or window)"));
  }
  rep.window_s = FLAGS_window_s;
  if (!(rep.window_s > 0)) return UsageError("--window_s must be > 0");

  ClientOptions co;
  co.master_address = FLAGS_master;
  co.store_threads = FLAGS_store_threads;
  co.max_pending_stores = FLAGS_max_pending_stores;
  if (!FLAGS_token_file.empty()) {
    auto token = ReadTokenFile(FLAGS_token_file);
    if (!token.ok()) {
      return UsageError(absl::StrCat("--token_file: ", token.status().message()));
    }
    co.auth_token = *token;
  }
  co.tls_ca_file = FLAGS_tls_ca;
  co.tls_cert_file = FLAGS_tls_cert;
  co.tls_key_file = FLAGS_tls_key;
  if (FLAGS_transport == "tcp") {
    co.transport = TransportKind::kTcp;
  } else if (FLAGS_transport == "shm") {
    co.transport = TransportKind::kShm;
  } else if (FLAGS_transport == "rdma") {
    co.transport = TransportKind::kRdma;
  } else if (FLAGS_transport == "auto") {
    co.transport = TransportKind::kAuto;
  } else {
    return UsageError(absl::StrCat("bad --transport '", FLAGS_transport,
                                   "' (want tcp, shm, rdma or auto)"));
  }
  if (auto s = co.Validate(); !s.ok()) return UsageError(std::string(s.message()));

  std::vector<Request> requests;
  if (int rc = LoadRequests(&requests); rc != 0) return rc;
  if (requests.empty()) return Fail("the workload has no requests");

  // Open the outputs before the run so that a typo does not waste it.
  std::ofstream csv, json;
  // --plot plots the JSON report: --json's, else DIR/hymbench.json.
  std::string json_path = FLAGS_json;
  if (!FLAGS_plot.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(FLAGS_plot, ec);
    if (ec) return Fail(absl::StrCat("cannot create --plot=", FLAGS_plot, ": ", ec.message()));
    if (json_path.empty()) json_path = FLAGS_plot + "/hymbench.json";
  }
  if (!FLAGS_csv.empty()) {
    csv.open(FLAGS_csv);
    if (!csv.is_open()) return Fail(absl::StrCat("cannot open --csv=", FLAGS_csv));
  }
  if (!json_path.empty()) {
    json.open(json_path);
    if (!json.is_open()) return Fail(absl::StrCat("cannot open ", json_path));
  }

  auto client = Client::Create(co);
  if (!client.ok()) return Fail(absl::StrCat("client: ", client.status().message()));
  if (FLAGS_check_cluster) {
    if (auto s = CheckCluster(client->get()); !s.ok()) {
      return Fail(absl::StrCat(FLAGS_master, ": ", s.message()));
    }
  }
  const CeilingSummary ceiling = ComputeCeiling(requests);
  std::cerr << "hymbench: replaying " << requests.size() << " requests ("
            << ceiling.blocks << " blocks, ceiling hit ratio "
            << absl::StrFormat("%.4f", ceiling.hit_ratio()) << ") against " << FLAGS_master
            << "\n";

  auto result = Replay(client->get(), requests, ro, FLAGS_progress_s > 0 ? &std::cerr : nullptr);
  if (!result.ok()) return Fail(std::string(result.status().message()));

  auto report = BuildReport(result->records, rep);
  if (!report.ok()) return UsageError(std::string(report.status().message()));
  report->wall_seconds = result->wall_seconds;
  report->config = {
      {"master", FLAGS_master},
      {"workload", FLAGS_synthetic ? "synthetic" : FLAGS_trace},
      {"requests", absl::StrCat(requests.size())},
      {"block_bytes", absl::StrCat(ro.block_bytes)},
      {"block_tokens", absl::StrCat(FLAGS_block_tokens)},
      {"concurrency", absl::StrCat(ro.concurrency)},
      {"time_scale", absl::StrCat(ro.time_scale)},
      {"prefetch", ro.prefetch ? "true" : "false"},
      {"verify", ro.verify ? "true" : "false"},
      {"wait_stores", ro.wait_stores ? "true" : "false"},
      {"namespace", ro.key_namespace},
      {"pool_bytes", absl::StrCat(result->pool_bytes)},
      {"pools_registered",
       absl::StrCat(result->pools_registered, " of ", result->pools_allocated)},
      {"max_pending_stores", absl::StrCat(FLAGS_max_pending_stores)},
      {"store_queue_wait_ms", absl::StrCat(FLAGS_store_queue_wait_ms)},
      {"store_queue_retries", absl::StrCat(result->store_queue_retries)},
      {"store_queue_wait_seconds",
       absl::StrFormat("%.3f", result->store_queue_wait_seconds)},
      {"hint_next_turn", ro.hint_next_turn ? "true" : "false"},
      {"hints_sent", absl::StrCat(result->hints_sent)},
      {"hints_dropped", absl::StrCat(result->hints_dropped)},
      {"hint_conversation_end", ro.hint_conversation_end ? "true" : "false"},
      {"ended_hints_sent", absl::StrCat(result->ended_hints_sent)},
      {"turn_source", FLAGS_synthetic ? "synthetic"
                      : FLAGS_infer_turns
                          ? "from the trace, else inferred from prefix chains"
                          : "from the trace"},
  };
  if (FLAGS_synthetic) {
    report->config.push_back({"conversations", absl::StrCat(FLAGS_conversations)});
    report->config.push_back({"turns", absl::StrCat(FLAGS_turns)});
    report->config.push_back({"system_prompt_tokens", absl::StrCat(FLAGS_system_prompt_tokens)});
    report->config.push_back({"shared_system_prompt", FLAGS_shared_system_prompt ? "true" : "false"});
    report->config.push_back({"user_tokens", absl::StrCat(FLAGS_user_tokens)});
    report->config.push_back({"output_tokens", absl::StrCat(FLAGS_output_tokens)});
  }
  WriteTable(*report, std::cout);
  std::cout << absl::StrFormat(
      "KV pool %d bytes per worker (%d of %d registered); %d store retries on a full "
      "client queue (%.3f s waited)\n",
      result->pool_bytes, result->pools_registered, result->pools_allocated,
      result->store_queue_retries, result->store_queue_wait_seconds);
  std::cout.flush();
  if (csv.is_open()) {
    WriteCsv(*report, csv);
    csv.close();
    if (!csv.good()) return Fail(absl::StrCat("cannot write --csv=", FLAGS_csv));
  }
  if (json.is_open()) {
    WriteJson(*report, result->records, json);
    json.close();
    if (!json.good()) return Fail(absl::StrCat("cannot write ", json_path));
  }
  absl::Status plotted;
  if (!FLAGS_plot.empty()) {
    PlotOptions po;
    po.python = FLAGS_python;
    po.out_dir = FLAGS_plot;
    po.reports = {json_path};
    plotted = WritePlots(po);
  }

  int rc = 0;
  if (result->load_errors > 0) {
    std::cerr << "hymbench: " << result->load_errors << " of " << result->load_calls
              << " Load calls failed; first: " << result->first_load_error << "\n";
    if (result->load_errors == result->load_calls) rc = Fail("every Load failed");
  }
  if (!result->first_store_error.ok()) {
    std::cerr << "hymbench: stores reported errors; first: " << result->first_store_error
              << "\n";
  }
  if (result->corrupt_blocks > 0) {
    rc = Fail(absl::StrCat("verification failed: ", result->corrupt_blocks,
                           " corrupt blocks; first: ", result->first_corruption));
  }
  if (!plotted.ok()) rc = Fail(std::string(plotted.message()));
  return rc;
}

}  // namespace
}  // namespace hymcache::hymbench

int main(int argc, char** argv) {
  // Debian's Abseil has the mutex deadlock detector on; too costly here.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  FLAGS_logtostderr = true;
  hymcache::ParseCommandLine({.program = "hymbench",
                              .usage = hymcache::hymbench::kUsage,
                              .main_file = __FILE__},
                             &argc, &argv);
  google::InitGoogleLogging(argv[0]);
  if (argc != 2) return hymcache::hymbench::UsageError("expected one command");
  const std::string command = argv[1];
  if (command == "replay") return hymcache::hymbench::RunReplay();
  if (command == "gen") return hymcache::hymbench::RunGen();
  if (command == "ceiling") return hymcache::hymbench::RunCeiling();
  if (command == "plot") return hymcache::hymbench::RunPlot();
  return hymcache::hymbench::UsageError(absl::StrCat("unknown command '", command, "'"));
}
