#include "common/status_reason.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hymcache {
namespace {

constexpr uint32_t kLastReason = 0
#define HYMCACHE_STATUS_REASON_COUNT(name, str, doc) +1
    HYMCACHE_STATUS_REASONS(HYMCACHE_STATUS_REASON_COUNT)
#undef HYMCACHE_STATUS_REASON_COUNT
    ;

}  // namespace

absl::Status WithReason(absl::Status s, StatusReason reason) {
  if (s.ok()) return s;
  if (reason == StatusReason::kNone) {
    s.ErasePayload(kStatusReasonUrl);
  } else {
    s.SetPayload(kStatusReasonUrl,
                 absl::Cord(std::to_string(static_cast<uint32_t>(reason))));
  }
  return s;
}

StatusReason ReasonOf(const absl::Status& s) {
  if (s.ok()) return StatusReason::kNone;
  absl::optional<absl::Cord> p = s.GetPayload(kStatusReasonUrl);
  if (!p) return StatusReason::kNone;
  uint32_t v = 0;
  if (!absl::SimpleAtoi(std::string(*p), &v) || v > kLastReason) {
    return StatusReason::kNone;
  }
  return static_cast<StatusReason>(v);
}

absl::string_view ReasonName(StatusReason reason) {
  switch (reason) {
    case StatusReason::kNone:
      return "none";
#define HYMCACHE_STATUS_REASON_NAME(name, str, doc) \
  case StatusReason::name:                          \
    return str;
      HYMCACHE_STATUS_REASONS(HYMCACHE_STATUS_REASON_NAME)
#undef HYMCACHE_STATUS_REASON_NAME
  }
  return "unknown";
}

absl::Status NotLeaderError(absl::string_view message, const LeaderHint& hint) {
  absl::Status s =
      WithReason(absl::UnavailableError(message), StatusReason::kNotLeader);
  s.SetPayload(kLeaderHintUrl,
               absl::Cord(absl::StrCat(hint.epoch, " ", hint.address)));
  return s;
}

std::optional<LeaderHint> LeaderHintOf(const absl::Status& s) {
  if (s.ok()) return std::nullopt;
  absl::optional<absl::Cord> p = s.GetPayload(kLeaderHintUrl);
  if (!p) return std::nullopt;
  const std::string v(*p);
  const size_t space = v.find(' ');
  if (space == std::string::npos) return std::nullopt;
  LeaderHint hint;
  if (!absl::SimpleAtoi(v.substr(0, space), &hint.epoch) || hint.epoch < 0) {
    return std::nullopt;
  }
  hint.address = v.substr(space + 1);
  return hint;
}

}  // namespace hymcache
