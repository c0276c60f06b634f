// Index snapshot files: the master's MetadataIndex (MetadataIndex::Save's
// stream) together with the metadata store's sequence number it matches,
// so that a restart loads the index with large sequential reads and then
// replays only the store's changes after that sequence number
// (MetadataStore::ForEachObjectChangeSince) instead of scanning the store.
//
// File layout (little-endian): "HYMIDX01", u64 store sequence, u64 stream
// bytes, the stream, u64 checksum of everything before it. Written to
// `path`.tmp, then fsynced and renamed over `path`, so a reader sees a
// whole old or a whole new file; the checksum catches anything else.
//
// Thread safety: the functions are safe to call concurrently for different
// paths; for one path the caller serialises them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "master/metadata_index.h"

namespace hymcache {
namespace master {

// Writes `index` and `sequence` to `path`.tmp (in the page cache; not yet
// durable, not yet visible at `path`). Returns the bytes written. Errors:
// FailedPrecondition as MetadataIndex::Save; the file system's errors
// (Internal, ResourceExhausted for a full disk) naming the file.
absl::StatusOr<uint64_t> WriteIndexSnapshotTemp(const std::string& path,
                                                uint64_t sequence,
                                                const MetadataIndex& index);

// Makes `path`.tmp durable and moves it over `path` (fsync, rename, fsync of
// the directory). Errors: the file system's, naming the file.
absl::Status CommitIndexSnapshot(const std::string& path);

// Reads the snapshot at `path` into `index` and returns its store sequence.
// `alongside`, if given, runs on a second thread ("snapshot-check") while
// the index is restored, with the snapshot's entry stream
// (MetadataIndex::ForEachSnapshotLocation reads it), once the file's
// checksum matched; not at all otherwise. It returns before this does.
// REQUIRES: `index` is empty. Errors: NotFound if there is no file;
// DataLoss if it is not a whole snapshot (the index is left empty); other
// file system errors.
absl::StatusOr<uint64_t> ReadIndexSnapshot(
    const std::string& path, MetadataIndex* index,
    const std::function<void(absl::string_view stream)>& alongside = {});

// Deletes the snapshot at `path` (none is not an error).
absl::Status RemoveIndexSnapshot(const std::string& path);

// The checksum of the file format, exposed for tests.
uint64_t IndexSnapshotChecksum(absl::string_view data);

}  // namespace master
}  // namespace hymcache
