#include "client/testing/fake_device_memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace hymcache {

class FakeDeviceMemory::Stream : public DeviceStream {
 public:
  explicit Stream(FakeDeviceMemory* owner) : owner_(owner) {}
  ~Stream() override {
    owner_->Sync(&queue_).IgnoreError();  // as CUDA: destruction waits
    owner_->StreamGone();
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t size) override {
    return owner_->Enqueue(&queue_, Copy{true, dst, src, size});
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t size) override {
    return owner_->Enqueue(&queue_, Copy{false, dst, src, size});
  }
  absl::Status Synchronize() override { return owner_->Sync(&queue_); }

 private:
  FakeDeviceMemory* const owner_;
  std::vector<Copy> queue_;  // one thread at a time (DeviceStream contract)
};

FakeDeviceMemory::~FakeDeviceMemory() {
  MutexLock l(&mu_);
  for (auto& [p, size] : pinned_) std::free(p);
}

void* FakeDeviceMemory::AllocateDeviceForTest(size_t size, int device) {
  MutexLock l(&mu_);
  const uint64_t addr = next_device_addr_;
  // Keep buffers apart so that an overrun never lands in the next one.
  next_device_addr_ += (size + 4096) & ~uint64_t{4095};
  device_[addr].assign(size, 0);
  (void)device;
  return reinterpret_cast<void*>(addr);
}

uint8_t* FakeDeviceMemory::Resolve(const void* p, size_t size) const {
  const uint64_t a = reinterpret_cast<uint64_t>(p);
  auto it = device_.upper_bound(a);
  if (it == device_.begin()) std::abort();  // not a device address
  --it;
  if (a + size > it->first + it->second.size()) std::abort();  // overrun
  return const_cast<uint8_t*>(it->second.data()) + (a - it->first);
}

std::vector<uint8_t> FakeDeviceMemory::ReadDeviceForTest(const void* p,
                                                         size_t size) const {
  MutexLock l(&mu_);
  const uint8_t* b = Resolve(p, size);
  return std::vector<uint8_t>(b, b + size);
}

void FakeDeviceMemory::WriteDeviceForTest(void* p, const void* src,
                                          size_t size) {
  MutexLock l(&mu_);
  std::memcpy(Resolve(p, size), src, size);
}

void FakeDeviceMemory::FailCopyEnqueue(size_t n, absl::Status s) {
  MutexLock l(&mu_);
  enqueue_failures_[enqueued_ + n] = std::move(s);
}

void FakeDeviceMemory::FailNextSync(absl::Status s) {
  MutexLock l(&mu_);
  sync_failure_ = std::move(s);
}

size_t FakeDeviceMemory::copies_to_device() const {
  MutexLock l(&mu_);
  return to_device_;
}
size_t FakeDeviceMemory::copies_to_host() const {
  MutexLock l(&mu_);
  return to_host_;
}
size_t FakeDeviceMemory::syncs() const {
  MutexLock l(&mu_);
  return syncs_;
}
size_t FakeDeviceMemory::streams_created() const {
  MutexLock l(&mu_);
  return streams_;
}
size_t FakeDeviceMemory::live_streams() const {
  MutexLock l(&mu_);
  return live_streams_;
}
size_t FakeDeviceMemory::live_pinned() const {
  MutexLock l(&mu_);
  return pinned_.size();
}
size_t FakeDeviceMemory::pinned_allocations() const {
  MutexLock l(&mu_);
  return pinned_allocations_;
}
size_t FakeDeviceMemory::max_unsynchronized() const {
  MutexLock l(&mu_);
  return max_unsynced_;
}

absl::StatusOr<void*> FakeDeviceMemory::AllocatePinned(size_t size) {
  void* p = std::malloc(size);
  if (p == nullptr) return absl::ResourceExhaustedError("fake pinned alloc");
  MutexLock l(&mu_);
  pinned_[p] = size;
  ++pinned_allocations_;
  return p;
}

void FakeDeviceMemory::FreePinned(void* p) {
  MutexLock l(&mu_);
  if (pinned_.erase(p) != 1) std::abort();  // not ours, or freed twice
  std::free(p);
}

absl::StatusOr<std::unique_ptr<DeviceStream>> FakeDeviceMemory::NewStream(
    int device) {
  if (device < 0) return absl::InvalidArgumentError("fake: no such device");
  MutexLock l(&mu_);
  ++streams_;
  ++live_streams_;
  return std::unique_ptr<DeviceStream>(new Stream(this));
}

void FakeDeviceMemory::StreamGone() {
  MutexLock l(&mu_);
  --live_streams_;
}

absl::Status FakeDeviceMemory::Enqueue(std::vector<Copy>* queue,
                                       const Copy& c) {
  MutexLock l(&mu_);
  const size_t n = enqueued_++;
  if (auto it = enqueue_failures_.find(n); it != enqueue_failures_.end()) {
    absl::Status s = std::move(it->second);
    enqueue_failures_.erase(it);
    return s;
  }
  // The device side must be a device address now (aborts otherwise).
  Resolve(c.to_device ? c.dst : c.src, c.size);
  queue->push_back(c);
  max_unsynced_ = std::max(max_unsynced_, ++unsynced_);
  return absl::OkStatus();
}

absl::Status FakeDeviceMemory::Sync(std::vector<Copy>* queue) {
  MutexLock l(&mu_);
  ++syncs_;
  unsynced_ -= queue->size();
  if (!sync_failure_.ok()) {
    absl::Status s = std::move(sync_failure_);
    sync_failure_ = absl::OkStatus();
    queue->clear();
    return s;
  }
  for (const Copy& c : *queue) {
    if (c.to_device) {
      std::memcpy(Resolve(c.dst, c.size), c.src, c.size);
      ++to_device_;
    } else {
      std::memcpy(c.dst, Resolve(c.src, c.size), c.size);
      ++to_host_;
    }
  }
  queue->clear();
  return absl::OkStatus();
}

}  // namespace hymcache
