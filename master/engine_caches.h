// EngineCaches: which blocks each serving engine holds in its own cache
// (its GPU's prefix cache), as the engines report them, so that PrefixQuery
// answers a router's "longest prefix per engine" beside "per node"
// (docs/deployment.md, "KV events").
//
// An engine is named by its tenant and an id it chooses (1..128 bytes). Its
// reporter (hymcache.engine_blocks, which follows vLLM's own KV events)
// sends the keys the engine's cache gained and lost since its last report;
// the master keeps them in a bounded set per engine, each key as a 64-bit
// hash (about 60 bytes a key in all; two keys of one chain colliding, at
// odds of 2^-64, would make a router's guess wrong, never a read):
// - at most max_blocks_per_engine keys, and at most its share of
//   max_blocks (max_blocks / engines known) when the engines hold more than
//   max_blocks in all: beyond that, the keys reported longest ago go first
//   (an engine's cache is bounded too, so a set that outgrows it has missed
//   removals, and its oldest keys are the likeliest stale). An engine over
//   its share after another joined is trimmed at its next report, so the
//   keys held stay below about twice max_blocks;
// - at most max_engines engines: a new engine beyond them is refused
//   (ResourceExhausted, reason engines_full) until one expires;
// - an engine that has not reported for `ttl` is forgotten (its engine
//   died, or its reporter did; a new leader knows no engine until each
//   reports again). A reporter resends its whole set when the count it is
//   answered differs from its own, so a new leader, a forgotten engine or a
//   trimmed set heals at the next report.
//
// Nothing here is durable or replicated: it is advice for routers, and a
// missing engine costs a router a cache hit, never a wrong answer.
//
// Thread safety: safe for concurrent use (its own leaf mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/limits.h"
#include "common/mutex.h"
#include "google/protobuf/repeated_field.h"

namespace hymcache {
namespace master {

struct EngineCachesOptions {
  // Engines known at once. 0: engine reports are refused (FailedPrecondition,
  // reason engine_reports_off). 0..65536. Default: 256.
  uint32_t max_engines = 256;
  // Keys kept per engine. 1..2^24. Default: 262144 (a large GPU's prefix
  // cache in 16-token blocks).
  uint32_t max_blocks_per_engine = 262144;
  // Keys kept for all engines together (see the file comment). 1..2^26.
  // Default: 4,194,304 (about 256 MiB of the master's memory).
  uint64_t max_blocks = uint64_t{1} << 22;
  // An engine not reported for this long is forgotten. 1 s..1 h. Default:
  // 60 s (reporters report at least every ttl / 4).
  absl::Duration ttl = absl::Seconds(60);

  absl::Status Validate() const;
};

class EngineCaches {
 public:
  explicit EngineCaches(const EngineCachesOptions& options);

  struct Report {
    // Applied in this order: every key dropped, then `removed`, then
    // `stored`.
    bool cleared = false;
    const google::protobuf::RepeatedPtrField<std::string>* removed = nullptr;
    const google::protobuf::RepeatedPtrField<std::string>* stored = nullptr;
  };
  // Applies one report of engine `engine_id` of `tenant` at `now` and
  // answers how many keys the master now holds for it. InvalidArgument for
  // an empty or too long id; ResourceExhausted (engines_full) for a new
  // engine beyond max_engines; FailedPrecondition (engine_reports_off)
  // when max_engines is 0.
  absl::StatusOr<uint64_t> Apply(absl::string_view tenant,
                                 absl::string_view engine_id,
                                 const Report& report, absl::Time now);

  // Per engine of `tenant` whose cache holds keys[0]: how many leading keys
  // it holds, longest first (ties by id). Expired engines are skipped.
  std::vector<std::pair<std::string, uint32_t>> LongestPrefixes(
      absl::string_view tenant,
      const google::protobuf::RepeatedPtrField<std::string>& keys,
      absl::Time now) const;

  // Engines known (not yet expired at `now`) and keys held in all.
  size_t engines(absl::Time now) const;
  uint64_t blocks() const;

 private:
  struct Engine {
    absl::Time last_report;
    // Keys' hashes, oldest report first; `where` finds each in it.
    std::list<uint64_t> order;
    absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> where;
  };
  using EngineKey = std::pair<std::string, std::string>;  // tenant, id

  static uint64_t HashOf(absl::string_view key);
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What one engine may hold now (max_blocks_per_engine, or its share of
  // max_blocks when the engines hold more).
  size_t CapLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EngineCachesOptions options_;
  mutable Mutex mu_;
  absl::flat_hash_map<EngineKey, Engine> engines_ ABSL_GUARDED_BY(mu_);
  uint64_t blocks_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace master
}  // namespace hymcache
