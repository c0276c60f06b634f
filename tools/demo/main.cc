// hymcache-demo: a small multi-turn workload against a running cluster.
#include <iostream>

#include <gflags/gflags.h>

#include "common/cli.h"
#include "common/security.h"
#include "tools/demo/demo.h"

DEFINE_string(master, "127.0.0.1:50051", "master gRPC address host:port");
DEFINE_string(token_file, "", "file holding the bearer token (role engine)");
DEFINE_string(tls_ca, "", "PEM CA of the master's certificate (enables TLS)");
DEFINE_int32(conversations, 4, "conversations");
DEFINE_int32(turns, 5, "turns per conversation");
DEFINE_int32(block_tokens, 512, "tokens per KV block");
DEFINE_uint64(block_bytes, 1 << 20, "bytes per KV block");
DEFINE_int32(tokens_per_turn, 1024, "new user tokens per turn");

int main(int argc, char** argv) {
  hymcache::ParseCommandLine({.program = "hymcache-demo",
                              .usage = "hymcache-demo: a small multi-turn "
                                       "workload against a running cluster",
                              .main_file = __FILE__},
                             &argc, &argv);
  hymcache::demo::DemoOptions o;
  o.master_address = FLAGS_master;
  o.tls_ca_file = FLAGS_tls_ca;
  if (!FLAGS_token_file.empty()) {
    auto token = hymcache::ReadTokenFile(FLAGS_token_file);
    if (!token.ok()) {
      std::cerr << "hymcache-demo: --token_file: " << token.status().message()
                << "\n";
      return 2;
    }
    o.token = *token;
  }
  o.conversations = FLAGS_conversations;
  o.turns = FLAGS_turns;
  o.block_tokens = FLAGS_block_tokens;
  o.block_bytes = FLAGS_block_bytes;
  o.tokens_per_turn = FLAGS_tokens_per_turn;
  absl::Status s = hymcache::demo::Run(o, std::cout);
  if (!s.ok()) {
    std::cerr << "hymcache-demo: " << s.ToString() << "\n";
    return 1;
  }
  return 0;
}
