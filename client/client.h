// hymcache::Client: the C++ SDK an inference server links to store and load
// KV-cache blocks.
//
// Blocks are named by keys (see block_key.h for prefix-chained keys). The
// master maps each key to a Location on a storage node; the bytes move over
// the data plane (TCP, same-host shared memory or RDMA: ClientOptions::
// transport) straight between the node and the caller's buffers.
//
//   auto client = hymcache::Client::Create({.master_address = "host:50051"});
//   auto got = client->Load(keys, buffers);  // the leading run of hits
//   // blocks [got->loaded, keys.size()) are recomputed by the engine, then
//   client->Store(new_keys, new_buffers);    // stored in the background
//
// One read path (Load; Get is Load without prefetch hints) and one write
// path (Store; Put is Store and wait). Every call takes an absolute
// deadline (absl::Time; absl::InfinitePast() means now + the client's
// default). When it passes, the call returns what it finished and the
// caller recomputes the rest; nothing writes into the caller's buffers
// after a read returns.
//
// Thread safety: a Client is safe for concurrent use without external
// synchronization.
#pragma once

#include <cstddef>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/options.h"
#include "common/cluster_stats.h"

namespace hymcache {

// Caller-owned memory.
struct ConstBuffer {
  const void* data = nullptr;
  size_t size = 0;
};
struct MutableBuffer {
  void* data = nullptr;
  size_t size = 0;
};

// Which memory a call's buffers are in. Host memory is read and written in
// place; CUDA device memory goes through the client's pinned bounce pool
// (ClientOptions::device): a load copies the loaded blocks host->device, a
// store copies device->host before writing (see docs/data_planes.md, "GPU
// memory"). A client built without CUDA support refuses device buffers
// with FailedPrecondition; it never reads a device pointer as host memory.
enum class MemoryKind {
  kHost,
  kCudaDevice,
};

struct MemorySpace {
  MemoryKind kind = MemoryKind::kHost;
  // CUDA device ordinal of the buffers (kCudaDevice only). Default: 0.
  int device = 0;
};

// The master's permission to read (lookup) or write (put) one location
// until it expires (see proto/common.proto Capability). Opaque to callers:
// the storage node checks it on the data plane.
struct ObjectCapability {
  int64_t expires_unix_ms = 0;
  uint8_t rights = 0;
  std::array<uint8_t, 16> tag{};
};

// Where an object lives (see proto/common.proto Location).
struct ObjectLocation {
  uint32_t node_id = 0;
  uint32_t region_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t generation = 0;
  ObjectCapability capability;
};

// Per-call options of the calls that take no more than a deadline.
struct CallOptions {
  // Absolute deadline. Default: absl::InfinitePast() = now + the client's
  // default_deadline (10 s).
  absl::Time deadline = absl::InfinitePast();
};

struct LookupResult {
  // Per key, in order: whether it is stored (on a live node).
  std::vector<bool> found;
  // Per key; meaningful where found.
  std::vector<ObjectLocation> locations;
  // Number of leading keys found: the reusable prefix.
  size_t hit_prefix = 0;
};

// What Exists answers: BatchLookup's answer without the locations.
struct ExistsResult {
  // Per key, in order: whether it is stored (on a live node).
  std::vector<bool> found;
  // Number of leading keys found: the reusable prefix.
  size_t hit_prefix = 0;
};

enum class PutOutcome {
  kStored,         // written and committed by this call
  kAlreadyStored,  // the key was already stored: nothing written
  kInProgress,     // another writer is storing the key: nothing written
  kFailed,         // not stored; see PutResult::errors
};

struct PutResult {
  // Per key, in order.
  std::vector<PutOutcome> outcomes;
  // Per key: OK, or why it failed.
  std::vector<absl::Status> errors;
  size_t stored = 0;
  size_t skipped = 0;  // kAlreadyStored + kInProgress
  size_t failed = 0;
  // Of `failed`, keys refused for lack of room (ResourceExhausted: no node
  // had space, or the node's write buffer was full). Opportunistic writes
  // skip these; nothing is retried.
  size_t refused = 0;
  // Node the (last chunk of) stored blocks went to (0 if none).
  uint32_t node_id = 0;
  // Copies stored on a second node (StoreOptions::replicas).
  size_t replicated = 0;
};

// A request's read path (Client::Load).
struct LoadOptions {
  // Absolute deadline. Default: absl::InfinitePast() = now + the client's
  // default_deadline (10 s). When it passes, Load returns the blocks it has
  // loaded, cancels the rest on the nodes, and the engine recomputes them.
  absl::Time deadline = absl::InfinitePast();
  // Send each node the ordered list of its blocks first, so that it stages
  // them from SSD into DRAM ahead of the reads. false: plain reads (each
  // read of an unstaged block waits for the SSD). A load whose found blocks
  // one read takes (all looked up, one node, read_batch_bytes) sends no
  // list even so: there is nothing to stage ahead of that read, and the
  // list would cost a round trip. Default: true.
  bool prefetch = true;
  // Which memory every buffer of the call is in. Default: host memory.
  // Device buffers: the keys are loaded in groups that fit one bounce chunk
  // (ClientOptions::device.bounce_chunk_bytes), each group's device copy
  // overlapping the next group's reads; a block whose copy fails counts as
  // not loaded (stop_reason carries the CUDA error). Errors (whole call):
  // FailedPrecondition (built without CUDA).
  MemorySpace memory;
};

struct LoadResult {
  // Blocks [0, loaded) are in the caller's buffers, complete.
  size_t loaded = 0;
  // Byte length of each loaded block.
  std::vector<uint64_t> lengths;
  // Leading keys the master reported stored (>= loaded). Keys past the
  // first lookup round trip that were not looked up count as not stored.
  size_t hit_prefix = 0;
  // Why loading stopped before the end of the key list: NotFound (a miss or
  // the object vanished), DeadlineExceeded, Unavailable (node unreachable),
  // OutOfRange (a buffer was too small). OK when everything was loaded.
  absl::Status stop_reason;
  // Bytes loaded (sum of lengths).
  uint64_t bytes = 0;
};

// Placement hints and limits of an opportunistic Store.
struct StoreOptions {
  // Absolute deadline of the whole store. A store never blocks the caller;
  // this bounds how long its buffers are in use. Default:
  // absl::InfinitePast() = now + the client's default_store_deadline (2 s).
  absl::Time deadline = absl::InfinitePast();
  // Key of the block preceding keys[0] in the request's chain (the last
  // block of the prefix the engine loaded). The master places the new
  // blocks on that block's node when it has room, keeping the chain on one
  // node for ordered prefetch. Empty: keys[0] heads its chain.
  // keys are in chain order: eviction prefers the later ones (a chain that
  // loses its tail still serves a shorter prefix).
  std::string parent_key;
  // Relocation (an admin's hymctl drain --copy; needs an admin token where
  // the master checks identities): `keys` are objects the caller read from
  // this node, to be moved off it. A key still listed there is written to
  // another node and moved there at commit, keeping its chain links, if
  // its listing did not change meanwhile; any other key is skipped
  // (kAlreadyStored: nothing written). Host buffers only. 0: an ordinary
  // store. Default: 0.
  uint32_t relocate_from_node = 0;
  // Copies of each block: 2 also stores a copy of every block stored (or
  // found stored) on another node, once the blocks are committed, so that
  // losing one node loses none of them (a prefix many sessions share: a
  // system prompt, an agent's scaffold). The copies count against capacity
  // and the tenant's quota like any block and are evicted like one; a
  // lookup uses a copy when the block's own node is not readable. Best
  // effort: a copy that finds no room is skipped (PutResult::replicated
  // counts the ones stored). A tenant whose replication factor is 2 (hymctl
  // tenant set-replicas) gets copies whatever this says. 1 or 2. Default: 1.
  uint32_t replicas = 1;
  // Which memory every buffer of the call is in. Default: host memory.
  // Device buffers are copied device->host into bounce chunks, one group of
  // keys at a time, before they are written; a failed copy fails its keys
  // and the rest of the chain. Errors (whole call, through the handle):
  // FailedPrecondition (built without CUDA).
  MemorySpace memory;
};

// Completion of an asynchronous Store. Thread-safe.
class StoreHandle {
 public:
  virtual ~StoreHandle() = default;
  // Whether the store finished (its buffers are no longer used).
  virtual bool Done() const = 0;
  // Waits until the store finishes or `deadline` passes (DeadlineExceeded;
  // the store goes on). The result: per key stored / skipped / failed
  // (refused), or a whole-call error (InvalidArgument, Unavailable,
  // ResourceExhausted when the client's store queue is full).
  virtual absl::StatusOr<PutResult> Wait(
      absl::Time deadline = absl::InfiniteFuture()) = 0;
};

// A think-time hint (Client::HintNextTurn).
struct TurnHintOptions {
  // When the conversation's next turn is expected, from now; zero: unknown
  // (the nodes stage its blocks as soon as their windows are idle).
  // Default: zero.
  absl::Duration expected_in = absl::ZeroDuration();
  // How long past expected_in the nodes hold the blocks staged before
  // giving up on the turn. > 0. Default: 60 s (nodes cap expected_in + hold
  // at their max_hint_hold, 5 min by default).
  absl::Duration hold = absl::Seconds(60);
};

struct NodeStatus {
  uint32_t node_id = 0;
  std::string name;
  std::string data_address;
  std::string control_address;
  bool alive = false;
  // Registered with its objects kept, not yet reconciled with the master:
  // its objects are served, it takes no placements.
  bool awaiting_reconcile = false;
  int64_t last_heartbeat_unix_ms = 0;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t object_count = 0;
  std::string device_kind;
};

// The master's cluster-wide numbers (common/cluster_stats.h): object_count,
// object_bytes, pending_puts, nodes_alive, nodes_dead,
// index_bytes_per_entry, and since the master started: evicted_objects and
// evicted_bytes (evictions to make room), reconciliations with the nodes,
// the listings they removed (reconcile_dropped_listings: the node did not
// hold them) and the unlisted extents they handed back
// (reconcile_unlisted_extents), and listings dropped by read repair
// (read_repairs).
struct ClusterStatus {
  std::vector<NodeStatus> nodes;
  HYM_CLUSTER_STAT_MEMBERS
};

// For routers (Client::PrefixQuery): how much of a chain of keys is cached,
// and where.
struct PrefixAnswer {
  // Leading keys stored on alive nodes (what a Load would read).
  uint32_t hit_prefix_length = 0;
  struct Node {
    uint32_t node_id = 0;
    // Leading keys all on this node.
    uint32_t longest_prefix = 0;
    // Keys of the hit prefix this node holds.
    uint32_t blocks = 0;
  };
  // Every node holding a block of the hit prefix, by node_id.
  std::vector<Node> nodes;
  struct Engine {
    std::string engine_id;
    // Leading keys the engine's own cache holds.
    uint32_t longest_prefix = 0;
  };
  // Engines of this caller's tenant whose own caches hold keys[0]
  // (Client::ReportEngineBlocks), longest prefix first.
  std::vector<Engine> engines;
};

// What an engine's own cache (its GPU's prefix cache) gained and lost since
// its last report (Client::ReportEngineBlocks). Applied in field order.
struct EngineBlocksReport {
  // 1..128 bytes, unique within the tenant.
  std::string engine_id;
  // The engine dropped every block, or the reporter resends its whole set.
  bool cleared = false;
  std::vector<std::string> removed;
  std::vector<std::string> stored;
};

struct EngineBlocksReply {
  // Keys the master now holds for the engine: a reporter whose own count
  // differs resends its whole set (cleared, then every key).
  uint64_t blocks = 0;
  // Report again within this, or the master forgets the engine.
  absl::Duration ttl;
};

class Client {
 public:
  // Connects lazily: Create succeeds while the master is down; calls then
  // fail with Unavailable until it is up. InvalidArgument on bad options;
  // FailedPrecondition when options.grpc_poll_strategy cannot take effect
  // (gRPC already runs in this process).
  static absl::StatusOr<std::unique_ptr<Client>> Create(
      const ClientOptions& options);

