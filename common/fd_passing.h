// Passing file descriptors between processes on one host over Unix-domain
// sockets (SCM_RIGHTS), used to hand a same-host client read-only access to a
// storage node's memory after checking who it is (SO_PEERCRED).
#pragma once

#include <sys/socket.h>  // ucred
#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/net.h"

namespace hymcache {

// Listens on an abstract-namespace Unix socket named `name` (no file on
// disk; visible to processes in the same network namespace).
// Errors: InvalidArgument (name empty or over 100 bytes), Unavailable
// (the name is taken).
absl::StatusOr<Socket> ListenUnixAbstract(const std::string& name);
absl::StatusOr<Socket> ConnectUnixAbstract(const std::string& name,
                                           absl::Time deadline);

// The connected peer's credentials.
absl::StatusOr<ucred> PeerCredentials(int fd);
// The connected peer's supplementary groups (SO_PEERGROUPS, Linux 4.13+).
// Errors: Internal (the kernel cannot tell).
absl::StatusOr<std::vector<gid_t>> PeerGroups(int fd);

// Sends `payload` (1..64 KiB) with `fds` (at most 64) in one message.
absl::Status SendWithFds(int fd, const std::string& payload,
                         const std::vector<int>& fds);
// Receives one such message. The caller owns the returned descriptors.
// Errors: DeadlineExceeded, Unavailable (peer closed), DataLoss (truncated
// message or descriptors).
absl::Status RecvWithFds(int fd, std::string* payload, std::vector<int>* fds,
                         absl::Time deadline);

}  // namespace hymcache
