// ShmExport: hands same-host clients read-only access to the device's
// exposed memory (MemoryDevice::Areas, memfd-backed) for the shared-memory
// data plane. A client connects to an abstract-namespace Unix socket; the
// exporter checks its credentials (SO_PEERCRED and SO_PEERGROUPS: by default
// the node's own user, root, a listed uid, or a member of a listed group) and
// sends it read-only descriptors of the areas
// (SCM_RIGHTS), which the client maps PROT_READ. Holds on the TCP data plane
// (common/wire.h, direct access; each acquire carries a read capability)
// still protect every copy, but a client given the descriptors can read
// every byte of the exported memory: the lists decide who is trusted that
// far (docs/security.md). Writes from
// clients go over TCP.
//
// Threads: one "shm-export" thread answering connections one at a time.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <sys/socket.h>  // ucred
#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/net.h"
#include "common/thread.h"
#include "storage_node/device/memory_device.h"

namespace hymcache::storage {

struct ShmExportOptions {
  // The areas to export (those with an fd). Required, at least one.
  std::vector<MemoryArea> areas;
  // Abstract socket name. Default: "" = "hymcache-shm-<pid>-<random>".
  std::string socket_name;
  // Who may map the memory: the node's own user (default: true), root
  // (default: true), and these users (default: none).
  bool allow_own_user = true;
  bool allow_root = true;
  std::vector<uid_t> allowed_uids;
  // And members of these groups (the peer's primary group or one of its
  // supplementary groups). Default: none.
  std::vector<gid_t> allowed_gids;
};

class ShmExport {
 public:
  // Opens read-only descriptors of the areas and starts listening.
  // Errors: FailedPrecondition (no shareable area), Unavailable (socket).
  static absl::StatusOr<std::unique_ptr<ShmExport>> Create(
      const ShmExportOptions& options);
  ~ShmExport();
  ShmExport(const ShmExport&) = delete;
  ShmExport& operator=(const ShmExport&) = delete;

  const std::string& socket_name() const { return name_; }
  // Whether a peer with `cred` and supplementary `groups` may map the
  // memory, for a node running as `me`.
  static bool Allowed(const ShmExportOptions& options, uid_t me,
                      const ucred& cred, const std::vector<gid_t>& groups);
  // kShm* transport parameters (host identity, socket, area lengths, a
  // per-start instance id).
  std::map<std::string, std::string> TransportParams() const;
  // Connections served and refused so far.
  uint64_t served() const;
  uint64_t refused() const;

 private:
  ShmExport() = default;
  void Loop();
  void Serve(int fd);

  ShmExportOptions options_;
  std::string name_;
  std::string instance_;
  std::string areas_param_;   // "area:length,..."
  std::string payload_;       // "area:length\n" per descriptor, in order
  std::vector<int> fds_;      // read-only descriptors, owned
  Socket listen_;
  int stop_fd_ = -1;
  Thread thread_;
  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace hymcache::storage
