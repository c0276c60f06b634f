// Machine-readable reasons on absl::Status: the one way code decides what a
// failure means beyond its canonical code. A status's message is for people
// and may change; its reason is for programs and is stable.
//
// Like RocksDB's Status::SubCode, a reason refines a code: a
// ResourceExhausted Store may have been refused because the client's store
// queue was full, because no node had room, or because the node refused the
// bytes (its write buffer was full), and a caller counting refusals needs to
// tell these apart. The reason rides in the status as an absl payload, so it
// survives copies and RETURN_IF_ERROR and costs nothing on the OK path.
//
//   absl::Status s = WithReason(absl::ResourceExhaustedError("..."),
//                               StatusReason::kStoreQueueFull);
//   if (ReasonOf(s) == StatusReason::kStoreQueueFull) ...
//
// Reasons are attached where the failure is known, in this process (the
// data-plane wire carries a per-op code, not a reason: the client attaches
// the reason when it knows which side refused). Declared once, in
// HYMCACHE_STATUS_REASONS below; ReasonName gives each a stable snake_case
// name for logs, JSON and metrics labels.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace hymcache {

// X(Name, "name", "what it means"); values are stable (they are never
// reused), kNone is 0.
#define HYMCACHE_STATUS_REASONS(X)                                          \
  X(kStoreQueueFull, "store_queue_full",                                    \
    "the client's queue of asynchronous stores was full; the store was "    \
    "skipped")                                                              \
  X(kNoRoom, "no_room",                                                     \
    "the master found no node with room for the blocks (after eviction)")   \
  X(kNodeRefusedWrite, "node_refused_write",                                \
    "the storage node refused the bytes (its write buffer or device was "   \
    "full)")                                                                \
  X(kNotAttempted, "not_attempted",                                         \
    "the operation was never carried out: the exchange it belonged to "     \
    "failed first")                                                         \
  X(kNotLeader, "not_leader",                                               \
    "the master called does not lead (it stands by, or was deposed): call " \
    "the leader; LeaderHintOf gives it when the master knew it")            \
  X(kReadOnly, "read_only",                                                 \
    "the master led until it lost etcd (no quorum, or cut off) and now "    \
    "answers lookups only: writes are refused until an election with a "    \
    "quorum makes it (or another master) lead again; skip the store or "    \
    "retry later")                                                          \
  X(kWriteReceiptInvalid, "write_receipt_invalid",                          \
    "a PutCommit named a written slot without the storage node's write "    \
    "receipt for it (missing, forged, or another slot's, generation's or "  \
    "node's): the master committed nothing of that put (docs/ha.md, "       \
    "node-confirmed commits)")                                              \
  X(kNodesRejoining, "nodes_rejoining",                                     \
    "the master has just started serving (elected, or restarted) and no "   \
    "storage node has re-registered and reconciled with it yet, though "    \
    "some were alive: puts are placeable again within a heartbeat or two; " \
    "retry the same master shortly")                                        \
  X(kConnectionRefused, "connection_refused",                               \
    "the host answered that nothing listens at the address's port "         \
    "(ECONNREFUSED): the process is gone, not merely slow or cut off")      \
  X(kMasterEpochBehind, "master_epoch_behind",                              \
    "a storage node registering has accepted a master of a higher epoch "   \
    "than this master's (etcd was recreated empty, and no master's store "  \
    "remembered that epoch): an elected master ends its term so that the "  \
    "next leader's epoch is above it; register again shortly")              \
  X(kEnginesFull, "engines_full",                                           \
    "the master already keeps the caches of max_engines engines "           \
    "(ReportEngineBlocks): a new engine is known once one of them has not " \
    "reported for the engine TTL")                                          \
  X(kEngineReportsOff, "engine_reports_off",                                \
    "the master keeps no engines' caches (--max_engines=0): "               \
    "ReportEngineBlocks is refused and PrefixQuery answers per node only")  \
  X(kCommitNotConfirmed, "commit_not_confirmed",                            \
    "a leader with --replication=confirm answered the commit, but a "       \
    "standby it named no longer follows that leader's database (a "         \
    "failover came between): the put may be lost; store it again")

enum class StatusReason : uint32_t {
  kNone = 0,
#define HYMCACHE_STATUS_REASON_ENUM(name, str, doc) name,
  HYMCACHE_STATUS_REASONS(HYMCACHE_STATUS_REASON_ENUM)
#undef HYMCACHE_STATUS_REASON_ENUM
};

// The payload's type URL.
inline constexpr absl::string_view kStatusReasonUrl =
    "type.hymcache.dev/hymcache.StatusReason";

// `s` with `reason` attached (replacing any earlier one). An OK status is
// returned unchanged: OK has no reason.
absl::Status WithReason(absl::Status s, StatusReason reason);

// The reason attached to `s`, kNone when there is none (or an unknown value,
// from a newer peer).
StatusReason ReasonOf(const absl::Status& s);

// The stable name ("store_queue_full"; "none" for kNone).
absl::string_view ReasonName(StatusReason reason);

// Where a kNotLeader status points (docs/ha.md): the leader the refusing
// master knows of, and its epoch. It rides in a second payload, "EPOCH
// ADDRESS" in decimal and text, so that it crosses gRPC with the reason
// (common/grpc_status.h).
struct LeaderHint {
  // The leader's client address ("host:port"); "" when none is known.
  std::string address;
  // The leader's epoch (common/leader_election.h); 0 when none is known.
  int64_t epoch = 0;
};
inline constexpr absl::string_view kLeaderHintUrl =
    "type.hymcache.dev/hymcache.LeaderHint";

// Unavailable(message) with reason kNotLeader and `hint` attached.
absl::Status NotLeaderError(absl::string_view message, const LeaderHint& hint);
// The hint a kNotLeader status carries; nullopt when it carries none (or a
// malformed one).
std::optional<LeaderHint> LeaderHintOf(const absl::Status& s);

}  // namespace hymcache
