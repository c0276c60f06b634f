// FakeMetadataStore: an in-memory MetadataStore for tests, with failure
// injection. Testonly.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "master/metadata_store.h"

namespace hymcache {
namespace master {

class FakeMetadataStore : public MetadataStore {
 public:
  FakeMetadataStore() = default;

  absl::Status Apply(const MetadataMutation& mutation) override {
    MutexLock l(&mu_);
    if (!fail_writes_.ok()) return fail_writes_;
    for (const auto& k : mutation.delete_objects) {
      objects_.erase(k);
      uses_.erase(k);
    }
    for (const auto& [k, r] : mutation.put_objects) objects_[k] = r;
    for (const auto& [k, ms] : mutation.object_uses) uses_[k] = ms;
    for (const auto& n : mutation.delete_nodes) nodes_.erase(n);
    for (const auto& n : mutation.put_nodes) nodes_[n.name()] = n;
    ++writes_;
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> NextGeneration() override {
    MutexLock l(&mu_);
    if (!fail_writes_.ok()) return fail_writes_;
    return next_generation_++;
  }
  uint64_t GenerationCeiling() override {
    MutexLock l(&mu_);
    return next_generation_ + (uint64_t{1} << 20);
  }
  absl::Status ForEachObject(
      const std::function<void(absl::string_view, const ObjectRecord&)>& fn)
      override {
    MutexLock l(&mu_);
    for (const auto& [k, r] : objects_) {
      auto use = uses_.find(k);
      if (use == uses_.end() || use->second <= r.last_use_ms) {
        fn(k, r);
        continue;
      }
      ObjectRecord later = r;
      later.last_use_ms = use->second;
      fn(k, later);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<hymcache::v1::NodeInfo>> LoadNodes() override {
    MutexLock l(&mu_);
    std::vector<hymcache::v1::NodeInfo> out;
    for (const auto& [name, n] : nodes_) out.push_back(n);
    return out;
  }

  // Every later write (Apply, NextGeneration) fails with `status` until
  // called again with OkStatus().
  void FailWritesForTest(absl::Status status) {
    MutexLock l(&mu_);
    fail_writes_ = std::move(status);
  }
  size_t object_count() const {
    MutexLock l(&mu_);
    return objects_.size();
  }
  uint64_t writes() const {
    MutexLock l(&mu_);
    return writes_;
  }

 private:
  mutable Mutex mu_;
  absl::Status fail_writes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ObjectRecord> objects_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> uses_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, hymcache::v1::NodeInfo> nodes_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace master
}  // namespace hymcache
