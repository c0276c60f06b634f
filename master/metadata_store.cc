#include "master/metadata_store.h"

#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/transaction_log.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>

#include <algorithm>
#include <deque>
#include <cstring>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/rocksdb_util.h"
#include "common/thread.h"

namespace hymcache {
namespace master {
namespace {

// Key layout. One-byte prefixes keep the kinds apart:
//   "o" + object key  -> EncodeObjectRecord
//   "u" + object key  -> little-endian u64: a later use of the object (Unix
//                        ms), written lazily; deleted with the object
//   "n" + node name   -> serialized v1::NodeInfo (registration fields)
//   "m:generation"    -> little-endian u64: generations below it may have
//                        been handed out.
//   "m:replica"       -> a standby's replication position
//                        (kReplicaPositionKey, master/replica_follower.cc).
constexpr char kObjectPrefix = 'o';
constexpr char kUsePrefix = 'u';
constexpr char kNodePrefix = 'n';
constexpr char kGenerationKey[] = "m:generation";

// Object value, all little-endian:
//   format 1: version byte + node_id u32 + region_id u32 + addr u64 +
//             length u64 + generation u64 (33 bytes);
//   format 2: the same fields, then last_use_ms u64 + parent key length
//             u16 + the parent key (43 bytes + the parent key).
// Format 2 is written; both are read.
constexpr uint8_t kObjectFormat1 = 1;
constexpr uint8_t kObjectFormat2 = 2;
constexpr size_t kObjectValueSize1 = 1 + 4 + 4 + 8 + 8 + 8;
constexpr size_t kObjectValueSize2 = kObjectValueSize1 + 8 + 2;
constexpr size_t kMaxParentKey = 65535;

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  return FromRocksDb(s, "metadata store", what);
}

std::string PrefixedKey(char prefix, absl::string_view key) {
  std::string k;
  k.reserve(key.size() + 1);
  k.push_back(prefix);
  k.append(key.data(), key.size());
  return k;
}

std::string ObjectKey(absl::string_view key) {
  return PrefixedKey(kObjectPrefix, key);
}

std::string UseKey(absl::string_view key) {
  return PrefixedKey(kUsePrefix, key);
}

std::string NodeKey(absl::string_view name) {
  std::string k;
  k.reserve(name.size() + 1);
  k.push_back(kNodePrefix);
  k.append(name.data(), name.size());
  return k;
}

std::string EncodeU64(uint64_t v) {
  std::string s(8, '\0');
  absl::little_endian::Store64(s.data(), v);
  return s;
}

// Only the registration fields are durable.
hymcache::v1::NodeInfo DurableNodeFields(const hymcache::v1::NodeInfo& in) {
  hymcache::v1::NodeInfo out;
  out.set_node_id(in.node_id());
  out.set_name(in.name());
  out.set_incarnation(in.incarnation());
  out.set_alive(in.alive());
  out.set_data_address(in.data_address());
  out.set_control_address(in.control_address());
  out.set_host(in.host());
  for (const auto& r : in.regions()) {
    auto* nr = out.add_regions();
    *nr = r;
    nr->set_used_bytes(0);
  }
  *out.mutable_transport_params() = in.transport_params();
  out.set_node_key(in.node_key());
  out.set_draining(in.draining());
  return out;
}

}  // namespace

absl::Status MetadataStore::PutObjects(
    std::vector<std::pair<std::string, ObjectRecord>> objects) {
  MetadataMutation m;
  m.put_objects = std::move(objects);
  return Apply(m);
}

absl::Status MetadataStore::DeleteObjects(std::vector<std::string> keys) {
  MetadataMutation m;
  m.delete_objects = std::move(keys);
  return Apply(m);
}

absl::Status MetadataStore::PutNode(const hymcache::v1::NodeInfo& node) {
  MetadataMutation m;
  m.put_nodes.push_back(node);
  return Apply(m);
}

std::string EncodeObjectRecord(const ObjectRecord& r) {
  // A parent key longer than any key is a caller bug; keep the record
  // loadable (as a chain head) rather than corrupt.
  const size_t plen =
      r.parent_key.size() <= kMaxParentKey ? r.parent_key.size() : 0;
  std::string v(kObjectValueSize2 + plen, '\0');
  char* p = v.data();
  p[0] = static_cast<char>(kObjectFormat2);
  absl::little_endian::Store32(p + 1, r.node_id);
  absl::little_endian::Store32(p + 5, r.region_id);
  absl::little_endian::Store64(p + 9, r.addr);
  absl::little_endian::Store64(p + 17, r.length);
  absl::little_endian::Store64(p + 25, r.generation);
  absl::little_endian::Store64(p + 33, r.last_use_ms);
  absl::little_endian::Store16(p + 41, static_cast<uint16_t>(plen));
  if (plen > 0) std::memcpy(p + kObjectValueSize2, r.parent_key.data(), plen);
  return v;
}

namespace {

// Decodes into *r, reusing its parent_key's buffer.
absl::Status DecodeObjectRecordInto(absl::string_view v, ObjectRecord* r) {
  const int format = v.empty() ? -1 : static_cast<uint8_t>(v[0]);
  const bool v1 = format == kObjectFormat1 && v.size() == kObjectValueSize1;
  const bool v2 =
      format == kObjectFormat2 && v.size() >= kObjectValueSize2 &&
      v.size() == kObjectValueSize2 +
                      absl::little_endian::Load16(v.data() + 41);
  if (!v1 && !v2) {
    return absl::DataLossError(absl::StrCat("object record of ", v.size(),
                                            " bytes, format ", format,
                                            ": not understood"));
  }
  const char* p = v.data();
  r->node_id = absl::little_endian::Load32(p + 1);
  r->region_id = absl::little_endian::Load32(p + 5);
  r->addr = absl::little_endian::Load64(p + 9);
  r->length = absl::little_endian::Load64(p + 17);
  r->generation = absl::little_endian::Load64(p + 25);
  if (v2) {
    r->last_use_ms = absl::little_endian::Load64(p + 33);
    r->parent_key.assign(p + kObjectValueSize2, v.size() - kObjectValueSize2);
  } else {
    r->last_use_ms = 0;
    r->parent_key.clear();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ObjectRecord> DecodeObjectRecord(absl::string_view v) {
  ObjectRecord r;
  absl::Status s = DecodeObjectRecordInto(v, &r);
  if (!s.ok()) return s;
  return r;
}

absl::Status RocksDbMetadataStoreOptions::Validate() const {
  if (path.empty()) {
    return absl::InvalidArgumentError("metadata store: path is required");
  }
  if (generation_block == 0) {
    return absl::InvalidArgumentError(
        "metadata store: generation_block must be > 0");
  }
  if (generation_end != 0 && generation_end <= generation_floor) {
    return absl::InvalidArgumentError(
        "metadata store: generation_end must exceed generation_floor");
  }
  return absl::OkStatus();
}

rocksdb::Options MetadataStoreDbOptions(
    const RocksDbMetadataStoreOptions& options) {
  // Small values, point reads never happen after start-up: keep RocksDB lean,
  // and able to open and close on a full disk (common/rocksdb_util.h). After
  // a disk-full error RocksDB resumes by itself once a memtable's worth of
  // space is free: 8 MiB rather than the default 64 MiB.
  rocksdb::Options db_options = SmallDbOptions(options.path, size_t{8} << 20);
  if (options.keep_wal_seconds > 0) {
    // Obsolete logs move to archive/ and stay for ForEachObjectChangeSince.
    db_options.WAL_ttl_seconds = options.keep_wal_seconds;
    db_options.WAL_size_limit_MB = options.keep_wal_mb;
  }
  return db_options;
}

absl::StatusOr<uint64_t> ReadReservedGenerationLimit(const std::string& path) {
  struct stat st;
  if (stat((path + "/CURRENT").c_str(), &st) != 0) return 0;  // no store
  RocksDbMetadataStoreOptions options;
  options.path = path;
  rocksdb::DB* raw = nullptr;
  absl::Status s = FromRocks(
      rocksdb::DB::OpenForReadOnly(MetadataStoreDbOptions(options), path, &raw),
      absl::StrCat("open ", path, " read-only"));
  if (!s.ok()) return s;
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string value;
  rocksdb::Status gs = db->Get(rocksdb::ReadOptions(), kGenerationKey, &value);
  if (gs.IsNotFound()) return 0;
  if (!gs.ok()) return FromRocks(gs, "read generation");
  if (value.size() != 8) {
    return absl::DataLossError(
        absl::StrCat("metadata store: generation record has ", value.size(),
                     " bytes, want 8"));
  }
  return absl::little_endian::Load64(value.data());
}

absl::StatusOr<std::unique_ptr<RocksDbMetadataStore>>
RocksDbMetadataStore::Create(const RocksDbMetadataStoreOptions& options) {
  absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;
  const rocksdb::Options db_options = MetadataStoreDbOptions(options);
  rocksdb::DB* raw = nullptr;
  if (options.read_only) {
    absl::Status s =
        FromRocks(rocksdb::DB::OpenForReadOnly(db_options, options.path, &raw),
                  absl::StrCat("open ", options.path, " read-only"));
    if (!s.ok()) return s;
    return std::unique_ptr<RocksDbMetadataStore>(
        new RocksDbMetadataStore(options, std::unique_ptr<rocksdb::DB>(raw)));
  }
  // Created here, as RocksDB logs an error for a missing directory even
  // with create_if_missing; a real problem is DB::Open's to report.
  mkdir(options.path.c_str(), 0755);
  ReleasePreallocatedSpace(options.path);
  absl::Status s = FromRocks(rocksdb::DB::Open(db_options, options.path, &raw),
                             absl::StrCat("open ", options.path));
  if (!s.ok()) return s;
  std::unique_ptr<RocksDbMetadataStore> store(
      new RocksDbMetadataStore(options, std::unique_ptr<rocksdb::DB>(raw)));

  std::string value;
  rocksdb::Status gs =
      store->db_->Get(rocksdb::ReadOptions(), kGenerationKey, &value);
  uint64_t start = 1;
  if (gs.ok()) {
    if (value.size() != 8) {
      return absl::DataLossError(
          absl::StrCat("metadata store: generation record has ", value.size(),
                       " bytes, want 8"));
    }
    start = std::max<uint64_t>(1, absl::little_endian::Load64(value.data()));
  } else if (!gs.IsNotFound()) {
    return FromRocks(gs, "read generation");
  }
  start = std::max(start, options.generation_floor);
  {
    MutexLock l(&store->gen_mu_);
    store->next_generation_ = start;
    store->generation_limit_ = start;
    s = store->ReserveGenerationBlock();
  }
  if (!s.ok()) return s;
  LOG(INFO) << "metadata store " << options.path
            << " opened; generations resume at " << start;
  return store;
}

RocksDbMetadataStore::RocksDbMetadataStore(
    const RocksDbMetadataStoreOptions& options, std::unique_ptr<rocksdb::DB> db)
    : options_(options),
      db_(std::move(db)),
      opened_sequence_(db_->GetLatestSequenceNumber()) {}

RocksDbMetadataStore::~RocksDbMetadataStore() {
  rocksdb::Status s = db_->Close();
  if (!s.ok()) LOG(WARNING) << "metadata store close: " << s.ToString();
}

absl::Status RocksDbMetadataStore::ReserveGenerationBlock() {
  const uint64_t end =
      options_.generation_end == 0 ? UINT64_MAX : options_.generation_end;
  uint64_t new_limit = generation_limit_ + options_.generation_block;
  if (new_limit < generation_limit_) new_limit = UINT64_MAX;
  new_limit = std::min(new_limit, end);
  if (new_limit <= generation_limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "metadata store: generations exhausted (the range ends at ", end,
        ")"));
  }
  // The limit must be durable before any generation of the block is used,
  // even when ordinary writes are not synced: a lost limit could repeat
  // generations. This write happens once per block.
  rocksdb::WriteBatch batch;
  batch.Put(kGenerationKey, EncodeU64(new_limit));
  absl::Status s = Write(&batch, /*sync=*/true, "persist generation");
  if (!s.ok()) return s;
  generation_limit_ = new_limit;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RocksDbMetadataStore::NextGeneration() {
  MutexLock l(&gen_mu_);
  if (next_generation_ >= generation_limit_) {
    absl::Status s = ReserveGenerationBlock();
    if (!s.ok()) return s;
  }
  return next_generation_++;
}

uint64_t RocksDbMetadataStore::GenerationCeiling() {
  MutexLock l(&gen_mu_);
  // Nodes learn the ceiling at most one heartbeat late: leave room for a few
  // blocks to be reserved in between.
  uint64_t slack = 4 * options_.generation_block;
  return generation_limit_ > UINT64_MAX - slack ? UINT64_MAX
                                                : generation_limit_ + slack;
}

absl::Status RocksDbMetadataStore::Apply(const MetadataMutation& mutation) {
  if (mutation.empty()) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  for (const auto& key : mutation.delete_objects) {
    batch.Delete(ObjectKey(key));
    batch.Delete(UseKey(key));
  }
  for (const auto& [key, record] : mutation.put_objects) {
    batch.Put(ObjectKey(key), EncodeObjectRecord(record));
  }
  for (const auto& [key, ms] : mutation.object_uses) {
    batch.Put(UseKey(key), EncodeU64(ms));
  }
  for (const auto& name : mutation.delete_nodes) batch.Delete(NodeKey(name));
  for (const auto& node : mutation.put_nodes) {
    std::string value;
    if (!DurableNodeFields(node).SerializeToString(&value)) {
      return absl::InternalError("metadata store: cannot serialize NodeInfo");
    }
    batch.Put(NodeKey(node.name()), value);
  }
  return Write(&batch, options_.sync_writes, "write batch");
}

absl::Status RocksDbMetadataStore::Write(rocksdb::WriteBatch* batch, bool sync,
                                         absl::string_view what) {
  if (options_.read_only) {
    return absl::FailedPreconditionError(absl::StrCat(
        "metadata store ", options_.path, " is open read-only: cannot ", what));
  }
  if (write_failed_.load(std::memory_order_acquire)) {
    // After a failed write RocksDB refuses writes until resumed (it also
    // resumes by itself once a full disk has room again; meanwhile Resume
    // says Busy, and the write below returns the original error).
    rocksdb::Status r = db_->Resume();
    if (!r.ok() && !r.IsBusy()) {
      return Explain(FromRocks(r, "resume after a failed write"), what);
    }
    if (r.ok() && write_failed_.exchange(false, std::memory_order_acq_rel)) {
      LOG(INFO) << "metadata store " << options_.path << " takes writes again";
    }
  }
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  absl::Status s = FromRocks(db_->Write(wo, batch), what);
  if (!s.ok()) {
    write_failed_.store(true, std::memory_order_release);
    return Explain(s, what);
  }
  ReaderMutexLock l(&listener_mu_);
  for (const auto& [owner, fn] : listeners_) fn();
  return s;
}

void RocksDbMetadataStore::AddWriteListener(const void* owner,
                                            std::function<void()> fn) {
  MutexLock l(&listener_mu_);
  for (auto& [o, f] : listeners_) {
    if (o == owner) {
      f = std::move(fn);
      return;
    }
  }
  listeners_.emplace_back(owner, std::move(fn));
}

void RocksDbMetadataStore::RemoveWriteListener(const void* owner) {
  MutexLock l(&listener_mu_);
  listeners_.erase(
      std::remove_if(listeners_.begin(), listeners_.end(),
                     [owner](const auto& l) { return l.first == owner; }),
      listeners_.end());
}

absl::Status RocksDbMetadataStore::Explain(const absl::Status& s,
                                           absl::string_view what) const {
  if (!absl::IsResourceExhausted(s)) return s;
  return absl::ResourceExhaustedError(
      absl::StrCat("metadata store: ", what, ": the filesystem of ",
                   options_.path, " is full; writes are refused until space "
                   "is freed (", s.message(), ")"));
}

namespace {

// Objects decoded by the scanning thread for the caller's: keys and parent
// keys in one buffer, no allocation per object.
struct ScanBatch {
  struct Item {
    ObjectRecord fixed;  // parent_key unused (in `bytes`)
    uint32_t key_begin;
    uint32_t key_len;
    uint32_t parent_len;  // the parent follows the key in `bytes`
  };
  std::string bytes;
  std::vector<Item> items;
};
constexpr size_t kScanBatchObjects = 4096;
constexpr size_t kScanBatchesQueued = 4;

// The hand-off between the two threads.
struct ScanQueue {
  Mutex mu;
  std::deque<std::unique_ptr<ScanBatch>> full ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<ScanBatch>> spare ABSL_GUARDED_BY(mu);
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
};

}  // namespace

absl::Status RocksDbMetadataStore::ForEachObject(
    const std::function<void(absl::string_view key, const ObjectRecord&)>& fn) {
  // Reading and decoding run on a thread of their own, a few batches ahead
  // of `fn` (the master's index inserts): a restart takes the longer of the
  // two rather than their sum.
  ScanQueue q;
  Thread scanner("meta-scan", [this, &q] {
    auto next_batch = [&q] {
      MutexLock l(&q.mu);
      q.mu.Await(absl::Condition(
          +[](ScanQueue* q) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return q->full.size() < kScanBatchesQueued;
          },
          &q));
      std::unique_ptr<ScanBatch> b;
      if (!q.spare.empty()) {
        b = std::move(q.spare.back());
        q.spare.pop_back();
      } else {
        b = std::make_unique<ScanBatch>();
      }
      return b;
    };
    auto ship = [&q](std::unique_ptr<ScanBatch> b) {
      MutexLock l(&q.mu);
      q.full.push_back(std::move(b));
    };
    std::unique_ptr<ScanBatch> batch = next_batch();
    absl::Status s = ScanObjects([&](absl::string_view key,
                                     const ObjectRecord& r) {
      ScanBatch::Item item;
      item.fixed.node_id = r.node_id;
      item.fixed.region_id = r.region_id;
      item.fixed.addr = r.addr;
      item.fixed.length = r.length;
      item.fixed.generation = r.generation;
      item.fixed.last_use_ms = r.last_use_ms;
      item.key_begin = static_cast<uint32_t>(batch->bytes.size());
      item.key_len = static_cast<uint32_t>(key.size());
      item.parent_len = static_cast<uint32_t>(r.parent_key.size());
      batch->bytes.append(key.data(), key.size());
      batch->bytes.append(r.parent_key);
      batch->items.push_back(item);
      if (batch->items.size() >= kScanBatchObjects) {
        ship(std::move(batch));
        batch = next_batch();
      }
    });
    MutexLock l(&q.mu);
    q.full.push_back(std::move(batch));
    q.status = s;
    q.done = true;
  });

  ObjectRecord record;  // reused: no allocation per object
  for (;;) {
    std::unique_ptr<ScanBatch> batch;
    {
      MutexLock l(&q.mu);
      q.mu.Await(absl::Condition(
          +[](ScanQueue* q) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return !q->full.empty() || q->done;
          },
          &q));
      if (q.full.empty()) break;  // done
      batch = std::move(q.full.front());
      q.full.pop_front();
    }
    for (const ScanBatch::Item& item : batch->items) {
      const char* k = batch->bytes.data() + item.key_begin;
      record.node_id = item.fixed.node_id;
      record.region_id = item.fixed.region_id;
      record.addr = item.fixed.addr;
      record.length = item.fixed.length;
      record.generation = item.fixed.generation;
      record.last_use_ms = item.fixed.last_use_ms;
      record.parent_key.assign(k + item.key_len, item.parent_len);
      fn(absl::string_view(k, item.key_len), record);
    }
    batch->bytes.clear();
    batch->items.clear();
    MutexLock l(&q.mu);
    q.spare.push_back(std::move(batch));
  }
  scanner.Join();
  MutexLock l(&q.mu);
  return q.status;
}

absl::Status RocksDbMetadataStore::ScanObjects(
    const std::function<void(absl::string_view key, const ObjectRecord&)>& fn) {
  // Objects and their later uses are both in key order: merge the two
  // ranges with one iterator each. A one-time sequential read: large
  // readahead, no block cache pollution, each iterator bounded to its range
  // (so it never walks on into the next kind's keys or tombstones).
  const std::string prefix(1, kObjectPrefix);
  const std::string use_prefix(1, kUsePrefix);
  const std::string end(1, kObjectPrefix + 1);
  const std::string use_end(1, kUsePrefix + 1);
  const rocksdb::Slice end_slice(end), use_end_slice(use_end);
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  ro.readahead_size = size_t{2} << 20;
  ro.iterate_upper_bound = &end_slice;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  ro.iterate_upper_bound = &use_end_slice;
  std::unique_ptr<rocksdb::Iterator> use(db_->NewIterator(ro));
  use->Seek(use_prefix);
  auto use_valid = [&] {
    return use->Valid() && use->key().starts_with(use_prefix);
  };
  ObjectRecord record;  // reused: no allocation per object
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix);
       it->Next()) {
    rocksdb::Slice k = it->key();
    rocksdb::Slice v = it->value();
    const rocksdb::Slice key(k.data() + 1, k.size() - 1);
    absl::Status decoded =
        DecodeObjectRecordInto(absl::string_view(v.data(), v.size()), &record);
    if (!decoded.ok()) {
      return absl::DataLossError(absl::StrCat(
          "metadata store: object '",
          absl::CEscape(absl::string_view(key.data(), key.size())),
          "': ", decoded.message()));
    }
    // Uses of keys that are no objects (cannot happen) are skipped.
    while (use_valid() &&
           rocksdb::Slice(use->key().data() + 1, use->key().size() - 1)
                   .compare(key) < 0) {
      use->Next();
    }
    if (use_valid() &&
        rocksdb::Slice(use->key().data() + 1, use->key().size() - 1)
                .compare(key) == 0 &&
        use->value().size() == 8) {
      record.last_use_ms = std::max(
          record.last_use_ms, absl::little_endian::Load64(use->value().data()));
    }
    fn(absl::string_view(key.data(), key.size()), record);
  }
  absl::Status s = FromRocks(it->status(), "scan objects");
  if (!s.ok()) return s;
  return FromRocks(use->status(), "scan object uses");
}

