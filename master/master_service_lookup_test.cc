// MasterService tests: BatchLookup, Remove and its cascade, ListObjects
// (master_service_lookup.cc).
// The shared Harness is in master_service_test_fixture.h.

#include <catch2/catch.hpp>

#include "master/master_service_test_fixture.h"

namespace hymcache {
namespace master {
namespace service_test {
namespace {

TEST_CASE("BatchLookup reports the hit prefix and the nodes referenced") {
  Harness h("lookup");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  CHECK(h.Put({"b0", "b1"}) == a);
  CHECK(h.Put({"b2"}) == b);
  h.Put({"b4"});

  auto l = h.Lookup({"b0", "b1", "b2", "b3", "b4"});
  CHECK(l.hit_prefix_length() == 3);
  CHECK(l.results(4).found());
  CHECK(l.nodes_size() == 2);
  std::set<uint32_t> ids;
  for (const auto& n : l.nodes()) {
    ids.insert(n.node_id());
    CHECK(n.alive());
    CHECK(n.transport_params().at("tcp") == "yes");
  }
  CHECK(ids == std::set<uint32_t>{a, b});
  CHECK(h.Lookup({"nope", "b0"}).hit_prefix_length() == 0);
  auto only_a = h.Lookup({"b0", "b0"});  // duplicates are fine
  CHECK(only_a.hit_prefix_length() == 2);
  CHECK(only_a.nodes_size() == 1);
}

TEST_CASE(
    "An existence check answers a bitmap and the hit prefix, signing "
    "nothing") {
  Harness h("exists");
  h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"e0", "e1"});
  h.Put({"e3"});
  const std::vector<std::string> keys = {"e0", "e1", "e2", "e3", "e4",
                                         "e5", "e6", "e7", "e0"};
  v1::BatchLookupRequest req = LookupReq(keys);
  req.set_exists_only(true);
  req.set_packed(true);  // as the client asks: exists_only wins
  auto r = h.svc->BatchLookup(req);
  REQUIRE(r.ok());
  CHECK(r->results_size() == 0);
  CHECK(r->packed_results().empty());
  CHECK(r->nodes_size() == 0);
  CHECK(r->hit_prefix_length() == 2);
  // e0, e1, e3 and e0 again: bits 0, 1, 3 and 8.
  REQUIRE(r->found_bits().size() == 2);
  CHECK(static_cast<uint8_t>(r->found_bits()[0]) == 0b1011);
  CHECK(static_cast<uint8_t>(r->found_bits()[1]) == 0b1);
  // The same as a lookup finds.
  auto l = h.Lookup(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    CHECK(
        l.results(static_cast<int>(i)).found() ==
        (((static_cast<uint8_t>(r->found_bits()[i / 8]) >> (i % 8)) & 1) == 1));
  }
  // It neither reads nor ends a chain.
  req.set_for_read(true);
  CHECK(h.svc->BatchLookup(req).status().code() ==
        absl::StatusCode::kInvalidArgument);
  req.set_for_read(false);
  req.set_ended(true);
  CHECK(h.svc->BatchLookup(req).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Remove deletes objects durably and frees their space") {
  Harness h("remove");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  for (const char* k : {"r1", "r2", "r3"}) h.Put({k});  // unrelated
  auto pending = h.Start({"p"}, {10});
  v1::RemoveRequest rm;
  rm.add_keys("r1");
  rm.add_keys("missing");
  rm.add_keys("r3");
  rm.add_keys("p");
  rm.add_keys("r1");
  auto r = h.svc->Remove(rm);
  REQUIRE(r.ok());
  REQUIRE(r->removed_size() == 5);
  CHECK(r->removed(0));
  CHECK_FALSE(r->removed(1));
  CHECK(r->removed(2));
  CHECK_FALSE(r->removed(3));
  CHECK_FALSE(r->removed(4));
  CHECK(h.UsedBytes(a) == 128 + 64);
  CHECK(h.Commit(pending) == 1);
  h.Restart();
  h.Rejoin("a", 1, {{0, 1 << 20}});
  auto l = h.Lookup({"r1", "r2", "r3", "p"});
  CHECK_FALSE(l.results(0).found());
  CHECK(l.results(1).found());
  CHECK_FALSE(l.results(2).found());
  CHECK(l.results(3).found());
}

TEST_CASE("Remove of a middle block removes the blocks after it") {
  Harness h("remove_cascade");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  CHECK(h.Put({"c0", "c1", "c2", "c3"}, kObj, a) == a);
  CHECK(h.PutChild({"d2"}, kObj, "c1") == a);  // a second continuation
  CHECK(h.Put({"x"}, kObj, a) == a);
  CHECK(h.Put({"y"}, kObj, b) == b);
  v1::RemoveRequest rm;
  rm.add_keys("c1");
  auto r = h.svc->Remove(rm);
  REQUIRE(r.ok());
  REQUIRE(r->removed_size() == 1);
  CHECK(r->removed(0));
  CHECK(h.Found({"c0", "c1", "c2", "c3", "d2", "x", "y"}) == "1000011");
  CHECK(h.svc->counters().orphans_removed == 3);
  CHECK(h.UsedBytes(a) == 2 * kSlot);
  CHECK(h.svc->GetStats().object_count() == 3);
  h.Restart();
  h.Rejoin("a", 1, {{0, 1 << 20}});
  h.Rejoin("b", 1, {{0, 1 << 20}}, 7100);
  CHECK(h.Found({"c0", "c1", "c2", "c3", "d2", "x", "y"}) == "1000011");
  CHECK(h.UsedBytes(a) == 2 * kSlot);

  // A block whose node refused it (read repair) takes its tail along.
  h.Put({"e0", "e1"}, kObj, a);
  const v1::BatchLookupResponse e0 = h.Lookup({"e0"});
  v1::ReportMissingRequest missing;
  missing.add_keys("e0");
  *missing.add_locations() = e0.results(0).location();
  REQUIRE(h.svc->ReportMissing(missing).ok());
  CHECK(h.Found({"e0", "e1", "c0", "x"}) == "0011");
}

TEST_CASE("ListObjects pages through every listing once, by node") {
  Harness h("list_objects");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  for (int i = 0; i < 10; ++i) h.Put({"a" + std::to_string(i)}, 64, a);
  for (int i = 0; i < 7; ++i) h.Put({"b" + std::to_string(i)}, 64, b);
  h.svc->Remove([] {
    v1::RemoveRequest r;
    r.add_keys("a3");
    return r;
  }()).IgnoreError();
  CHECK(h.Listed(a).size() == 9);
  CHECK(h.Listed(b).size() == 7);
  CHECK(h.Listed(0).size() == 16);

  // Chain links are listed (fsck checks reachability with them).
  h.Put({"c0", "c1", "c2"}, 64, a);
  uint64_t cursor = 0;
  std::map<std::string, v1::ListedObject> chain;
  bool more = true;
  while (more) {
    v1::ListObjectsResponse page;
    more = h.svc->ListObjects(a, &cursor, 100, &page);
    for (const auto& o : page.objects()) chain[o.key()] = o;
  }
  CHECK(chain.at("c0").parent_key().empty());
  CHECK(chain.at("c1").parent_key() == "c0");
  CHECK(chain.at("c2").parent_key() == "c1");
  for (const auto& [k, o] : chain) CHECK_FALSE(o.unreachable());
}

}  // namespace
}  // namespace service_test
}  // namespace master
}  // namespace hymcache
