// What the leader sends its standbys, read from its store: a consistent
// full copy (ReplicationCopyReader) and the write log from a sequence on
// (ReplicationLogReader), one FollowResponse at a time. Both the blocking
// stream (a gRPC handler thread) and the completion-queue stream (the
// master's poller) of ReplicationSource send what these produce, so the
// two differ only in how they wait.
//
// Thread safety: none; each reader belongs to one stream.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/transaction_log.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/replication.pb.h"

namespace hymcache {
namespace master {

// Whether `db`'s write log holds a batch starting exactly at `seq` (or
// `seq` is the next sequence to be written): a follower whose next
// sequence this is can resume from the log without a full copy.
bool WriteLogStartsAt(rocksdb::DB* db, uint64_t seq);

// A consistent copy of the database (every key but the replication
// position), in COPY_CHUNK messages.
class ReplicationCopyReader {
 public:
  ReplicationCopyReader(rocksdb::DB* db, size_t chunk_records,
                        size_t chunk_bytes);
  ~ReplicationCopyReader();
  ReplicationCopyReader(const ReplicationCopyReader&) = delete;
  ReplicationCopyReader& operator=(const ReplicationCopyReader&) = delete;

  // The copy's sequence: COPY_END carries it, and the log follows from the
  // next one.
  uint64_t sequence() const { return sequence_; }
  // Records put into chunks so far.
  uint64_t records() const { return records_; }

  // Fills `chunk` (cleared first) with the next records; false when the
  // copy is complete (nothing filled). Errors: the store's, as Internal or
  // as FromRocksDb maps them.
  absl::StatusOr<bool> Next(hymcache::v1::FollowResponse* chunk);

 private:
  rocksdb::DB* const db_;
  const size_t chunk_records_;
  const size_t chunk_bytes_;
  const rocksdb::Snapshot* snapshot_;
  uint64_t sequence_;
  std::unique_ptr<rocksdb::Iterator> it_;
  uint64_t records_ = 0;
};

// The write log from a sequence on, tailing the current log file
// (RocksDB's TransactionLogIterator reads records appended after it reached
// the end; a new log file makes it answer TryAgain, and a new iterator is
// opened from the next sequence).
class ReplicationLogReader {
 public:
  ReplicationLogReader(rocksdb::DB* db, uint64_t next, size_t message_bytes);
  ReplicationLogReader(const ReplicationLogReader&) = delete;
  ReplicationLogReader& operator=(const ReplicationLogReader&) = delete;

  // The next sequence to send.
  uint64_t next() const { return next_; }
  // Whether the store holds writes from next() on.
  bool Behind() const;

  enum class Fill {
    kFilled,      // `m` holds a BATCH message: send it
    kCaughtUp,    // nothing written past what was sent
    kRetryLater,  // written but not readable yet: try again in a moment
  };
  // Fills `m` (cleared first) with the batches from next() on, at most
  // about message_bytes of them. Errors: OutOfRange when the log from
  // next() is gone, damaged or has a gap (the follower needs a full copy).
  absl::StatusOr<Fill> Next(hymcache::v1::FollowResponse* m);

 private:
  rocksdb::DB* const db_;
  const size_t message_bytes_;
  uint64_t next_;
  std::unique_ptr<rocksdb::TransactionLogIterator> it_;
};

}  // namespace master
}  // namespace hymcache
