// EngineCaches (master/engine_caches.h): a bounded key set per engine.

#include "master/engine_caches.h"

#include <algorithm>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/status_reason.h"

namespace hymcache {
namespace master {

absl::Status EngineCachesOptions::Validate() const {
  if (max_engines > 65536) {
    return absl::InvalidArgumentError("max_engines must be 0..65536");
  }
  if (max_blocks_per_engine == 0 || max_blocks_per_engine > (1u << 24)) {
    return absl::InvalidArgumentError("max_blocks_per_engine must be 1..2^24");
  }
  if (max_blocks == 0 || max_blocks > (uint64_t{1} << 26)) {
    return absl::InvalidArgumentError("max_blocks must be 1..2^26");
  }
  if (ttl < absl::Seconds(1) || ttl > absl::Hours(1)) {
    return absl::InvalidArgumentError("engine ttl must be 1 s..1 h");
  }
  return absl::OkStatus();
}

EngineCaches::EngineCaches(const EngineCachesOptions& options)
    : options_(options) {}

uint64_t EngineCaches::HashOf(absl::string_view key) {
  return absl::HashOf(key);
}

size_t EngineCaches::CapLocked() const {
  if (blocks_ <= options_.max_blocks || engines_.empty()) {
    return options_.max_blocks_per_engine;
  }
  return std::max<size_t>(
      1, std::min<uint64_t>(options_.max_blocks_per_engine,
                            options_.max_blocks / engines_.size()));
}

void EngineCaches::ExpireLocked(absl::Time now) {
  for (auto it = engines_.begin(); it != engines_.end();) {
    if (now - it->second.last_report >= options_.ttl) {
      blocks_ -= it->second.order.size();
      engines_.erase(it++);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<uint64_t> EngineCaches::Apply(absl::string_view tenant,
                                             absl::string_view engine_id,
                                             const Report& report,
                                             absl::Time now) {
  if (engine_id.empty() || engine_id.size() > kMaxEngineIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportEngineBlocks: an engine id of ", engine_id.size(),
                     " bytes (1..", kMaxEngineIdBytes, ")"));
  }
  if (options_.max_engines == 0) {
    return WithReason(
        absl::FailedPreconditionError(
            "ReportEngineBlocks: this master keeps no engines' caches "
            "(--max_engines=0)"),
        StatusReason::kEngineReportsOff);
  }
  MutexLock l(&mu_);
  ExpireLocked(now);
  EngineKey id{std::string(tenant), std::string(engine_id)};
  auto it = engines_.find(id);
  if (it == engines_.end()) {
    if (engines_.size() >= options_.max_engines) {
      return WithReason(
          absl::ResourceExhaustedError(absl::StrCat(
              "ReportEngineBlocks: the master keeps ", options_.max_engines,
              " engines already (--max_engines); a new one is known once "
              "one of them has not reported for ",
              absl::FormatDuration(options_.ttl))),
          StatusReason::kEnginesFull);
    }
    it = engines_.try_emplace(std::move(id)).first;
  }
  Engine& e = it->second;
  e.last_report = now;
  if (report.cleared) {
    blocks_ -= e.order.size();
    e.order.clear();
    e.where.clear();
  }
  if (report.removed != nullptr) {
    for (const std::string& key : *report.removed) {
      auto w = e.where.find(HashOf(key));
      if (w == e.where.end()) continue;
      e.order.erase(w->second);
      e.where.erase(w);
      --blocks_;
    }
  }
  if (report.stored != nullptr) {
    for (const std::string& key : *report.stored) {
      const uint64_t h = HashOf(key);
      auto [w, inserted] = e.where.try_emplace(h);
      if (!inserted) {
        // Reported again: now the newest.
        e.order.splice(e.order.end(), e.order, w->second);
        continue;
      }
      w->second = e.order.insert(e.order.end(), h);
      ++blocks_;
    }
  }
  for (const size_t cap = CapLocked(); e.order.size() > cap;) {
    e.where.erase(e.order.front());
    e.order.pop_front();
    --blocks_;
  }
  return static_cast<uint64_t>(e.order.size());
}

std::vector<std::pair<std::string, uint32_t>> EngineCaches::LongestPrefixes(
    absl::string_view tenant,
    const google::protobuf::RepeatedPtrField<std::string>& keys,
    absl::Time now) const {
  std::vector<std::pair<std::string, uint32_t>> out;
  if (keys.empty()) return out;
  ReaderMutexLock l(&mu_);
  for (const auto& [id, e] : engines_) {
    if (id.first != tenant || now - e.last_report >= options_.ttl) continue;
    uint32_t n = 0;
    while (n < static_cast<uint32_t>(keys.size()) &&
           e.where.contains(HashOf(keys[n]))) {
      ++n;
    }
    if (n > 0) out.emplace_back(id.second, n);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  return out;
}

size_t EngineCaches::engines(absl::Time now) const {
  ReaderMutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [id, e] : engines_) {
    if (now - e.last_report < options_.ttl) ++n;
  }
  return n;
}

uint64_t EngineCaches::blocks() const {
  ReaderMutexLock l(&mu_);
  return blocks_;
}

}  // namespace master
}  // namespace hymcache
