// hymctl: the admin CLI's logic, as a library so tests run it in-process.
//
//   hymctl [--master=H:P] [--json] [--hex] status
//   hymctl stats               each node's data-plane and device counters
//   hymctl put KEY FILE        store FILE's bytes under KEY
//   hymctl get KEY FILE        write KEY's bytes to FILE
//   hymctl lookup KEY...       where each key lives, and the hit prefix
//   hymctl rm KEY...           remove keys
//   hymctl fsck [--repair] [--settle=SECONDS]
//                              master listings vs node extents (fsck.h);
//                              exit 1 if anything is inconsistent
//   hymctl tenant list | usage TENANT | set-quota TENANT MAX_OBJECTS MAX_BYTES
//                              tenants' objects, bytes, quotas (admins)
//   hymctl token new ROLE TENANT NAME TOKEN_FILE
//                              a fresh token written to TOKEN_FILE (0600,
//                              new file); its identities line on stdout
//                              (docs/security.md)
//   hymctl node forget NAME    (admin) remove a dead node's record and its
//                              objects from the master
//
// Keys are taken as text, or as hex with --hex (block keys are binary).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "common/security.h"

namespace hymcache::hymctl {

struct Options {
  // Master gRPC address. Default: 127.0.0.1:50051.
  std::string master_address = "127.0.0.1:50051";
  // Print JSON instead of tables. Default: false.
  bool json = false;
  // Keys on the command line are hex. Default: false.
  bool hex_keys = false;
  // Per-command deadline in seconds. Default: 10.
  double timeout_seconds = 10;
  // Token (an admin's, see docs/security.md) and TLS towards the master and
  // the nodes' control services. Default: none, plaintext.
  ChannelSecurity security;
};

// Runs one command (`args` = command and its operands). Returns the process
// exit code: 0 success, 1 the operation failed, 2 bad usage.
int Run(const Options& options, const std::vector<std::string>& args,
        std::ostream& out, std::ostream& err);

}  // namespace hymcache::hymctl
