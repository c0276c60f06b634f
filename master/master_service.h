// MasterService: the master's logic, independent of gRPC. It owns
//   - the node table (registration, incarnations, heartbeats, liveness),
//   - one RegionAllocator per storage-node region (the master chooses every
//     object's address),
//   - the in-memory MetadataIndex of committed objects,
//   - the pending two-phase puts,
// and keeps the durable part (nodes, committed objects, generations) in a
// MetadataStore. MasterServer (master_server.h) adapts it to gRPC.
//
// Consistency: a change is written to the store first and applied in memory
// only after the write succeeded, so everything a reader can see is durable
// (modulo MetadataStore sync settings) and a failed write changes nothing.
// At start-up the index and allocators are rebuilt from the store; pending
// puts are not durable and are forgotten by a restart.
//
// Where each part lives (each file opens with the design of its part):
//   master_service.cc            options, Create, periodic upkeep
//                                (ReapExpired), stats.
//   master_service_nodes.cc      Liveness: registration (validation,
//                                takeover of a name, region rebuild),
//                                heartbeats, node keys and capabilities,
//                                drain and forget. A node is alive while
//                                registered with this process, reconciled,
//                                and heard from within node_timeout.
//   master_service_put.cc        Placement and Chains: PutStart puts a
//                                request's new slots on one node (ranked
//                                by master/placement.h: the parent's node
//                                within a margin, else by fill and load;
//                                else evict), PutCommit links each
//                                block to the one before it; nothing
//                                unreachable is stored.
//   master_service_eviction.cc   Eviction: an exact LRU list per node;
//                                only chain leaves go, never a block read
//                                within read_lease; tenants over their quota
//                                lose their own objects first.
//   master_service_lookup.cc     BatchLookup (recency and leases), listing,
//                                and Remove, which cascades to the blocks
//                                after a removed one (orphans).
//   master_service_reconcile.cc  Reconciliation: the storage nodes are the
//                                truth about which bytes exist; listings
//                                converge to them (and read repair).
//   master_service_recovery.cc   Start-up (store scan, or index snapshot
//                                plus the changes since) and Recency across
//                                restarts.
//   master_service_internal.h    helpers shared by these files.
//
// Thread safety: safe for concurrent use without external synchronization.
// One mutex guards all state (plain lookups share it as readers; for_read
// lookups update recency and take it exclusively); store writes happen
// under it, so commits are serialized in store order.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/capability.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/stats.h"
#include "common/wire.h"
#include "master/allocator.h"
#include "master/engine_caches.h"
#include "master/event_log.h"
#include "master/eviction_cost.h"
#include "master/metadata_index.h"
#include "master/metadata_store.h"
#include "master/placement.h"
#include "proto/master.pb.h"

namespace hymcache {
namespace master {

struct MasterServiceOptions {
  // A node that has not heartbeated for this long is dead: its objects are
  // misses and it gets no placements. Must be > 0. Default: 10 s.
  absl::Duration node_timeout = absl::Seconds(10);
  // Heartbeat period told to nodes at registration. Must be > 0 and below
  // node_timeout. Default: 1 s.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // A PutStart allocation not committed within this is freed. Must be > 0.
  // Default: 30 s.
  absl::Duration put_timeout = absl::Seconds(30);
  // Most keys in one PutStart / BatchLookup / Remove. 1..65536.
  // Default: 1024.
  uint32_t max_batch_keys = 1024;
  // Longest key in bytes. 1..65535. Default: 256.
  uint32_t max_key_bytes = 256;
  // Largest object in bytes. 1..2^48-1. Default: 1 GiB.
  uint64_t max_object_bytes = uint64_t{1} << 30;
  // An object returned by a for_read BatchLookup is not evicted for this
  // long afterwards (a read in progress). 0 disables the protection (reads
  // still count as recent use). 0..24 h. Default: 5 s.
  absl::Duration read_lease = absl::Seconds(5);
  // Most objects one PutStart may evict to make room (bounds the work under
  // the lock). 0 disables eviction: a full node refuses puts. Default: 4096.
  uint32_t max_evictions_per_put = 4096;
  // Period of each node's background reconciliation (anti-entropy), told
  // to nodes at registration. 0 disables the periodic rounds (registration
  // still reconciles). 0..24 h. Default: 60 s.
  absl::Duration reconcile_interval = absl::Seconds(60);
  // Most extents one reconciliation may report (bounds the master's memory
  // for it: about 40 bytes each). 1..2^28. Default: 2^26.
  uint64_t max_reconcile_extents = uint64_t{1} << 26;
  // Most unlisted extents returned by one reconciliation (the next round
  // returns the rest). 1..2^20. Default: 65536.
  uint32_t max_unlisted_per_reconcile = 65536;
  // Most objects one PutStart's eviction walk looks at, victims and objects
  // passed over (leased, pinned, or with children) together, across its
  // rounds. Must be > 0. Default: 16384.
  uint32_t max_eviction_scan = 16384;
  // Which evictable objects a PutStart evicts first on a full node
  // (master/eviction_cost.h): kLru, the least recently used leaf (chains
  // whose conversation ended first); kCost, the lowest cost score among
  // eviction_cost.pool least recent leaves (ended chains still first).
  // Quota evictions within a tenant stay LRU. Default: kLru (chosen by
  // measurement, docs/prefetch.md).
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;
  EvictionCostOptions eviction_cost;
  // Most objects whose last read ReapExpired writes to the store per call
  // (see Recency across restarts, master_service_recovery.cc). 0: reads are
  // not persisted (a restart orders objects by commit time). Default: 16384.
  uint32_t recency_batch = 16384;
  // Most node records kept (alive or dead). RegisterNode of a new name
  // beyond it is refused (ResourceExhausted); ForgetNode, or
  // forget_dead_nodes_after, removes dead ones. With the registration size
  // caps (see RegisterNode) it bounds ListNodes and GetStats to about
  // 11 KiB per node. 1..65536. Default: 1024.
  uint32_t max_nodes = 1024;
  // A node record not seen for this long (dead or deregistered) is
  // forgotten by ReapExpired, as by ForgetNode. absl::InfiniteDuration():
  // never. Must be > node_timeout. Default: 7 days.
  absl::Duration forget_dead_nodes_after = absl::Hours(7 * 24);
  // Pending (started, not yet committed or aborted) puts of one caller
  // (PutStart's caller key): at most this share of a node's capacity in
  // bytes on that node, and at most max_pending_slots_per_caller slots in
  // all, so that one caller's never-committed puts cannot fill a node.
  // PutStart beyond them is refused (ResourceExhausted). Share in (0, 1];
  // 1: no limit on bytes.
  // Default: 0.25, 65536.
  double max_pending_share_per_caller = 0.25;
  uint64_t max_pending_slots_per_caller = 65536;
  // Lifetime of the read capability handed out with each BatchLookup hit
  // (common/wire.h, "Capabilities"); write capabilities last as long as
  // their put. Longer than a client's call deadline (10 s) plus the read
  // lease, so a Load never outlives its capabilities; storage nodes also
  // accept a capability for their skew allowance past it. 1 s..1 h.
  // Default: 5 min.
  absl::Duration capability_lifetime = absl::Minutes(5);
  // A node's proof of its key (NodeAuth) is accepted when its time is
  // within this of the master's clock (clock skew plus queueing; a
  // recorded proof can be replayed within it, see docs/security.md).
  // 1 s..1 h. Default: 5 min.
  absl::Duration node_auth_window = absl::Minutes(5);
  // Source of time for liveness and put expiry. Not owned; must outlive the
  // service. Default: nullptr, meaning Clock::Real().
  Clock* clock = nullptr;
  // Index snapshot file (master/index_snapshot.h), written at shutdown and
  // every snapshot_interval, read at start-up: the index is loaded from it
  // and the store's changes since it are replayed, instead of a scan of
  // the whole store. Whenever that is not possible (no file, damaged, the
  // store no longer holds every change since, a store that keeps none)
  // start-up scans the store as without one. "": none. Default: "".
  std::string snapshot_path;
  // Period of the snapshots written by MaybeSnapshot (besides the one at
  // shutdown). 0: only at shutdown. Default: 10 min.
  absl::Duration snapshot_interval = absl::Minutes(10);
  // MaybeSnapshot also writes one once the store has taken this many
  // changes (sequence numbers) since the snapshot the index last matched,
  // or half as many as the index holds objects if that is more. So a kill
  // -9 leaves at most about half an index's worth of changes to replay (a
  // change replays in about a third of the time a scan spends per object),
  // and a write load, however heavy, pays one snapshot's shared lock
  // (about 0.1 s per million objects) per half index of changes. A master
  // that loaded by scanning, or took over a standby's index, counts from
  // sequence 0: it writes one at its first upkeep. 0: by time only.
  // Default: 100,000.
  uint64_t snapshot_changes = 100000;
  // The epoch of this master's term when elected through etcd
  // (master/master_ha.h), sent in RegisterNode, Heartbeat and GetStats
  // answers (master_epoch) so that nodes refuse a master of an older term.
  // 0: no election. Default: 0.
  int64_t epoch = 0;
  // With an epoch: called (on the RPC's thread; must return quickly) when a
  // node registers having accepted a master of a higher epoch, which it
  // passes; the registration is refused (FailedPrecondition, reason
  // kMasterEpochBehind). HaMaster ends its term above that epoch. Default:
  // none.
  std::function<void(int64_t node_epoch)> on_epoch_behind;
  // Node-confirmed commits (docs/ha.md): PutCommit commits a slot only
  // with the storage node's write receipt for it (PutCommitRequest.receipts,
  // signed with the node's key when the bytes landed), so that no client
  // can list a slot it never wrote. false: receipts are not checked (the
  // behaviour before receipts; for benchmarks of the master alone whose
  // nodes hold no bytes, and for clusters with nodes older than receipts).
  // Default: true.
  bool require_write_receipts = true;
  // Automatic copies of shared prefixes (docs/deployment.md, "Replicas of
  // hot prefixes"): a for_read BatchLookup whose hit prefix reaches a block
  // that at least this many chains continue from (linked children on any
  // node: the sessions that share the prefix up to it) asks its reader to
  // store copies of the prefix up to that block
  // (BatchLookupResponse.copy_prefix_length) when some of it has none, so
  // that losing one node loses the prefix for none of them. One reader per
  // block is asked per put_timeout. 0: never. 0..65536. Default: 0 (copies
  // cost capacity: an operator turns them on).
  uint32_t auto_replica_branches = 0;
  // Which node takes a put's new slots (master/placement.h).
  PlacementOptions placement;
  // KV events kept for WatchEvents subscribers (master/event_log.h): a
  // subscriber further behind is told what it missed. 0: none kept.
  // 0..2^24. Default: 65536 (about 16 MiB with 64-byte keys).
  size_t event_log_capacity = 65536;
  // Engines' own caches, as their reporters send them, for PrefixQuery's
  // answer per engine (master/engine_caches.h).
  EngineCachesOptions engine_caches;

