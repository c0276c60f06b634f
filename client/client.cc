#include "client/client.h"

#include <cstring>

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "client/direct_transport.h"
#include "client/rdma_mover.h"
#include "client/tcp_transport.h"
#include "client/transport.h"
#include "common/executor.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "proto/master.grpc.pb.h"

namespace hymcache {

absl::Status ClientOptions::Validate() const {
  if (master_address.empty()) {
    return absl::InvalidArgumentError("ClientOptions.master_address is required");
  }
  if (auto hp = SplitHostPort(master_address); !hp.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.master_address: ", hp.status().message()));
  }
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "ClientOptions.tls_cert_file and tls_key_file go together");
  }
  if (default_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ClientOptions.default_deadline must be positive");
  }
  if (max_idle_connections_per_node < 0) {
    return absl::InvalidArgumentError(
        "ClientOptions.max_idle_connections_per_node must be >= 0");
  }
  if (max_keys_per_rpc == 0 || max_keys_per_rpc > 1024) {
    return absl::InvalidArgumentError(
        "ClientOptions.max_keys_per_rpc must be in 1..1024");
  }
  if (lookup_batch_keys == 0 || lookup_batch_keys > max_keys_per_rpc) {
    return absl::InvalidArgumentError(
        "ClientOptions.lookup_batch_keys must be in 1..max_keys_per_rpc");
  }
  if (lookup_pipeline_depth < 1 || lookup_pipeline_depth > 64) {
    return absl::InvalidArgumentError(
        "ClientOptions.lookup_pipeline_depth must be in 1..64");
  }
  if (read_batch_bytes == 0) {
    return absl::InvalidArgumentError(
        "ClientOptions.read_batch_bytes must be > 0");
  }
  if (store_threads < 1 || max_pending_stores < 1) {
    return absl::InvalidArgumentError(
        "ClientOptions.store_threads and max_pending_stores must be >= 1");
  }
  return absl::OkStatus();
}