  virtual ~Client() = default;

  // Looks up `keys` in order. Errors: InvalidArgument (empty list, empty or
  // oversized key), Unavailable, DeadlineExceeded.
  virtual absl::StatusOr<LookupResult> BatchLookup(
      absl::Span<const std::string> keys, const CallOptions& call = {}) = 0;

  // Which of `keys` are stored: BatchLookup's answer without locations,
  // cheaper on both sides (the master signs no capabilities and sends no
  // node entries; the answer is a bitmap). For a router's or an engine's
  // prefix match, which reads nothing. Errors: as BatchLookup.
  virtual absl::StatusOr<ExistsResult> Exists(
      absl::Span<const std::string> keys, const CallOptions& call = {}) = 0;

  // A request's read path. Looks `keys` up (pipelined: with prefetch, the
  // first round trip carries lookup_batch_keys keys and reads start as soon
  // as it returns),
  // tells each node holding hits the ordered list of its blocks so that it
  // stages them ahead (LoadOptions::prefetch), then reads the blocks in
  // order into `buffers`, each released on its node as soon as it has been
  // read. Returns how many leading blocks were loaded; see LoadResult. On
  // the deadline it returns what it has and cancels the rest on the nodes;
  // nothing writes into `buffers` after Load returns.
  // Errors (whole call): InvalidArgument (empty key list, sizes differ),
  // Unavailable or DeadlineExceeded from the master before anything was
  // loaded.
  virtual absl::StatusOr<LoadResult> Load(
      absl::Span<const std::string> keys,
      absl::Span<const MutableBuffer> buffers,
      const LoadOptions& options = {}) = 0;

