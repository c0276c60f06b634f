#include "common/status_reason.h"

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "catch2/catch.hpp"
#include "common/status_macros.h"

namespace hymcache {
namespace {

absl::Status Refuse() {
  return WithReason(absl::ResourceExhaustedError("queue full"),
                    StatusReason::kStoreQueueFull);
}

absl::StatusOr<int> Forward() {
  RETURN_IF_ERROR(Refuse());
  return 1;
}

TEST_CASE("A reason attached to a status is read back, whatever the message says") {
  absl::Status s = WithReason(absl::ResourceExhaustedError("write buffer full"),
                              StatusReason::kNoRoom);
  CHECK(ReasonOf(s) == StatusReason::kNoRoom);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(s.message() == "write buffer full");
}

TEST_CASE("A status without a reason, and OK, have reason kNone") {
  CHECK(ReasonOf(absl::ResourceExhaustedError("stores already pending")) ==
        StatusReason::kNone);
  CHECK(ReasonOf(absl::OkStatus()) == StatusReason::kNone);
  CHECK(ReasonOf(WithReason(absl::OkStatus(), StatusReason::kNoRoom)) ==
        StatusReason::kNone);
}

TEST_CASE("The reason survives copies, moves and RETURN_IF_ERROR") {
  absl::StatusOr<int> r = Forward();
  REQUIRE_FALSE(r.ok());
  absl::Status copy = r.status();
  absl::Status moved = std::move(copy);
  CHECK(ReasonOf(moved) == StatusReason::kStoreQueueFull);
}

TEST_CASE("A new reason replaces the old one, and kNone removes it") {
  absl::Status s = WithReason(Refuse(), StatusReason::kNodeRefusedWrite);
  CHECK(ReasonOf(s) == StatusReason::kNodeRefusedWrite);
  CHECK(ReasonOf(WithReason(s, StatusReason::kNone)) == StatusReason::kNone);
}

TEST_CASE("A payload this build does not know reads as kNone") {
  absl::Status s = absl::ResourceExhaustedError("x");
  s.SetPayload(kStatusReasonUrl, absl::Cord("4000000"));
  CHECK(ReasonOf(s) == StatusReason::kNone);
  s.SetPayload(kStatusReasonUrl, absl::Cord("not a number"));
  CHECK(ReasonOf(s) == StatusReason::kNone);
}

TEST_CASE("Every reason has a distinct snake_case name") {
  std::set<std::string> names;
  names.insert(std::string(ReasonName(StatusReason::kNone)));
#define NAME_OF(name, str, doc)                        \
  CHECK(ReasonName(StatusReason::name) == str);        \
  names.insert(std::string(ReasonName(StatusReason::name)));
  HYMCACHE_STATUS_REASONS(NAME_OF)
#undef NAME_OF
  size_t count = 1;
#define COUNT(name, str, doc) ++count;
  HYMCACHE_STATUS_REASONS(COUNT)
#undef COUNT
  CHECK(names.size() == count);
  for (const std::string& n : names) {
    for (char c : n) CHECK(((c >= 'a' && c <= 'z') || c == '_'));
  }
}

}  // namespace
}  // namespace hymcache
