// MetadataStore: the master's durable state. Holds
//   - committed objects: key -> ObjectRecord (where the bytes live, the key
//     of the block before it in its chain, when it was committed),
//   - the objects' last-use times, written lazily apart from the objects
//     (the master batches its readers' recency changes),
//   - storage-node records: name -> NodeInfo (id, incarnation, addresses,
//     regions, transport parameters),
//   - the generation high-water mark.
// The master keeps everything in memory as well and reads the store only at
// start-up (ForEachObject / LoadNodes); every change is written here first,
// then applied in memory, so a crash never loses a change that a reader saw.
//
// RocksDbMetadataStore is the production implementation; FakeMetadataStore
// (testonly, fake_metadata_store.h) keeps everything in memory and can inject
// write failures.
//
// Thread safety: implementations are safe for concurrent use without external
// synchronization.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "master/object_location.h"
#include "proto/common.pb.h"

namespace rocksdb {
class DB;
struct Options;
class WriteBatch;
}

namespace hymcache {
namespace master {

// One committed object: where it lives, its chain parent and its last use.
struct ObjectRecord : ObjectLocation {
  // Unix milliseconds of the last use known to the store: the commit time,
  // or a later use written with MetadataMutation::object_uses (ForEachObject
  // reports the later of the two). 0: unknown (records written before the
  // master kept it).
  uint64_t last_use_ms = 0;
  // The key of the block before this one in its chain (PutStart's
  // parent_key, or the previous key of the same put); "" for a chain head
  // and for records written before the master kept it. At most 65535 bytes.
  std::string parent_key;

  bool operator==(const ObjectRecord& o) const {
    return ObjectLocation::operator==(o) && last_use_ms == o.last_use_ms &&
           parent_key == o.parent_key;
  }
};

// One atomic change: all of it is applied or none of it.
struct MetadataMutation {
  std::vector<std::pair<std::string, ObjectRecord>> put_objects;
  // Deletes the objects and their last-use times.
  std::vector<std::string> delete_objects;
  // Later uses of committed objects: key -> Unix milliseconds. Kept apart
  // from the object (a small write; the object record stays as committed)
  // until the object is deleted. Writing one for a key that is not a
  // committed object is the caller's mistake: it is ignored at load.
  std::vector<std::pair<std::string, uint64_t>> object_uses;
  // Keyed by NodeInfo.name. Only the registration fields are kept (node_id,
  // name, incarnation, addresses, regions without used_bytes,
  // transport_params, node_key, draining); liveness and usage fields are
  // dropped.
  std::vector<hymcache::v1::NodeInfo> put_nodes;
  // Node records to delete, by name (applied before put_nodes). Deleting a
  // missing record is not an error.
  std::vector<std::string> delete_nodes;

  bool empty() const {
    return put_objects.empty() && delete_objects.empty() &&
           object_uses.empty() && put_nodes.empty() && delete_nodes.empty();
  }
};

class MetadataStore {
 public:
  virtual ~MetadataStore() = default;

  // Applies `mutation` atomically. Deleting a missing object is not an error.
  // Errors: ResourceExhausted when the disk is full; Internal / Unavailable
  // on another storage failure (nothing applied either way).
  virtual absl::Status Apply(const MetadataMutation& mutation) = 0;

  // Returns a generation never returned before by this store, including
  // across restarts: > 0 and increasing. Errors: a storage failure while
  // reserving the next block of generations.
  virtual absl::StatusOr<uint64_t> NextGeneration() = 0;

  // An upper bound on every generation NextGeneration has returned or will
  // return soon (the durable limit plus a few blocks of slack). Storage
  // nodes refuse writes that claim a higher generation.
  virtual uint64_t GenerationCeiling() = 0;

  // Calls `fn` for every committed object (unspecified order), with
  // last_use_ms the later of its commit time and its last object_uses
  // write. Stops and returns the error if an entry is corrupt or reading
  // fails.
  virtual absl::Status ForEachObject(
      const std::function<void(absl::string_view key, const ObjectRecord&)>& fn)
      = 0;

  // All node records.
  virtual absl::StatusOr<std::vector<hymcache::v1::NodeInfo>> LoadNodes() = 0;

  // Whether every write is refused (a read-only view of a store that
  // something else writes): its owner writes nothing on its own account
  // either (no index snapshot, no recency).
  virtual bool read_only() const { return false; }

