// The write path of ClientImpl: Store (Client::Put is Store and wait):
// PutStart, writes to the node, PutCommit.
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "common/status_macros.h"
#include "common/status_reason.h"

namespace hymcache {
namespace {

// Completion of one asynchronous Store.
class StoreHandleImpl : public StoreHandle {
 public:
  bool Done() const override {
    MutexLock l(&mu_);
    return result_.has_value();
  }

  absl::StatusOr<PutResult> Wait(absl::Time deadline) override {
    MutexLock l(&mu_);
    while (!result_.has_value()) {
      if (cv_.WaitWithDeadline(&mu_, deadline) && !result_.has_value()) {
        return absl::DeadlineExceededError("Store: still running");
      }
    }
    return *result_;
  }

  void Complete(absl::StatusOr<PutResult> r) {
    MutexLock l(&mu_);
    result_ = std::move(r);
    cv_.SignalAll();
  }

 private:
  mutable Mutex mu_;
  CondVar cv_;
  std::optional<absl::StatusOr<PutResult>> result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<StoreHandle> ClientImpl::Store(
    absl::Span<const std::string> keys, absl::Span<const ConstBuffer> buffers,
    const StoreOptions& options) {
  auto handle = std::make_shared<StoreHandleImpl>();
  absl::Status bad = CheckPut(keys, buffers);
  if (bad.ok() && options.relocate_from_node != 0 &&
      options.memory.kind != MemoryKind::kHost) {
    bad = absl::InvalidArgumentError(
        "Store: relocate_from_node takes host buffers only");
  }
  if (bad.ok() && (options.replicas < 1 || options.replicas > 2 ||
                   (options.replicas > 1 && options.relocate_from_node != 0))) {
    bad = absl::InvalidArgumentError(
        absl::StrCat("Store: replicas is ", options.replicas,
                     " (want 1 or 2, and 1 with relocate_from_node)"));
  }
  if (!bad.ok()) {
    handle->Complete(bad);
    return handle;
  }
  const absl::Time deadline =
      Deadline(options.deadline, options_.default_store_deadline);
  auto task = [this, handle,
               keys = std::vector<std::string>(keys.begin(), keys.end()),
               bufs = std::vector<ConstBuffer>(buffers.begin(), buffers.end()),
               parent = options.parent_key, memory = options.memory,
               relocate = options.relocate_from_node,
               replicas = options.replicas, deadline]() {
    handle->Complete(
        memory.kind == MemoryKind::kHost
            ? StoreNow(keys, bufs, parent, deadline, relocate, replicas)
            : StoreFromDevice(keys, bufs, memory, parent, deadline, replicas));
  };
  if (!store_executor_->TrySubmit(std::move(task))) {
    handle->Complete(WithReason(
        absl::ResourceExhaustedError(
            absl::StrCat("Store: ", options_.max_pending_stores,
                         " stores already pending; skipped")),
        StatusReason::kStoreQueueFull));
  }
  return handle;
}

absl::StatusOr<PutResult> ClientImpl::Put(absl::Span<const std::string> keys,
                                          absl::Span<const ConstBuffer> buffers,
                                          const CallOptions& call) {
  RETURN_IF_ERROR(CheckPut(keys, buffers));
  return StoreNow(keys, buffers, /*parent_key=*/"", Deadline(call.deadline),
                  /*relocate_from_node=*/0, /*replicas=*/1);
}

absl::StatusOr<PutResult> ClientImpl::StoreNow(
    absl::Span<const std::string> keys, absl::Span<const ConstBuffer> buffers,
    const std::string& parent_key, absl::Time deadline,
    uint32_t relocate_from_node, uint32_t replicas) {
  absl::StatusOr<PutResult> r =
      PutAll(keys, buffers, parent_key, deadline, relocate_from_node, replicas);
  if (!r.ok() && r.status().code() == absl::StatusCode::kResourceExhausted) {
    // No node had room: every key is refused (skipped), not an error.
    PutResult refused;
    refused.outcomes.assign(keys.size(), PutOutcome::kFailed);
    refused.errors.assign(keys.size(),
                          ReasonOf(r.status()) == StatusReason::kNone
                              ? WithReason(r.status(), StatusReason::kNoRoom)
                              : r.status());
    refused.failed = refused.refused = keys.size();
    r = std::move(refused);
  }
  return r;
}

absl::Status ClientImpl::CheckPut(absl::Span<const std::string> keys,
                                  absl::Span<const ConstBuffer> buffers) {
  RETURN_IF_ERROR(CheckKeys(keys));
  if (keys.size() != buffers.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Put: ", keys.size(), " keys but ", buffers.size(), " buffers"));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].size == 0 || buffers[i].data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Put: buffer ", i, " is empty"));
    }
  }
  return absl::OkStatus();
}

