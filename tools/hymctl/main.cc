// hymctl: HyMCache admin CLI. See hymctl.h for the commands.
#include <iostream>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "tools/hymctl/hymctl.h"

DEFINE_string(master, "127.0.0.1:50051", "master gRPC address host:port");
DEFINE_bool(json, false, "print JSON instead of tables");
DEFINE_bool(hex, false, "keys on the command line are hex");
DEFINE_double(timeout, 10, "per-command deadline in seconds");
DEFINE_bool(repair, false, "fsck: repair what is found, then check again");
DEFINE_double(settle, 2, "fsck: seconds between its two confirming passes");

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "hymctl [flags] status | stats | put KEY FILE | get KEY FILE | lookup KEY... | rm KEY... | fsck [--repair] [--settle=S]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  hymcache::hymctl::Options o;
  o.master_address = FLAGS_master;
  o.json = FLAGS_json;
  o.hex_keys = FLAGS_hex;
  o.timeout_seconds = FLAGS_timeout;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "fsck") {
    if (FLAGS_repair) args.push_back("--repair");
    args.push_back("--settle=" + std::to_string(FLAGS_settle));
  }
  return hymcache::hymctl::Run(o, args, std::cout, std::cerr);
}
