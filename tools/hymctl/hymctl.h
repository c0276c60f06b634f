// hymctl: the admin CLI's logic, as a library so tests run it in-process.
// HelpText() lists the commands (hymctl help, hymctl --help). On-call
// commands (docs/operations.md): drain / undrain NODE, forget NODE,
// inspect KEY, top, events, version.
//
// Keys are taken as text, or as hex with --hex (block keys are binary). In
// JSON output every key says how it is spelled: "key" beside
// "key_encoding" ("text", or "hex" for a key with bytes outside printable
// ASCII).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "common/security.h"
#include "tools/hymctl/events.h"

namespace hymcache::hymctl {

struct Options {
  // Master gRPC address, or several (A,B,C: commands go to the one that
  // leads, docs/ha.md). Default: 127.0.0.1:50051.
  std::string master_address = "127.0.0.1:50051";
  // etcd endpoints: the master is the leader the cluster's leader key
  // names (replaces master_address). Default: none.
  std::vector<std::string> etcd_endpoints;
  // The cluster's name (etcd keys /hymcache/<cluster>/). Default: "default".
  std::string cluster = "default";
  // Print JSON instead of tables. Default: false.
  bool json = false;
  // Keys on the command line are hex. Default: false.
  bool hex_keys = false;
  // Per-command deadline in seconds. Default: 10.
  double timeout_seconds = 10;
  // Token (an admin's, see docs/security.md) and TLS towards the master and
  // the nodes' control services. Default: none, plaintext.
  ChannelSecurity security;
  // status: the wide table (every address, exact sizes) instead of the one
  // that fits 80 columns. Default: false.
  bool wide = false;
  // drain: wait until the node holds no objects (at most timeout_seconds).
  // Default: false.
  bool wait = false;
  // drain: first copy the node's objects to other nodes (drain_copy.h):
  // "all", "hot" (read within hot_within_seconds, and the blocks before
  // them) or "" (none: they go when the node leaves). Default: "".
  std::string drain_copy;
  double hot_within_seconds = 600;
  // token new: the node names a node token may register as, comma-separated
  // ("": any name). Default: "".
  std::string token_nodes;
  // top: seconds between refreshes (> 0), and refreshes before exiting (0:
  // until interrupted). Default: 2, 0.
  double interval_seconds = 2;
  int iterations = 0;
  // top: clear the screen before each refresh (a terminal). Default: false.
  bool clear_screen = false;
  // What `hymctl version` reports for hymctl itself. Default: "" (unknown).
  std::string version;
  // events: where to start and when to stop (its json is `json`'s).
  EventsOptions events;
};

// The commands and what they do (hymctl help).
std::string HelpText();

// Runs one command (`args` = command and its operands). Returns the process
// exit code: 0 success, 1 the operation failed, 2 bad usage.
int Run(const Options& options, const std::vector<std::string>& args,
        std::ostream& out, std::ostream& err);

}  // namespace hymcache::hymctl