uint64_t RocksDbMetadataStore::LatestSequence() {
  return db_->GetLatestSequenceNumber();
}

namespace {

// Turns one write batch's records into object changes, numbering them
// from the batch's first sequence number (one per record) and skipping
// those at or below `after`.
class ChangeHandler : public rocksdb::WriteBatch::Handler {
 public:
  ChangeHandler(uint64_t first, uint64_t after,
                const std::function<void(
                    const MetadataStore::ObjectChange&)>& fn)
      : seq_(first), after_(after), fn_(fn) {}

  rocksdb::Status PutCF(uint32_t cf, const rocksdb::Slice& key,
                        const rocksdb::Slice& value) override {
    if (cf != 0 || Skip() || key.empty()) return rocksdb::Status::OK();
    MetadataStore::ObjectChange c;
    c.key = absl::string_view(key.data() + 1, key.size() - 1);
    if (key[0] == kObjectPrefix) {
      absl::Status s = DecodeObjectRecordInto(
          absl::string_view(value.data(), value.size()), &record_);
      if (!s.ok()) {
        status_ = absl::DataLossError(absl::StrCat(
            "metadata store: logged object '", absl::CEscape(c.key), "': ",
            s.message()));
        return rocksdb::Status::Corruption("object record");
      }
      c.kind = MetadataStore::ObjectChange::Kind::kPut;
      c.record = &record_;
      fn_(c);
    } else if (key[0] == kUsePrefix && value.size() == 8) {
      c.kind = MetadataStore::ObjectChange::Kind::kUse;
      c.use_ms = absl::little_endian::Load64(value.data());
      fn_(c);
    }
    return rocksdb::Status::OK();
  }
  rocksdb::Status DeleteCF(uint32_t cf, const rocksdb::Slice& key) override {
    if (cf != 0 || Skip() || key.empty()) return rocksdb::Status::OK();
    if (key[0] == kObjectPrefix) {
      MetadataStore::ObjectChange c;
      c.kind = MetadataStore::ObjectChange::Kind::kDelete;
      c.key = absl::string_view(key.data() + 1, key.size() - 1);
      fn_(c);
    }
    return rocksdb::Status::OK();
  }
  rocksdb::Status SingleDeleteCF(uint32_t cf,
                                 const rocksdb::Slice& key) override {
    return DeleteCF(cf, key);
  }
  rocksdb::Status DeleteRangeCF(uint32_t, const rocksdb::Slice&,
                                const rocksdb::Slice&) override {
    Skip();
    status_ = absl::InternalError("metadata store: a logged range delete");
    return rocksdb::Status::NotSupported("range delete");
  }
  rocksdb::Status MergeCF(uint32_t, const rocksdb::Slice&,
                          const rocksdb::Slice&) override {
    Skip();
    status_ = absl::InternalError("metadata store: a logged merge");
    return rocksdb::Status::NotSupported("merge");
  }

