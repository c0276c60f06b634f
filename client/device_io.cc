// Device-memory Loads and Stores of ClientImpl (MemoryKind::kCudaDevice).
//
// The bytes never move between a node and device memory directly: they pass
// through the pinned bounce pool (bounce_pool.h), which the transport has
// registered, and the DeviceMemory seam copies them between a chunk and the
// caller's device buffers on a stream.
//
// Load takes the keys in groups that fit one chunk. Each group is a host
// Load into a chunk; its loaded prefix is queued for the device on one of
// two streams, and the next group's reads run while that copy does: the
// previous group is synchronized only after the next one has been read. A
// group that did not load completely, or whose copy failed, ends the call:
// blocks count as loaded only once their copy is synchronized, so a failed
// copy leaves a shorter prefix for the engine to recompute. Every stream is
// synchronized before Load returns (nothing writes into the caller's
// buffers afterwards). When no chunk is free, the call first completes its
// own group in flight, so it never waits while holding a chunk (no deadlock
// between loads, and a pool of one chunk works, unpipelined).
//
// Each group is its own lookup (and prefetch session): the chain's prefix
// semantics hold because a group is read only when every earlier group was
// loaded whole; the cost is that nodes see the next group's hints one group
// later than a single host Load would give them.
//
// Store copies one group at a time device->host into a chunk, synchronizes,
// then writes it as a host Store whose parent_key is the previous group's
// last key (one chain across groups). A failed copy or write fails its keys
// and, as the chain cannot continue past a missing block, the rest.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "common/status_macros.h"

namespace hymcache {
namespace {

// The keys from `first` whose buffers fit one chunk together: [first, end).
// REQUIRES: buffers[first].size <= chunk_bytes.
template <typename Buffer>
size_t GroupEnd(absl::Span<const Buffer> buffers, size_t first,
                size_t chunk_bytes) {
  size_t end = first;
  size_t bytes = 0;
  while (end < buffers.size() && buffers[end].data != nullptr &&
         bytes + buffers[end].size <= chunk_bytes) {
    bytes += buffers[end].size;
    ++end;
  }
  return end;
}

absl::Status Annotate(const absl::Status& s, absl::string_view what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

}  // namespace

absl::StatusOr<BouncePool*> ClientImpl::Pool() {
  MutexLock l(&device_mu_);
  if (pool_ == nullptr) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<BouncePool> pool,
        BouncePool::Create(options_.device, device_.get(), transport_.get()));
    pool_ = std::move(pool);
  }
  return pool_.get();
}

absl::StatusOr<LoadResult> ClientImpl::LoadToDevice(
    absl::Span<const std::string> keys,
    absl::Span<const MutableBuffer> buffers, const LoadOptions& options) {
  const absl::Time deadline = Deadline(options.deadline);
  ASSIGN_OR_RETURN(BouncePool * pool, Pool());
  std::unique_ptr<DeviceStream> streams[2];
  for (auto& s : streams) {
    ASSIGN_OR_RETURN(s, device_->NewStream(options.memory.device));
  }
  const size_t chunk_bytes = pool->chunk_bytes();

  // A group read into a chunk whose copy to the device is queued.
  struct Group {
    bool active = false;
    BouncePool::Chunk chunk;
    size_t first = 0;
    size_t copies = 0;  // leading blocks whose copy is queued
    std::vector<uint64_t> lengths;
    DeviceStream* stream = nullptr;
  };
  LoadResult out;
  absl::Status stop;
  // Waits for `g`'s copies and frees its chunk; its blocks then count as
  // loaded (they extend the prefix: see the file comment).
  auto finish = [&](Group& g) -> absl::Status {
    absl::Status s = g.stream->Synchronize();
    pool->Release(g.chunk);
    g.active = false;
    if (!s.ok()) return Annotate(s, "Load: copy to device");
    for (size_t i = 0; i < g.copies; ++i) {
      out.lengths.push_back(g.lengths[i]);
      out.bytes += g.lengths[i];
    }
    out.loaded = g.first + g.copies;
    return absl::OkStatus();
  };

  Group pending;
  int turn = 0;
  size_t next = 0;
  LoadOptions host = options;
  host.memory = MemorySpace{};
  host.deadline = deadline;
  while (next < keys.size()) {
    if (buffers[next].data == nullptr || buffers[next].size > chunk_bytes) {
      stop = absl::OutOfRangeError(absl::StrCat(
          "Load: device buffer ", next, " (", buffers[next].size,
          " bytes) is null or larger than a bounce chunk (", chunk_bytes,
          " bytes: ClientOptions::device.bounce_chunk_bytes)"));
      break;
    }
    const size_t end = GroupEnd(buffers, next, chunk_bytes);
    BouncePool::Chunk chunk = pool->TryAcquire();
    if (chunk.index < 0) {
      // Never wait while holding a chunk.
      if (pending.active) {
        if (absl::Status s = finish(pending); !s.ok()) {
          stop = s;
          break;
        }
      }
      absl::StatusOr<BouncePool::Chunk> c =
          pool->Acquire(std::max(deadline - clock_->Now(), absl::ZeroDuration()));
      if (!c.ok()) {
        stop = c.status();
        break;
      }
      chunk = *c;
    }
    std::vector<MutableBuffer> bounce;
    size_t offset = 0;
    for (size_t i = next; i < end; ++i) {
      bounce.push_back({chunk.data + offset, buffers[i].size});
      offset += buffers[i].size;
    }
    absl::StatusOr<LoadResult> r =
        Load(keys.subspan(next, end - next), bounce, host);
    if (!r.ok()) {
      pool->Release(chunk);
      if (next == 0) return r.status();  // nothing loaded: a whole-call error
      stop = r.status();
      break;
    }
    out.hit_prefix += r->hit_prefix;
    Group cur;
    cur.active = true;
    cur.chunk = chunk;
    cur.first = next;
    cur.lengths = std::move(r->lengths);
    cur.stream = streams[turn].get();
    turn ^= 1;
    absl::Status queued;
    for (size_t i = 0; i < r->loaded; ++i) {
      queued = cur.stream->CopyToDevice(buffers[next + i].data, bounce[i].data,
                                        cur.lengths[i]);
      if (!queued.ok()) {
        queued = Annotate(queued, "Load: copy to device");
        break;
      }
      ++cur.copies;
    }
    // The previous group's copy ran while this group was read.
    if (pending.active) {
      if (absl::Status s = finish(pending); !s.ok()) {
        stop = s;
        cur.stream->Synchronize().IgnoreError();  // its blocks do not count
        pool->Release(cur.chunk);
        break;
      }
    }
    pending = std::move(cur);
    if (!queued.ok()) {
      stop = queued;
      break;
    }
    if (r->loaded < end - next) {
      stop = r->stop_reason;
      break;
    }
    next = end;
  }
  if (pending.active) {
    if (absl::Status s = finish(pending); !s.ok()) stop = s;
  }
  out.hit_prefix = std::max(out.hit_prefix, out.loaded);
  out.stop_reason = stop;
  return out;
}

