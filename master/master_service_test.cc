// MasterService tests: options, key checks shared by every call, store
// failures, concurrency (master_service.cc).
// The shared Harness is in master_service_test_fixture.h.

#include <catch2/catch.hpp>

#include "master/master_service_test_fixture.h"

namespace hymcache {
namespace master {
namespace service_test {
namespace {

TEST_CASE("MasterServiceOptions validation") {
  MasterServiceOptions o;
  CHECK(o.Validate().ok());
  o.node_timeout = absl::ZeroDuration();
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  o = MasterServiceOptions();
  o.heartbeat_interval = absl::Seconds(20);
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  o = MasterServiceOptions();
  o.put_timeout = absl::ZeroDuration();
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  o = MasterServiceOptions();
  o.max_batch_keys = 0;
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  o = MasterServiceOptions();
  o.max_key_bytes = 70000;
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  o = MasterServiceOptions();
  o.max_object_bytes = uint64_t{1} << 50;
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  CHECK(MasterService::Create(MasterServiceOptions(), nullptr).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("PutStart, BatchLookup and Remove validate their input") {
  Harness h("validate");
  h.Register("a", 1, {{0, 1 << 20}});
  auto put = [&](v1::PutStartRequest r) {
    return h.svc->PutStart(r).status().code();
  };
  CHECK(put(PutReq({}, {})) == StatusCode::kInvalidArgument);
  std::vector<std::string> too_many(1025, "k");
  for (size_t i = 0; i < too_many.size(); ++i) too_many[i] += std::to_string(i);
  CHECK(put(PutReq(too_many, std::vector<uint64_t>(1025, 1))) ==
        StatusCode::kInvalidArgument);
  too_many.pop_back();
  CHECK(put(PutReq(too_many, std::vector<uint64_t>(1024, 1))) ==
        StatusCode::kOk);
  CHECK(put(PutReq({""}, {1})) == StatusCode::kInvalidArgument);
  CHECK(put(PutReq({std::string(257, 'k')}, {1})) ==
        StatusCode::kInvalidArgument);
  CHECK(put(PutReq({std::string(256, 'k')}, {1})) == StatusCode::kOk);
  CHECK(put(PutReq({"a", "b"}, {1})) == StatusCode::kInvalidArgument);
  CHECK(put(PutReq({"a"}, {1, 2})) == StatusCode::kInvalidArgument);
  CHECK(put(PutReq({"a"}, {0})) == StatusCode::kInvalidArgument);
  CHECK(put(PutReq({"a"}, {(uint64_t{1} << 30) + 1})) ==
        StatusCode::kInvalidArgument);
  CHECK(put(PutReq({"a", "b", "a"}, {1, 1, 1})) ==
        StatusCode::kInvalidArgument);
  CHECK(put(PutReq({"a"}, {1}, 42)) == StatusCode::kNotFound);

  CHECK(h.svc->BatchLookup(LookupReq({})).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(h.svc->BatchLookup(LookupReq({"a", ""})).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(h.svc->BatchLookup(LookupReq({std::string(257, 'x')})).status().code() ==
        StatusCode::kInvalidArgument);
  v1::RemoveRequest rm;
  CHECK(h.svc->Remove(rm).status().code() == StatusCode::kInvalidArgument);
  rm.add_keys(std::string(300, 'x'));
  CHECK(h.svc->Remove(rm).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("A failed store write changes nothing") {
  FakeClock clock;
  auto fake = std::make_unique<FakeMetadataStore>();
  FakeMetadataStore* store = fake.get();
  MasterServiceOptions o;
  o.max_pending_share_per_caller = 1.0;  // fills one node
  o.clock = &clock;
  auto svc = MasterService::Create(o, std::move(fake));
  REQUIRE(svc.ok());
  MasterService& s = **svc;
  REQUIRE(Reg(&s, NodeReq("a", 1, {{0, 1 << 20}})).ok());
  auto put = s.PutStart(PutReq({"k1", "k2"}, {10, 10}));
  REQUIRE(put.ok());

  store->FailWritesForTest(absl::UnavailableError("disk on fire"));
  v1::PutCommitRequest c;
  c.set_put_id(put->put_id());
  AddReceipts(*put, &c);
  CHECK(s.PutCommit(c).status().code() == StatusCode::kUnavailable);
  CHECK_FALSE(s.BatchLookup(LookupReq({"k1"}))->results(0).found());
  CHECK(s.GetStats().pending_puts() == 1);
  CHECK(s.PutStart(PutReq({"k3"}, {10})).status().code() ==
        StatusCode::kUnavailable);  // no generation
  CHECK(s.GetStats().nodes(0).used_bytes() == 128);
  CHECK(Reg(&s, NodeReq("b", 1, {{0, 4096}})).status().code() ==
        StatusCode::kUnavailable);
  CHECK(s.ListNodes().nodes_size() == 1);

  store->FailWritesForTest(absl::OkStatus());
  auto ok = s.PutCommit(c);
  REQUIRE(ok.ok());
  CHECK(ok->committed() == 2);
  CHECK(store->object_count() == 2);
  CHECK(s.BatchLookup(LookupReq({"k1", "k2"}))->hit_prefix_length() == 2);

  store->FailWritesForTest(absl::UnavailableError("again"));
  v1::RemoveRequest rm;
  rm.add_keys("k1");
  CHECK(s.Remove(rm).status().code() == StatusCode::kUnavailable);
  CHECK(s.BatchLookup(LookupReq({"k1"}))->results(0).found());
}

TEST_CASE("Concurrent puts and lookups") {
  Harness h("concurrent");
  h.Register("a", 1, {{0, 64 << 20}});
  h.Register("b", 1, {{0, 64 << 20}}, 7100);
  {
    std::vector<Thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back("svc-test", [&h, t] {
        for (int i = 0; i < 200; ++i) {
          std::string key = "t" + std::to_string(t) + "-" + std::to_string(i);
          auto r = h.svc->PutStart(PutReq({key, key + "x"}, {100, 100}));
          if (!r.ok() || r->put_id() == 0) continue;
          v1::PutCommitRequest c;
          c.set_put_id(r->put_id());
          AddReceipts(*r, &c);
          h.svc->PutCommit(c).IgnoreError();
          h.svc->BatchLookup(LookupReq({key, key + "x"})).IgnoreError();
          if (i % 10 == 0) h.svc->ReapExpired();
          if (i % 20 == 0) h.svc->GetStats();
        }
      });
    }
  }
  CHECK(h.svc->GetStats().object_count() == 4 * 200 * 2);
}

TEST_CASE("MasterServiceOptions validates read_lease") {
  MasterServiceOptions o;
  o.max_pending_share_per_caller = 1.0;  // fills one node
  CHECK(o.read_lease == absl::Seconds(5));
  CHECK(o.max_evictions_per_put == 4096);
  o.read_lease = absl::ZeroDuration();
  CHECK(o.Validate().ok());
  o.read_lease = -absl::Milliseconds(1);
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  o.read_lease = absl::Hours(25);
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace service_test
}  // namespace master
}  // namespace hymcache
