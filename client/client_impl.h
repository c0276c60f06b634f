// ClientImpl: the Client behind Client::Create, built from its seams.
//
// It is handed a MasterClient (the control plane) and a Transport (the data
// plane) and owns the logic between them, split by concern:
//   client_impl.cc  construction, peers, lookups, removal, cluster status;
//   load.cc         the read path (Load: pipelined lookups, prefetch hints,
//                   batched reads, aborted-suffix retry, read repair, and
//                   reads of recently found keys without a lookup,
//                   location_cache.h);
//   store.cc        the write path (Store: PutStart, writes, PutCommit);
//   device_io.cc    device-memory Loads and Stores through the pinned
//                   bounce pool (bounce_pool.h) and the DeviceMemory seam;
// Client::Create (client.cc) hands it the gRPC MasterClient
// (grpc_master_client.h) and the Transport the options select
// (transport_select.h).
// Tests build one with fakes (client/testing/) through NewClientImpl.
// A third seam, DeviceMemory (device_memory.h), copies between CUDA device
// buffers and the pinned pool.
//
// Internal to the client library (not a public header of //client).
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "client/bounce_pool.h"
#include "client/client.h"
#include "client/device_memory.h"
#include "client/location_cache.h"
#include "client/master_client.h"
#include "client/transport.h"
#include "client/unresponsive_nodes.h"
#include "common/clock.h"
#include "common/executor.h"
#include "common/mutex.h"

namespace hymcache {

// Builds a client on the given seams (shared so that a test can inspect its
// fakes after the client is gone). `options` must be valid (Validate); its
// master_address, TLS and transport fields are not used. `clock` (not owned,
// outlives the client) gives the time deadlines are computed and checked
// against. `device` copies device-memory buffers (null: none; device calls
// fail with FailedPrecondition "built without CUDA").
// Errors: InvalidArgument (options), ResourceExhausted (threads).
absl::StatusOr<std::unique_ptr<Client>> NewClientImpl(
    const ClientOptions& options, std::shared_ptr<MasterClient> master,
    std::shared_ptr<Transport> transport, Clock* clock = Clock::Real(),
    std::shared_ptr<DeviceMemory> device = nullptr);

// The data-plane reference to `location`, with its capability.
RemoteRef ToRemoteRef(const ObjectLocation& location);

class ClientImpl : public Client {
 public:
  ClientImpl(const ClientOptions& options, std::shared_ptr<MasterClient> master,
             std::shared_ptr<Transport> transport, Clock* clock,
             std::unique_ptr<Executor> store_executor,
             std::unique_ptr<Executor> bg_executor,
             std::shared_ptr<DeviceMemory> device);
  ~ClientImpl() override;

  absl::StatusOr<ExistsResult> Exists(absl::Span<const std::string> keys,
                                      const CallOptions& call) override;
  absl::StatusOr<LookupResult> BatchLookup(absl::Span<const std::string> keys,
                                           const CallOptions& call) override;
  absl::StatusOr<LoadResult> Load(absl::Span<const std::string> keys,
                                  absl::Span<const MutableBuffer> buffers,
                                  const LoadOptions& options) override;
  std::shared_ptr<StoreHandle> Store(absl::Span<const std::string> keys,
                                     absl::Span<const ConstBuffer> buffers,
                                     const StoreOptions& options) override;
  // Store and wait, on the calling thread (no hand-off to "hym-store").
  absl::StatusOr<PutResult> Put(absl::Span<const std::string> keys,
                                absl::Span<const ConstBuffer> buffers,
                                const CallOptions& call) override;
  absl::StatusOr<std::vector<bool>> Remove(absl::Span<const std::string> keys,
                                           const CallOptions& call) override;
  absl::StatusOr<ClusterStatus> GetClusterStatus(
      const CallOptions& call) override;
  absl::StatusOr<PrefixAnswer> PrefixQuery(absl::Span<const std::string> keys,
                                           const CallOptions& call) override;
  absl::StatusOr<EngineBlocksReply> ReportEngineBlocks(
      const EngineBlocksReport& report, const CallOptions& call) override;
  absl::Status RegisterMemory(void* data, size_t size) override;
  absl::Status UnregisterMemory(void* data) override;
  absl::Status HintNextTurn(absl::Span<const std::string> keys,
                            const TurnHintOptions& options) override;
  absl::Status HintConversationEnded(
      absl::Span<const std::string> keys) override;