  uint64_t next_sequence() const { return seq_; }
  const absl::Status& status() const { return status_; }

 private:
  // Numbers the record; whether it is at or below `after`.
  bool Skip() { return seq_++ <= after_; }

  uint64_t seq_;
  const uint64_t after_;
  const std::function<void(const MetadataStore::ObjectChange&)>& fn_;
  ObjectRecord record_;
  absl::Status status_;
};

}  // namespace

absl::Status RocksDbMetadataStore::ForEachObjectChangeSince(
    uint64_t after, const std::function<void(const ObjectChange&)>& fn) {
  const uint64_t latest = db_->GetLatestSequenceNumber();
  if (after > latest) {
    return absl::NotFoundError(absl::StrCat(
        "metadata store: sequence ", after, " is beyond the latest, ",
        latest));
  }
  if (after == latest) return absl::OkStatus();
  std::unique_ptr<rocksdb::TransactionLogIterator> it;
  rocksdb::Status rs = db_->GetUpdatesSince(after + 1, &it);
  if (!rs.ok()) {
    return absl::NotFoundError(absl::StrCat(
        "metadata store: no log from sequence ", after + 1, ": ",
        rs.ToString()));
  }
  uint64_t next = after + 1;  // the first sequence not yet seen
  for (; it->Valid() && next <= latest; it->Next()) {
    rocksdb::BatchResult b = it->GetBatch();
    if (b.sequence > next) {
      return absl::NotFoundError(absl::StrCat(
          "metadata store: the log skips from sequence ", next, " to ",
          b.sequence));
    }
    ChangeHandler handler(b.sequence, after, fn);
    rs = b.writeBatchPtr->Iterate(&handler);
    if (!handler.status().ok()) return handler.status();
    if (!rs.ok()) return FromRocks(rs, "replay the log");
    next = std::max(next, handler.next_sequence());
  }
  if (!it->status().ok() && next <= latest) {
    return absl::NotFoundError(absl::StrCat(
        "metadata store: reading the log at sequence ", next, ": ",
        it->status().ToString()));
  }
  if (next <= latest) {
    return absl::NotFoundError(absl::StrCat(
        "metadata store: the log ends at sequence ", next - 1,
        " before the latest, ", latest));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<hymcache::v1::NodeInfo>>
RocksDbMetadataStore::LoadNodes() {
  std::vector<hymcache::v1::NodeInfo> nodes;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  const std::string prefix(1, kNodePrefix);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix);
       it->Next()) {
    hymcache::v1::NodeInfo node;
    if (!node.ParseFromArray(it->value().data(),
                             static_cast<int>(it->value().size()))) {
      return absl::DataLossError(absl::StrCat(
          "metadata store: node record '", it->key().ToString().substr(1),
          "' does not parse"));
    }
    nodes.push_back(std::move(node));
  }
  absl::Status s = FromRocks(it->status(), "scan nodes");
  if (!s.ok()) return s;
  return nodes;
}

}  // namespace master
}  // namespace hymcache
