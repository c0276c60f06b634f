#include "client/client_impl.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace hymcache {

absl::StatusOr<std::unique_ptr<Client>> NewClientImpl(
    const ClientOptions& options, std::shared_ptr<MasterClient> master,
    std::shared_ptr<Transport> transport, Clock* clock,
    std::shared_ptr<DeviceMemory> device) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<Executor> stores,
      Executor::Create(
          {.name = "hym-store",
           .threads = options.store_threads,
           .max_tasks = static_cast<size_t>(options.max_pending_stores)}));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Executor> bg,
      Executor::Create({.name = "hym-bg", .threads = 1, .max_tasks = 4096}));
  return std::unique_ptr<Client>(
      new ClientImpl(options, std::move(master), std::move(transport), clock,
                     std::move(stores), std::move(bg),
                     device != nullptr ? std::move(device)
                                       : std::shared_ptr<DeviceMemory>(
                                             NewNoDeviceMemory())));
}

RemoteRef ToRemoteRef(const ObjectLocation& l) {
  RemoteRef r{l.region_id, l.addr, l.length, l.generation};
  r.cap.expires_unix_ms = l.capability.expires_unix_ms;
  r.cap.rights = l.capability.rights;
  static_assert(sizeof(r.cap.tag) == sizeof(l.capability.tag));
  std::memcpy(r.cap.tag, l.capability.tag.data(), sizeof(r.cap.tag));
  return r;
}

ClientImpl::ClientImpl(const ClientOptions& options,
                       std::shared_ptr<MasterClient> master,
                       std::shared_ptr<Transport> transport, Clock* clock,
                       std::unique_ptr<Executor> store_executor,
                       std::unique_ptr<Executor> bg_executor,
                       std::shared_ptr<DeviceMemory> device)
    : options_(options),
      master_(std::move(master)),
      transport_(std::move(transport)),
      device_(std::move(device)),
      clock_(clock),
      unresponsive_(clock, options.unresponsive_node_period),
      locations_(clock, options.location_cache_entries,
                 options.location_cache_ttl),
      store_executor_(std::move(store_executor)),
      bg_executor_(std::move(bg_executor)) {}

ClientImpl::~ClientImpl() {
  // Stores and background work finish first (each is bounded by its
  // deadline); the MasterClient then waits for its own calls in flight.
  store_executor_.reset();
  bg_executor_.reset();
}

absl::StatusOr<LookupResult> ClientImpl::BatchLookup(
    absl::Span<const std::string> keys, const CallOptions& call) {
  RETURN_IF_ERROR(CheckKeys(keys));
  LookupResult out;
  RETURN_IF_ERROR(
      Lookup(keys, LookupIntent::kPeek, Deadline(call.deadline), &out));
  return out;
}

absl::StatusOr<ExistsResult> ClientImpl::Exists(
    absl::Span<const std::string> keys, const CallOptions& call) {
  RETURN_IF_ERROR(CheckKeys(keys));
  LookupResult got;
  RETURN_IF_ERROR(
      Lookup(keys, LookupIntent::kExists, Deadline(call.deadline), &got));
  ExistsResult out;
  out.found = std::move(got.found);
  out.hit_prefix = got.hit_prefix;
  return out;
}

absl::StatusOr<std::vector<bool>> ClientImpl::Remove(
    absl::Span<const std::string> keys, const CallOptions& call) {
  RETURN_IF_ERROR(CheckKeys(keys));
  locations_.Erase(keys);
  const absl::Time deadline = Deadline(call.deadline);
  std::vector<bool> out;
  for (size_t begin = 0; begin < keys.size();
       begin += options_.max_keys_per_rpc) {
    size_t n = std::min<size_t>(keys.size() - begin, options_.max_keys_per_rpc);
    ASSIGN_OR_RETURN(std::vector<bool> removed,
                     master_->Remove(keys.subspan(begin, n), deadline));
    out.insert(out.end(), removed.begin(), removed.end());
  }
  return out;
}

absl::StatusOr<ClusterStatus> ClientImpl::GetClusterStatus(
    const CallOptions& call) {
  return master_->GetClusterStatus(Deadline(call.deadline));
}

