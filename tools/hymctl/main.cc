// hymctl: HyMCache admin CLI. See hymctl.h for the commands.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "absl/strings/str_split.h"
#include "common/build_info.h"
#include "common/cli.h"
#include "tools/hymctl/hymctl.h"

DEFINE_string(master, "127.0.0.1:50051",
              "master gRPC address host:port, or several masters "
              "(A,B,C; commands go to the one that leads, docs/ha.md) "
              "(default: $HYMCACHE_MASTER if set)");
DEFINE_string(etcd, "",
              "etcd endpoints HOST:PORT[,...]: talk to the master that leads "
              "--cluster (instead of --master; docs/ha.md)");
DEFINE_string(cluster, "default", "with --etcd: the cluster's name");
DEFINE_bool(json, false, "print JSON instead of tables");
DEFINE_bool(hex, false, "keys on the command line are hex");
DEFINE_double(timeout, 10,
              "per-command deadline in seconds (drain --wait: how long to wait)");
DEFINE_bool(repair, false, "fsck: repair what is found, then check again");
DEFINE_double(settle, 2, "fsck: seconds between its two confirming passes");
DEFINE_string(token_file, "", "file holding the bearer token (an admin's)");
DEFINE_string(tls_ca, "", "PEM CA of the master's and nodes' certificates (enables TLS)");
DEFINE_string(tls_cert, "", "PEM client certificate for mutual TLS");
DEFINE_string(tls_key, "", "PEM private key of --tls_cert");
DEFINE_string(tls_server_name, "",
              "name the servers' certificates carry (default: the host dialled)");
DEFINE_string(o, "", "status: 'wide' for every address and exact sizes");
DEFINE_bool(wait, false, "drain: wait until the node holds no objects");
DEFINE_string(copy, "",
              "drain: first copy the node's objects to other nodes: 'all', or "
              "'hot' (read within --hot_within, and the blocks before them); "
              "rebalance: which chains may move");
DEFINE_double(hot_within, 600, "drain --copy=hot: seconds since a read");
DEFINE_double(interval, 2, "top: seconds between refreshes");
DEFINE_string(nodes, "",
              "token new: node names (comma-separated) a node token may "
              "register as");
DEFINE_int32(iterations, 0, "top: refreshes before exiting (0: until interrupted)");
DEFINE_int32(count, 0, "events: stop after this many events (0: follow)");
DEFINE_uint64(stream, 0, "events: the stream id to resume (with --after)");
DEFINE_uint64(after, 0, "events: resume after this sequence of --stream");

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "hymctl",
       .usage = hymcache::hymctl::HelpText(),
       .groups = {{"Connection",
                   {"master", "etcd", "cluster", "timeout", "token_file",
                    "tls_ca", "tls_cert", "tls_key", "tls_server_name"}},
                  {"Output", {"json", "hex", "o"}},
                  {"fsck", {"repair", "settle"}},
                  {"drain and top",
                   {"wait", "copy", "hot_within", "interval", "iterations"}},
                  {"token new", {"nodes"}}},
       .main_file = __FILE__},
      &argc, &argv);
  hymcache::hymctl::Options o;
  o.master_address = FLAGS_master;
  o.etcd_endpoints = absl::StrSplit(FLAGS_etcd, ',', absl::SkipEmpty());
  o.cluster = FLAGS_cluster;
  {
    const hymcache::BuildStamp& b = hymcache::BuildInfo();
    o.version = b.version + " (commit " + b.git_commit + ")";
  }
  // A CLI's environment: the default master (flags win).
  const char* env_master = std::getenv("HYMCACHE_MASTER");
  if (gflags::GetCommandLineFlagInfoOrDie("master").is_default &&
      env_master != nullptr && *env_master != '\0') {
    o.master_address = env_master;
  }
  if (FLAGS_o != "" && FLAGS_o != "wide") {
    std::cerr << "hymctl: -o takes 'wide'\n";
    return 2;
  }
  o.wide = FLAGS_o == "wide";
  o.wait = FLAGS_wait;
  o.drain_copy = FLAGS_copy;
  o.hot_within_seconds = FLAGS_hot_within;
  o.token_nodes = FLAGS_nodes;
  o.interval_seconds = FLAGS_interval;
  o.iterations = FLAGS_iterations;
  o.events.count = FLAGS_count;
  o.events.stream_id = FLAGS_stream;
  o.events.after_sequence = FLAGS_after;
  o.clear_screen = ::isatty(STDOUT_FILENO) == 1;
  o.json = FLAGS_json;
  o.hex_keys = FLAGS_hex;
  o.timeout_seconds = FLAGS_timeout;
  if (!FLAGS_token_file.empty()) {
    auto token = hymcache::ReadTokenFile(FLAGS_token_file);
    if (!token.ok()) {
      std::cerr << "hymctl: --token_file: " << token.status().message() << "\n";
      return 2;
    }
    o.security.token = *token;
  }
  o.security.tls.ca_file = FLAGS_tls_ca;
  o.security.tls.cert_file = FLAGS_tls_cert;
  o.security.tls.key_file = FLAGS_tls_key;
  o.security.tls.server_name = FLAGS_tls_server_name;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "fsck") {
    if (FLAGS_repair) args.push_back("--repair");
    args.push_back("--settle=" + std::to_string(FLAGS_settle));
  }
  return hymcache::hymctl::Run(o, args, std::cout, std::cerr);
}