absl::StatusOr<PutResult> ClientImpl::StoreFromDevice(
    absl::Span<const std::string> keys, absl::Span<const ConstBuffer> buffers,
    const MemorySpace& memory, const std::string& parent_key,
    absl::Time deadline, uint32_t replicas) {
  ASSIGN_OR_RETURN(BouncePool * pool, Pool());
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceStream> stream,
                   device_->NewStream(memory.device));
  const size_t chunk_bytes = pool->chunk_bytes();
  PutResult out;
  // Keys [from, end of call) are not stored, for `why`.
  auto fail_rest = [&](size_t from, const absl::Status& why) {
    for (size_t i = from; i < keys.size(); ++i) {
      out.outcomes.push_back(PutOutcome::kFailed);
      out.errors.push_back(why);
      ++out.failed;
    }
  };
  std::string parent = parent_key;
  size_t next = 0;
  while (next < keys.size()) {
    if (buffers[next].size > chunk_bytes) {
      fail_rest(next, absl::OutOfRangeError(absl::StrCat(
                          "Store: device buffer ", next, " (",
                          buffers[next].size,
                          " bytes) is larger than a bounce chunk (",
                          chunk_bytes, " bytes)")));
      break;
    }
    const size_t end = GroupEnd(buffers, next, chunk_bytes);
    absl::StatusOr<BouncePool::Chunk> chunk =
        pool->Acquire(std::max(deadline - clock_->Now(), absl::ZeroDuration()));
    if (!chunk.ok()) {
      fail_rest(next, chunk.status());
      break;
    }
    std::vector<ConstBuffer> bounce;
    absl::Status copied;
    size_t offset = 0;
    for (size_t i = next; i < end && copied.ok(); ++i) {
      copied = stream->CopyToHost(chunk->data + offset, buffers[i].data,
                                  buffers[i].size);
      bounce.push_back({chunk->data + offset, buffers[i].size});
      offset += buffers[i].size;
    }
    // Even after a failed enqueue: the copies queued before it must end
    // before the chunk is freed.
    absl::Status synced = stream->Synchronize();
    if (copied.ok()) copied = synced;
    if (!copied.ok()) {
      pool->Release(*chunk);
      fail_rest(next, Annotate(copied, "Store: copy from device"));
      break;
    }
    absl::StatusOr<PutResult> r =
        StoreNow(keys.subspan(next, end - next), bounce, parent, deadline,
                 /*relocate_from_node=*/0, replicas);
    pool->Release(*chunk);
    if (!r.ok()) {
      if (next == 0) return r.status();
      fail_rest(next, r.status());
      break;
    }
    out.outcomes.insert(out.outcomes.end(), r->outcomes.begin(),
                        r->outcomes.end());
    out.errors.insert(out.errors.end(), r->errors.begin(), r->errors.end());
    out.stored += r->stored;
    out.skipped += r->skipped;
    out.failed += r->failed;
    out.refused += r->refused;
    out.replicated += r->replicated;
    if (r->node_id != 0) out.node_id = r->node_id;
    if (r->failed > 0) {
      fail_rest(end, absl::AbortedError(
                         "Store: not written: an earlier block of the chain "
                         "was not stored"));
      break;
    }
    parent = keys[end - 1];
    next = end;
  }
  return out;
}

}  // namespace hymcache