namespace {

namespace pb = ::hymcache::v1;

absl::Status FromGrpc(const grpc::Status& s, const char* what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

ObjectLocation FromProto(const pb::Location& l, const pb::Capability& c) {
  ObjectLocation o;
  o.node_id = l.node_id();
  o.region_id = l.region_id();
  o.addr = l.addr();
  o.length = l.length();
  o.generation = l.generation();
  o.capability.expires_unix_ms = c.expires_unix_ms();
  o.capability.rights = static_cast<uint8_t>(c.rights());
  absl::little_endian::Store64(o.capability.tag.data(), c.tag_lo());
  absl::little_endian::Store64(o.capability.tag.data() + 8, c.tag_hi());
  return o;
}

RemoteRef ToRef(const ObjectLocation& l) {
  RemoteRef r{l.region_id, l.addr, l.length, l.generation};
  r.cap.expires_unix_ms = l.capability.expires_unix_ms;
  r.cap.rights = l.capability.rights;
  static_assert(sizeof(r.cap.tag) == sizeof(l.capability.tag));
  std::memcpy(r.cap.tag, l.capability.tag.data(), sizeof(r.cap.tag));
  return r;
}

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

class ClientImpl : public Client {
 public:
  ClientImpl(const ClientOptions& options,
             std::unique_ptr<pb::MasterService::Stub> stub,
             std::unique_ptr<Transport> transport,
             std::unique_ptr<Executor> store_executor,
             std::unique_ptr<Executor> bg_executor)
      : options_(options),
        stub_(std::move(stub)),
        transport_(std::move(transport)),
        store_executor_(std::move(store_executor)),
        bg_executor_(std::move(bg_executor)) {}

  ~ClientImpl() override {
    // Stores and releases finish first (each is bounded by its deadline).
    store_executor_.reset();
    bg_executor_.reset();
    // Background aborts and cancelled lookups reference this client: wait
    // for them (each is bounded by its deadline).
    MutexLock l(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return aborts_in_flight_ == 0;
    };
    mu_.Await(absl::Condition(&done));
  }

  absl::StatusOr<LookupResult> BatchLookup(absl::Span<const std::string> keys,
                                           const CallOptions& call) override {
    RETURN_IF_ERROR(CheckKeys(keys));
    absl::Time deadline = Deadline(call);
    LookupResult out;
    RETURN_IF_ERROR(Lookup(keys, deadline, /*stop_at_miss=*/false, &out));
    return out;
  }

  absl::StatusOr<PutResult> Put(absl::Span<const std::string> keys,
                                absl::Span<const ConstBuffer> buffers,
                                const CallOptions& call) override {
    RETURN_IF_ERROR(CheckPut(keys, buffers));
    return PutAll(keys, buffers, /*parent_key=*/"", Deadline(call));
  }

  absl::StatusOr<GetResult> Get(absl::Span<const std::string> keys,
                                absl::Span<const MutableBuffer> buffers,
                                const CallOptions& call) override {
    RETURN_IF_ERROR(CheckKeys(keys));
    if (keys.size() != buffers.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Get: ", keys.size(), " keys but ", buffers.size(), " buffers"));
    }
    absl::Time deadline = Deadline(call);
    LookupResult found;
    RETURN_IF_ERROR(Lookup(keys, deadline, /*stop_at_miss=*/true, &found));

    GetResult out;
    out.hit_prefix = found.hit_prefix;
    size_t usable = found.hit_prefix;
    out.stop_reason =
        usable < keys.size()
            ? absl::NotFoundError(absl::StrCat("key ", usable, " is not stored"))
            : absl::OkStatus();
    for (size_t i = 0; i < usable; ++i) {
      if (buffers[i].size < found.locations[i].length ||
          buffers[i].data == nullptr) {
        out.stop_reason = absl::OutOfRangeError(absl::StrCat(
            "Get: buffer ", i, " holds ", buffers[i].size, " bytes, object is ",
            found.locations[i].length));
        usable = i;
        break;
      }
    }
    // Read runs of consecutive blocks on the same node as one batch each.
    size_t i = 0;
    while (i < usable) {
      size_t j = i;
      uint32_t node = found.locations[i].node_id;
      while (j < usable && found.locations[j].node_id == node) ++j;
      absl::StatusOr<PeerInfo> peer = Peer(node);
      if (!peer.ok()) {
        out.stop_reason = peer.status();
        break;
      }
      std::vector<ReadOp> ops;
      ops.reserve(j - i);
      for (size_t k = i; k < j; ++k) {
        ops.push_back(ReadOp{ToRef(found.locations[k]), buffers[k].data});
      }
      std::vector<absl::Status> st = transport_->Read(*peer, ops, deadline);
      ReportRefused(keys, found.locations, i, st);
      size_t ok = 0;
      while (ok < st.size() && st[ok].ok()) ++ok;
      for (size_t k = i; k < i + ok; ++k) {
        out.lengths.push_back(found.locations[k].length);
      }
      out.loaded = i + ok;
      if (ok < st.size()) {
        out.stop_reason = st[ok];
        break;
      }
      i = j;
    }
    if (out.loaded == keys.size()) out.stop_reason = absl::OkStatus();
    return out;
  }

  absl::StatusOr<LoadResult> Load(absl::Span<const std::string> keys,
                                  absl::Span<const MutableBuffer> buffers,
                                  const LoadOptions& options) override {
    RETURN_IF_ERROR(CheckKeys(keys));
    if (keys.size() != buffers.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Load: ", keys.size(), " keys but ", buffers.size(), " buffers"));
    }
    const absl::Time deadline = options.deadline == absl::InfinitePast()
                                    ? absl::Now() + options_.default_deadline
                                    : options.deadline;
    const uint64_t session = options.prefetch ? NewSessionId() : 0;
    LookupPipeline lookups(this, keys, deadline);

    LoadResult out;
    std::vector<ObjectLocation> locs(keys.size());
    size_t found = 0;    // leading keys known to be stored
    size_t hinted = 0;   // of those, announced to their nodes
    bool closed = false; // the hit prefix ends at `found`
    absl::Status stop;
    std::vector<uint32_t> session_nodes;  // nodes holding hinted objects

    while (true) {
      // Take lookup answers in order: wait only when there is nothing to
      // read meanwhile.
      while (!closed && lookups.has_next()) {
        const bool block = out.loaded == found;
        absl::StatusOr<const pb::BatchLookupResponse*> r =
            lookups.Next(block);
        if (r.ok() && *r == nullptr) break;  // not arrived yet
        if (!r.ok()) {
          if (found == 0 && out.loaded == 0) return r.status();
          stop = r.status();
          closed = true;
          break;
        }
        const pb::BatchLookupResponse& resp = **r;
        for (const pb::NodeInfo& n : resp.nodes()) Remember(n);
        for (const pb::LookupResult& lr : resp.results()) {
          if (!lr.found()) {
            closed = true;
            break;
          }
          locs[found++] = FromProto(lr.location(), lr.capability());
        }
        if (closed) lookups.CancelRest();
      }
      if (lookups.done() ) closed = true;

      // Announce the new hits to their nodes, in read order.
      if (options.prefetch && hinted < found) {
        Hint(session, locs, hinted, found, deadline, &session_nodes);
        hinted = found;
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
      size_t j = i + 1;
      uint64_t batch = locs[i].length;
      while (j < found && locs[j].node_id == locs[i].node_id &&
             batch + locs[j].length <= options_.read_batch_bytes &&
             buffers[j].data != nullptr && buffers[j].size >= locs[j].length) {
        batch += locs[j].length;
        ++j;
      }
      absl::StatusOr<PeerInfo> peer = Peer(locs[i].node_id);
      if (!peer.ok()) {
        stop = peer.status();
        break;
      }
      std::vector<ReadOp> ops;
      ops.reserve(j - i);
      for (size_t k = i; k < j; ++k) {
        ops.push_back(ReadOp{ToRef(locs[k]), buffers[k].data});
      }
      std::vector<absl::Status> st =
          options.prefetch
              ? transport_->ReadSession(*peer, session, ops, deadline)
              : transport_->Read(*peer, ops, deadline);
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
    lookups.CancelRest();
    out.hit_prefix = std::max(found, out.loaded);
    if (out.loaded == keys.size()) {
      out.stop_reason = absl::OkStatus();
    } else if (!stop.ok()) {
      out.stop_reason = stop;
    } else {
      out.stop_reason =
          absl::NotFoundError(absl::StrCat("key ", found, " is not stored"));
    }
    // Objects announced but not read (deadline, a miss, an error): drop
    // them on their nodes without waiting (the node's session timeout
    // covers a lost release).
    if (options.prefetch && hinted > out.loaded) {
      ReleaseInBackground(session, session_nodes);
    }
    return out;
  }

  std::shared_ptr<StoreHandle> Store(absl::Span<const std::string> keys,
                                     absl::Span<const ConstBuffer> buffers,
                                     const StoreOptions& options) override {
    auto handle = std::make_shared<StoreHandleImpl>();
    absl::Status bad = CheckPut(keys, buffers);
    if (!bad.ok()) {
      handle->Complete(bad);
      return handle;
    }
    const absl::Time deadline = absl::Now() + options.timeout;
    auto task = [this, handle, keys = std::vector<std::string>(keys.begin(), keys.end()),
                 bufs = std::vector<ConstBuffer>(buffers.begin(), buffers.end()),
                 parent = options.parent_key, deadline]() {
      absl::StatusOr<PutResult> r = PutAll(keys, bufs, parent, deadline);
      if (!r.ok() && r.status().code() == absl::StatusCode::kResourceExhausted) {
        // No node had room: every key is refused (skipped), not an error.
        PutResult refused;
        refused.outcomes.assign(keys.size(), PutOutcome::kFailed);
        refused.errors.assign(keys.size(), r.status());
        refused.failed = refused.refused = keys.size();
        r = std::move(refused);
      }
      handle->Complete(std::move(r));
    };
    if (!store_executor_->TrySubmit(std::move(task))) {
      handle->Complete(absl::ResourceExhaustedError(absl::StrCat(
          "Store: ", options_.max_pending_stores,
          " stores already pending; skipped")));
    }
    return handle;
  }

  absl::Status RegisterMemory(void* data, size_t size) override {
    if (data == nullptr || size == 0) {
      return absl::InvalidArgumentError("RegisterMemory: empty range");
    }
    return transport_->RegisterMemory(data, size);
  }

  absl::Status UnregisterMemory(void* data) override {
    return transport_->UnregisterMemory(data);
  }

  absl::StatusOr<std::vector<bool>> Remove(absl::Span<const std::string> keys,
                                           const CallOptions& call) override {
    RETURN_IF_ERROR(CheckKeys(keys));
    absl::Time deadline = Deadline(call);
    std::vector<bool> out;
    for (size_t begin = 0; begin < keys.size();
         begin += options_.max_keys_per_rpc) {
      size_t n = std::min<size_t>(keys.size() - begin, options_.max_keys_per_rpc);
      pb::RemoveRequest req;
      for (size_t i = begin; i < begin + n; ++i) req.add_keys(keys[i]);
      pb::RemoveResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      RETURN_IF_ERROR(FromGrpc(stub_->Remove(&ctx, req, &resp), "Remove"));
      for (bool b : resp.removed()) out.push_back(b);
    }
    return out;
  }

  absl::StatusOr<ClusterStatus> GetClusterStatus(const CallOptions& call) override {
    pb::GetStatsRequest req;
    pb::GetStatsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(Deadline(call)));
    RETURN_IF_ERROR(FromGrpc(stub_->GetStats(&ctx, req, &resp), "GetStats"));
    ClusterStatus out;
    out.object_count = resp.object_count();
    out.object_bytes = resp.object_bytes();
    out.pending_puts = resp.pending_puts();
    out.index_bytes_per_entry = resp.index_bytes_per_entry();
    out.evicted_objects = resp.evicted_objects();
    out.evicted_bytes = resp.evicted_bytes();
    out.reconciliations = resp.reconciliations();
    out.reconcile_dropped_listings = resp.reconcile_dropped_listings();
    out.read_repairs = resp.read_repairs();
    for (const pb::NodeInfo& n : resp.nodes()) {
      NodeStatus s;
      s.node_id = n.node_id();
      s.name = n.name();
      s.data_address = n.data_address();
      s.control_address = n.control_address();
      s.alive = n.alive();
      s.awaiting_reconcile = n.awaiting_reconcile();
      s.last_heartbeat_unix_ms = n.last_heartbeat_unix_ms();
      s.capacity_bytes = n.capacity_bytes();
      s.used_bytes = n.used_bytes();
      s.object_count = n.object_count();
      if (n.regions_size() > 0) s.device_kind = n.regions(0).device_kind();
      out.nodes.push_back(std::move(s));
    }
    return out;
  }

 private:
  absl::Time Deadline(const CallOptions& call) const {
    if (call.deadline == absl::InfinitePast()) {
      return absl::Now() + options_.default_deadline;
    }
    return call.deadline;
  }

  static absl::Status CheckKeys(absl::Span<const std::string> keys) {
    if (keys.empty()) return absl::InvalidArgumentError("empty key list");
    return absl::OkStatus();
  }

  void Remember(const pb::NodeInfo& n) {
    PeerInfo p;
    p.node_id = n.node_id();
    p.data_address = n.data_address();
    for (const auto& [k, v] : n.transport_params()) p.params[k] = v;
    MutexLock l(&mu_);
    peers_[p.node_id] = std::move(p);
  }

  absl::StatusOr<PeerInfo> Peer(uint32_t node_id) {
    MutexLock l(&mu_);
    auto it = peers_.find(node_id);
    if (it == peers_.end()) {
      return absl::UnavailableError(
          absl::StrCat("no address known for storage node ", node_id));
    }
    return it->second;
  }

  // Looks keys up in RPCs of max_keys_per_rpc. With stop_at_miss, stops
  // after the first RPC that ends the hit prefix (later keys are reported
  // missing). An RPC failure after the first returns what was found so far.
  absl::Status Lookup(absl::Span<const std::string> keys, absl::Time deadline,
                      bool stop_at_miss, LookupResult* out) {
    out->found.assign(keys.size(), false);
    out->locations.assign(keys.size(), ObjectLocation{});
    out->hit_prefix = 0;
    bool prefix_open = true;
    for (size_t begin = 0; begin < keys.size();
         begin += options_.max_keys_per_rpc) {
      size_t n = std::min<size_t>(keys.size() - begin, options_.max_keys_per_rpc);
      pb::BatchLookupRequest req;
      for (size_t i = begin; i < begin + n; ++i) req.add_keys(keys[i]);
      // Get reads the leading hits: mark them in use on the master.
      req.set_for_read(stop_at_miss);
      pb::BatchLookupResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      absl::Status st = FromGrpc(stub_->BatchLookup(&ctx, req, &resp), "BatchLookup");
      if (!st.ok()) {
        if (begin == 0) return st;
        break;
      }
      if (static_cast<size_t>(resp.results_size()) != n) {
        return absl::InternalError("BatchLookup: master returned a short answer");
      }
      for (const pb::NodeInfo& node : resp.nodes()) Remember(node);
      for (size_t i = 0; i < n; ++i) {
        const pb::LookupResult& r = resp.results(static_cast<int>(i));
        out->found[begin + i] = r.found();
        if (r.found()) {
          out->locations[begin + i] = FromProto(r.location(), r.capability());
        }
        if (prefix_open && r.found()) {
          ++out->hit_prefix;
        } else {
          prefix_open = false;
        }
      }
      if (stop_at_miss && !prefix_open) break;
    }
    return absl::OkStatus();
  }

  static absl::Status CheckPut(absl::Span<const std::string> keys,
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

  // Put of checked arguments, in chunks of max_keys_per_rpc; the first
  // chunk is placed with `parent_key`'s node, later ones on the first's.
  // Each chunk names the block before it as its parent, so the master
  // knows the whole call as one chain.
  absl::StatusOr<PutResult> PutAll(absl::Span<const std::string> keys,
                                   absl::Span<const ConstBuffer> buffers,
                                   const std::string& parent_key,
                                   absl::Time deadline) {
    PutResult out;
    out.outcomes.assign(keys.size(), PutOutcome::kFailed);
    out.errors.assign(keys.size(), absl::OkStatus());
    uint32_t node = 0;
    for (size_t begin = 0; begin < keys.size();
         begin += options_.max_keys_per_rpc) {
      size_t n = std::min<size_t>(keys.size() - begin, options_.max_keys_per_rpc);
      absl::Status st = PutChunk(keys.subspan(begin, n),
                                 buffers.subspan(begin, n), begin,
                                 begin == 0 ? parent_key : keys[begin - 1],
                                 deadline, &node, &out);
      if (!st.ok()) {
        if (begin == 0) return st;  // nothing happened yet: the call failed
        for (size_t i = begin; i < keys.size(); ++i) out.errors[i] = st;
        break;
      }
    }
    out.node_id = node;
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
          if (out.errors[i].ok()) {
            out.errors[i] = absl::UnknownError("not stored");
          }
          if (out.errors[i].code() == absl::StatusCode::kResourceExhausted) {
            ++out.refused;
          }
          break;
      }
    }
    return out;
  }

  uint64_t NewSessionId() {
    MutexLock l(&mu_);
    uint64_t id;
    do {
      id = absl::Uniform<uint64_t>(rng_);
    } while (id == 0);
    return id;
  }

  // Announces locs[from, to) to their nodes (one ordered list per node).
  // Hints are advisory: a failed one only costs speed, the reads report
  // real errors.
  void Hint(uint64_t session, const std::vector<ObjectLocation>& locs,
            size_t from, size_t to, absl::Time deadline,
            std::vector<uint32_t>* nodes) {
    std::vector<std::pair<uint32_t, std::vector<RemoteRef>>> per_node;
    for (size_t i = from; i < to; ++i) {
      auto it = std::find_if(per_node.begin(), per_node.end(),
                             [&](const auto& p) { return p.first == locs[i].node_id; });
      if (it == per_node.end()) {
        per_node.emplace_back(locs[i].node_id, std::vector<RemoteRef>());
        it = std::prev(per_node.end());
      }
      it->second.push_back(ToRef(locs[i]));
    }
    for (auto& [node, refs] : per_node) {
      absl::StatusOr<PeerInfo> peer = Peer(node);
      if (!peer.ok()) continue;
      if (std::find(nodes->begin(), nodes->end(), node) == nodes->end()) {
        nodes->push_back(node);
      }
      transport_->Prefetch(*peer, session, refs, deadline);
    }
  }

  // Ends `session` on `nodes` without waiting.
  // Read repair: the node refused reads of listed objects (NotFound: it
  // does not hold that extent, e.g. it lost its write buffer in a crash;
  // DataLoss: the bytes failed their checksum).
  // Tells the master in the background, which drops the listings that still
  // name those exact locations, so the keys can be stored again. `st[k]` is
  // the status of the read of keys[first + k] at locs[first + k].
  void ReportRefused(absl::Span<const std::string> keys,
                     const std::vector<ObjectLocation>& locs, size_t first,
                     const std::vector<absl::Status>& st) {
    pb::ReportMissingRequest req;
    for (size_t k = 0; k < st.size(); ++k) {
      // NotFound: no such extent; DataLoss: its bytes failed their
      // checksum (the node forgot it).
      if (st[k].code() != absl::StatusCode::kNotFound &&
          st[k].code() != absl::StatusCode::kDataLoss) {
        continue;
      }
      req.add_keys(keys[first + k]);
      const ObjectLocation& l = locs[first + k];
      pb::Location* loc = req.add_locations();
      loc->set_node_id(l.node_id);
      loc->set_region_id(l.region_id);
      loc->set_addr(l.addr);
      loc->set_length(l.length);
      loc->set_generation(l.generation);
    }
    if (req.keys_size() == 0) return;
    // Dropped when the queue is full: the node's next reconciliation
    // removes the listings instead.
    bg_executor_->TrySubmit([this, req = std::move(req)] {
      pb::ReportMissingResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + kReleaseTimeout));
      stub_->ReportMissing(&ctx, req, &resp);
    });
  }

