#include "client/bounce_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace hymcache {

absl::StatusOr<std::unique_ptr<BouncePool>> BouncePool::Create(
    const DeviceOptions& options, DeviceMemory* device, Transport* transport) {
  if (options.bounce_chunk_bytes == 0 || options.bounce_chunks < 1) {
    return absl::InvalidArgumentError(
        "DeviceOptions.bounce_chunk_bytes and bounce_chunks must be positive");
  }
  const size_t bytes =
      options.bounce_chunk_bytes * static_cast<size_t>(options.bounce_chunks);
  ASSIGN_OR_RETURN(void* region, device->AllocatePinned(bytes));
  if (absl::Status s = transport->RegisterMemory(region, bytes); !s.ok()) {
    device->FreePinned(region);
    return absl::Status(s.code(), absl::StrCat("bounce pool: registering ",
                                               bytes, " bytes: ", s.message()));
  }
  return std::unique_ptr<BouncePool>(new BouncePool(
      options, device, transport, static_cast<uint8_t*>(region)));
}

BouncePool::BouncePool(const DeviceOptions& options, DeviceMemory* device,
                       Transport* transport, uint8_t* region)
    : chunk_bytes_(options.bounce_chunk_bytes),
      chunks_(options.bounce_chunks),
      device_(device),
      transport_(transport),
      region_(region) {
  MutexLock l(&mu_);
  for (int i = chunks_ - 1; i >= 0; --i) free_.push_back(i);
}

BouncePool::~BouncePool() {
  transport_->UnregisterMemory(region_).IgnoreError();  // nothing to do else
  device_->FreePinned(region_);
}

BouncePool::Chunk BouncePool::TakeLocked() {
  const int i = free_.back();
  free_.pop_back();
  return Chunk{region_ + static_cast<size_t>(i) * chunk_bytes_, chunk_bytes_,
               i};
}

BouncePool::Chunk BouncePool::TryAcquire() {
  MutexLock l(&mu_);
  if (free_.empty()) return Chunk{};
  return TakeLocked();
}

absl::StatusOr<BouncePool::Chunk> BouncePool::Acquire(absl::Duration timeout) {
  MutexLock l(&mu_);
  auto any_free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !free_.empty();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&any_free),
                             absl::Now() + timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "bounce pool: all ", chunks_, " chunks in use until the deadline"));
  }
  return TakeLocked();
}

void BouncePool::Release(const Chunk& chunk) {
  MutexLock l(&mu_);
  free_.push_back(chunk.index);
}

int BouncePool::free_chunks() const {
  MutexLock l(&mu_);
  return static_cast<int>(free_.size());
}

}  // namespace hymcache
