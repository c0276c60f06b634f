// fsck: compares the master's listings with every storage node's extents.
//
// The storage nodes are the truth about which bytes exist (see
// master/master_service_reconcile.cc); fsck reports where the
// master's index disagrees with them:
//   * listed but missing: the master lists a key at a location its node
//     does not hold (a reader would be refused);
//   * present but unlisted: a node holds an extent the master does not list
//     (space nobody can reach until the node's next reconciliation);
//   * mismatched: the node holds the listed generation at another range;
//   * unreachable: a listed block whose chain is broken before it on its
//     node (the master removes such tails itself; a chain continued on
//     another node is not linked and not checked);
// and, for information, the checksum failures the nodes counted since they
// started (hybrid capacity tier: an object whose bytes fail their CRC32C is
// dropped by its node at once, so its listing shows up as listed-but-missing
// until the node reconciles or a reader reports it; the counter itself is
// not an inconsistency).
// Listings on nodes that are not alive, or whose control port does not
// answer, are counted as unchecked, not as inconsistencies.
//
// Safe under load: a listing is taken from the master first, then from each
// node, so a put that commits in between can look unlisted, and an object
// evicted in between can look missing. fsck therefore runs two passes
// `settle` apart and reports only the findings present in both (same kind,
// same generation). A put still pending after `settle` can still look
// unlisted; use a settle longer than puts take.
//
// Repair: listings found missing or mismatched are dropped through the
// master's read repair (ReportMissing: only if the listing still names that
// exact location); unreachable blocks are removed (Remove); nodes holding
// unlisted extents are asked to reconcile
// (StorageControl.RequestReconcile), which frees what the master neither
// lists nor has pending. fsck then checks again and reports what is left.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "proto/common.pb.h"

namespace hymcache::hymctl {

struct FsckOptions {
  std::string master_address;
  // Token and TLS towards the master and the nodes. Default: none.
  ChannelSecurity security;
  // Time between the two passes. Default: 2 s.
  absl::Duration settle = absl::Seconds(2);
  // Repair what is found, then check again. Default: false.
  bool repair = false;
  // Deadline of each RPC stream. Default: 60 s.
  absl::Duration rpc_timeout = absl::Seconds(60);
};

struct FsckFinding {
  enum class Kind { kListedMissing, kUnlisted, kMismatched, kUnreachable };
  Kind kind;
  uint32_t node_id = 0;
  std::string key;             // empty for kUnlisted
  hymcache::v1::Location listed;  // kListedMissing, kMismatched
  hymcache::v1::Location held;    // kUnlisted, kMismatched
};

struct FsckReport {
  uint64_t listed = 0;     // listings on checked nodes
  uint64_t held = 0;       // extents the checked nodes hold
  uint64_t matched = 0;
  uint64_t unchecked = 0;  // listings on dead or unreachable nodes
  uint64_t nodes_checked = 0;
  std::vector<std::string> unreachable;  // "node N (name): why"
  uint64_t checksum_failures = 0;        // summed node counters (info)
  std::vector<FsckFinding> findings;     // confirmed by both passes
  // With repair: what was done, and the findings left afterwards.
  uint64_t listings_dropped = 0;
  uint64_t nodes_reconciled = 0;
  uint64_t remaining = 0;

  bool clean() const { return findings.empty(); }
};

// Errors: Unavailable / DeadlineExceeded if the master cannot be listed.
absl::StatusOr<FsckReport> RunFsck(const FsckOptions& options);

const char* FindingKindName(FsckFinding::Kind kind);

}  // namespace hymcache::hymctl