  // Stores a request's new blocks asynchronously and opportunistically:
  // returns at once; a write a node refuses (no room, write buffer full) is
  // skipped and reported in the result, never retried. `buffers` must stay
  // valid and unchanged until the handle is Done(). Keys are copied.
  // The keys are one chain (keys[i+1] extends keys[i]): a block after one
  // that could not be stored is not kept, and removing a block removes the
  // blocks after it. All new blocks of one call go to one storage node when
  // the call fits one master RPC (max_keys_per_rpc keys); longer calls ask
  // for the first chunk's node for every later chunk, which the master
  // honours while that node has room. Keys already stored, or being stored
  // by another writer, are skipped. Per-key failures (a node refusing a
  // write, the deadline) are reported in the result, and the keys written
  // before them are still committed. Never fails: errors are reported
  // through the handle (whole call: InvalidArgument for sizes that differ,
  // an empty buffer or key list; Unavailable; ResourceExhausted when
  // max_pending_stores are pending).
  virtual std::shared_ptr<StoreHandle> Store(
      absl::Span<const std::string> keys,
      absl::Span<const ConstBuffer> buffers,
      const StoreOptions& options = {}) = 0;

  // Load without prefetch hints (plain reads; each lookup round trip carries
  // max_keys_per_rpc keys), with the deadline of `call` (default: now +
  // default_deadline). See Load for the result and errors.
  absl::StatusOr<LoadResult> Get(absl::Span<const std::string> keys,
                                 absl::Span<const MutableBuffer> buffers,
                                 const CallOptions& call = {});

