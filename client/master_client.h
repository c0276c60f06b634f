// MasterClient: the client library's view of the master, in absl types.
//
// ClientImpl (client_impl.h) talks to the master only through this
// interface: the gRPC implementation (grpc_master_client.h) owns the proto
// conversion and the pipelined lookups of a Load; FakeMasterClient
// (client/testing/fake_master_client.h) keeps an in-memory index so that
// Load and Store are unit-tested without daemons (the way leveldb injects
// Env).
//
// Internal to the client library (not a public header of //client).
//
// Thread safety: implementations are safe for concurrent use.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/transport.h"

namespace hymcache {

// The answer to lookups of consecutive keys.
struct LookupBatch {
  // Per key, in order: whether it is stored (on a live node), and where.
  // locations[i] is meaningful where found[i].
  std::vector<bool> found;
  std::vector<ObjectLocation> locations;
  // How to reach the nodes the found locations name.
  std::vector<PeerInfo> nodes;
  // A read's lookup only: the master asks the reader to store copies of
  // its read's blocks up to and including this batch's key copy_prefix - 1
  // (BatchLookupResponse.copy_prefix_length); 0: nothing asked.
  uint32_t copy_prefix = 0;
};

// The lookups of one read: consecutive chunks of its keys, several in
// flight, answers taken in order. Destroying the stream cancels the calls
// still in flight. Used by one thread at a time.
class LookupStream {
 public:
  virtual ~LookupStream() = default;
  // Whether answers remain to be taken (false after CancelRest).
  virtual bool has_next() const = 0;
  // The next chunk's answer (one entry per key of the chunk, following the
  // previous chunk's keys); nullptr when `block` is false and it has not
  // arrived. The pointer is valid until the next call. Errors: the RPC's
  // status, DeadlineExceeded, Internal for a malformed answer.
  virtual absl::StatusOr<const LookupBatch*> Next(bool block) = 0;
  // No more answers are wanted: cancels the calls in flight.
  virtual void CancelRest() = 0;
};

struct PutStartArgs {
  // Keys and byte lengths of the objects (same count, 1..max_keys_per_rpc).
  std::vector<std::string> keys;
  std::vector<uint64_t> lengths;
  // Place on this node if it is alive and has room (0: the master chooses).
  uint32_t preferred_node_id = 0;
  // Key of the block before keys[0] in its chain ("": keys[0] heads it).
  std::string parent_key;
  // Relocation off this node (StoreOptions::relocate_from_node); 0: none.
  uint32_t relocate_from_node = 0;
  // Copies of committed keys on another node (StoreOptions::replicas).
  bool replica = false;
  // With replica: the generation each key's copied bytes were listed with
  // (empty, or one per key; 0: any). A key listed since with another
  // generation is not copied (PutStartRequest.copied_generations).
  std::vector<uint64_t> copied_generations;
};

enum class PutSlotState {
  kAllocated,   // write the bytes to `location`, then commit
  kExists,      // already stored: nothing to write
  kInProgress,  // another put of the key is in progress: nothing to write
};

struct PutSlot {
  PutSlotState state = PutSlotState::kAllocated;
  // kAllocated: where to write, with the capability to write it. kExists:
  // where the key is stored (no capability).
  ObjectLocation location;
};

struct PutStartReply {
  // Handle for PutCommit / PutAbort; 0 when nothing was allocated.
  uint64_t put_id = 0;
  // One per key, in order (the caller checks the count).
  std::vector<PutSlot> slots;
  // The node every allocated slot is on.
  PeerInfo node;
  // The tenant's replication factor (2: also store copies).
  uint32_t replicas = 0;
};

// What a lookup is for (BatchLookupRequest's for_read, next_turn, ended and
// exists_only).
enum class LookupIntent : uint8_t {
  // Nothing changes on the master.
  kPeek,
  // The caller is about to read the leading hits: the master marks them
  // used and holds them for its read lease (for_read).
  kRead,
  // kRead for a think-time hint (Client::HintNextTurn): the conversation
  // answered a turn and `keys` are its chain, or a run of it (for_read with
  // next_turn; the master learns how often turns come back from it).
  kNextTurn,
  // `keys` are a chain (or a run of it, head first) whose conversation
  // ended: the master moves its unshared tail to the front of its node's
  // eviction order (ended).
  kEnded,
  // Only which keys are stored (exists_only): the answer's `found`, with no
  // locations or nodes (a master that predates exists_only sends them
  // anyway).
  kExists,
};

class MasterClient {
 public:
  virtual ~MasterClient() = default;

  // One lookup of `keys` (at most max_keys_per_rpc), for `intent`.
  // Errors: the RPC's status, Internal for a malformed answer.
  virtual absl::StatusOr<LookupBatch> Lookup(absl::Span<const std::string> keys,
                                             LookupIntent intent,
                                             absl::Time deadline) = 0;