  void ReleaseInBackground(uint64_t session, std::vector<uint32_t> nodes) {
    for (uint32_t node : nodes) {
      absl::StatusOr<PeerInfo> peer = Peer(node);
      if (!peer.ok()) continue;
      // Dropped when the queue is full: the node's session timeout frees
      // the staging instead.
      bg_executor_->TrySubmit([this, p = *peer, session] {
        transport_->Release(p, session, {}, absl::Now() + kReleaseTimeout)
            .IgnoreError();
      });
    }
  }

  // One PutStart / writes / PutCommit round for keys [offset, offset+n).
  absl::Status PutChunk(absl::Span<const std::string> keys,
                        absl::Span<const ConstBuffer> buffers, size_t offset,
                        const std::string& parent_key, absl::Time deadline,
                        uint32_t* node, PutResult* out) {
    pb::PutStartRequest req;
    for (size_t i = 0; i < keys.size(); ++i) {
      req.add_keys(keys[i]);
      req.add_lengths(buffers[i].size);
    }
    req.set_preferred_node_id(*node);
    if (!parent_key.empty()) req.set_parent_key(parent_key);
    pb::PutStartResponse resp;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      RETURN_IF_ERROR(FromGrpc(stub_->PutStart(&ctx, req, &resp), "PutStart"));
    }
    if (static_cast<size_t>(resp.slots_size()) != keys.size()) {
      AbortInBackground(resp.put_id());
      return absl::InternalError("PutStart: master returned a short answer");
    }
    std::vector<WriteOp> ops;
    std::vector<size_t> op_index;  // op -> key index in this chunk
    for (size_t i = 0; i < keys.size(); ++i) {
      const pb::PutSlot& slot = resp.slots(static_cast<int>(i));
      switch (slot.state()) {
        case pb::SLOT_EXISTS:
          out->outcomes[offset + i] = PutOutcome::kAlreadyStored;
          break;
        case pb::SLOT_IN_PROGRESS:
          out->outcomes[offset + i] = PutOutcome::kInProgress;
          break;
        default: {
          ObjectLocation loc = FromProto(slot.location(), slot.capability());
          if (loc.length != buffers[i].size) {
            AbortInBackground(resp.put_id());
            return absl::InternalError("PutStart: allocation of the wrong size");
          }
          ops.push_back(WriteOp{ToRef(loc), buffers[i].data});
          op_index.push_back(i);
        }
      }
    }
    if (ops.empty()) return absl::OkStatus();
    Remember(resp.node());
    *node = resp.node().node_id();
    PeerInfo peer;
    peer.node_id = resp.node().node_id();
    peer.data_address = resp.node().data_address();
    for (const auto& [k, v] : resp.node().transport_params()) peer.params[k] = v;