  absl::Status Validate() const;
};

// The master service's counters since start, declared once
// (common/stats.h); kept under the service's lock and exported by the
// daemon (hymcache_master_*_total).
#define HYM_MASTER_SERVICE_COUNTERS(COUNTER, GAUGE, DGAUGE)                    \
  COUNTER(objects_dropped,                                                     \
          "Persisted objects dropped at start-up or re-registration: their "   \
          "node or region no longer holds them")                               \
  COUNTER(objects_purged,                                                      \
          "Objects purged because their node's memory started afresh")         \
  COUNTER(puts_expired, "Pending puts freed by expiry")                        \
  COUNTER(puts_cancelled,                                                      \
          "Pending puts cancelled: their node re-registered or left")          \
  COUNTER(evicted_objects,                                                     \
          "Committed objects evicted to make room for new puts")               \
  COUNTER(evicted_bytes, "Bytes (object lengths) of evicted objects")          \
  COUNTER(reconciliations, "Completed node reconciliations")                   \
  COUNTER(reconcile_dropped_listings,                                          \
          "Listings reconciliations removed: the node did not hold them")      \
  COUNTER(reconcile_unlisted_extents,                                          \
          "Unlisted extents reconciliations returned to nodes")                \
  COUNTER(read_repairs,                                                        \
          "Listings dropped because a reader reported the node refused them")  \
  COUNTER(orphans_removed,                                                     \
          "Objects removed because a block before them in their chain was "    \
          "removed")                                                           \
  COUNTER(                                                                     \
      commits_unreachable,                                                     \
      "Put slots freed at commit: the block before them was not committed")    \
  COUNTER(commits_refused_receipt,                                             \
          "PutCommits refused: a slot to commit lacked its node's write "      \
          "receipt (missing or forged)")                                       \
  COUNTER(recency_writes, "Object reads written to the store (recency)")       \
  COUNTER(recency_write_failures, "Failed writes of read-recency batches")     \
  COUNTER(puts_over_caller_limit,                                              \
          "PutStarts refused: their caller had too many pending puts")         \
  COUNTER(tenant_evicted_objects,                                              \
          "Objects evicted from a tenant over its quota for its own new put "  \
          "(also in evicted_objects)")                                         \
  COUNTER(                                                                     \
      puts_over_tenant_quota,                                                  \
      "PutStarts refused: the tenant could not be brought within its quota")   \
  COUNTER(nodes_forgotten,                                                     \
          "Node records removed (ForgetNode, or dead too long)")               \
  COUNTER(placements_spilled,                                                  \
          "PutStarts whose chain continued on another node: its own was "      \
          "filled past the spill margin (master/placement.h)")                 \
  COUNTER(placements_over_tenant_share,                                        \
          "PutStarts placed although every node was over the tenant's "        \
          "max_tenant_share_per_node")                                         \
  COUNTER(ended_chain_blocks_demoted,                                          \
          "Blocks of ended conversations moved to the least recent end of "    \
          "their node's eviction order (BatchLookup with ended)")              \
  COUNTER(turns_returned,                                                      \
          "Chains hinted as awaiting their next turn (BatchLookup with "       \
          "next_turn) read again: returns (eviction_policy cost)")             \
  COUNTER(turns_not_returned,                                                  \
          "Chains hinted as awaiting their next turn that ended or passed "    \
          "the turn horizon unread (eviction_policy cost)")                    \
  COUNTER(index_snapshots,                                                     \
          "Index snapshots written (by time, by changes, at shutdown)")        \
  COUNTER(objects_relocated,                                                   \
          "Objects moved to another node by a relocation (hymctl drain "       \
          "--copy)")                                                           \
  COUNTER(relocations_skipped,                                                 \
          "Relocated or replica copies not committed: the object was "         \
          "removed or changed between PutStart and PutCommit")                 \
  COUNTER(replicas_stored,                                                     \
          "Copies of blocks stored on a second node (StoreOptions::replicas)") \
  COUNTER(auto_copies_asked,                                                   \
          "Reads asked to store copies of a prefix many chains share "         \
          "(auto_replica_branches)")                                           \
  DGAUGE(placement_imbalance,                                                  \
         "The largest alive node's used bytes over the alive nodes' mean")
HYM_DECLARE_STATS_STRUCT(MasterServiceCounters, HYM_MASTER_SERVICE_COUNTERS);

// A tenant's quota as PutStart enforces it (0: unlimited).
struct TenantLimit {
  uint64_t max_objects = 0;
  uint64_t max_bytes = 0;
  bool limited() const { return max_objects != 0 || max_bytes != 0; }
};

// One node's extents as streamed by it during a reconciliation (see
// MasterService::BeginReconcile). Owned by the caller; not thread-safe.
class Reconciliation {
 public:
  // Adds a chunk of the node's extents. Errors: InvalidArgument (a
  // generation 0 or repeated, length 0), ResourceExhausted (more than
  // max_reconcile_extents in total). After an error the reconciliation is
  // unusable.
  absl::Status Add(
      const google::protobuf::RepeatedPtrField<hymcache::v1::Location>&
          extents);

