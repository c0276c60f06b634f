#include "common/status_reason.h"

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "catch2/catch.hpp"
#include "common/grpc_status.h"
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

TEST_CASE("A not-leader status names the leader and its epoch") {
  absl::Status s = NotLeaderError("standing by", {"10.0.0.2:50051", 42});
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(ReasonOf(s) == StatusReason::kNotLeader);
  std::optional<LeaderHint> hint = LeaderHintOf(s);
  REQUIRE(hint.has_value());
  CHECK(hint->address == "10.0.0.2:50051");
  CHECK(hint->epoch == 42);
  std::optional<LeaderHint> none = LeaderHintOf(NotLeaderError("no leader", {}));
  REQUIRE(none.has_value());
  CHECK(none->address.empty());
  CHECK(none->epoch == 0);
  CHECK_FALSE(LeaderHintOf(absl::UnavailableError("x")).has_value());
  absl::Status bad = absl::UnavailableError("x");
  bad.SetPayload(kLeaderHintUrl, absl::Cord("nope"));
  CHECK_FALSE(LeaderHintOf(bad).has_value());
}

TEST_CASE("The reason and the leader hint cross gRPC with the status") {
  absl::Status sent = NotLeaderError("standing by", {"[::1]:7", 9});
  sent.SetPayload("type.example.com/other", absl::Cord("not ours"));
  grpc::Status wire = ToGrpcStatus(sent);
  CHECK(wire.error_code() == grpc::StatusCode::UNAVAILABLE);
  absl::Status got = FromGrpcStatus(wire, "PutStart");
  CHECK(got.code() == absl::StatusCode::kUnavailable);
  CHECK(got.message() == "PutStart: standing by");
  CHECK(ReasonOf(got) == StatusReason::kNotLeader);
  REQUIRE(LeaderHintOf(got).has_value());
  CHECK(LeaderHintOf(got)->address == "[::1]:7");
  CHECK(LeaderHintOf(got)->epoch == 9);
  CHECK_FALSE(got.GetPayload("type.example.com/other").has_value());
  // A status without payloads sends no details; foreign details are ignored.
  CHECK(ToGrpcStatus(absl::NotFoundError("x")).error_details().empty());
  absl::Status foreign = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "m", "\x08\x0e"));
  CHECK(ReasonOf(foreign) == StatusReason::kNone);
}

}  // namespace
}  // namespace hymcache