 protected:
  absl::Time DefaultCallDeadline() const override {
    return clock_->Now() + options_.default_deadline;
  }

 private:
  static constexpr absl::Duration kReleaseTimeout = absl::Seconds(1);

  // client_impl.cc
  // `requested`, or now + default_deadline for absl::InfinitePast().
  absl::Time Deadline(absl::Time requested,
                      absl::Duration default_deadline) const;
  absl::Time Deadline(absl::Time requested) const {
    return Deadline(requested, options_.default_deadline);
  }
  static absl::Status CheckKeys(absl::Span<const std::string> keys);
  void Remember(const PeerInfo& peer);
  absl::StatusOr<PeerInfo> Peer(uint32_t node_id);
  // Looks keys up in RPCs of max_keys_per_rpc, for `intent` (kPeek or
  // kExists: then `out`'s locations stay empty). An RPC failure after the
  // first returns what was found so far.
  absl::Status Lookup(absl::Span<const std::string> keys, LookupIntent intent,
                      absl::Time deadline, LookupResult* out);

  // load.cc
  // Reads keys whose locations `locs` came from the location cache, with
  // no lookup. True: `out` is the Load's answer (every block read, or the
  // deadline passed: the blocks read before it). False: a read was refused
  // or failed with time left; the keys' entries are dropped and the caller
  // looks them up.
  bool LoadCached(absl::Span<const std::string> keys,
                  absl::Span<const MutableBuffer> buffers,
                  const std::vector<ObjectLocation>& locs, absl::Time deadline,
                  LoadResult* out);
  uint64_t NewSessionId();
  // Reads blocks [i, j) of one node's run from `peer` into their buffers,
  // in `session` (0: the ordinary way, no staged copies), and tells
  // unresponsive_ how the node answered. One status per block.
  std::vector<absl::Status> ReadRun(const PeerInfo& peer, uint64_t session,
                                    const std::vector<ObjectLocation>& locs,
                                    absl::Span<const MutableBuffer> buffers,
                                    size_t i, size_t j, absl::Time deadline);
  size_t ReadRunEnd(const std::vector<ObjectLocation>& locs,
                    absl::Span<const MutableBuffer> buffers, size_t i,
                    size_t end) const;
  void Hint(uint64_t session, const std::vector<ObjectLocation>& locs,
            size_t from, size_t to, absl::Time deadline,
            std::vector<uint32_t>* nodes);
  void ReportRefused(absl::Span<const std::string> keys,
                     const std::vector<ObjectLocation>& locs, size_t first,
                     const std::vector<absl::Status>& st);
  void ReleaseInBackground(uint64_t session, std::vector<uint32_t> nodes);

  // hints.cc
  // Queues a think-time hint of `keys` (hold 0: the end of their hints).
  absl::Status QueueTurnHint(absl::Span<const std::string> keys,
                             absl::Duration expected_in, absl::Duration hold);
  // Looks the chain up and sends each node its part of the stored prefix.
  void SendTurnHint(const std::vector<std::string>& keys,
                    const wire::HintTimes& times);