  uint32_t node_id() const { return node_id_; }
  uint64_t held() const { return held_.size(); }

 private:
  friend class MasterService;
  struct Held {
    uint32_t region_id;
    uint64_t addr;
    uint64_t length;
  };
  uint32_t node_id_ = 0;
  uint64_t incarnation_ = 0;
  uint64_t epoch_ = 0;
  uint64_t max_ = 0;
  // By generation (unique cluster-wide).
  absl::flat_hash_map<uint64_t, Held> held_;
};

class MasterService {
 public:
  // Loads `store` (nodes, then objects), rebuilds the allocators and the
  // index (chains and recency order, see master_service_recovery.cc).
  // Objects whose node or region is gone, or whose range does not fit the
  // region, are dropped
  // with a WARNING and deleted from the store, and so are objects whose
  // chain lost a block before them (orphans_removed).
  // Errors: InvalidArgument for bad options or a null store; the store's
  // error if loading fails.
  static absl::StatusOr<std::unique_ptr<MasterService>> Create(
      const MasterServiceOptions& options,
      std::unique_ptr<MetadataStore> store);
  // As above, but instead of loading `store` it takes over what `preloaded`
  // loaded: its nodes, index, allocators and counts. The caller vouches
  // that `preloaded` loaded the same nodes and objects as `store` holds (a
  // standby's index, loaded while it stood by from a read-only view of the
  // same database at the same sequence: MasterServer::PreloadIndex), and
  // that nothing uses `preloaded` any more; it is destroyed here. Nodes
  // loaded count as seen now. Errors: as Create; `preloaded` null is
  // InvalidArgument.
  static absl::StatusOr<std::unique_ptr<MasterService>> CreatePreloaded(
      const MasterServiceOptions& options, std::unique_ptr<MetadataStore> store,
      std::unique_ptr<MasterService> preloaded);

  MasterService(const MasterService&) = delete;
  MasterService& operator=(const MasterService&) = delete;
  // Writes the reads not yet persisted (see Recency across restarts,
  // master_service_recovery.cc).
  ~MasterService();

  // Registers a node (or re-registers a known name; its id is stable).
  // A new name gets a new random node key (returned, persisted with the
  // node record). A known name must prove its key (request.auth): then, if
  // the incarnation differs, the objects in its non-persistent regions are
  // purged. Without the proof the name is taken over as a new node (every
  // object of the name purged, a new key issued), which is refused while
  // the old node may still be alive (seen within node_timeout and not
  // deregistered). A record persisted without a key (an older master) is
  // trusted on first use. If its regions changed, its allocators are
  // rebuilt and objects that no longer fit are dropped. Either way its
  // pending puts are cancelled.
  // Errors: InvalidArgument (name empty or > 128 bytes, address not
  // host:port or > 256 bytes, 0 or > 64 regions, capacity 0 or below
  // alignment, alignment not a power of two or > 1 GiB, repeated region id,
  // transport_params over their caps: 32 entries, keys 1..64 bytes, values
  // <= 4096 bytes, 8192 bytes in all); PermissionDenied (no valid proof for
  // a name whose node is alive); ResourceExhausted (a new name while
  // max_nodes records are kept); Internal (no random key); store errors.
  absl::StatusOr<hymcache::v1::RegisterNodeResponse> RegisterNode(
      const hymcache::v1::RegisterNodeRequest& request);

  // Records liveness. reregister=true if the id is unknown, the incarnation
  // differs or the node deregistered. Errors: PermissionDenied (the request
  // does not prove the node's key).
  absl::StatusOr<hymcache::v1::HeartbeatResponse> Heartbeat(
      const hymcache::v1::HeartbeatRequest& request);

  // Removes the record of the node named `name`, its objects and its
  // pending puts; if it comes back it registers as a new node. Errors:
  // NotFound (unknown name); FailedPrecondition (the node may still come
  // back: not deregistered and seen within node_timeout); store errors
  // (nothing removed).
  absl::StatusOr<hymcache::v1::ForgetNodeResponse> ForgetNode(
      const hymcache::v1::ForgetNodeRequest& request);

  // Drains (request.draining) or undrains the node named request.name: a
  // draining node gets no new placements (PutStart passes it over as if it
  // were not alive, also as a preferred or parent's node, and never evicts
  // on it); its committed objects are still found and served, and its keys
  // are still SLOT_EXISTS for PutStart. The state is persisted with the
  // node record (kept by a master restart and by re-registrations).
  // Errors: NotFound (unknown name); store errors (nothing changes).
  absl::StatusOr<hymcache::v1::SetNodeDrainingResponse> SetNodeDraining(
      const hymcache::v1::SetNodeDrainingRequest& request);

  // What the master knows about one key (see InspectKeyResponse): its
  // location and node (found even on a dead node), last read, lease,
  // chain links, tenant, and whether a put of it is pending. Changes
  // nothing. Errors: InvalidArgument (key empty or over max_key_bytes).
  absl::StatusOr<hymcache::v1::InspectKeyResponse> InspectKey(
      const hymcache::v1::InspectKeyRequest& request) const;

  // The node is dead from now on; objects in its non-persistent regions are
  // purged and its pending puts cancelled. Errors: NotFound for an unknown
  // id; PermissionDenied (the request does not prove the node's key);
  // FailedPrecondition for a different incarnation; store errors.
  absl::StatusOr<hymcache::v1::DeregisterNodeResponse> DeregisterNode(
      const hymcache::v1::DeregisterNodeRequest& request);