  // Starts the pipelined for-read lookups of a Load: chunks of
  // `chunk_keys` (at most max_keys_per_rpc), lookup_pipeline_depth in
  // flight. `keys` must outlive the stream.
  virtual std::unique_ptr<LookupStream> StartLookups(
      absl::Span<const std::string> keys, size_t chunk_keys,
      absl::Time deadline) = 0;

  // Allocates space for new objects. Errors: the RPC's status
  // (ResourceExhausted: no node has room).
  virtual absl::StatusOr<PutStartReply> PutStart(const PutStartArgs& args,
                                                 absl::Time deadline) = 0;
  // Makes a put's written slots visible; `failed_indexes` (into the
  // PutStart keys) are freed instead. `receipts`: one per PutStart key, the
  // node's write receipt of each written slot (Transport::Write; ignored
  // for the others). Errors: the RPC's status (PermissionDenied with
  // StatusReason::kWriteReceiptInvalid: a written slot's receipt is missing
  // or not the node's; nothing was committed).
  virtual absl::Status PutCommit(uint64_t put_id,
                                 absl::Span<const uint32_t> failed_indexes,
                                 absl::Span<const wire::Receipt> receipts,
                                 absl::Time deadline) = 0;
  // Frees a put's allocation without waiting for the answer (bounded by a
  // short timeout of its own; the master frees a put nobody commits when it
  // expires). No-op for put_id 0. The destructor waits for aborts in flight.
  virtual void PutAbortInBackground(uint64_t put_id) = 0;

  // Read repair: a node refused reads of keys[i] at locations[i] (it does
  // not hold them); the master drops the listings that still name those
  // exact locations.
  virtual absl::Status ReportMissing(absl::Span<const std::string> keys,
                                     absl::Span<const ObjectLocation> locations,
                                     absl::Time deadline) = 0;

  // Removes `keys` (at most max_keys_per_rpc); per key whether it was
  // stored.
  virtual absl::StatusOr<std::vector<bool>> Remove(
      absl::Span<const std::string> keys, absl::Time deadline) = 0;

  virtual absl::StatusOr<ClusterStatus> GetClusterStatus(
      absl::Time deadline) = 0;

  // PrefixQuery of `keys` (at most max_keys_per_rpc).
  virtual absl::StatusOr<PrefixAnswer> PrefixQuery(
      absl::Span<const std::string> keys, absl::Time deadline) = 0;
  // One ReportEngineBlocks call (removed and stored together at most
  // max_keys_per_rpc keys).
  virtual absl::StatusOr<EngineBlocksReply> ReportEngineBlocks(
      const EngineBlocksReport& report, absl::Time deadline) = 0;
};

// Every MasterClient method as an implementation declares it, written once
// here for the classes that implement them all (FailoverMasterClient,
// FakeMasterClient), so that a method added above is added to each:
//   class Mine final : public MasterClient {
//    public:
//     HYMCACHE_MASTER_CLIENT_OVERRIDES
//   };
#define HYMCACHE_MASTER_CLIENT_OVERRIDES                                       \
  absl::StatusOr<LookupBatch> Lookup(absl::Span<const std::string> keys,       \
                                     LookupIntent intent, absl::Time deadline) \
      override;                                                                \
  std::unique_ptr<LookupStream> StartLookups(                                  \
      absl::Span<const std::string> keys, size_t chunk_keys,                   \
      absl::Time deadline) override;                                           \
  absl::StatusOr<PutStartReply> PutStart(const PutStartArgs& args,             \
                                         absl::Time deadline) override;        \
  absl::Status PutCommit(                                                      \
      uint64_t put_id, absl::Span<const uint32_t> failed_indexes,              \
      absl::Span<const wire::Receipt> receipts, absl::Time deadline) override; \
  void PutAbortInBackground(uint64_t put_id) override;                         \
  absl::Status ReportMissing(absl::Span<const std::string> keys,               \
                             absl::Span<const ObjectLocation> locations,       \
                             absl::Time deadline) override;                    \
  absl::StatusOr<std::vector<bool>> Remove(absl::Span<const std::string> keys, \
                                           absl::Time deadline) override;      \
  absl::StatusOr<ClusterStatus> GetClusterStatus(absl::Time deadline)          \
      override;                                                                \
  absl::StatusOr<PrefixAnswer> PrefixQuery(absl::Span<const std::string> keys, \
                                           absl::Time deadline) override;      \
  absl::StatusOr<EngineBlocksReply> ReportEngineBlocks(                        \
      const EngineBlocksReport& report, absl::Time deadline) override;

}  // namespace hymcache
