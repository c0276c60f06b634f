// FakeMasterClient: an in-memory master for unit tests of the client
// (testonly). It keeps an index key -> location, allocates locations on the
// nodes it is given, commits and aborts puts, and records what the client
// asked of it. Failures are injected per call kind.
//
// Allocated locations carry a capability with the right the master would
// grant (wire::kCapWrite for a put, wire::kCapRead for a lookup) and a tag
// naming the location, which FakeTransport checks.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "client/master_client.h"
#include "common/mutex.h"

namespace hymcache {

// The capability a fake master grants for `location` with `rights`, and
// whether `cap` is one it granted for the location.
ObjectCapability FakeCapability(const ObjectLocation& location,
                                uint8_t rights);

class FakeMasterClient : public MasterClient {
 public:
  struct Commit {
    uint64_t put_id = 0;
    std::vector<uint32_t> failed_indexes;
  };

  FakeMasterClient() = default;

  // A node PutStart may place objects on. The first one added takes puts
  // that name neither a preferred node nor a stored parent.
  void AddNode(const PeerInfo& node);
  // Puts without a preferred node or stored parent go to `node_id` from now.
  void SetDefaultNode(uint32_t node_id);

  // Failure injection. Each holds until changed.
  // Chunk `chunk` (0-based) of every later lookup stream fails with `s`.
  void FailLookupChunk(size_t chunk, absl::Status s);
  // Lookup answers after the first of a stream have not arrived when the
  // client asks without blocking (it reads before it waits for them).
  void SetLaterChunksLate(bool late);
  // PutStart calls numbered >= `from_call` (0-based, counted from now) fail
  // with `s`.
  void FailPutStart(absl::Status s, size_t from_call = 0);
  void FailPutCommit(absl::Status s);
  // PutStart answers SLOT_IN_PROGRESS for `key`.
  void MarkInProgress(const std::string& key);
  // PutStart waits until UnblockPutStart (a store that takes its time).
  void BlockPutStart();
  void UnblockPutStart();

  // Records.
  std::optional<ObjectLocation> Find(const std::string& key) const;
  std::vector<PutStartArgs> put_starts() const;
  std::vector<Commit> commits() const;
  std::vector<uint64_t> aborts() const;
  // Keys reported missing and the locations given, in order.
  std::vector<std::pair<std::string, ObjectLocation>> reported_missing() const;
  // Lookup chunks the client took from its streams, and streams cancelled
  // with chunks left.
  size_t lookup_chunks_taken() const;
  size_t streams_cancelled_early() const;
  // Chunk sizes of the lookup streams started, in order.
  std::vector<size_t> stream_chunk_keys() const;
  // The keys of each Lookup with LookupIntent::kEnded, in order.
  std::vector<std::vector<std::string>> ended_chains() const;

  // MasterClient.
  HYMCACHE_MASTER_CLIENT_OVERRIDES

 private:
  class Stream;
  struct PendingPut {
    std::vector<std::string> keys;
    std::vector<std::optional<ObjectLocation>> locations;
  };

  LookupBatch LookupLocked(absl::Span<const std::string> keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<PeerInfo> nodes_ ABSL_GUARDED_BY(mu_);
  uint32_t default_node_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, uint64_t> next_addr_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_put_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, ObjectLocation> index_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> in_progress_ ABSL_GUARDED_BY(mu_);
  // ReportEngineBlocks: each engine's keys (no bound, no expiry).
  std::map<std::string, std::set<std::string>> engines_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, PendingPut> pending_ ABSL_GUARDED_BY(mu_);

  std::map<size_t, absl::Status> lookup_failures_ ABSL_GUARDED_BY(mu_);
  bool later_chunks_late_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status put_start_error_ ABSL_GUARDED_BY(mu_);
  size_t put_start_fail_from_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status put_commit_error_ ABSL_GUARDED_BY(mu_);
  bool put_start_blocked_ ABSL_GUARDED_BY(mu_) = false;

  std::vector<std::vector<std::string>> ended_chains_ ABSL_GUARDED_BY(mu_);
  std::vector<PutStartArgs> put_starts_ ABSL_GUARDED_BY(mu_);
  std::vector<Commit> commits_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> aborts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, ObjectLocation>> reported_
      ABSL_GUARDED_BY(mu_);
  size_t chunks_taken_ ABSL_GUARDED_BY(mu_) = 0;
  size_t streams_cancelled_early_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<size_t> stream_chunk_keys_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hymcache