  // Allocates space for every key that is neither committed (on an alive
  // node: SLOT_EXISTS) nor in another pending put (SLOT_IN_PROGRESS). All
  // allocated slots go to one node (see Placement, master_service_put.cc): the
  // preferred node (preferred_node_id, else parent_key's node) if it is alive
  // and has room, else the next alive node (round robin) with room for all,
  // else the preferred (or next alive) node after evicting least recently used
  // objects, at most max_evictions_per_put of them.
  // Eviction plans before it acts: if the objects it may evict (chain
  // leaves, up to the first leased one, the caps, or the end of the list)
  // cannot free enough bytes, nothing is evicted. Only fragmentation can
  // make a put fail after evicting; those evictions stay made (they were
  // next in LRU order).
  // Errors: InvalidArgument (key count, key sizes, length count or values,
  // duplicate keys, parent_key too long or one of the keys); NotFound
  // (unknown preferred node); FailedPrecondition (parent_key is neither
  // committed nor in a pending put: the blocks would be unreachable);
  // ResourceExhausted (no room even after eviction, or `caller` has too
  // many pending puts, see max_pending_share_per_caller; nothing
  // allocated); store errors.
  // `caller` identifies who asks, for the pending-put limits (the gRPC
  // adapter passes its caller key; "" is one anonymous caller).
  // `quota`: the limits of the tenant whose key space the keys are in
  // (master/tenant.h; all keys of one request are one tenant's), 0 for
  // none. The tenant's committed objects plus its pending puts plus this
  // put's new slots must stay within them: if they would not, the tenant's
  // own least recently used objects are evicted first (chain leaves, not
  // leased by reads, not this put's parent or existing keys; nodes in
  // turn, at most max_evictions_per_put, planned before anything goes);
  // if even that cannot make room, ResourceExhausted naming the quota
  // (counted in puts_over_tenant_quota; *over_quota set when given) and
  // nothing changes. (Evictions made for the quota stay made if the put
  // then finds no node with room.)
  // Relocation (request.relocate_from_node, see master.proto): keys listed
  // on that node get slots on another node (not counted against `quota`:
  // the commit replaces them), any other key SLOT_NOT_ON_NODE; NotFound
  // for an unknown node.
  absl::StatusOr<hymcache::v1::PutStartResponse> PutStart(
      const hymcache::v1::PutStartRequest& request,
      absl::string_view caller = "", const TenantLimit& quota = {},
      bool* over_quota = nullptr);

  // Makes every allocated slot of the put visible except `failed_indexes`,
  // which are freed, and except slots whose parent (the block before them)
  // is not committed once the earlier slots are: those are freed too
  // (commits_unreachable), since no reader could reach them. Each committed
  // block is linked to its parent (across nodes too).
  // With require_write_receipts, each slot to commit needs its node's
  // write receipt (request.receipts[index]). A relocation's slot commits
  // only if its key is still listed where PutStart found it (else it is
  // freed: relocations_skipped); the key then moves (objects_relocated),
  // keeping its chain links, and its old extent is freed.
  // Errors: NotFound ("put expired or unknown");
  // InvalidArgument for an index >= the put's key count (nothing changes);
  // PermissionDenied with StatusReason::kWriteReceiptInvalid when a slot to
  // commit lacks a valid receipt (nothing is committed; the put is freed);
  // store errors (nothing changes, the put stays pending).
  absl::StatusOr<hymcache::v1::PutCommitResponse> PutCommit(
      const hymcache::v1::PutCommitRequest& request);

  // Frees the put's space. Errors: NotFound ("put expired or unknown").
  absl::StatusOr<hymcache::v1::PutAbortResponse> PutAbort(
      const hymcache::v1::PutAbortRequest& request);

  // Per key: found (committed, node alive) and where; the length of the
  // leading run of hits; NodeInfo of each node referenced. With for_read,
  // the hit prefix becomes most recently used (chain heads first, each
  // linked block just below its parent; unlinked keys last key first) and
  // leased for read_lease; such calls take the mutex exclusively. With
  // ended (a conversation ended), after the lookup the keys' unshared chain
  // tail goes to the least recent end of its node's eviction order
  // (MetadataIndex::DemoteChain; exclusively too). Otherwise nothing
  // changes. Errors: InvalidArgument (key count or sizes; for_read with
  // ended).
  absl::StatusOr<hymcache::v1::BatchLookupResponse> BatchLookup(
      const hymcache::v1::BatchLookupRequest& request);
  // The same answer written into `*response`, which must be empty (on an
  // arena or not: the RPC path reuses one per stream). On an error it is
  // left empty.
  absl::Status BatchLookupInto(const hymcache::v1::BatchLookupRequest& request,
                               hymcache::v1::BatchLookupResponse* response);

  // Removes committed keys and frees their space; per key whether it
  // existed. Then removes their descendants on any node (blocks whose
  // chain passes through a removed key: unreachable), which are not
  // reported per key (orphans_removed). Pending puts are not affected.
  // Errors: InvalidArgument (key count or sizes); store errors (nothing
  // removed; a failure removing the descendants is logged and retried by
  // ReapExpired).
  absl::StatusOr<hymcache::v1::RemoveResponse> Remove(
      const hymcache::v1::RemoveRequest& request);

  // The name node `node_id` registered under. Errors: NotFound (unknown
  // node).
  absl::StatusOr<std::string> NodeName(uint32_t node_id) const;

  // Whether `auth` proves the key of node `node_id` for the call `purpose`
  // ("reconcile" for BeginReconcile and ReconcileNode). Errors: NotFound
  // (unknown node); PermissionDenied.
  absl::Status CheckNodeAuth(uint32_t node_id, uint64_t incarnation,
                             absl::string_view purpose,
                             const hymcache::v1::NodeAuth& auth) const;

  // Starts a reconciliation of `node_id` (see master_service_reconcile.cc): the
  // caller Adds the node's extents, then calls FinishReconcile. A newer
  // BeginReconcile or a re-registration of the node supersedes it.
  // Errors: NotFound (unknown node); FailedPrecondition (another
  // incarnation, or the node deregistered).
  absl::StatusOr<std::unique_ptr<Reconciliation>> BeginReconcile(
      uint32_t node_id, uint64_t incarnation);
  // The same in two steps, for a node that lists its extents after the
  // master has begun tracking commits: StartReconcile returns the epoch,
  // OpenReconcile the Reconciliation for it. OpenReconcile errors: as
  // BeginReconcile, and Aborted if `epoch` is not the node's current one.
  absl::StatusOr<uint64_t> StartReconcile(uint32_t node_id,
                                          uint64_t incarnation);
  absl::StatusOr<std::unique_ptr<Reconciliation>> OpenReconcile(
      uint32_t node_id, uint64_t incarnation, uint64_t epoch);
  // Compares and converges (see master_service_reconcile.cc). Errors: Aborted
  // (the reconciliation was superseded, or the node re-registered or
  // deregistered meanwhile: nothing changed); store errors (nothing
  // changed; the node stays unreconciled).
  absl::StatusOr<hymcache::v1::ReconcileNodeResponse> FinishReconcile(
      std::unique_ptr<Reconciliation> r);

  // Drops each listing that still names exactly the reported location.
  // Errors: InvalidArgument (key count or sizes, or as many locations as
  // keys not given); store errors (nothing dropped).
  absl::StatusOr<hymcache::v1::ReportMissingResponse> ReportMissing(
      const hymcache::v1::ReportMissingRequest& request);

  // Appends up to `max` committed objects (of `node_id`, or of every node
  // if 0) to `out`, resuming at `*cursor` (start with 0) and advancing it;
  // returns false once the listing is complete. Takes the lock once per
  // call; objects committed or removed between calls may or may not appear.
  bool ListObjects(uint32_t node_id, uint64_t* cursor, size_t max,
                   hymcache::v1::ListObjectsResponse* out) const;

  hymcache::v1::ListNodesResponse ListNodes() const;
  hymcache::v1::GetStatsResponse GetStats() const;

  // Objects and bytes stored per tenant (keys qualified as in
  // master/tenant.h); UsageOfTenant of a tenant without objects is zero.
  MetadataIndex::TenantUsage UsageOfTenant(absl::string_view tenant) const;
  absl::flat_hash_map<std::string, MetadataIndex::TenantUsage> AllTenantUsage()
      const;
  // Objects each tenant lost to its own quota (PutStart's eviction inside
  // the tenant) since the service was created; tenants without any are
  // absent.
  absl::flat_hash_map<std::string, uint64_t> QuotaEvictionsByTenant() const;

