// Helpers for the small RocksDB databases HyMCache keeps (the master's
// metadata store, a capacity tier's durable extent record).
//
// RocksDB's defaults suit a large database on a disk with room to spare: the
// write-ahead log is preallocated with fallocate (write_buffer_size * 1.1,
// 70 MiB by default), the MANIFEST with manifest_preallocation_size (4 MiB),
// and a build without NDEBUG logs at DEBUG level. On a small filesystem an
// empty database then fills the disk at its first open. SmallDbOptions()
// returns options under which an empty database takes a few tens of KiB.
//
// Full disks: RocksDB 7.8 writes its info LOG through a WritableFileWriter.
// Once a LOG write fails (ENOSPC), that writer is in an error state, and the
// next log line trips an assertion (`sync_without_flush_called_`) in builds
// with assertions, Debian's librocksdb included: the first failed write,
// Close() and every later Open() log something, so the process aborts. So
// SmallDbOptions() sends RocksDB's log to glog instead (warnings and errors;
// everything with --v=1) and keeps no LOG file; and it turns off the
// shutdown flush, which would append to a failed WAL writer. After a failed
// write the database refuses writes (a background error) until Resume()
// succeeds, or RocksDB's own recovery once space is free; on a full disk
// DB::Open fails with IOError(NoSpace) (it writes a new MANIFEST), while
// DB::OpenForReadOnly works.
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace rocksdb {
struct Options;
class Status;
}  // namespace rocksdb

namespace hymcache {

// Options for a small database that must open and close on a full disk.
// `name` prefixes its log lines. `write_buffer_bytes` is the memtable size
// (and so roughly the largest WAL); nothing is preallocated.
rocksdb::Options SmallDbOptions(absl::string_view name,
                                size_t write_buffer_bytes);

// Releases space preallocated past the end of the WAL and MANIFEST files in
// database directory `dir` (ftruncate to their own size: contents are
// unchanged). RocksDB trims that space when it closes a file; a process that
// died first (or an older build with fallocate on) leaves it allocated, up
// to 70 MiB a WAL, which can keep a small filesystem full for good. Call it
// before opening the database. Best effort: returns the bytes released.
uint64_t ReleasePreallocatedSpace(const std::string& dir);

// Maps a RocksDB status to an absl::Status whose message is
// "<prefix>: <what>: <rocksdb message>". OK stays OK.
//   Corruption                     -> DataLoss
//   IOError(NoSpace), SpaceLimit   -> ResourceExhausted
//   other IOError, Busy, TimedOut, TryAgain -> Unavailable
//   InvalidArgument                -> InvalidArgument
//   anything else                  -> Internal
absl::Status FromRocksDb(const rocksdb::Status& s, absl::string_view prefix,
                         absl::string_view what);

}  // namespace hymcache
