// FaultyBlockIo: a testonly BlockIo wrapper that fails chosen requests as a
// failing disk does, for tests of what the layers above do with I/O errors.
//
// Every request still goes to the inner BlockIo, so completions arrive on its
// completion thread, in its order and with its timing, as real errors do; a
// request chosen to fail then completes with the injected status instead of
// the inner result, and a failed read's buffer is scribbled over (after a
// failed read the buffer's bytes are unspecified: a caller that uses them
// anyway is caught by its test).
//
// Which requests fail, until ClearFaultsForTest():
//   * FailReadsForTest(offset, len): every read overlapping the file range;
//   * FailWritesForTest(offset, len): every write overlapping it;
//   * FailEveryNthReadForTest(n): reads number n, 2n, 3n, ... counted from
//     the call.
// The default status is what the real engines make of EIO: DataLoss.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "storage_node/device/block_io.h"

namespace hymcache::storage {

class FaultyBlockIo final : public BlockIo {
 public:
  // The status of an injected failure unless a test names another.
  static absl::Status InjectedEio() {
    return absl::DataLossError("faulty block io: injected Input/output error");
  }
  // The byte a failed read leaves in its buffer.
  static constexpr uint8_t kScribble = 0xEE;

  // Over `inner`, which must outlive this wrapper.
  explicit FaultyBlockIo(BlockIo* inner) : inner_(inner) {}
  // Over `inner`, owned.
  explicit FaultyBlockIo(std::unique_ptr<BlockIo> inner)
      : owned_(std::move(inner)), inner_(owned_.get()) {}

  void Read(uint64_t offset, void* buf, size_t len, Callback done) override {
    absl::Status fail = Choose(false, offset, len);
    if (fail.ok()) {
      inner_->Read(offset, buf, len, std::move(done));
      return;
    }
    inner_->Read(offset, buf, len,
                 [done = std::move(done), fail = std::move(fail), buf,
                  len](absl::Status s) {
                   // Only a buffer the inner read accepted is known to be
                   // writable.
                   if (s.ok()) std::memset(buf, kScribble, len);
                   done(fail);
                 });
  }
  void Write(uint64_t offset, const void* buf, size_t len,
             Callback done) override {
    absl::Status fail = Choose(true, offset, len);
    if (fail.ok()) {
      inner_->Write(offset, buf, len, std::move(done));
      return;
    }
    // A failed write reaches the disk or not: here it does not.
    Callback failed = [done = std::move(done), fail = std::move(fail)](
                          absl::Status) { done(fail); };
    // Completed through the inner engine (a read of the same range, into a
    // scratch buffer), so that the failure arrives on its thread.
    auto scratch = std::make_shared<AlignedBuffer>(AllocateAligned(len));
    inner_->Read(offset, scratch->get(), len,
                 [failed = std::move(failed), scratch](absl::Status) {
                   failed(absl::OkStatus());
                 });
  }
  absl::Status Sync() override { return inner_->Sync(); }
  uint64_t size() const override { return inner_->size(); }
  absl::string_view engine() const override { return inner_->engine(); }

  // ---- knobs
  void FailReadsForTest(uint64_t offset, uint64_t len,
                        absl::Status status = InjectedEio()) {
    MutexLock l(&mu_);
    ranges_.push_back(Range{false, offset, len, std::move(status)});
  }
  void FailWritesForTest(uint64_t offset, uint64_t len,
                         absl::Status status = InjectedEio()) {
    MutexLock l(&mu_);
    ranges_.push_back(Range{true, offset, len, std::move(status)});
  }
  // n >= 1; n == 1 fails every read.
  void FailEveryNthReadForTest(int n, absl::Status status = InjectedEio()) {
    MutexLock l(&mu_);
    every_nth_ = n;
    nth_counter_ = 0;
    nth_status_ = std::move(status);
  }
  void ClearFaultsForTest() {
    MutexLock l(&mu_);
    ranges_.clear();
    every_nth_ = 0;
  }

  // ---- observation
  uint64_t FailedReadsForTest() const {
    MutexLock l(&mu_);
    return failed_reads_;
  }
  uint64_t FailedWritesForTest() const {
    MutexLock l(&mu_);
    return failed_writes_;
  }

 private:
  struct Range {
    bool write;
    uint64_t offset;
    uint64_t len;
    absl::Status status;
  };

  // The status a new request is to fail with; OK: it goes through.
  absl::Status Choose(bool write, uint64_t offset, uint64_t len) {
    MutexLock l(&mu_);
    absl::Status fail;
    for (const Range& r : ranges_) {
      if (r.write == write && offset < r.offset + r.len &&
          r.offset < offset + len) {
        fail = r.status;
        break;
      }
    }
    if (!write && every_nth_ > 0 && ++nth_counter_ % every_nth_ == 0 &&
        fail.ok()) {
      fail = nth_status_;
    }
    if (!fail.ok()) ++(write ? failed_writes_ : failed_reads_);
    return fail;
  }

  const std::unique_ptr<BlockIo> owned_;
  BlockIo* const inner_;

  mutable Mutex mu_;
  std::vector<Range> ranges_ ABSL_GUARDED_BY(mu_);
  int every_nth_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t nth_counter_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status nth_status_ ABSL_GUARDED_BY(mu_);
  uint64_t failed_reads_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_writes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hymcache::storage