// Put of checked arguments, in chunks of max_keys_per_rpc; the first chunk
// is placed with `parent_key`'s node, later ones on the first's. Each chunk
// names the block before it as its parent, so the master knows the whole
// call as one chain.
absl::StatusOr<PutResult> ClientImpl::PutAll(
    absl::Span<const std::string> keys, absl::Span<const ConstBuffer> buffers,
    const std::string& parent_key, absl::Time deadline,
    uint32_t relocate_from_node, uint32_t replicas) {
  PutResult out;
  out.outcomes.assign(keys.size(), PutOutcome::kFailed);
  out.errors.assign(keys.size(), absl::OkStatus());
  PutProgress progress;
  progress.generations.assign(keys.size(), 0);
  progress.nodes.assign(keys.size(), 0);
  size_t failed_at = 0;
  absl::Status st =
      PutChunks(keys, buffers, parent_key, deadline, relocate_from_node,
                /*replica=*/false, &progress, &out, &failed_at);
  if (!st.ok()) {
    if (failed_at == 0) return st;  // nothing happened yet: the call failed
    for (size_t i = failed_at; i < keys.size(); ++i) out.errors[i] = st;
  }
  out.node_id = progress.node;
  // The caller's replicas, or its tenant's (the master says): copies of
  // the leading keys this store stored or found stored, whose listed
  // generations it knows (a key that failed, or that another writer was
  // storing, ends them).
  if (std::max(replicas, progress.replicas) > 1) {
    size_t copyable = 0;
    while (copyable < keys.size() &&
           (out.outcomes[copyable] == PutOutcome::kStored ||
            out.outcomes[copyable] == PutOutcome::kAlreadyStored)) {
      ++copyable;
    }
    progress.generations.resize(copyable);
    progress.nodes.resize(copyable);
    if (copyable > 0) {
      out.replicated =
          PutCopies(keys.first(copyable), buffers.first(copyable), parent_key,
                    std::move(progress.generations), progress.nodes, deadline);
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    switch (out.outcomes[i]) {
      case PutOutcome::kStored:
        ++out.stored;
        break;
      case PutOutcome::kAlreadyStored:
      case PutOutcome::kInProgress:
        ++out.skipped;
        break;
      case PutOutcome::kFailed:
        ++out.failed;
        if (out.errors[i].ok()) out.errors[i] = absl::UnknownError("not stored");
        if (out.errors[i].code() == absl::StatusCode::kResourceExhausted) {
          ++out.refused;
        }
        break;
    }
  }
  return out;
}

// The copies of a Store with replicas 2 (and a Load's automatic ones): the
// same chunks again, each a PutStart with `replica` (the master places them
// on another node than the blocks', after the copy of the block before)
// and the generations the bytes belong to, a run of keys listed on one node
// at a time; best effort. Returns how many were stored.
size_t ClientImpl::PutCopies(absl::Span<const std::string> keys,
                             absl::Span<const ConstBuffer> buffers,
                             const std::string& parent_key,
                             std::vector<uint64_t> generations,
                             absl::Span<const uint32_t> nodes,
                             absl::Time deadline) {
  size_t stored = 0;
  for (size_t begin = 0; begin < keys.size();) {
    size_t end = begin + 1;
    if (nodes.size() == keys.size()) {
      while (end < keys.size() && nodes[end] == nodes[begin]) ++end;
    } else {
      end = keys.size();
    }
    const size_t n = end - begin;
    PutResult copies;
    copies.outcomes.assign(n, PutOutcome::kFailed);
    copies.errors.assign(n, absl::OkStatus());
    PutProgress progress;
    if (generations.size() == keys.size()) {
      progress.generations.assign(generations.begin() + begin,
                                  generations.begin() + end);
    }
    size_t failed_at = 0;
    PutChunks(keys.subspan(begin, n), buffers.subspan(begin, n),
              begin == 0 ? parent_key : keys[begin - 1], deadline,
              /*relocate_from_node=*/0, /*replica=*/true, &progress, &copies,
              &failed_at)
        .IgnoreError();  // best effort: what was stored counts
    stored += static_cast<size_t>(std::count(
        copies.outcomes.begin(), copies.outcomes.end(), PutOutcome::kStored));
    begin = end;
  }
  return stored;
}

absl::Status ClientImpl::PutChunks(absl::Span<const std::string> keys,
                                   absl::Span<const ConstBuffer> buffers,
                                   const std::string& parent_key,
                                   absl::Time deadline,
                                   uint32_t relocate_from_node, bool replica,
                                   PutProgress* progress, PutResult* out,
                                   size_t* failed_at) {
  for (size_t begin = 0; begin < keys.size();
       begin += options_.max_keys_per_rpc) {
    size_t n = std::min<size_t>(keys.size() - begin, options_.max_keys_per_rpc);
    absl::Status st =
        PutChunk(keys.subspan(begin, n), buffers.subspan(begin, n), begin,
                 begin == 0 ? parent_key : keys[begin - 1], deadline,
                 relocate_from_node, replica, progress, out);
    if (!st.ok()) {
      *failed_at = begin;
      return st;
    }
  }
  return absl::OkStatus();
}

// One PutStart / writes / PutCommit round for keys [offset, offset+n).
absl::Status ClientImpl::PutChunk(absl::Span<const std::string> keys,
                                  absl::Span<const ConstBuffer> buffers,
                                  size_t offset, const std::string& parent_key,
                                  absl::Time deadline,
                                  uint32_t relocate_from_node, bool replica,
                                  PutProgress* progress, PutResult* out) {
  PutStartArgs args;
  args.keys.assign(keys.begin(), keys.end());
  args.lengths.reserve(buffers.size());
  for (const ConstBuffer& b : buffers) args.lengths.push_back(b.size);
  args.preferred_node_id = progress->node;
  args.parent_key = parent_key;
  args.relocate_from_node = relocate_from_node;
  args.replica = replica;
  const bool generations = progress->generations.size() >= offset + keys.size();
  if (replica && generations) {
    args.copied_generations.assign(
        progress->generations.begin() + offset,
        progress->generations.begin() + offset + keys.size());
  }
  ASSIGN_OR_RETURN(PutStartReply start, master_->PutStart(args, deadline));
  if (start.slots.size() != keys.size()) {
    master_->PutAbortInBackground(start.put_id);
    return absl::InternalError("PutStart: master returned a short answer");
  }
  if (!replica && generations) {
    for (size_t i = 0; i < keys.size(); ++i) {
      progress->generations[offset + i] = start.slots[i].location.generation;
    }
  }
  if (!replica && progress->nodes.size() >= offset + keys.size()) {
    for (size_t i = 0; i < keys.size(); ++i) {
      progress->nodes[offset + i] = start.slots[i].location.node_id;
    }
  }
  std::vector<WriteOp> ops;
  std::vector<uint32_t> op_index;  // op -> key index in this chunk
  // The nodes' write receipts, by key index, for PutCommit.
  std::vector<wire::Receipt> receipts(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const PutSlot& slot = start.slots[i];
    switch (slot.state) {
      case PutSlotState::kExists:
        out->outcomes[offset + i] = PutOutcome::kAlreadyStored;
        break;
      case PutSlotState::kInProgress:
        out->outcomes[offset + i] = PutOutcome::kInProgress;
        break;
      case PutSlotState::kAllocated:
        if (slot.location.length != buffers[i].size) {
          master_->PutAbortInBackground(start.put_id);
          return absl::InternalError("PutStart: allocation of the wrong size");
        }
        ops.push_back(
            WriteOp{ToRemoteRef(slot.location), buffers[i].data, &receipts[i]});
        op_index.push_back(static_cast<uint32_t>(i));
        break;
    }
  }
  progress->replicas = std::max(progress->replicas, start.replicas);
  if (ops.empty()) return absl::OkStatus();
  Remember(start.node);
  progress->node = start.node.node_id;

  if (unresponsive_.Skip(start.node.node_id)) {
    // Opportunistic: not stored, rather than waiting for the deadline.
    master_->PutAbortInBackground(start.put_id);
    for (uint32_t i : op_index) {
      out->errors[offset + i] = absl::UnavailableError(
          absl::StrCat("storage node ", start.node.node_id,
                       " did not answer a recent call: not stored"));
    }
    return absl::OkStatus();
  }
  const absl::Time write_start = clock_->Now();
  std::vector<absl::Status> st = transport_->Write(start.node, ops, deadline);
  unresponsive_.Observe(start.node.node_id, write_start, st.front());
  std::vector<uint32_t> failed;
  size_t good = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    if (st[k].ok()) {
      ++good;
    } else {
      failed.push_back(op_index[k]);
      // A node answers a write it has no room for (its write buffer or
      // device is full) ResourceExhausted; the wire carries the code only.
      out->errors[offset + op_index[k]] =
          st[k].code() == absl::StatusCode::kResourceExhausted &&
                  ReasonOf(st[k]) == StatusReason::kNone
              ? WithReason(st[k], StatusReason::kNodeRefusedWrite)
              : st[k];
    }
  }
  if (clock_->Now() >= deadline) {
    // No time left to commit: free the space in the background and report
    // the written blocks as not stored.
    master_->PutAbortInBackground(start.put_id);
    for (size_t k = 0; k < ops.size(); ++k) {
      if (st[k].ok()) {
        out->errors[offset + op_index[k]] =
            absl::DeadlineExceededError("Put: deadline passed before commit");
      }
    }
    return absl::OkStatus();
  }
  if (good == 0) {
    master_->PutAbortInBackground(start.put_id);
    return absl::OkStatus();
  }
  absl::Status cs =
      master_->PutCommit(start.put_id, failed, receipts, deadline);
  if (!cs.ok()) {
    // Refused, or the answer was lost (deadline, connection): end the put
    // now rather than at its expiry, which until then refuses its keys to
    // every writer (a no-op if the commit did apply).
    master_->PutAbortInBackground(start.put_id);
  }
  for (size_t k = 0; k < ops.size(); ++k) {
    if (!st[k].ok()) continue;
    if (cs.ok()) {
      out->outcomes[offset + op_index[k]] = PutOutcome::kStored;
    } else {
      out->errors[offset + op_index[k]] = cs;
    }
  }
  return absl::OkStatus();
}

}  // namespace hymcache
