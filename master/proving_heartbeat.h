// The heartbeat a storage node sends right after it registers, proving that
// it holds the key the master's answer gave it. A node given a fresh key
// takes no placements until the master has seen that proof
// (MasterService::IsPlaceable). For the in-process nodes of tests and
// benchmarks; the storage node signs its own (StorageNode::Auth).

#ifndef HYMCACHE_MASTER_PROVING_HEARTBEAT_H_
#define HYMCACHE_MASTER_PROVING_HEARTBEAT_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/capability.h"
#include "proto/master.pb.h"

namespace hymcache {
namespace master {

inline v1::HeartbeatRequest ProvingHeartbeat(
    const v1::RegisterNodeRequest& registered,
    const v1::RegisterNodeResponse& answer, absl::Time now = absl::Now()) {
  v1::HeartbeatRequest hb;
  hb.set_node_id(answer.node_id());
  hb.set_incarnation(registered.incarnation());
  v1::NodeAuth* auth = hb.mutable_auth();
  auth->set_unix_ms(absl::ToUnixMillis(now));
  auth->set_proof(NodeProof(HmacSha256(answer.node_key()), "heartbeat",
                            registered.name(), answer.node_id(),
                            registered.incarnation(), auth->unix_ms()));
  return hb;
}

}  // namespace master
}  // namespace hymcache

#endif  // HYMCACHE_MASTER_PROVING_HEARTBEAT_H_
