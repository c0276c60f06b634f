// Private to the hybrid device (in the srcs of //storage_node/device:
// hybrid_device, not its hdrs): the records HybridDevice keeps for
// buffered objects, staging misses, flush batches and queued I/O, shared by
// its implementation files (hybrid_device*.cc); staged objects are
// StagingWindow's (staging_window.h). Every field is guarded by
// HybridDevice::mu_ (the CondVars wait on it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "storage_node/device/block_io.h"
#include "storage_node/device/hybrid_device.h"

namespace hymcache::storage {
namespace internal {

constexpr uint64_t kPage = BlockIo::kAlignment;

inline uint64_t RoundUp(uint64_t v) { return (v + kPage - 1) / kPage * kPage; }
inline uint64_t RoundDown(uint64_t v) { return v / kPage * kPage; }

}  // namespace internal

// ---------------------------------------------------------------- internals

// An object in the write buffer.
struct HybridDevice::Entry {
  uint64_t id = 0;
  uint64_t addr = 0;
  uint64_t len = 0;
  uint64_t tag = 0;
  uint64_t buf_off = 0;
  uint64_t buf_len = 0;  // len rounded up to a page
  bool writing = true;       // between BeginWrite and Commit/Abort
  bool live = false;         // in live_: readable from the buffer
  bool queued = false;       // in flush_queue_: not yet on the tier
  bool in_flight = false;    // in a batch being written
  bool forgotten = false;    // CapacityTier::Forget done over its range
  bool superseded = false;   // a newer write covers it
  bool committing = false;   // CommitWrite is computing its CRC
  bool has_crc = false;      // crc computed (at CommitWrite)
  uint32_t crc = 0;          // CRC32C of the object's len bytes
  int pins = 0;              // reads and prefetch handles
  uint64_t seq = 0;
  absl::Time commit_time;
};

// A staging miss: the object read into a bounce buffer.
struct HybridDevice::MissRead {
  uint8_t* buf = nullptr;
  uint64_t span_start = 0;
  uint64_t span_len = 0;
  int outstanding = 0;  // chunks not completed
  absl::Status status;
  bool check = false;      // verify_reads and the object's checksum is known
  uint32_t crc = 0;
  bool abandoned = false;  // the reader gave up; the last chunk frees it
  CondVar cv;              // signalled when outstanding reaches 0
};

// A batch of the flush pipeline: in pipeline_ from its first write until
// its last completes.
struct HybridDevice::FlushBatch {
  std::vector<Entry*> entries;  // in commit order, in_flight
  int outstanding = 0;          // writes not completed
  absl::Status status;          // first write error
  absl::Time issued;            // for the flush latency histogram
};


struct HybridDevice::IoReq {
  enum class Kind { kRefill, kMiss, kFlush };
  Kind kind = Kind::kRefill;
  void* owner = nullptr;  // Staged*, MissRead* or FlushBatch*
  uint64_t file_off = 0;
  uint8_t* buf = nullptr;
  size_t len = 0;
  bool write() const { return kind == Kind::kFlush; }
};

}  // namespace hymcache::storage