  // Change tracking, for a restart from a snapshot of the owner's state
  // plus the changes written after it. The store's sequence number grows
  // with every write; read while no Apply runs, it names exactly the state
  // written so far. 0 if the store does not track changes.
  virtual uint64_t LatestSequence() { return 0; }

  // One object change, as ForEachObjectChangeSince reports it.
  struct ObjectChange {
    enum class Kind { kPut, kDelete, kUse };
    Kind kind;
    absl::string_view key;
    const ObjectRecord* record = nullptr;  // kPut
    uint64_t use_ms = 0;                   // kUse: a later use (Unix ms)
  };
  // Calls `fn` for every object put, delete and later use (object_uses)
  // written after sequence number `after`, in the order written (node and
  // generation records are not reported: LoadNodes has them current).
  // `fn` must not write to the store. Errors: Unimplemented if the store
  // does not keep its changes; NotFound if it no longer holds every change
  // since `after` (pruned) or `after` is not one of its sequence numbers;
  // DataLoss for an object record that does not decode; others on read
  // failure. On error `fn` may have seen some of the changes.
  virtual absl::Status ForEachObjectChangeSince(
      uint64_t after, const std::function<void(const ObjectChange&)>& fn) {
    (void)after;
    (void)fn;
    return absl::UnimplementedError("this store does not keep its changes");
  }

  // Convenience wrappers around Apply.
  absl::Status PutObjects(
      std::vector<std::pair<std::string, ObjectRecord>> objects);
  absl::Status DeleteObjects(std::vector<std::string> keys);
  absl::Status PutNode(const hymcache::v1::NodeInfo& node);
};

struct RocksDbMetadataStoreOptions {
  // Directory of the RocksDB database; created if missing (its parent must
  // exist). Required. Default: "" (invalid).
  std::string path;
  // fsync the write-ahead log on every write. Without it a write survives a
  // process crash (kill -9: the WAL is in the OS page cache) but the last
  // writes can be lost on a machine crash or power loss. Losing them is safe
  // for a cache: those objects are simply missing after restart.
  // Default: false.
  bool sync_writes = false;
  // Generations are reserved in blocks of this many: the end of the block is
  // persisted before any generation of it is handed out, so a restart starts
  // after the block and never repeats one. Must be > 0. Default: 1 << 20.
  uint64_t generation_block = uint64_t{1} << 20;
  // Generations handed out lie in [generation_floor, generation_end): the
  // first one is the larger of the persisted resume point and the floor,
  // and NextGeneration is ResourceExhausted once the end is reached. A
  // master elected through etcd sets [epoch << 32, (epoch + 1) << 32), so
  // that nothing a leader of an earlier term issued (whatever store it
  // used) can equal a generation of this term (docs/ha.md).
  // generation_end 0: no end. Default: 0, 0.
  uint64_t generation_floor = 0;
  uint64_t generation_end = 0;
  // Keep write-ahead log files this long after RocksDB is done with them
  // (and at most keep_wal_mb of them), so that ForEachObjectChangeSince
  // can read the changes since the owner's last snapshot. 0: do not keep
  // them (ForEachObjectChangeSince then sees only the unflushed tail).
  // Default: 0.
  uint64_t keep_wal_seconds = 0;
  // Most megabytes of kept log files (0: no size limit besides the time).
  // Default: 1024.
  uint64_t keep_wal_mb = 1024;
  // Open the database read-only (RocksDB's OpenForReadOnly: no lock, so
  // beside a handle that writes, as a standby's ReplicaFollower's): reads
  // see the database as it was when opened; every write, generations
  // included, is FailedPrecondition. A standby preloads its index this way
  // (MasterServer::PreloadIndex). Default: false.
  bool read_only = false;

