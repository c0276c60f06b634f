// BouncePool: the client's pinned host memory that device-memory Loads and
// Stores pass through (ClientOptions::device).
//
// One region of chunks x chunk_bytes, allocated through DeviceMemory
// (cudaHostAlloc) and registered with the Transport once, so that RDMA reads
// land in it and writes leave from it without another copy. A call takes
// whole chunks; the pool bounds how many device groups are in flight over
// all calls, and a caller that finds none free waits (up to its timeout).
//
// Internal to the client library.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/device_memory.h"
#include "client/options.h"
#include "client/transport.h"
#include "common/mutex.h"

namespace hymcache {

class BouncePool {
 public:
  struct Chunk {
    uint8_t* data = nullptr;
    size_t size = 0;
    int index = -1;  // -1: no chunk
  };

  // Allocates and registers the region. `device` and `transport` (not owned)
  // outlive the pool. Errors: InvalidArgument (options), those of
  // DeviceMemory::AllocatePinned (FailedPrecondition: built without CUDA)
  // and Transport::RegisterMemory.
  static absl::StatusOr<std::unique_ptr<BouncePool>> Create(
      const DeviceOptions& options, DeviceMemory* device,
      Transport* transport);
  // Unregisters and frees the region. REQUIRES: no chunk is held.
  ~BouncePool();

  // A free chunk, or Chunk{} (index -1) if none is free now.
  Chunk TryAcquire();
  // A free chunk, waiting up to `timeout` (real time) for one. Errors:
  // DeadlineExceeded (none came free in time).
  absl::StatusOr<Chunk> Acquire(absl::Duration timeout);
  // REQUIRES: `chunk` came from this pool and no copy uses it.
  void Release(const Chunk& chunk);

  size_t chunk_bytes() const { return chunk_bytes_; }
  int chunks() const { return chunks_; }
  int free_chunks() const;

 private:
  BouncePool(const DeviceOptions& options, DeviceMemory* device,
             Transport* transport, uint8_t* region);
  Chunk TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const size_t chunk_bytes_;
  const int chunks_;
  DeviceMemory* const device_;
  Transport* const transport_;
  uint8_t* const region_;

  // Protected by mu_.
  mutable Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hymcache
