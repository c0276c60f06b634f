// The read path of ClientImpl: Load (Client::Get is Load without hints).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "common/status_macros.h"

namespace hymcache {

absl::StatusOr<LoadResult> ClientImpl::Load(
    absl::Span<const std::string> keys,
    absl::Span<const MutableBuffer> buffers, const LoadOptions& options) {
  RETURN_IF_ERROR(CheckKeys(keys));
  if (keys.size() != buffers.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Load: ", keys.size(), " keys but ", buffers.size(), " buffers"));
  }
  if (options.memory.kind != MemoryKind::kHost) {
    return LoadToDevice(keys, buffers, options);
  }
  const absl::Time deadline = Deadline(options.deadline);
  // Every key found a moment ago: read without looking up, when the load
  // would send no hint anyway (no prefetch, or all of it one read).
  {
    std::vector<ObjectLocation> cached;
    LoadResult out;
    if (locations_.FindAll(keys, &cached) &&
        (!options.prefetch ||
         ReadRunEnd(cached, buffers, 0, keys.size()) == keys.size()) &&
        LoadCached(keys, buffers, cached, deadline, &out)) {
      return out;
    }
  }
  uint64_t session = 0;  // drawn at the first hint
  // With hints, a small first lookup lets the nodes start staging and the
  // reads start early; without, fewer and larger lookups are faster
  // (get_bench, 256 blocks of 64 KiB over shm: +17%), as Get always did.
  std::unique_ptr<LookupStream> lookups = master_->StartLookups(
      keys,
      options.prefetch ? options_.lookup_batch_keys : options_.max_keys_per_rpc,
      deadline);

  LoadResult out;
  std::vector<ObjectLocation> locs(keys.size());
  size_t found = 0;     // leading keys known to be stored
  size_t hinted = 0;    // of those, announced to their nodes
  bool closed = false;  // the hit prefix ends at `found`
  absl::Status stop;
  std::vector<uint32_t> session_nodes;  // nodes holding hinted objects
  bool plain_tail = false;  // blocks [hinted, found) are read unhinted
  size_t copy_end = 0;      // the master asks for copies of [0, copy_end)

  while (true) {
    // Take lookup answers in order: wait only when there is nothing to read
    // meanwhile.
    while (!closed && lookups->has_next()) {
      const bool block = out.loaded == found;
      absl::StatusOr<const LookupBatch*> r = lookups->Next(block);
      if (r.ok() && *r == nullptr) break;  // not arrived yet
      if (!r.ok()) {
        if (found == 0 && out.loaded == 0) return r.status();
        stop = r.status();
        closed = true;
        break;
      }
      const LookupBatch& batch = **r;
      for (const PeerInfo& n : batch.nodes) Remember(n);
      const size_t first = found;
      if (batch.copy_prefix > 0) copy_end = first + batch.copy_prefix;
      for (size_t k = 0; k < batch.found.size(); ++k) {
        if (!batch.found[k]) {
          closed = true;
          break;
        }
        locs[found++] = batch.locations[k];
      }
      locations_.Insert(keys.subspan(first, found - first),
                        absl::MakeConstSpan(locs).subspan(first));
      if (closed) lookups->CancelRest();
    }
    if (!lookups->has_next()) closed = true;

    // Announce the new hits to their nodes, in read order. Not when the
    // next read is all there is left to do (every lookup answered, nothing
    // hinted still unread, the rest fits one read of one node): the node
    // could stage nothing ahead of that read, and the hint would only add
    // a round trip before it (a one-block load's three become two).
    if (options.prefetch && hinted < found && !plain_tail) {
      if (closed && hinted == out.loaded &&
          ReadRunEnd(locs, buffers, out.loaded, found) == found) {
        plain_tail = true;
      } else {
        if (session == 0) session = NewSessionId();
        Hint(session, locs, hinted, found, deadline, &session_nodes);
        hinted = found;
      }
    }

    if (out.loaded == found) {
      if (closed) break;
      continue;  // wait for the next lookup answer
    }
    // Read the next run of blocks on one node.
    const size_t i = out.loaded;
    if (buffers[i].data == nullptr || buffers[i].size < locs[i].length) {
      stop = absl::OutOfRangeError(
          absl::StrCat("Load: buffer ", i, " holds ", buffers[i].size,
                       " bytes, object is ", locs[i].length));
      break;
    }
    // Hinted blocks are read in the session (their staged copies), the
    // others the ordinary way.
    const bool in_session = i < hinted;
    const size_t j = ReadRunEnd(locs, buffers, i, in_session ? hinted : found);
    absl::StatusOr<PeerInfo> peer = Peer(locs[i].node_id);
    if (!peer.ok()) {
      stop = peer.status();
      break;
    }
    if (unresponsive_.Skip(locs[i].node_id)) {
      stop = absl::UnavailableError(
          absl::StrCat("storage node ", locs[i].node_id,
                       " did not answer a recent call: its blocks count as "
                       "misses for now"));
      break;
    }
    std::vector<absl::Status> st =
        ReadRun(*peer, in_session ? session : 0, locs, buffers, i, j, deadline);
    ReportRefused(keys, locs, i, st);
    size_t ok = 0;
    while (ok < st.size() && st[ok].ok()) {
      out.lengths.push_back(locs[i + ok].length);
      out.bytes += locs[i + ok].length;
      ++ok;
    }
    out.loaded = i + ok;
    // Aborted: the node had not staged the rest yet; ask again.
    if (ok < st.size() && st[ok].code() != absl::StatusCode::kAborted) {
      stop = st[ok];
      break;
    }
  }
  lookups->CancelRest();
  // Blocks found but not read (a node down, a deadline): no cached read of
  // them next time.
  if (out.loaded < found) {
    locations_.Erase(keys.subspan(out.loaded, found - out.loaded));
  }
  out.hit_prefix = std::max(found, out.loaded);
  if (out.loaded == keys.size()) {
    out.stop_reason = absl::OkStatus();
  } else if (!stop.ok()) {
    out.stop_reason = stop;
  } else {
    out.stop_reason =
        absl::NotFoundError(absl::StrCat("key ", found, " is not stored"));
  }
  // Objects announced but not read (deadline, a miss, an error): drop them
  // on their nodes without waiting (the node's session timeout covers a lost
  // release).
  if (options.prefetch && hinted > out.loaded) {
    ReleaseInBackground(session, session_nodes);
  }
  if (copy_end > 0 && copy_end <= out.loaded) {
    CopyInBackground(keys.first(copy_end), buffers, locs, out.lengths);
  }
  return out;
}

// The copies a read's lookup asked for (LookupBatch::copy_prefix): its
// first keys.size() blocks, read into `buffers` (`lengths` bytes each)
// from `locations`, copied out and stored as copies (PutCopies) by a
// background Store. Each copy names the generation it was read at, so a key
// stored again meanwhile is not copied, and the blocks on each node are
// copied off it (a prefix that spilled over nodes is copied whole).
void ClientImpl::CopyInBackground(absl::Span<const std::string> keys,
                                  absl::Span<const MutableBuffer> buffers,
                                  absl::Span<const ObjectLocation> locations,
                                  const std::vector<uint64_t>& lengths) {
  uint64_t bytes = 0;
  for (size_t k = 0; k < keys.size(); ++k) bytes += lengths[k];
  if (bytes == 0 || bytes > options_.max_auto_copy_bytes) return;
  std::vector<std::string> data(keys.size());
  std::vector<uint64_t> generations(keys.size());
  std::vector<uint32_t> nodes(keys.size());
  for (size_t k = 0; k < keys.size(); ++k) {
    data[k].assign(static_cast<const char*>(buffers[k].data), lengths[k]);
    generations[k] = locations[k].generation;
    nodes[k] = locations[k].node_id;
  }
  // Dropped when the store queue is full: the master asks the next reader.
  store_executor_->TrySubmit(
      [this, keys = std::vector<std::string>(keys.begin(), keys.end()),
       data = std::move(data), generations = std::move(generations),
       nodes = std::move(nodes)] {
        std::vector<ConstBuffer> bufs;
        bufs.reserve(data.size());
        for (const std::string& d : data) bufs.push_back({d.data(), d.size()});
        PutCopies(keys, bufs, /*parent_key=*/"", generations, nodes,
                  clock_->Now() + options_.default_store_deadline);
      });
}

bool ClientImpl::LoadCached(absl::Span<const std::string> keys,
                            absl::Span<const MutableBuffer> buffers,
                            const std::vector<ObjectLocation>& locs,
                            absl::Time deadline, LoadResult* out) {
  for (size_t k = 0; k < keys.size(); ++k) {
    // The lookup path reports a buffer too small.
    if (buffers[k].data == nullptr || buffers[k].size < locs[k].length) {
      return false;
    }
  }
  absl::Status stop;
  while (out->loaded < keys.size()) {
    const size_t i = out->loaded;
    const size_t j = ReadRunEnd(locs, buffers, i, keys.size());
    absl::StatusOr<PeerInfo> peer = Peer(locs[i].node_id);
    if (!peer.ok() || unresponsive_.Skip(locs[i].node_id)) {
      stop = absl::UnavailableError("skipped");
      break;
    }
    std::vector<absl::Status> st =
        ReadRun(*peer, /*session=*/0, locs, buffers, i, j, deadline);
    size_t ok = 0;
    while (ok < st.size() && st[ok].ok()) {
      out->lengths.push_back(locs[i + ok].length);
      out->bytes += locs[i + ok].length;
      ++ok;
    }
    out->loaded = i + ok;
    if (ok < st.size()) {
      stop = st[ok];
      break;
    }
  }
  out->hit_prefix = keys.size();  // what the lookups said within the ttl
  if (stop.ok()) return true;
  locations_.Erase(keys.subspan(out->loaded));
  // Refused (NotFound: evicted, removed or the space reused; a capability
  // the node no longer takes) or failed with time left: the lookup path
  // starts over and reports what is really missing. The deadline passed
  // (a node that does not answer): there is no time for a lookup; the
  // blocks read are the answer, as on the lookup path.
  if (absl::IsDeadlineExceeded(stop) || clock_->Now() >= deadline) {
    out->stop_reason = stop;
    return true;
  }
  *out = LoadResult();
  return false;
}

std::vector<absl::Status> ClientImpl::ReadRun(
    const PeerInfo& peer, uint64_t session,
    const std::vector<ObjectLocation>& locs,
    absl::Span<const MutableBuffer> buffers, size_t i, size_t j,
    absl::Time deadline) {
  std::vector<ReadOp> ops;
  ops.reserve(j - i);
  for (size_t k = i; k < j; ++k) {
    ops.push_back(ReadOp{ToRemoteRef(locs[k]), buffers[k].data});
  }
  const absl::Time read_start = clock_->Now();
  std::vector<absl::Status> st =
      session != 0 ? transport_->ReadSession(peer, session, ops, deadline)
                   : transport_->Read(peer, ops, deadline);
  unresponsive_.Observe(locs[i].node_id, read_start, st.front());
  return st;
}

// The end of the run of blocks from `i` (< `end`) that one read takes: on
// the node of block i, at most read_batch_bytes (block i alone may exceed
// it), each block's buffer large enough.
size_t ClientImpl::ReadRunEnd(const std::vector<ObjectLocation>& locs,
                              absl::Span<const MutableBuffer> buffers, size_t i,
                              size_t end) const {
  size_t j = i + 1;
  uint64_t batch = locs[i].length;
  while (j < end && locs[j].node_id == locs[i].node_id &&
         batch + locs[j].length <= options_.read_batch_bytes &&
         buffers[j].data != nullptr && buffers[j].size >= locs[j].length) {
    batch += locs[j].length;
    ++j;
  }
  return j;
}

uint64_t ClientImpl::NewSessionId() {
  MutexLock l(&mu_);
  uint64_t id;
  do {
    id = absl::Uniform<uint64_t>(rng_);
  } while (id == 0);
  return id;
}

// Announces locs[from, to) to their nodes (one ordered list per node).
// Hints are advisory: a failed one only costs speed, the reads report real
// errors.
void ClientImpl::Hint(uint64_t session, const std::vector<ObjectLocation>& locs,
                      size_t from, size_t to, absl::Time deadline,
                      std::vector<uint32_t>* nodes) {
  std::vector<std::pair<uint32_t, std::vector<RemoteRef>>> per_node;
  for (size_t i = from; i < to; ++i) {
    auto it = std::find_if(per_node.begin(), per_node.end(), [&](const auto& p) {
      return p.first == locs[i].node_id;
    });
    if (it == per_node.end()) {
      per_node.emplace_back(locs[i].node_id, std::vector<RemoteRef>());
      it = std::prev(per_node.end());
    }
    it->second.push_back(ToRemoteRef(locs[i]));
  }
  for (auto& [node, refs] : per_node) {
    absl::StatusOr<PeerInfo> peer = Peer(node);
    if (!peer.ok() || unresponsive_.Skip(node)) continue;
    if (std::find(nodes->begin(), nodes->end(), node) == nodes->end()) {
      nodes->push_back(node);
    }
    const absl::Time start = clock_->Now();
    std::vector<absl::Status> st =
        transport_->Prefetch(*peer, session, refs, deadline);
    if (!st.empty()) unresponsive_.Observe(node, start, st.front());
  }
}

// Read repair: the node refused reads of listed objects (NotFound: it does
// not hold that extent, e.g. it lost its write buffer in a crash; DataLoss:
// the bytes failed their checksum, so the node forgot them). Tells the
// master in the background, which drops the listings that still name those
// exact locations, so the keys can be stored again. `st[k]` is the status of
// the read of keys[first + k] at locs[first + k].
void ClientImpl::ReportRefused(absl::Span<const std::string> keys,
                               const std::vector<ObjectLocation>& locs,
                               size_t first,
                               const std::vector<absl::Status>& st) {
  std::vector<std::string> missing;
  std::vector<ObjectLocation> where;
  for (size_t k = 0; k < st.size(); ++k) {
    if (st[k].code() != absl::StatusCode::kNotFound &&
        st[k].code() != absl::StatusCode::kDataLoss) {
      continue;
    }
    missing.push_back(keys[first + k]);
    where.push_back(locs[first + k]);
  }
  if (missing.empty()) return;
  locations_.Erase(missing);
  // Dropped when the queue is full: the node's next reconciliation removes
  // the listings instead.
  bg_executor_->TrySubmit(
      [this, missing = std::move(missing), where = std::move(where)] {
        master_->ReportMissing(missing, where, clock_->Now() + kReleaseTimeout)
            .IgnoreError();
      });
}

// Ends `session` on `nodes` without waiting.
void ClientImpl::ReleaseInBackground(uint64_t session,
                                     std::vector<uint32_t> nodes) {
  for (uint32_t node : nodes) {
    absl::StatusOr<PeerInfo> peer = Peer(node);
    if (!peer.ok()) continue;
    // Dropped when the queue is full: the node's session timeout frees the
    // staging instead.
    bg_executor_->TrySubmit([this, p = *peer, session] {
      transport_->Release(p, session, {}, clock_->Now() + kReleaseTimeout)
          .IgnoreError();
    });
  }
}

}  // namespace hymcache
