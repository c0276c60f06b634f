// The RDMA DirectMover: one RC queue pair per channel, connected to the
// node's over the channel's TCP connection (kRdmaConnectRequest), one-sided
// READ/WRITE between registered caller buffers and the node's memory, each
// object through the key the node granted for it (wire::AreaRef::rkey; the
// areas are published as "rdma.*" transport parameters). Internal to
// //client.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/direct_transport.h"

namespace hymcache {

// Opens `device` ("" = the first). Unavailable on a host without an RDMA
// device.
absl::StatusOr<std::unique_ptr<DirectMover>> NewRdmaMover(
    const std::string& device);

}  // namespace hymcache