absl::StatusOr<PrefixAnswer> ClientImpl::PrefixQuery(
    absl::Span<const std::string> keys, const CallOptions& call) {
  RETURN_IF_ERROR(CheckKeys(keys));
  if (keys.size() > options_.max_keys_per_rpc) {
    return absl::InvalidArgumentError(
        absl::StrCat("PrefixQuery: ", keys.size(), " keys (at most ",
                     options_.max_keys_per_rpc, ")"));
  }
  return master_->PrefixQuery(keys, Deadline(call.deadline));
}

absl::StatusOr<EngineBlocksReply> ClientImpl::ReportEngineBlocks(
    const EngineBlocksReport& report, const CallOptions& call) {
  for (const auto* list : {&report.removed, &report.stored}) {
    if (!list->empty()) RETURN_IF_ERROR(CheckKeys(*list));
  }
  const absl::Time deadline = Deadline(call.deadline);
  // Removals first, as the master applies them: each call takes the next
  // max_keys_per_rpc keys of removed then stored.
  const size_t total = report.removed.size() + report.stored.size();
  size_t sent = 0;
  EngineBlocksReply reply;
  do {
    EngineBlocksReport part;
    part.engine_id = report.engine_id;
    part.cleared = report.cleared && sent == 0;
    const size_t end = std::min(total, sent + options_.max_keys_per_rpc);
    for (size_t i = sent; i < end; ++i) {
      if (i < report.removed.size()) {
        part.removed.push_back(report.removed[i]);
      } else {
        part.stored.push_back(report.stored[i - report.removed.size()]);
      }
    }
    ASSIGN_OR_RETURN(reply, master_->ReportEngineBlocks(part, deadline));
    sent = end;
  } while (sent < total);
  return reply;
}

absl::Status ClientImpl::RegisterMemory(void* data, size_t size) {
  if (data == nullptr || size == 0) {
    return absl::InvalidArgumentError("RegisterMemory: empty range");
  }
  return transport_->RegisterMemory(data, size);
}

absl::Status ClientImpl::UnregisterMemory(void* data) {
  return transport_->UnregisterMemory(data);
}

absl::Time ClientImpl::Deadline(absl::Time requested,
                                absl::Duration default_deadline) const {
  if (requested == absl::InfinitePast()) {
    return clock_->Now() + default_deadline;
  }
  return requested;
}

absl::Status ClientImpl::CheckKeys(absl::Span<const std::string> keys) {
  if (keys.empty()) return absl::InvalidArgumentError("empty key list");
  return absl::OkStatus();
}

void ClientImpl::Remember(const PeerInfo& peer) {
  MutexLock l(&mu_);
  peers_[peer.node_id] = peer;
}

absl::StatusOr<PeerInfo> ClientImpl::Peer(uint32_t node_id) {
  MutexLock l(&mu_);
  auto it = peers_.find(node_id);
  if (it == peers_.end()) {
    return absl::UnavailableError(
        absl::StrCat("no address known for storage node ", node_id));
  }
  return it->second;
}

absl::Status ClientImpl::Lookup(absl::Span<const std::string> keys,
                                LookupIntent intent, absl::Time deadline,
                                LookupResult* out) {
  const bool exists = intent == LookupIntent::kExists;
  out->found.assign(keys.size(), false);
  out->locations.assign(exists ? 0 : keys.size(), ObjectLocation{});
  out->hit_prefix = 0;
  // As Load and Store do: a call whose deadline has passed does not start
  // (gRPC may still complete a call whose deadline passes in flight).
  if (deadline <= clock_->Now()) {
    return absl::DeadlineExceededError("BatchLookup: the deadline has passed");
  }
  bool prefix_open = true;
  for (size_t begin = 0; begin < keys.size();
       begin += options_.max_keys_per_rpc) {
    size_t n = std::min<size_t>(keys.size() - begin, options_.max_keys_per_rpc);
    absl::StatusOr<LookupBatch> batch =
        master_->Lookup(keys.subspan(begin, n), intent, deadline);
    if (!batch.ok()) {
      if (begin == 0 || batch.status().code() == absl::StatusCode::kInternal) {
        return batch.status();
      }
      break;
    }
    for (const PeerInfo& node : batch->nodes) Remember(node);
    for (size_t i = 0; i < n; ++i) {
      out->found[begin + i] = batch->found[i];
      if (batch->found[i] && !exists) {
        out->locations[begin + i] = batch->locations[i];
      }
      if (prefix_open && batch->found[i]) {
        ++out->hit_prefix;
      } else {
        prefix_open = false;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace hymcache
