// Names of the transport parameters a storage node publishes to clients
// through the master (NodeInfo.transport_params): how to reach its memory
// over the one-sided data planes. Shared by the node and the client.
#pragma once

namespace hymcache {

// Same-host shared memory (clients map /proc/<pid>/fd/<fd>).
inline constexpr char kShmHostParam[] = "shm.host";          // LocalHostIdentity()
inline constexpr char kShmPidParam[] = "shm.pid";            // node process id
inline constexpr char kShmInstanceParam[] = "shm.instance";  // per node start
// "area:fd:length[,area:fd:length...]"
inline constexpr char kShmAreasParam[] = "shm.areas";

// RDMA.
inline constexpr char kRdmaDeviceParam[] = "rdma.device";
// "area:remote_addr:length:rkey[,...]"
inline constexpr char kRdmaAreasParam[] = "rdma.areas";

}  // namespace hymcache
