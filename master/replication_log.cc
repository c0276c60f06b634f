#include "master/replication_log.h"

#include <rocksdb/write_batch.h>

#include "absl/strings/str_cat.h"
#include "common/rocksdb_util.h"
#include "master/metadata_store.h"

namespace hymcache {
namespace master {

namespace v1 = ::hymcache::v1;

bool WriteLogStartsAt(rocksdb::DB* db, uint64_t seq) {
  if (seq <= 1) return false;
  const uint64_t latest = db->GetLatestSequenceNumber();
  if (seq > latest + 1) return false;  // the follower is ahead: another past
  if (seq == latest + 1) return true;
  std::unique_ptr<rocksdb::TransactionLogIterator> it;
  if (!db->GetUpdatesSince(seq, &it).ok() || !it->Valid()) return false;
  return it->GetBatch().sequence == seq;
}

ReplicationCopyReader::ReplicationCopyReader(rocksdb::DB* db,
                                             size_t chunk_records,
                                             size_t chunk_bytes)
    : db_(db),
      chunk_records_(chunk_records),
      chunk_bytes_(chunk_bytes),
      snapshot_(db->GetSnapshot()),
      sequence_(snapshot_->GetSequenceNumber()) {
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot_;
  ro.fill_cache = false;
  ro.readahead_size = size_t{2} << 20;
  it_.reset(db_->NewIterator(ro));
  it_->SeekToFirst();
}

ReplicationCopyReader::~ReplicationCopyReader() {
  it_.reset();  // before the snapshot it reads
  db_->ReleaseSnapshot(snapshot_);
}

absl::StatusOr<bool> ReplicationCopyReader::Next(v1::FollowResponse* chunk) {
  chunk->Clear();
  size_t bytes = 0;
  for (; it_->Valid(); it_->Next()) {
    if (static_cast<size_t>(chunk->keys_size()) >= chunk_records_ ||
        bytes >= chunk_bytes_) {
      break;
    }
    if (it_->key() == rocksdb::Slice(kReplicaPositionKey)) continue;
    chunk->add_keys(it_->key().data(), it_->key().size());
    chunk->add_values(it_->value().data(), it_->value().size());
    bytes += it_->key().size() + it_->value().size();
    ++records_;
  }
  if (chunk->keys_size() > 0) {
    chunk->set_kind(v1::FollowResponse::COPY_CHUNK);
    return true;
  }
  absl::Status s = FromRocksDb(it_->status(), "replication source", "copy");
  if (!s.ok()) return s;
  return false;
}

ReplicationLogReader::ReplicationLogReader(rocksdb::DB* db, uint64_t next,
                                           size_t message_bytes)
    : db_(db), message_bytes_(message_bytes), next_(next) {}

bool ReplicationLogReader::Behind() const {
  return next_ <= db_->GetLatestSequenceNumber();
}

absl::StatusOr<ReplicationLogReader::Fill> ReplicationLogReader::Next(
    v1::FollowResponse* m) {
  m->Clear();
  // A worn iterator that reads nothing is replaced at once, once; a fresh
  // one that reads nothing is tried again later.
  for (int round = 0; round < 2; ++round) {
    if (!Behind()) return Fill::kCaughtUp;
    bool fresh = false;
    if (it_ == nullptr) {
      rocksdb::Status rs = db_->GetUpdatesSince(next_, &it_);
      if (!rs.ok()) {
        it_.reset();
        return absl::OutOfRangeError(absl::StrCat(
            "the log from sequence ", next_, " is gone: ", rs.ToString()));
      }
      fresh = true;
    } else if (!it_->Valid() && it_->status().ok()) {
      it_->Next();  // at the end: read what was appended since
    }
    size_t bytes = 0;
    while (it_->Valid()) {
      rocksdb::BatchResult b = it_->GetBatch();
      const uint32_t count = b.writeBatchPtr->Count();
      if (b.sequence + count <= next_) {  // sent already
        it_->Next();
        continue;
      }
      if (b.sequence != next_) {
        if (m->batches_size() > 0) break;  // send those; the gap next time
        return absl::OutOfRangeError(absl::StrCat(
            "the log skips from sequence ", next_, " to ", b.sequence));
      }
      m->add_batches(b.writeBatchPtr->Data());
      m->set_count(m->count() + count);
      bytes += b.writeBatchPtr->GetDataSize();
      next_ += count;
      it_->Next();
      if (bytes >= message_bytes_) break;
    }
    if (m->batches_size() > 0) {
      m->set_kind(v1::FollowResponse::BATCH);
      m->set_sequence(next_ - m->count());
      return Fill::kFilled;
    }
    if (!it_->status().ok()) {
      if (fresh) {
        // A new iterator that cannot read: the log is damaged or gone, or
        // (TryAgain) it moved to a new file meanwhile.
        if (it_->status().IsTryAgain()) {
          it_.reset();
          return Fill::kRetryLater;
        }
        return absl::OutOfRangeError(
            absl::StrCat("reading the log at sequence ", next_, ": ",
                         it_->status().ToString()));
      }
      it_.reset();  // TryAgain: the log moved to a new file
      continue;
    }
    if (!Behind()) return Fill::kCaughtUp;
    // Published but not readable yet: a new iterator, after a pause if a
    // new one did not help either.
    it_.reset();
    if (fresh) return Fill::kRetryLater;
  }
  return Fill::kRetryLater;
}

}  // namespace master
}  // namespace hymcache
