#include "storage_node/device/flush_batch.h"

#include <catch2/catch.hpp>

#include <vector>

namespace hymcache::storage {
namespace {

constexpr uint64_t kKiB = 1024;

// A committed object whose extent is forgotten and that is not in flight:
// ready to be written.
FlushCandidate Ready(uint64_t addr, uint64_t len) {
  FlushCandidate c;
  c.addr = addr;
  c.len = len;
  c.forgotten = true;
  return c;
}

using Verdict = FlushBatchChooser::Verdict;
using Indices = std::vector<size_t>;

TEST_CASE("FlushBatch: an empty queue gives an empty batch") {
  CHECK(ChooseFlushBatch({}, 64 * kKiB, {}).empty());
  CHECK(ChooseFlushBatch({}, 64 * kKiB, {{0, 4 * kKiB}}).empty());
}

TEST_CASE("FlushBatch: one ready object is taken") {
  CHECK(ChooseFlushBatch({Ready(0, 4 * kKiB)}, 64 * kKiB, {}) == Indices{0});
}

TEST_CASE("FlushBatch: the first object is taken whatever its size") {
  // Larger than the batch limit: a batch of that one object, else it could
  // never be flushed.
  CHECK(ChooseFlushBatch({Ready(0, 1024 * kKiB), Ready(1024 * kKiB, 4 * kKiB)},
                         64 * kKiB, {}) == Indices{0});
}

TEST_CASE("FlushBatch: objects in commit order up to the byte limit") {
  std::vector<FlushCandidate> q;
  // Commit order is not address order: the batch keeps commit order.
  for (uint64_t a : {5, 1, 7, 3, 0}) q.push_back(Ready(a * 16 * kKiB, 16 * kKiB));
  // Exactly at the limit fits.
  CHECK(ChooseFlushBatch(q, 48 * kKiB, {}) == Indices{0, 1, 2});
  CHECK(ChooseFlushBatch(q, 47 * kKiB, {}) == Indices{0, 1});
  CHECK(ChooseFlushBatch(q, 1024 * kKiB, {}) == Indices{0, 1, 2, 3, 4});
}

TEST_CASE("FlushBatch: the first object that does not fit ends the batch") {
  // A later, smaller object does not jump ahead of the one that did not fit.
  const std::vector<FlushCandidate> q = {
      Ready(0, 32 * kKiB), Ready(64 * kKiB, 64 * kKiB),
      Ready(256 * kKiB, 4 * kKiB)};
  CHECK(ChooseFlushBatch(q, 64 * kKiB, {}) == Indices{0});
}

TEST_CASE("FlushBatch: objects in flight or not forgotten are skipped") {
  std::vector<FlushCandidate> q = {Ready(0, 4 * kKiB), Ready(8 * kKiB, 4 * kKiB),
                                   Ready(16 * kKiB, 4 * kKiB),
                                   Ready(24 * kKiB, 4 * kKiB)};
  q[0].in_flight = true;   // in an earlier batch
  q[2].forgotten = false;  // waits for its Forget
  CHECK(ChooseFlushBatch(q, 64 * kKiB, {}) == Indices{1, 3});
  // Skipped objects count nothing against the limit.
  q[0].len = q[2].len = 1024 * kKiB;
  CHECK(ChooseFlushBatch(q, 8 * kKiB, {}) == Indices{1, 3});
  // Nothing ready: an empty batch.
  for (FlushCandidate& c : q) c.in_flight = true;
  CHECK(ChooseFlushBatch(q, 64 * kKiB, {}).empty());
}

TEST_CASE("FlushBatch: an object overlapping a write in flight ends the batch") {
  const std::vector<FlushCandidate> q = {
      Ready(0, 8 * kKiB), Ready(16 * kKiB, 8 * kKiB), Ready(32 * kKiB, 8 * kKiB)};
  // [20K, 24K) being written overlaps the second object: the third waits
  // too (commit order).
  CHECK(ChooseFlushBatch(q, 1024 * kKiB, {{20 * kKiB, 4 * kKiB}}) ==
        Indices{0});
  // Overlapping the first: nothing.
  CHECK(ChooseFlushBatch(q, 1024 * kKiB, {{40 * kKiB, 4 * kKiB},
                                           {4 * kKiB, 1 * kKiB}})
            .empty());
  // Touching is not overlapping: [8K, 16K) and [24K, 32K) lie between.
  CHECK(ChooseFlushBatch(q, 1024 * kKiB,
                         {{8 * kKiB, 8 * kKiB}, {24 * kKiB, 8 * kKiB}}) ==
        Indices{0, 1, 2});
}

TEST_CASE("FlushBatch: an overlap with a skipped object does not stop") {
  // An object in flight is itself in the writing set; it is skipped, not
  // checked against it.
  std::vector<FlushCandidate> q = {Ready(0, 8 * kKiB), Ready(8 * kKiB, 8 * kKiB)};
  q[0].in_flight = true;
  CHECK(ChooseFlushBatch(q, 64 * kKiB, {{0, 8 * kKiB}}) == Indices{1});
}

TEST_CASE("FlushBatchChooser: verdicts, counts, and kStop is final") {
  FlushBatchChooser c(16 * kKiB, {{100 * kKiB, 4 * kKiB}});
  FlushCandidate waiting = Ready(0, 4 * kKiB);
  waiting.forgotten = false;
  CHECK(c.Offer(waiting) == Verdict::kSkip);
  CHECK(c.Offer(Ready(0, 8 * kKiB)) == Verdict::kTake);
  CHECK(c.Offer(Ready(8 * kKiB, 8 * kKiB)) == Verdict::kTake);
  CHECK(c.bytes() == 16 * kKiB);
  CHECK(c.taken() == 2);
  CHECK(c.Offer(Ready(16 * kKiB, 4 * kKiB)) == Verdict::kStop);
  // Even an object that would be skipped, or would fit, after the stop.
  CHECK(c.Offer(waiting) == Verdict::kStop);
  CHECK(c.Offer(Ready(200 * kKiB, 0)) == Verdict::kStop);
  CHECK(c.bytes() == 16 * kKiB);
  CHECK(c.taken() == 2);

  FlushBatchChooser overlap(1024 * kKiB, {{100 * kKiB, 4 * kKiB}});
  CHECK(overlap.Offer(Ready(96 * kKiB, 8 * kKiB)) == Verdict::kStop);
  CHECK(overlap.Offer(Ready(0, 4 * kKiB)) == Verdict::kStop);
  CHECK(overlap.taken() == 0);
}

bool SameRuns(const std::vector<FlushRun>& a, const std::vector<FlushRun>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].addr != b[i].addr || a[i].buf_off != b[i].buf_off ||
        a[i].len != b[i].len) {
      return false;
    }
  }
  return true;
}