  // Periodic upkeep, called by MasterServer: frees pending puts whose
  // expiry has passed, writes up to recency_batch objects' last reads to
  // the store, removes orphans left by removals, and forgets nodes dead for
  // forget_dead_nodes_after. Returns the number of puts freed.
  size_t ReapExpired();

  // Writes the index snapshot (options.snapshot_path) if snapshot_interval
  // has passed since the last one, or the store has taken snapshot_changes
  // (at least half the index) since; called by MasterServer's
  // upkeep thread. A read-only view writes none.
  // The index is serialised under a shared lock (lookups that only read go
  // on; writers wait: about 0.1 s per million objects), made durable
  // outside it. Errors: as WriteSnapshot; OK when none was due.
  absl::Status MaybeSnapshot();
  // Writes the index snapshot now, at the store's latest sequence (a
  // read-only view's: the one it opened at, as a standby's snapshots do,
  // master/standby_snapshots.h). Errors: FailedPrecondition without a
  // snapshot_path, while removed entries' orphans are still listed, or for
  // a view whose index CreatePreloaded took; Unimplemented if the store
  // keeps no sequence numbers; file system errors.
  absl::Status WriteSnapshot();
  // How the last start-up loaded the objects.
  enum class LoadPath { kScan, kCarefulScan, kSnapshot };
  LoadPath load_path() const;

  MasterServiceCounters counters() const;

  // KV events after the request's position (EventLog::Read); max_events 0
  // means 4096, more than 65536 is capped.
  hymcache::v1::WatchEventsResponse WatchEvents(
      const hymcache::v1::WatchEventsRequest& request) const;
  const EventLog& events() const { return *events_; }
  // The longest cached prefix of a chain, overall and per node (alive
  // nodes only). Errors: InvalidArgument (no keys, too many, too long).
  // Engines that report their caches (ReportEngineBlocks) are answered
  // too, those of the keys' tenant only.
  absl::StatusOr<hymcache::v1::PrefixQueryResponse> PrefixQuery(
      const hymcache::v1::PrefixQueryRequest& request) const;
  // One report of engine request.engine_id of `tenant` (EngineCaches::Apply;
  // keys as the tenant's qualified keys). Errors: InvalidArgument (a bad
  // id, an empty or oversized key, more than max_batch_keys keys), and
  // EngineCaches::Apply's.
  absl::StatusOr<hymcache::v1::ReportEngineBlocksResponse> ReportEngineBlocks(
      absl::string_view tenant,
      const hymcache::v1::ReportEngineBlocksRequest& request);
  // Engines known now (reported within the TTL) and keys held for them.
  std::pair<size_t, uint64_t> EngineCacheSizes() const {
    return {engine_caches_->engines(clock_->Now()), engine_caches_->blocks()};
  }

  // While set, lookups and puts carry no capabilities (benchmarks
  // measuring what signing them costs; nodes then refuse every op). Never
  // set outside tests and benchmarks.
  void SetSkipCapabilitiesForTest(bool skip) {
    skip_capabilities_for_test_.store(skip, std::memory_order_relaxed);
  }
  const MasterServiceOptions& options() const { return options_; }

 private:
  struct Region {
    hymcache::v1::RegionInfo info;  // registration fields
    std::unique_ptr<RegionAllocator> allocator;
    uint64_t object_count = 0;
  };
  struct Node {
    // Registration fields, and node_key (never copied out: FillNodeInfo).
    hymcache::v1::NodeInfo info;
    // Keyed with info.node_key(); empty for a record without one.
    std::optional<HmacSha256> mac;
    // The node has proven it holds info.node_key() (a proof in a heartbeat
    // or registration) since this process gave it out. While not, the
    // answer that carried the key may have been lost (the node's deadline
    // passed first), so a registration again with the same name,
    // incarnation and non-empty registration_nonce and no proof is answered
    // as the first was, with the same key. True for records loaded from
    // the store. Placement waits for it (IsPlaceable).
    bool key_confirmed = true;
    std::string registration_nonce;  // of the registration that gave the key
    absl::Time last_seen;
    bool deregistered = false;
    // Registered with this master process (false for nodes loaded from the
    // store until they register again).
    bool registered = false;
    // Registered with its listings kept, not yet reconciled: its objects
    // are served (IsReadable), but it takes no placements (IsAlive) until
    // a reconciliation completes.
    bool needs_reconcile = false;
    // Bumped by every BeginReconcile and registration; a reconciliation
    // with an older epoch is superseded.
    uint64_t reconcile_epoch = 0;
    // Generations committed on the node since the current reconciliation
    // began (not judged by it). Only filled while one runs.
    bool reconciling = false;
    absl::flat_hash_set<uint64_t> committed_since_reconcile;
    std::map<uint32_t, Region> regions;
    uint64_t object_count = 0;
    // ReapExpired logged that it missed its heartbeats (once per outage).
    bool reported_dead = false;
    // Recent bytes read (for_read lookups) and placed on it, and its
    // pending puts: the load placement weighs (master/placement.h).
    DecayingRate traffic;
    uint32_t puts_in_flight = 0;
  };
  struct PendingSlot {
    uint32_t index;  // into the PutStart keys
    std::string key;
    std::string parent;  // the block before it in its chain ("": none)
    uint32_t region_id;
    uint64_t addr;
    uint64_t length;
    uint64_t generation;
    // A relocation's or a replica's slot: the generation of the listing it
    // copies (0: an ordinary put). A replica's `key` is the copy's
    // (master/replica_key.h).
    uint64_t copied_generation = 0;
    ObjectLocation location(uint32_t node_id) const {
      return ObjectLocation{node_id, region_id, addr, length, generation};
    }
  };
  struct PendingPut {
    std::string caller;  // PutStart's caller key
    std::string tenant;  // whose key space its keys are in
    uint64_t bytes = 0;  // of its slots
    uint32_t node_id;
    uint32_t key_count;
    std::string parent_key;  // PutStart's; pinned while the put is pending
    absl::Time expiry;
    std::vector<PendingSlot> slots;
    uint64_t token = 0;  // PutStartRequest.put_token (0: none)
    uint32_t relocate_from = 0;  // PutStartRequest.relocate_from_node
    bool replica = false;        // PutStartRequest.replica
  };
  // One tenant's pending puts (for its quota).
  struct TenantPending {
    uint64_t objects = 0;
    uint64_t bytes = 0;
  };
  // One caller's pending puts (see max_pending_share_per_caller).
  struct CallerPending {
    uint64_t slots = 0;
    absl::flat_hash_map<uint32_t, uint64_t> bytes_by_node;
  };
  // A new region layout and the node's objects sorted against it.
  struct Rebuild {
    std::map<uint32_t, Region> regions;
    std::vector<std::string> doomed;  // purged or no longer fitting
    uint64_t purged = 0;              // of doomed, purged by incarnation
    uint64_t kept = 0;
  };
  // Who registers under a known name (DecideTakeoverLocked).
  struct NodeIdentity {
    bool proven = false;    // proved the name's key
    bool takeover = false;  // a new node under the name: nothing it held
    std::string key;        // the node key to answer with
  };
  // Phase 1 of FinishReconcile (CompareListings).
  struct ReconcileScan {
    // Listings the node does not hold exactly, judged again in phase 2.
    std::vector<std::pair<std::string, ObjectLocation>> candidates;
    uint64_t listed = 0;   // the node's listings looked at
    uint64_t matched = 0;  // held exactly (removed from the held extents)
    uint64_t skipped = 0;  // committed since the reconciliation began
  };
  // The shared part of a read's hit prefix (auto_replica_branches;
  // LookupLocked).
  struct SharedPrefix {
    static constexpr uint32_t kNone = ~uint32_t{0};
    // One past the deepest hit-prefix block that at least
    // auto_replica_branches chains continue from; 0: none.
    uint32_t end = 0;
    absl::string_view block;  // that block's key (the request's)
    // The first hit-prefix block with no readable copy; kNone: all have.
    uint32_t first_uncopied = kNone;
  };
  // A PutStart's keys sorted out under the lock (ClassifyPutKeysLocked).
  struct PutPlan {
    uint32_t preferred = 0;         // the node to try first; 0: none
    bool requested = false;         // the caller named it (not a chain's)
    std::vector<int> to_allocate;   // indexes of the keys that need space
    std::vector<uint64_t> lengths;  // their lengths, in that order
    uint64_t total_bytes = 0;       // their sum
    // A relocation's source, or the node a replica's keys are on: never
    // chosen.
    uint32_t exclude = 0;
    bool replica = false;
    // A relocation or a replica: per key, the generation of its listing
    // to copy (0: none, nothing to copy).
    std::vector<uint64_t> copied;
    // A relocation: the nodes holding a relocated block's copy
    // (master/replica_key.h), tried last (PlacementCandidate::holds_copy).
    // A replica's block is on `exclude`, never chosen.
    std::vector<uint32_t> copy_nodes;
    void AvoidCopyNode(uint32_t node_id) {
      if (node_id != exclude && std::find(copy_nodes.begin(), copy_nodes.end(),
                                          node_id) == copy_nodes.end()) {
        copy_nodes.push_back(node_id);
      }
    }
    // Never evicted by this PutStart: its parent_key and the keys it
    // reports as existing (the caller relies on their locations).
    absl::flat_hash_set<absl::string_view> keep;
  };
  // Where a PutStart's space is (ChooseNodeLocked).
  struct NodeChoice {
    Node* chosen = nullptr;  // has room: `placed` is allocated on it
    Node* target = nullptr;  // where to evict when no node has room
    std::vector<std::pair<uint32_t, uint64_t>> placed;  // region, addr
    std::string over_limit;  // why the caller may not put on some node
    size_t alive = 0;        // alive nodes looked at, not draining
    size_t draining = 0;     // alive, but drained by an operator
    size_t unproven = 0;     // alive, not yet proven its key (IsPlaceable)
    // Not alive only because it has not re-registered or reconciled with
    // this master yet, though seen within node_timeout (this master loaded
    // it, or it is mid-registration): it is expected back shortly.
    size_t rejoining = 0;
    bool chain_spilled = false;         // see PlacementRanking
    bool tenant_share_ignored = false;  // see PlacementRanking
  };