  // Store, then wait for it: the deadline of `call` (default: now +
  // default_deadline) bounds the store, and the result is the handle's
  // (StoreHandle::Wait). Blocks before a failure are still committed. "No
  // node has room" refuses every key (PutResult::refused) rather than failing the
  // call. Errors (whole call): InvalidArgument (sizes differ, an empty
  // buffer or key list), Unavailable or DeadlineExceeded from the master
  // before anything was stored.
  // (The client runs it on the calling thread; the default implementation,
  // for other Clients, is Store(...)->Wait().)
  virtual absl::StatusOr<PutResult> Put(absl::Span<const std::string> keys,
                                        absl::Span<const ConstBuffer> buffers,
                                        const CallOptions& call = {});

  // Removes keys; per key whether it was stored. The blocks after a removed
  // one in its chain (on the same node) go too: nothing could reach them.
  virtual absl::StatusOr<std::vector<bool>> Remove(
      absl::Span<const std::string> keys, const CallOptions& call = {}) = 0;

  // Think-time hints (docs/prefetch.md). Advice only: each returns at once
  // and its work (a lookup of `keys`, then one small frame per
  // node holding them) runs in the background; it never fails or delays a
  // Load, Store or Put. A client runs at most max_pending_hints at once.
  //
  // HintNextTurn: `keys` is a conversation's chain, in order (the blocks its
  // next turn will load first), just answered. Nodes stage the stored
  // prefix of it into DRAM while their windows are idle, so that the next
  // turn's Load finds it staged, and the lookup keeps the chain recent on
  // the master (away from eviction).
  // HintConversationEnded: the conversation will not come back; the nodes
  // drop its hints, and the master moves the chain's own blocks (not a
  // prefix other chains share) to the front of their node's eviction
  // order: they stay stored, and go before any other block when the node
  // needs room.
  // Errors: InvalidArgument (empty list, empty or oversized key, hold <= 0),
  // ResourceExhausted (max_pending_hints in flight: the hint is dropped).
  virtual absl::Status HintNextTurn(absl::Span<const std::string> keys,
                                    const TurnHintOptions& options = {}) = 0;
  virtual absl::Status HintConversationEnded(
      absl::Span<const std::string> keys) = 0;

