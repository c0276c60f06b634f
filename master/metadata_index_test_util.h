// What the MetadataIndex tests share: the eviction walks run to a list of
// the chosen keys (metadata_index_test.cc, metadata_index_scored_test.cc).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "master/metadata_index.h"

namespace hymcache {
namespace master {
namespace index_test {

using Keys = std::vector<std::string>;
using Verdict = MetadataIndex::Verdict;
using WalkEnd = MetadataIndex::WalkEnd;
using Judge = std::function<Verdict(absl::string_view)>;

// The walk's judge: `judge` of the key (default: everything may go).
inline auto JudgeBy(const Judge& judge) {
  return [&judge](absl::string_view k, const ObjectLocation&, uint32_t) {
    return judge ? judge(k) : Verdict::kEvict;
  };
}

// The walk's take: appends to `out` until it holds `want` keys.
inline auto TakeInto(Keys& out, size_t want) {
  return [&out, want](absl::string_view k, const ObjectLocation&) {
    out.emplace_back(k);
    return out.size() < want;
  };
}

// PickEvictions with `judge`, taking at most `want` entries; returns the
// chosen keys in order, and in *end why the walk ended.
inline Keys Pick(const MetadataIndex& index, uint32_t node, size_t want,
                 const Judge& judge = nullptr, size_t max_scan = 1000,
                 WalkEnd* end = nullptr) {
  Keys out;
  WalkEnd e =
      index.PickEvictions(node, max_scan, JudgeBy(judge), TakeInto(out, want));
  if (end != nullptr) *end = e;
  return out;
}

// PickEvictionsScored the same way, with a pool of `pool` and `score`.
inline Keys PickScored(
    const MetadataIndex& index, uint32_t node, size_t want, size_t pool,
    const std::function<double(const MetadataIndex::Candidate&)>& score,
    const Judge& judge = nullptr, size_t max_scan = 1000,
    WalkEnd* end = nullptr) {
  Keys out;
  WalkEnd e = index.PickEvictionsScored(node, max_scan, pool, JudgeBy(judge),
                                        score, TakeInto(out, want));
  if (end != nullptr) *end = e;
  return out;
}

}  // namespace index_test
}  // namespace master
}  // namespace hymcache