  // store.cc
  static absl::Status CheckPut(absl::Span<const std::string> keys,
                               absl::Span<const ConstBuffer> buffers);
  // The body of a Store of checked arguments: PutAll, with "no node has
  // room" reported as every key refused. `relocate_from_node` and
  // `replicas`: see StoreOptions (0 and 1: an ordinary store).
  absl::StatusOr<PutResult> StoreNow(absl::Span<const std::string> keys,
                                     absl::Span<const ConstBuffer> buffers,
                                     const std::string& parent_key,
                                     absl::Time deadline,
                                     uint32_t relocate_from_node,
                                     uint32_t replicas);
  absl::StatusOr<PutResult> PutAll(absl::Span<const std::string> keys,
                                   absl::Span<const ConstBuffer> buffers,
                                   const std::string& parent_key,
                                   absl::Time deadline,
                                   uint32_t relocate_from_node,
                                   uint32_t replicas);
  // `generations`: per key, the generation its bytes were listed with
  // (PutStartArgs::copied_generations; 0: any). `nodes`: per key, the node
  // it is listed on (empty: all on one): each run of keys on one node is
  // copied by puts of its own, as the master places a copy off the node of
  // its put's first key (a chain that spilled over nodes is copied whole).
  size_t PutCopies(absl::Span<const std::string> keys,
                   absl::Span<const ConstBuffer> buffers,
                   const std::string& parent_key,
                   std::vector<uint64_t> generations,
                   absl::Span<const uint32_t> nodes, absl::Time deadline);
  // load.cc: stores copies of a Load's first keys.size() blocks, which the
  // master asked for (ClientOptions::max_auto_copy_bytes), in the
  // background from a copy of their bytes.
  void CopyInBackground(absl::Span<const std::string> keys,
                        absl::Span<const MutableBuffer> buffers,
                        absl::Span<const ObjectLocation> locations,
                        const std::vector<uint64_t>& lengths);
  // What a Store's chunks learn as they go: the node the first one's
  // blocks went to (asked for by the next ones), and the most copies the
  // master asked for (the tenant's replication factor).
  struct PutProgress {
    uint32_t node = 0;
    uint32_t replicas = 0;
    // Per key of the whole Store, when not empty. An ordinary put fills in
    // the generation each key is listed with (its own slot's, or the
    // stored key's; 0: unknown); copies send them as copied_generations.
    std::vector<uint64_t> generations;
    // Beside generations: the node each key is listed on (0: unknown).
    std::vector<uint32_t> nodes;
  };
  // PutChunk over `keys` in chunks of max_keys_per_rpc, each naming the
  // block before it as its parent; the first error, with the offset of its
  // chunk in *failed_at.
  absl::Status PutChunks(absl::Span<const std::string> keys,
                         absl::Span<const ConstBuffer> buffers,
                         const std::string& parent_key, absl::Time deadline,
                         uint32_t relocate_from_node, bool replica,
                         PutProgress* progress, PutResult* out,
                         size_t* failed_at);
  // `replica`: PutStartArgs::replica.
  absl::Status PutChunk(absl::Span<const std::string> keys,
                        absl::Span<const ConstBuffer> buffers, size_t offset,
                        const std::string& parent_key, absl::Time deadline,
                        uint32_t relocate_from_node, bool replica,
                        PutProgress* progress, PutResult* out);

  // device_io.cc
  // The bounce pool, created (pinned, registered) on first use.
  absl::StatusOr<BouncePool*> Pool();
  // Load and StoreNow for buffers in device memory. REQUIRES: arguments
  // checked (Load, CheckPut).
  absl::StatusOr<LoadResult> LoadToDevice(
      absl::Span<const std::string> keys,
      absl::Span<const MutableBuffer> buffers, const LoadOptions& options);
  absl::StatusOr<PutResult> StoreFromDevice(
      absl::Span<const std::string> keys, absl::Span<const ConstBuffer> buffers,
      const MemorySpace& memory, const std::string& parent_key,
      absl::Time deadline, uint32_t replicas);

  // Constant after construction.
  const ClientOptions options_;
  const std::shared_ptr<MasterClient> master_;
  const std::shared_ptr<Transport> transport_;
  const std::shared_ptr<DeviceMemory> device_;
  Clock* const clock_;
  // Nodes that did not answer, skipped for a while.
  UnresponsiveNodes unresponsive_;
  // Where recent Loads found their keys.
  LocationCache locations_;
  // Run Stores ("hym-store") and background work: releases of cancelled
  // prefetches, read-repair reports ("hym-bg"). Reset first on destruction.
  std::unique_ptr<Executor> store_executor_;
  std::unique_ptr<Executor> bg_executor_;

  // Protected by mu_.
  Mutex mu_;
  absl::flat_hash_map<uint32_t, PeerInfo> peers_ ABSL_GUARDED_BY(mu_);
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
  // Think-time hints queued or running (max_pending_hints).
  int hints_pending_ ABSL_GUARDED_BY(mu_) = 0;

  // Protected by device_mu_ (never held with mu_). Destroyed before
  // transport_ and device_, which it uses.
  Mutex device_mu_;
  std::unique_ptr<BouncePool> pool_ ABSL_GUARDED_BY(device_mu_);
};

}  // namespace hymcache