  MasterService(const MasterServiceOptions& options,
                std::unique_ptr<MetadataStore> store);

  absl::Status Load();
  // Loads index_ from options_.snapshot_path and the store's changes since
  // it, and builds the allocators (master_service_recovery.cc).
  class SnapshotLoader;
  // Loads index_ from options_.snapshot_path plus the store's changes since
  // it, then the allocators, adding the keys of the objects it drops to
  // *doomed. Returns false (index_ and the allocators empty again) when it
  // cannot: the caller scans the store instead.
  bool LoadSnapshotLocked(std::vector<std::string>* doomed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empties index_, the allocators and the object counts.
  void ResetObjectsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loads the persisted objects into index_ and the allocators (empty
  // before), adding the keys of the objects it drops to *doomed. Careful:
  // reserves one object at a time, dropping the ones whose space is taken.
  // Otherwise reserves each region's objects at once after the scan, and
  // returns false (state half-loaded: reset it) if some region refuses.
  absl::StatusOr<bool> LoadObjectsLocked(bool careful,
                                         std::vector<std::string>* doomed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidateKeys(
      const google::protobuf::RepeatedPtrField<std::string>& keys) const;

  // Registered with this process, reconciled, heartbeating in time.
  bool IsAlive(const Node& node, absl::Time now) const;
  // Whether lookups serve the node's objects: alive, or registered with
  // its listings kept and still to reconcile. A listing such a node no
  // longer holds costs a refused read and its report, never another
  // object's bytes (the read names the exact extent and generation), and
  // the node's objects need not miss for the whole reconciliation (0.3-3 s
  // at 1-10 M objects) after a master restart or failover.
  bool IsReadable(const Node& node, absl::Time now) const;
  // Alive and not draining: may get new placements.
  bool IsPlaceable(const Node& node, absl::Time now) const;
  // Whether `auth` is a valid proof of `node`'s key now.
  bool ProofValid(const Node& node, absl::string_view purpose, uint32_t node_id,
                  uint64_t incarnation, const hymcache::v1::NodeAuth& auth,
                  absl::Time now) const;
  // OK if every slot of `put` not in `failed` has its node's write receipt
  // in `request` (see require_write_receipts); else why not, with
  // StatusReason::kWriteReceiptInvalid.
  absl::Status CheckReceipts(
      const PendingPut& put, const absl::flat_hash_set<uint32_t>& failed,
      const hymcache::v1::PutCommitRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PutCommit's slots of `put` (id `put_id`) to commit, in chain order:
  // those not in `failed` whose parent is committed, committed by this put
  // or pending in another put (those also go to `waiting`); the rest are
  // counted in `unreachable`.
  void SlotsToCommitLocked(uint64_t put_id, const PendingPut& put,
                           const absl::flat_hash_set<uint32_t>& failed,
                           std::vector<const PendingSlot*>* to_commit,
                           std::vector<const PendingSlot*>* waiting,
                           uint32_t* unreachable) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The read or write capability for a location on `node`.
  void Grant(const Node& node, const hymcache::v1::Location& loc,
             uint8_t rights, absl::Time expiry,
             hymcache::v1::Capability* out) const;
  // The capability for `scope` on `node` (its incarnation filled in here),
  // in the data plane's form: false (nothing signed) for a node without a
  // key, where Grant leaves its answer empty.
  bool Sign(const Node& node, CapabilityScope scope,
            wire::Capability* out) const;
  // Alive, or only briefly unavailable with its objects: not deregistered
  // and seen within node_timeout (registration pending after a master
  // restart counts from the load; a reconciliation in progress). PutStart
  // reports such a node's keys as existing rather than storing them again.
  bool MayComeBack(const Node& node, absl::Time now) const;
  // An exists_only request's answer: found_bits and hit_prefix_length.
  void ExistsLocked(const hymcache::v1::BatchLookupRequest& request,
                    absl::Time now,
                    hymcache::v1::BatchLookupResponse* response) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The copy of `key` (master/replica_key.h) if its node is readable, with
  // its record in *record.
  std::optional<ObjectLocation> ReadableCopyLocked(absl::string_view key,
                                                   absl::Time now,
                                                   uint32_t* record) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Fills `response` for `request`'s keys; returns the hit prefix length.
  // A key with a copy is answered from whichever of its two nodes is
  // readable and, when both are, less loaded (CopyChooser). `hit_records`
  // (if given) gets the index records of the hit prefix, both copies' where
  // a key has two (for MetadataIndex::TouchRecords under the same lock:
  // a prefix read from one copy keeps the other as recent).
  // `read_bytes_by_node` (if given) gets the hit prefix's bytes by the node
  // that serves them. `shared` (if given; auto_replica_branches > 0) gets
  // the hit prefix's shared part.
  uint32_t LookupLocked(
      const hymcache::v1::BatchLookupRequest& request, absl::Time now,
      hymcache::v1::BatchLookupResponse* response,
      std::vector<uint32_t>* hit_records = nullptr,
      std::vector<std::pair<uint32_t, uint64_t>>* read_bytes_by_node = nullptr,
      SharedPrefix* shared = nullptr) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether a read whose hit prefix is `shared` is asked to store copies of
  // it (BatchLookupResponse.copy_prefix_length): some of it up to its
  // shared block has none, and no reader was asked for that block within
  // put_timeout. Records the ask.
  bool AskForCopiesLocked(const SharedPrefix& shared, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The read tick of `now` for the index: milliseconds since lease_epoch_
  // plus one (0 means "never read"). Kept below 2^31 by moving the epoch
  // forward and rebasing the index's ticks, so ticks never wrap.
  uint32_t LeaseTick(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When read tick `tick` was read: lease_epoch_ + (tick - 1) ms; a tick
  // rebased to 0 is older than the epoch (the epoch itself).
  absl::Time ReadTimeOfTick(uint32_t tick) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether an object read at `read_tick` is still leased at `now_tick`.
  bool IsLeased(uint32_t read_tick, uint32_t now_tick) const;
  // Evicts least recently used objects of `node` (never `keep`, never past
  // the first leased one, at most max_evictions_per_put) until `lengths`
  // fit, and allocates them into *out. Returns false if they cannot fit,
  // with the reason in *why. Store errors are returned as such.
  absl::StatusOr<bool> EvictAndAllocate(
      Node& node, const std::vector<uint64_t>& lengths,
      const absl::flat_hash_set<absl::string_view>& keep, absl::Time now,
      std::vector<std::pair<uint32_t, uint64_t>>* out, std::string* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The eviction walk of `node_id` under options_.eviction_policy:
  // MetadataIndex::PickEvictions (kLru) or PickEvictionsScored with the
  // cost score (kCost, master/eviction_cost.h).
  MetadataIndex::WalkEnd PickEvictionsLocked(
      uint32_t node_id, size_t max_scan, uint32_t now_tick,
      const std::function<MetadataIndex::Verdict(
          absl::string_view, const ObjectLocation&, uint32_t)>& judge,
      const std::function<bool(absl::string_view, const ObjectLocation&)>& take)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a lookup tells the cost policy of its tenant's returns: a for_read
  // one's gap since the chain's last read (`before`, a tick; 0: never
  // read) and the turns it answers (a next_turn one awaits a turn, an
  // ended one ends those it names). Only under eviction_policy kCost.
  void LearnReturnsLocked(const hymcache::v1::BatchLookupRequest& request,
                          uint32_t hits, absl::Time now, uint32_t before,
                          uint32_t tick) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes `victims` (all on `node_id`) from the store in one batch, then
  // from the index and allocators. Errors: store errors (nothing changes).
  absl::Status EvictObjects(
      uint32_t node_id,
      const std::vector<std::pair<std::string, ObjectLocation>>& victims)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillNodeInfo(const Node& node, absl::Time now,
                    hymcache::v1::NodeInfo* out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // What a reader needs of a node a lookup answer references (see
  // BatchLookupResponse.nodes): a small part of FillNodeInfo's.
  void FillPeerInfo(const Node& node, hymcache::v1::NodeInfo* out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // RegisterNode of a name not known yet: a new id, key and allocators.
  // Errors: ResourceExhausted (max_nodes records kept, ids exhausted);
  // Internal (no random key); store errors.
  absl::Status RegisterNewNodeLocked(
      const hymcache::v1::RegisterNodeRequest& request,
      hymcache::v1::NodeInfo info, absl::Time now,
      hymcache::v1::RegisterNodeResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a registration under the known name of `node` (id `id`) keeps
  // its identity (a proof of its key, a repeat of a registration whose
  // answer was lost, a record without a key) or takes it over (no proof,
  // and the node is dead), and the key to answer with. Errors:
  // PermissionDenied (no proof while the node may still be alive);
  // Internal (no random key).
  absl::StatusOr<NodeIdentity> DecideTakeoverLocked(
      uint32_t id, const Node& node,
      const hymcache::v1::RegisterNodeRequest& request, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Re-registration of `node` with a new incarnation or new regions:
  // purges the objects of a new incarnation, rebuilds the allocators for
  // the new layout (dropping objects that no longer fit), cancels its
  // pending puts. Errors: store errors (nothing changes).
  absl::Status RebuildRegionsLocked(
      uint32_t id, Node& node, const hymcache::v1::RegisterNodeRequest& request,
      hymcache::v1::NodeInfo info, const NodeIdentity& who,
      bool new_incarnation, absl::Time now,
      hymcache::v1::RegisterNodeResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds allocators for `regions` and reserves the node's objects in them.
  // Objects in `purge_regions` or that do not fit are listed as doomed.
  absl::StatusOr<Rebuild> PlanRebuild(
      uint32_t node_id,
      const google::protobuf::RepeatedPtrField<hymcache::v1::RegionInfo>&
          regions,
      const std::vector<uint32_t>& purge_regions, bool scan_index = true) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // PutStart's checks of the request alone, before the lock: key count
  // and sizes, lengths, parent_key, duplicates. Errors: InvalidArgument.
  // A relocation's or a replica's slots (PutCommit) whose key is no longer
  // listed as PutStart found it join `failed`; returns how many. A
  // relocation's others take the parent their key is linked to now.
  uint32_t SkipChangedCopiesLocked(PendingPut* put,
                                   absl::flat_hash_set<uint32_t>* failed) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidatePutStart(
      const hymcache::v1::PutStartRequest& request) const;
  // Resolves the preferred node (parent_key's node when none is given and
  // it is placeable) and classifies each key, adding its slot to
  // *response: SLOT_IN_PROGRESS, SLOT_EXISTS (with its location), or
  // SLOT_ALLOCATED (in the plan; no space yet). Errors: NotFound (unknown
  // preferred node); FailedPrecondition (parent_key neither committed nor
  // pending).
  absl::StatusOr<PutPlan> ClassifyPutKeysLocked(
      const hymcache::v1::PutStartRequest& request, absl::Time now,
      hymcache::v1::PutStartResponse* response) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Allocates the plan on the first node with room in the order
  // RankNodes gives (master/placement.h: the chain's node while within its
  // margin, then by fill and load, or round robin), skipping nodes where
  // `caller`'s pending puts leave no room for it; if none has room, names
  // the node to evict on: the first of that order the caller may use.
  NodeChoice ChooseNodeLocked(const PutPlan& plan, absl::string_view caller,
                              absl::string_view tenant, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The imbalance of the alive nodes' used bytes (PlacementImbalance).
  double PlacementImbalanceLocked(absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // choice->chosen if it has the space; else evicts on choice->target and
  // allocates there (into choice->placed). Errors: ResourceExhausted (no
  // alive node; the caller over its limits on every node; eviction cannot
  // make room); store errors.
  absl::StatusOr<Node*> EvictAndPlaceLocked(const PutPlan& plan,
                                            NodeChoice* choice, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Allocates every length on `node` (one region per slot), or nothing.
  bool TryAllocateOnNode(Node& node, const std::vector<uint64_t>& lengths,
                         std::vector<std::pair<uint32_t, uint64_t>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns space to its allocator; a failure is a broken invariant, logged.
  void FreeSpace(uint32_t node_id, uint32_t region_id, uint64_t addr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Accounts a committed object added to / removed from the index.
  void CountObject(const ObjectLocation& e, int delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a pending put, freeing its space if `free_space`.
  void ReleasePut(uint64_t put_id, bool free_space)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CancelPutsOfNode(uint32_t node_id, bool free_space)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `caller` may have `slots` more pending slots of `bytes` on
  // `node`; if not, why in *why.
  bool CallerMayPut(absl::string_view caller, const Node& node, uint64_t slots,
                    uint64_t bytes, std::string* why) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Counts a pending put in / out of its caller's and its tenant's usage.
  void CountCallerPending(const PendingPut& put, int delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The id of the node named `name`. Errors: NotFound.
  absl::StatusOr<uint32_t> NodeIdByNameLocked(absl::string_view name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Brings `tenant` within `quota` for `new_objects` / `new_bytes` more by
  // evicting its own least recently used objects (never `keep`); see
  // PutStart. OK if it fits (possibly after evicting); ResourceExhausted
  // naming the quota if it cannot (nothing evicted); store errors.
  absl::Status MakeRoomInTenant(
      const std::string& tenant, const TenantLimit& quota, uint64_t new_objects,
      uint64_t new_bytes, const absl::flat_hash_set<absl::string_view>& keep,
      absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes node `node_id` with its objects and pending puts (ForgetNode).
  // Returns the objects removed. Errors: store errors (nothing changes).
  absl::StatusOr<uint64_t> ForgetNodeLocked(uint32_t node_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A registration of `node` succeeded: supersedes any reconciliation and
  // decides whether the node must reconcile before it is served
  // (`retained`: the master kept its listings).
  void MarkRegistered(Node& node, bool retained)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether reconciliation `r` was superseded (see FinishReconcile).
  bool ReconcileSupersededLocked(const Reconciliation& r) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // FinishReconcile's phase 1: compares the node's listings with the
  // extents in `r`, a chunk of the index per hold of the shared lock;
  // matched extents leave r's held set. Errors: Aborted (superseded).
  absl::Status CompareListings(Reconciliation* r, ReconcileScan* scan)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Adds to *response the extents still held in `r` that are neither
  // listed nor pending on `node` (up to max_unlisted_per_reconcile) and
  // returns how many there are.
  uint64_t AddUnlistedLocked(const Reconciliation& r, const Node& node,
                             hymcache::v1::ReconcileNodeResponse* response)
      const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Releases a put's pin on its parent (see Chains, master_service_put.cc).
  void UnpinParent(const PendingPut& put) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `key` was committed (link the blocks waiting for it) or its put ended
  // without committing it (remove them: unreachable).
  void SettleWaitingChildrenLocked(const std::string& key, bool committed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the index's orphans (objects whose chain lost a block before
  // them) from the store in one batch, then from the index and allocators;
  // returns them. A store failure leaves them for the next call (WARNING).
  std::vector<std::pair<std::string, ObjectLocation>> SweepOrphansLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes up to `max` queued reads (object, read time) to the store in one
  // batch; returns how many (0 on a store failure: those reads are lost).
  size_t PersistRecencyLocked(size_t max) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A KV event for the block `key` committed at `e` after `parent`.
  void EmitStoredLocked(const std::string& key, const std::string& parent,
                        const ObjectLocation& e) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A NODE_UP or NODE_DOWN event.
  void EmitNode(hymcache::v1::KvEvent::Kind kind, uint32_t node_id) const;
  // PrefixQuery's answer per node (and hit_prefix_length).
  void AnswerNodePrefixes(const hymcache::v1::PrefixQueryRequest& request,
                          absl::Time now,
                          hymcache::v1::PrefixQueryResponse* out) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Makes index_ report what leaves it as BLOCK_REMOVED events.
  void ListenToIndexLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const MasterServiceOptions options_;
  Clock* const clock_;
  const std::unique_ptr<MetadataStore> store_;  // thread-safe itself
  const std::unique_ptr<EventLog> events_;      // thread-safe itself
  const std::unique_ptr<EngineCaches> engine_caches_;  // thread-safe itself
  std::atomic<bool> skip_capabilities_for_test_{false};

  // One snapshot writer at a time. Taken before mu_.
  Mutex snapshot_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Time last_snapshot_ ABSL_GUARDED_BY(snapshot_mu_);
  // The store sequence of the last snapshot written, or of the one loaded
  // (copied from loaded_snapshot_sequence_ at the first MaybeSnapshot).
  uint64_t last_snapshot_sequence_ ABSL_GUARDED_BY(snapshot_mu_) = 0;
  // The sequence of the snapshot Load read the index from; 0 after a scan.
  uint64_t loaded_snapshot_sequence_ ABSL_GUARDED_BY(mu_) = 0;

  mutable Mutex mu_;
  // Protected by mu_.
  LoadPath load_path_ ABSL_GUARDED_BY(mu_) = LoadPath::kScan;
  // CreatePreloaded moved this (preloaded) service's state out.
  bool taken_over_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint32_t, Node> nodes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> node_by_name_ ABSL_GUARDED_BY(mu_);
  // Shared prefixes' blocks whose reader was asked for copies, with when
  // the ask lapses (AskForCopiesLocked).
  absl::flat_hash_map<std::string, absl::Time> copies_asked_
      ABSL_GUARDED_BY(mu_);
  uint32_t next_node_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint32_t last_placed_node_ ABSL_GUARDED_BY(mu_) = 0;
  // Never null; a pointer so that CreatePreloaded can take another
  // service's over.
  std::unique_ptr<MetadataIndex> index_ ABSL_GUARDED_BY(mu_)
      ABSL_PT_GUARDED_BY(mu_);
  uint64_t object_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, PendingPut> pending_ ABSL_GUARDED_BY(mu_);
  // put_token -> put id, for the pending puts that carry one.
  absl::flat_hash_map<uint64_t, uint64_t> pending_tokens_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, CallerPending> pending_by_caller_
      ABSL_GUARDED_BY(mu_);
  // What the cost policy learns of returns (eviction_policy kCost only).
  ReturnLearner returns_ ABSL_GUARDED_BY(mu_){
      options_.eviction_cost.turn_horizon};
  absl::flat_hash_map<std::string, uint64_t> quota_evictions_by_tenant_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, TenantPending> pending_by_tenant_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> pending_keys_ ABSL_GUARDED_BY(mu_);
  // Parents of pending puts -> number of such puts (never evicted).
  absl::flat_hash_map<std::string, uint32_t> pending_parents_
      ABSL_GUARDED_BY(mu_);
  // Blocks committed while the block before them was in another pending
  // put: that block's key -> theirs. Linked when it commits, removed when
  // its put ends without committing it.
  absl::flat_hash_map<std::string, std::vector<std::string>> waiting_children_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_put_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Time of read tick 1 (see LeaseTick).
  absl::Time lease_epoch_ ABSL_GUARDED_BY(mu_);
  MasterServiceCounters counters_ ABSL_GUARDED_BY(mu_);
  // Evictions since the last log line about them (at most one line per
  // kEvictionLogPeriod: a full cache evicts on every put).
  struct EvictionLog {
    uint64_t batches = 0;
    uint64_t objects = 0;
    uint64_t bytes = 0;
    absl::Time last_line = absl::InfinitePast();
  };
  EvictionLog eviction_log_ ABSL_GUARDED_BY(mu_);
};

}  // namespace master
}  // namespace hymcache