  absl::Status Validate() const;
};

// The RocksDB options RocksDbMetadataStore opens `options.path` with. A
// standby's ReplicaFollower (master/replica_follower.h) opens its copy of
// the leader's store with them, so that the master's restart path finds the
// directory exactly as its own.
rocksdb::Options MetadataStoreDbOptions(
    const RocksDbMetadataStoreOptions& options);

// The end of the last block of generations reserved in the store at `path`
// (0: no store there, or none reserved yet), read without the store's lock
// (beside a process that has it open). An elected master's generations lie
// in [epoch << 32, ...): this tells a restarted master which epochs its
// store has issued generations in (master/master_ha.cc's epoch floor).
// Errors: DataLoss (a corrupt record); RocksDB's error if it cannot read.
absl::StatusOr<uint64_t> ReadReservedGenerationLimit(const std::string& path);

// A key of the store reserved for a standby's replication position
// (ReplicaFollower); the store itself never reads or writes it.
inline constexpr char kReplicaPositionKey[] = "m:replica";

class RocksDbMetadataStore : public MetadataStore {
 public:
  // Opens (or creates) the database and reserves the first block of
  // generations. Errors: InvalidArgument for bad options; Internal /
  // Unavailable if RocksDB cannot open the directory (e.g. another process
  // holds its lock); DataLoss if the generation record is corrupt.
  static absl::StatusOr<std::unique_ptr<RocksDbMetadataStore>> Create(
      const RocksDbMetadataStoreOptions& options);
  ~RocksDbMetadataStore() override;

  absl::Status Apply(const MetadataMutation& mutation) override;
  absl::StatusOr<uint64_t> NextGeneration() override;
  uint64_t GenerationCeiling() override;
  absl::Status ForEachObject(
      const std::function<void(absl::string_view key, const ObjectRecord&)>& fn)
      override;
  absl::StatusOr<std::vector<hymcache::v1::NodeInfo>> LoadNodes() override;
  uint64_t LatestSequence() override;
  bool read_only() const override { return options_.read_only; }
  absl::Status ForEachObjectChangeSince(
      uint64_t after,
      const std::function<void(const ObjectChange&)>& fn) override;

  // The database's latest sequence number when it was opened, before this
  // store wrote anything (it reserves generations at once): two stores
  // opened on one directory with the same opened_sequence() hold the same
  // nodes and objects.
  uint64_t opened_sequence() const { return opened_sequence_; }

  // The database, for the replication source (master/replication_source.h):
  // snapshots, iterators and its write log, read only. Writes go through
  // Apply.
  rocksdb::DB* db() const { return db_.get(); }

  // Calls `fn` on the writing thread after each write that succeeds: how
  // a replication source hears of every write at once
  // (ReplicationSource::NotifyWrite), not only of the commits. `owner`
  // names it for RemoveWriteListener (one listener per owner; adding again
  // replaces it).
  void AddWriteListener(const void* owner, std::function<void()> fn);
  // Removes `owner`'s listener, if any. Once this returns it is not
  // running and is not called again.
  void RemoveWriteListener(const void* owner);

 private:
  RocksDbMetadataStore(const RocksDbMetadataStoreOptions& options,
                       std::unique_ptr<rocksdb::DB> db);
  absl::Status ReserveGenerationBlock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gen_mu_);
  // ForEachObject on the calling thread (ForEachObject runs it on a thread
  // of its own, a few batches ahead of its `fn`).
  absl::Status ScanObjects(
      const std::function<void(absl::string_view key, const ObjectRecord&)>&
          fn);
  // One write; after a failed one, resumes the DB first.
  absl::Status Write(rocksdb::WriteBatch* batch, bool sync,
                     absl::string_view what);
  // Names the full filesystem in a ResourceExhausted error.
  absl::Status Explain(const absl::Status& s, absl::string_view what) const;

  // Constant after construction.
  const RocksDbMetadataStoreOptions options_;
  const std::unique_ptr<rocksdb::DB> db_;  // thread-safe itself
  const uint64_t opened_sequence_;

  // The last write failed (RocksDB refuses writes until resumed).
  std::atomic<bool> write_failed_{false};

  // Held shared while the listeners run, exclusive to change them.
  Mutex listener_mu_;
  std::vector<std::pair<const void*, std::function<void()>>> listeners_
      ABSL_GUARDED_BY(listener_mu_);

  Mutex gen_mu_;
  uint64_t next_generation_ ABSL_GUARDED_BY(gen_mu_) = 0;
  // Generations < generation_limit_ may be handed out; the limit is durable.
  uint64_t generation_limit_ ABSL_GUARDED_BY(gen_mu_) = 0;
};

// Encoding helpers, exposed for tests and tools. Decode also reads the
// first format (no last use, no parent), which older masters wrote.
std::string EncodeObjectRecord(const ObjectRecord& record);
absl::StatusOr<ObjectRecord> DecodeObjectRecord(absl::string_view value);

}  // namespace master
}  // namespace hymcache
