#include "storage_node/device/flush_batch.h"

#include <utility>

namespace hymcache::storage {

FlushBatchChooser::Verdict FlushBatchChooser::Offer(const FlushCandidate& c) {
  if (stopped_) return Verdict::kStop;
  if (c.in_flight || !c.forgotten) return Verdict::kSkip;
  if (taken_ > 0 && bytes_ + c.len > batch_bytes_) {
    stopped_ = true;
    return Verdict::kStop;
  }
  for (const FlushExtent& w : writing_) {
    if (w.addr < c.addr + c.len && c.addr < w.addr + w.len) {
      stopped_ = true;
      return Verdict::kStop;
    }
  }
  bytes_ += c.len;
  ++taken_;
  return Verdict::kTake;
}

std::vector<size_t> ChooseFlushBatch(const std::vector<FlushCandidate>& queue,
                                     uint64_t batch_bytes,
                                     std::vector<FlushExtent> writing) {
  FlushBatchChooser chooser(batch_bytes, std::move(writing));
  std::vector<size_t> batch;
  for (size_t i = 0; i < queue.size(); ++i) {
    const FlushBatchChooser::Verdict v = chooser.Offer(queue[i]);
    if (v == FlushBatchChooser::Verdict::kStop) break;
    if (v == FlushBatchChooser::Verdict::kTake) batch.push_back(i);
  }
  return batch;
}

std::vector<FlushRun> FlushRuns(const std::vector<FlushRun>& objects) {
  std::vector<FlushRun> runs;
  for (const FlushRun& o : objects) {
    if (!runs.empty() && runs.back().addr + runs.back().len == o.addr &&
        runs.back().buf_off + runs.back().len == o.buf_off) {
      runs.back().len += o.len;
    } else {
      runs.push_back(o);
    }
  }
  return runs;
}

}  // namespace hymcache::storage