TEST_CASE("FlushRuns: contiguous in the tier and the buffer merge") {
  CHECK(FlushRuns({}).empty());
  CHECK(SameRuns(FlushRuns({{0, 4096, 8192}}), {{0, 4096, 8192}}));
  // Three in a row merge into one write.
  CHECK(SameRuns(FlushRuns({{0, 0, 4096}, {4096, 4096, 8192},
                            {12288, 12288, 4096}}),
                 {{0, 0, 16384}}));
  // Contiguous in the tier only, or in the buffer only: separate writes.
  CHECK(SameRuns(FlushRuns({{0, 0, 4096}, {4096, 8192, 4096}}),
                 {{0, 0, 4096}, {4096, 8192, 4096}}));
  CHECK(SameRuns(FlushRuns({{0, 0, 4096}, {8192, 4096, 4096}}),
                 {{0, 0, 4096}, {8192, 4096, 4096}}));
  // Only consecutive objects merge, in batch order: descending addresses
  // stay apart, and a gap splits runs that then merge again.
  CHECK(SameRuns(FlushRuns({{4096, 4096, 4096}, {0, 0, 4096}}),
                 {{4096, 4096, 4096}, {0, 0, 4096}}));
  CHECK(SameRuns(FlushRuns({{0, 0, 4096}, {4096, 4096, 4096},
                            {65536, 65536, 4096}, {69632, 69632, 4096}}),
                 {{0, 0, 8192}, {65536, 65536, 8192}}));
}

}  // namespace
}  // namespace hymcache::storage