  // Nodes, liveness, capacity and object counts.
  virtual absl::StatusOr<ClusterStatus> GetClusterStatus(
      const CallOptions& call = {}) = 0;

  // For routers (docs/deployment.md, "KV events"): the longest cached
  // prefix of the chain `keys` (keys[i+1] extends keys[i]; at most
  // max_keys_per_rpc), per node and per engine that reports its cache.
  // Errors: InvalidArgument (no keys, too many, an empty or oversized
  // key), the RPC's.
  virtual absl::StatusOr<PrefixAnswer> PrefixQuery(
      absl::Span<const std::string> keys, const CallOptions& call = {}) = 0;
  // For an engine's reporter (python -m hymcache.engine_blocks): sends
  // `report`, in several calls when it has more than max_keys_per_rpc keys
  // (`cleared` with the first), and answers the master's count after the
  // last. A report with no keys keeps the engine known. Errors:
  // InvalidArgument (a bad id or key), ResourceExhausted (reason
  // engines_full), FailedPrecondition (reason engine_reports_off), the
  // RPC's.
  virtual absl::StatusOr<EngineBlocksReply> ReportEngineBlocks(
      const EngineBlocksReport& report, const CallOptions& call = {}) = 0;

  // Registers engine-owned memory [data, data + size) (e.g. the KV buffers
  // the engine loads into) for direct transfers: RDMA reads then land in
  // it, and writes leave from it, without a copy through the transport's
  // bounce buffer. The memory stays pinned and must stay mapped until
  // UnregisterMemory(data). A no-op for transports without registration.
  // Errors: InvalidArgument (null, empty, overlapping a registration),
  // ResourceExhausted (the locked-memory limit).
  virtual absl::Status RegisterMemory(void* data, size_t size) = 0;
  // Errors: NotFound if `data` does not start a registration.
  virtual absl::Status UnregisterMemory(void* data) = 0;

 protected:
  // The deadline of a Put given none: now + ClientOptions::default_deadline.
  virtual absl::Time DefaultCallDeadline() const {
    return absl::Now() + absl::Seconds(10);
  }
};

}  // namespace hymcache
