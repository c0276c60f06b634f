// Names of the transport parameters a storage node publishes to clients
// through the master (NodeInfo.transport_params): how to reach its memory
// over the one-sided data planes. Shared by the node and the client.
#pragma once

namespace hymcache {

// Same-host shared memory: a client on the same host connects to the
// node's abstract Unix socket, which checks its credentials and passes it
// read-only descriptors of the areas (storage_node/dataplane/shm_export.h).
inline constexpr char kShmHostParam[] = "shm.host";          // LocalHostIdentity()
inline constexpr char kShmSocketParam[] = "shm.socket";      // abstract name
inline constexpr char kShmInstanceParam[] = "shm.instance";  // per node start
// "area:length[,area:length...]"
inline constexpr char kShmAreasParam[] = "shm.areas";

// RDMA.
inline constexpr char kRdmaDeviceParam[] = "rdma.device";
// "area:remote_addr:length:rkey[,...]"
inline constexpr char kRdmaAreasParam[] = "rdma.areas";

}  // namespace hymcache