    std::vector<absl::Status> st = transport_->Write(peer, ops, deadline);
    pb::PutCommitRequest commit;
    commit.set_put_id(resp.put_id());
    size_t good = 0;
    for (size_t k = 0; k < ops.size(); ++k) {
      if (st[k].ok()) {
        ++good;
      } else {
        commit.add_failed_indexes(static_cast<uint32_t>(op_index[k]));
        out->errors[offset + op_index[k]] = st[k];
      }
    }
    if (absl::Now() >= deadline) {
      // No time left to commit: free the space in the background and report
      // the written blocks as not stored.
      AbortInBackground(resp.put_id());
      for (size_t k = 0; k < ops.size(); ++k) {
        if (st[k].ok()) {
          out->errors[offset + op_index[k]] =
              absl::DeadlineExceededError("Put: deadline passed before commit");
        }
      }
      return absl::OkStatus();
    }
    if (good == 0) {
      AbortInBackground(resp.put_id());
      return absl::OkStatus();
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    pb::PutCommitResponse cr;
    absl::Status cs = FromGrpc(stub_->PutCommit(&ctx, commit, &cr), "PutCommit");
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

  // Frees a put's allocation on the master without waiting: used when the
  // call gives up after PutStart (deadline, bad answer). If the abort is
  // lost, the master frees the space when the put expires.
  void AbortInBackground(uint64_t put_id) {
    if (put_id == 0) return;
    struct Call {
      grpc::ClientContext ctx;
      pb::PutAbortRequest req;
      pb::PutAbortResponse resp;
    };
    auto* call = new Call;
    call->req.set_put_id(put_id);
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + kAbortTimeout));
    {
      MutexLock l(&mu_);
      ++aborts_in_flight_;
    }
    TsanRelease(call);
    stub_->async()->PutAbort(&call->ctx, &call->req, &call->resp,
                             [this, call](grpc::Status) {
                               TsanAcquire(call);
                               delete call;
                               MutexLock l(&mu_);
                               --aborts_in_flight_;
                             });
  }

  static constexpr absl::Duration kAbortTimeout = absl::Seconds(2);
  static constexpr absl::Duration kReleaseTimeout = absl::Seconds(1);

  // The BatchLookup round trips of one Load: chunks of lookup_batch_keys,
  // up to lookup_pipeline_depth in flight, answers taken in order. Calls
  // still in flight when the pipeline is destroyed are cancelled; their
  // state lives until their callbacks ran (the client waits for those).
  class LookupPipeline {
   public:
    LookupPipeline(ClientImpl* client, absl::Span<const std::string> keys,
                   absl::Time deadline)
        : client_(client),
          keys_(keys),
          deadline_(deadline),
          chunk_(client->options_.lookup_batch_keys),
          nchunks_((keys.size() + chunk_ - 1) / chunk_),
          state_(std::make_shared<State>()) {
      state_->calls.resize(nchunks_);
      Launch();
    }
    ~LookupPipeline() { CancelRest(); }

    // Whether answers remain to be taken.
    bool has_next() const { return !stopped_ && next_ < nchunks_; }
    bool done() const { return !has_next(); }

    // The next chunk's answer (one result per key of the chunk); nullptr
    // when !block and it has not arrived. Errors: the RPC's status,
    // DeadlineExceeded, Internal for a malformed answer.
    absl::StatusOr<const pb::BatchLookupResponse*> Next(bool block) {
      Call* c = state_->calls[next_].get();
      {
        MutexLock l(&state_->mu);
        while (!c->done) {
          if (!block) return nullptr;
          if (state_->cv.WaitWithDeadline(&state_->mu, deadline_) &&
              !c->done) {
            return absl::DeadlineExceededError(
                "Load: lookup did not answer before the deadline");
          }
        }
      }
      const size_t n = ChunkSize(next_);
      ++next_;
      Launch();
      RETURN_IF_ERROR(FromGrpc(c->status, "BatchLookup"));
      if (static_cast<size_t>(c->resp.results_size()) != n) {
        return absl::InternalError("BatchLookup: master returned a short answer");
      }
      return &c->resp;
    }

    // No more answers are wanted: cancels the calls in flight.
    void CancelRest() {
      stopped_ = true;
      MutexLock l(&state_->mu);
      for (size_t k = next_; k < launched_; ++k) {
        if (!state_->calls[k]->done) state_->calls[k]->ctx.TryCancel();
      }
    }

   private:
    struct Call {
      grpc::ClientContext ctx;
      pb::BatchLookupRequest req;
      pb::BatchLookupResponse resp;
      grpc::Status status;
      bool done = false;  // guarded by State::mu
    };
    struct State {
      Mutex mu;
      CondVar cv;
      // Filled by the Load's thread before each call starts.
      std::vector<std::unique_ptr<Call>> calls;
    };

    size_t ChunkSize(size_t k) const {
      return std::min(chunk_, keys_.size() - k * chunk_);
    }

    void Launch() {
      const size_t depth = static_cast<size_t>(
          client_->options_.lookup_pipeline_depth);
      while (!stopped_ && launched_ < nchunks_ && launched_ < next_ + depth) {
        auto call = std::make_unique<Call>();
        Call* c = call.get();
        const size_t begin = launched_ * chunk_;
        for (size_t i = begin; i < begin + ChunkSize(launched_); ++i) {
          c->req.add_keys(keys_[i]);
        }
        c->req.set_for_read(true);
        c->ctx.set_deadline(absl::ToChronoTime(deadline_));
        state_->calls[launched_] = std::move(call);
        ++launched_;
        client_->AsyncStarted();
        // The callback runs on a gRPC thread: publish the call's state to it.
        TsanRelease(c);
        client_->stub_->async()->BatchLookup(
            &c->ctx, &c->req, &c->resp,
            [state = state_, c, client = client_](grpc::Status s) {
              TsanAcquire(c);
              {
                MutexLock l(&state->mu);
                c->status = std::move(s);
                c->done = true;
                state->cv.SignalAll();
              }
              client->AsyncDone();
            });
      }
    }

    ClientImpl* const client_;
    const absl::Span<const std::string> keys_;
    const absl::Time deadline_;
    const size_t chunk_;
    const size_t nchunks_;
    const std::shared_ptr<State> state_;
    size_t next_ = 0;      // next chunk to take
    size_t launched_ = 0;  // chunks whose call started
    bool stopped_ = false;
  };

  void AsyncStarted() {
    MutexLock l(&mu_);
    ++aborts_in_flight_;
  }
  void AsyncDone() {
    MutexLock l(&mu_);
    --aborts_in_flight_;
  }

  const ClientOptions options_;
  const std::unique_ptr<pb::MasterService::Stub> stub_;
  const std::unique_ptr<Transport> transport_;
  // Run Stores ("hym-store") and releases of cancelled prefetches
  // ("hym-bg").
  std::unique_ptr<Executor> store_executor_;
  std::unique_ptr<Executor> bg_executor_;

  Mutex mu_;
  absl::flat_hash_map<uint32_t, PeerInfo> peers_ ABSL_GUARDED_BY(mu_);
  // Async calls (aborts, lookups) whose callbacks have not run.
  int aborts_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(
    const ClientOptions& options) {
  TcpTransportOptions t;
  t.max_idle_per_peer = options.max_idle_connections_per_node;
  DirectTransportOptions d;
  d.max_idle_per_peer = options.max_idle_connections_per_node;
  std::vector<std::unique_ptr<Transport>> candidates;
  switch (options.transport) {
    case TransportKind::kTcp:
      return NewTcpTransport(t);
    case TransportKind::kShm:
      candidates.push_back(NewDirectTransport(NewShmMover(), d));
      return NewFirstReachableTransport(std::move(candidates));
    case TransportKind::kRdma: {
      ASSIGN_OR_RETURN(std::unique_ptr<DirectMover> rdma,
                       NewRdmaMover(options.rdma_device));
      candidates.push_back(NewDirectTransport(std::move(rdma), d));
      return NewFirstReachableTransport(std::move(candidates));
    }
    case TransportKind::kAuto: {
      candidates.push_back(NewDirectTransport(NewShmMover(), d));
      absl::StatusOr<std::unique_ptr<DirectMover>> rdma =
          NewRdmaMover(options.rdma_device);
      if (rdma.ok()) {
        candidates.push_back(NewDirectTransport(std::move(*rdma), d));
      }
      candidates.push_back(NewTcpTransport(t));
      return NewFirstReachableTransport(std::move(candidates));
    }
  }
  return absl::InvalidArgumentError("unknown transport kind");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(
    const ClientOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  // Calls fail fast while the master is unreachable (the engine recomputes);
  // reconnect quickly once it is back instead of after gRPC's default
  // backoff of up to two minutes.
  // (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also uses it as the minimum
  // connect timeout, and 100 ms fails connects on a loaded machine.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  ChannelSecurity security;
  security.token = options.auth_token;
  security.tls.ca_file = options.tls_ca_file;
  security.tls.cert_file = options.tls_cert_file;
  security.tls.key_file = options.tls_key_file;
  security.tls.server_name = options.tls_server_name;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   CreateChannel(options.master_address, security, args));
  ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport,
                   MakeTransport(options));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Executor> stores,
      Executor::Create({.name = "hym-store",
                        .threads = options.store_threads,
                        .max_tasks = static_cast<size_t>(options.max_pending_stores)}));
  ASSIGN_OR_RETURN(std::unique_ptr<Executor> bg,
                   Executor::Create({.name = "hym-bg", .threads = 1,
                                     .max_tasks = 4096}));
  return std::unique_ptr<Client>(new ClientImpl(
      options, pb::MasterService::NewStub(channel), std::move(transport),
      std::move(stores), std::move(bg)));
}

}  // namespace hymcache
