// The hybrid device's flush batch choice: which committed objects of the
// write buffer form the next flush batch, and how a batch is cut into tier
// writes. Pure functions of plain values (tier addresses, lengths, buffer
// offsets, flags), so that the rules are unit-tested without threads or
// I/O (flush_batch_test.cc); HybridDevice evaluates them under its lock,
// like FlushPolicy (when a batch starts) and IoPolicy (what is issued).
//
// The rules:
//   * Objects are offered in commit order. One already in a batch in
//     flight, or whose tier extent is not forgotten yet (it waits for its
//     Forget), is skipped: later objects may go first, as queued objects
//     never overlap (a commit supersedes every older queued object it
//     overlaps).
//   * A batch holds at most batch_bytes, except that its first object is
//     taken whatever its size; the first object that does not fit ends the
//     batch (a later, smaller one does not jump ahead).
//   * An object that overlaps a tier range being written (a batch in
//     flight) ends the batch: two writes of the same tier bytes may complete
//     in either order, so it waits until that write has landed, and later
//     objects wait too, so that objects are written in commit order.
//   * In a batch, consecutive objects contiguous both in the tier and in the
//     buffer are merged into one run (one write, cut into io_chunk_bytes
//     pieces by the device).
//
// Thread safety: FlushBatchChooser is a value owned by one caller;
// ChooseFlushBatch and FlushRuns are safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace hymcache::storage {

// A committed object waiting in the write buffer, as the choice sees it.
struct FlushCandidate {
  uint64_t addr = 0;       // tier address of its bytes
  uint64_t len = 0;        // its length in bytes
  bool in_flight = false;  // in a batch being written already
  bool forgotten = false;  // its old tier extent is forgotten: may be written
};

// A tier range being written by a batch in flight: [addr, addr + len).
struct FlushExtent {
  uint64_t addr = 0;
  uint64_t len = 0;
};

// Builds one batch from objects offered in commit order.
class FlushBatchChooser {
 public:
  enum class Verdict {
    kTake,  // the object joins the batch
    kSkip,  // not this object; offer the next one
    kStop,  // the batch is complete: offer no more
  };

  // `batch_bytes`: HybridDeviceOptions::flush_batch_bytes. `writing`: the
  // tier ranges of the batches in flight.
  FlushBatchChooser(uint64_t batch_bytes, std::vector<FlushExtent> writing)
      : batch_bytes_(batch_bytes), writing_(std::move(writing)) {}

  // The verdict on the next object in commit order. Once kStop, always
  // kStop.
  Verdict Offer(const FlushCandidate& c);

  // Bytes and objects taken so far.
  uint64_t bytes() const { return bytes_; }
  size_t taken() const { return taken_; }

 private:
  const uint64_t batch_bytes_;
  const std::vector<FlushExtent> writing_;
  uint64_t bytes_ = 0;
  size_t taken_ = 0;
  bool stopped_ = false;
};

// The next batch over a whole queue in commit order: the indices into
// `queue` of the objects taken, ascending.
std::vector<size_t> ChooseFlushBatch(const std::vector<FlushCandidate>& queue,
                                     uint64_t batch_bytes,
                                     std::vector<FlushExtent> writing);

// A batch object, or a run of them, to write: tier bytes
// [addr, addr + len) from the buffer at buf_off.
struct FlushRun {
  uint64_t addr = 0;
  uint64_t buf_off = 0;
  uint64_t len = 0;
};

// The writes of a batch: `objects` in batch order, consecutive ones
// contiguous both in the tier and in the buffer merged into one run.
std::vector<FlushRun> FlushRuns(const std::vector<FlushRun>& objects);

}  // namespace hymcache::storage
