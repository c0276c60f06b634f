#include "tools/bench/ha_bench_chains.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/wire.h"
#include "master/proving_heartbeat.h"

namespace hymcache::bench {

PutChain::PutChain(v1::MasterService::Stub* stub, const HmacSha256* node_key,
                   StandbyConfirmer* confirmer, int keys_per_put,
                   std::string prefix, absl::Time end,
                   std::function<void()> done)
    : stub_(stub),
      node_key_(node_key),
      confirmer_(confirmer),
      keys_per_put_(keys_per_put),
      prefix_(std::move(prefix)),
      end_(end),
      done_(std::move(done)) {}

void PutChain::Next() {
  if (absl::Now() >= end_) {
    done_();
    return;
  }
  start_req_.Clear();
  for (int k = 0; k < keys_per_put_; ++k) {
    start_req_.add_keys(absl::StrCat(prefix_, n_, "-", k));
    start_req_.add_lengths(4096);
  }
  ++n_;
  started_ = absl::Now();
  start_resp_.Clear();
  start_ctx_ = std::make_unique<grpc::ClientContext>();
  stub_->async()->PutStart(start_ctx_.get(), &start_req_, &start_resp_,
                           [this](grpc::Status st) { OnStarted(st); });
}

void PutChain::OnStarted(const grpc::Status& st) {
  if (!st.ok() || start_resp_.put_id() == 0) {
    ++failures;
    Next();
    return;
  }
  commit_req_.Clear();
  commit_req_.set_put_id(start_resp_.put_id());
  master::AddWriteReceipts(start_resp_, *node_key_, &commit_req_);
  commit_resp_.Clear();
  commit_ctx_ = std::make_unique<grpc::ClientContext>();
  stub_->async()->PutCommit(commit_ctx_.get(), &commit_req_, &commit_resp_,
                            [this](grpc::Status st) { OnCommitted(st); });
}

void PutChain::OnCommitted(const grpc::Status& st) {
  if (st.ok() && StandbyConfirmer::NeedsConfirm(commit_resp_)) {
    // The put counts once the standbys hold it, as the SDK counts it.
    confirmer_->ConfirmAsync(
        commit_resp_, absl::Now() + kConfirmTimeout,
        [this](absl::Status confirmed) { OnConfirmed(confirmed.ok()); });
    return;
  }
  OnConfirmed(st.ok());
}

void PutChain::OnConfirmed(bool ok) {
  if (!ok || commit_resp_.committed() != static_cast<uint32_t>(keys_per_put_)) {
    ++failures;
  } else {
    ++puts;
    times.push_back(absl::Now() - started_);
    keys.insert(keys.end(), start_req_.keys().begin(), start_req_.keys().end());
  }
  Next();
}

void FillLookup(const std::vector<std::string>& keys, int batch, bool packed,
                std::mt19937_64* rng, v1::BatchLookupRequest* req) {
  std::uniform_int_distribution<size_t> pick(0, keys.size() - 1);
  req->Clear();
  for (int k = 0; k < batch; ++k) req->add_keys(keys[pick(*rng)]);
  req->set_packed(packed);
}

uint64_t MissesOf(const v1::BatchLookupResponse& resp) {
  uint64_t misses = 0;
  const std::string& packed = resp.packed_results();
  for (size_t at = 0; at + wire::kLookupRecordBytes <= packed.size();
       at += wire::kLookupRecordBytes) {
    uint32_t node_id;
    std::memcpy(&node_id, packed.data() + at, sizeof(node_id));
    if (node_id == 0) ++misses;
  }
  for (const auto& e : resp.results()) {
    if (!e.found()) ++misses;
  }
  return misses;
}

LookupChain::LookupChain(v1::MasterService::Stub* stub,
                         const std::vector<std::string>* keys, int batch,
                         bool packed, uint64_t seed, absl::Time end,
                         std::function<void()> done)
    : stub_(stub),
      keys_(keys),
      batch_(batch),
      packed_(packed),
      rng_(seed),
      end_(end),
      done_(std::move(done)) {}

void LookupChain::Next() {
  if (absl::Now() >= end_) {
    done_();
    return;
  }
  FillLookup(*keys_, batch_, packed_, &rng_, &req_);
  resp_.Clear();
  ctx_ = std::make_unique<grpc::ClientContext>();
  stub_->async()->BatchLookup(ctx_.get(), &req_, &resp_,
                              [this](grpc::Status st) { OnAnswered(st); });
}

void LookupChain::OnAnswered(const grpc::Status& st) {
  if (!st.ok()) {
    if (failures++ == 0) first_error = st.error_message();
  } else {
    ++lookups;
    misses += MissesOf(resp_);
  }
  Next();
}

}  // namespace hymcache::bench
