// The heartbeat a storage node sends right after it registers, proving that
// it holds the key the master's answer gave it. A node given a fresh key
// takes no placements until the master has seen that proof
// (MasterService::IsPlaceable). For the in-process nodes of tests and
// benchmarks; the storage node signs its own (StorageNode::Auth).

#ifndef HYMCACHE_MASTER_PROVING_HEARTBEAT_H_
#define HYMCACHE_MASTER_PROVING_HEARTBEAT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/capability.h"
#include "common/wire.h"
#include "proto/master.grpc.pb.h"

namespace hymcache {
namespace master {

// The proof of `node_key` that the node `registered` attaches to a call for
// `purpose` ("register" with node id 0, "heartbeat", "reconcile").
inline v1::NodeAuth ProvingAuth(const char* purpose,
                                const v1::RegisterNodeRequest& registered,
                                const std::string& node_key, uint32_t node_id,
                                absl::Time now = absl::Now()) {
  v1::NodeAuth auth;
  auth.set_unix_ms(absl::ToUnixMillis(now));
  auth.set_proof(NodeProof(HmacSha256(node_key), purpose, registered.name(),
                           node_id, registered.incarnation(), auth.unix_ms()));
  return auth;
}

inline v1::HeartbeatRequest ProvingHeartbeat(
    const v1::RegisterNodeRequest& registered,
    const v1::RegisterNodeResponse& answer, absl::Time now = absl::Now()) {
  v1::HeartbeatRequest hb;
  hb.set_node_id(answer.node_id());
  hb.set_incarnation(registered.incarnation());
  *hb.mutable_auth() = ProvingAuth("heartbeat", registered, answer.node_key(),
                                   answer.node_id(), now);
  return hb;
}

// A node that holds no bytes, for benchmarks of the master alone (its
// puts are metadata only): one 1 TiB DRAM region at 127.0.0.1:7000/7001.
inline v1::RegisterNodeRequest MetadataOnlyNodeRequest(
    const std::string& name) {
  v1::RegisterNodeRequest reg;
  reg.set_name(name);
  reg.set_incarnation(1);
  reg.set_data_address("127.0.0.1:7000");
  reg.set_control_address("127.0.0.1:7001");
  v1::RegionInfo* region = reg.add_regions();
  region->set_region_id(0);
  region->set_capacity_bytes(uint64_t{1} << 40);
  region->set_alignment(4096);
  region->set_device_kind("dram");
  return reg;
}

// The write receipt node `node_key` gives for `loc` once its bytes landed
// (common/wire.h, "Write receipts"), as bytes for PutCommitRequest.
inline std::string WriteReceiptFor(const HmacSha256& node_key,
                                   const v1::Location& loc) {
  WriteReceiptScope scope;
  scope.node_id = loc.node_id();
  scope.region_id = loc.region_id();
  scope.addr = loc.addr();
  scope.length = loc.length();
  scope.generation = loc.generation();
  const wire::Receipt r = SignWriteReceipt(node_key, scope);
  return std::string(reinterpret_cast<const char*>(r.tag), wire::kReceiptBytes);
}

// Sets `commit`'s receipts to those the node of `start` (whose key is
// `node_key`) gives for every slot allocated: what a client that wrote
// them all carries. For nodes that hold no bytes (metadata-only benchmarks
// and tests).
inline void AddWriteReceipts(const v1::PutStartResponse& start,
                             const HmacSha256& node_key,
                             v1::PutCommitRequest* commit) {
  commit->clear_receipts();
  for (const v1::PutSlot& slot : start.slots()) {
    commit->add_receipts(slot.state() == v1::SLOT_ALLOCATED
                             ? WriteReceiptFor(node_key, slot.location())
                             : std::string());
  }
}

// Registers `reg` through `stub` and sends the proving heartbeat, as a node
// does, so that the master places puts on it. Returns the node's key (for
// its write receipts, AddWriteReceipts); the first RPC error, naming the
// call.
inline absl::StatusOr<std::string> RegisterProvenNode(
    v1::MasterService::Stub* stub, const v1::RegisterNodeRequest& reg) {
  v1::RegisterNodeResponse answer;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    grpc::Status s = stub->RegisterNode(&ctx, reg, &answer);
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("RegisterNode: ", s.error_message()));
    }
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::HeartbeatResponse hb;
  grpc::Status s = stub->Heartbeat(&ctx, ProvingHeartbeat(reg, answer), &hb);
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("Heartbeat: ", s.error_message()));
  }
  return answer.node_key();
}

}  // namespace master
}  // namespace hymcache

#endif  // HYMCACHE_MASTER_PROVING_HEARTBEAT_H_
