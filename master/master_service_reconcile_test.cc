// MasterService tests: reconciliation and read repair
// (master_service_reconcile.cc).
// The shared Harness is in master_service_test_fixture.h.

#include <catch2/catch.hpp>

#include "common/status_reason.h"
#include "master/master_service_test_fixture.h"

namespace hymcache {
namespace master {
namespace service_test {
namespace {

// ------------------------------------------------------------ reconciliation

v1::Location At(uint32_t region, uint64_t addr, uint64_t length,
                uint64_t generation) {
  v1::Location l;
  l.set_region_id(region);
  l.set_addr(addr);
  l.set_length(length);
  l.set_generation(generation);
  return l;
}

TEST_CASE("A listing reconciled away takes the blocks after it; the node frees them at once") {
  Harness h("reconcile_cascade");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"c0", "c1", "c2", "c3"}, kObj);
  h.Put({"x"}, kObj);
  const v1::Location c1 = h.Lookup({"c1"}).results(0).location();
  const v1::Location c2 = h.Lookup({"c2"}).results(0).location();
  const v1::Location c3 = h.Lookup({"c3"}).results(0).location();
  // The node lost c1 (say, in a crash) but holds everything else.
  std::vector<v1::Location> held;
  for (const auto& loc : h.Listed(a)) {
    if (loc.generation() != c1.generation()) held.push_back(loc);
  }
  REQUIRE(held.size() == 4);
  const v1::ReconcileNodeResponse r = h.ReconcileWith(a, 1, held);
  CHECK(r.dropped_listings() == 1);
  CHECK(h.Found({"c0", "c1", "c2", "c3", "x"}) == "10001");
  CHECK(h.svc->counters().orphans_removed == 2);
  std::set<uint64_t> unlisted;
  for (const auto& loc : r.unlisted()) unlisted.insert(loc.generation());
  CHECK(unlisted == std::set<uint64_t>{c2.generation(), c3.generation()});
  CHECK(r.unlisted_count() == 2);
  CHECK(h.UsedBytes(a) == 2 * kSlot);
}

TEST_CASE(
    "Reconciliation drops listings a restarted node lost and frees what it "
    "holds unlisted; its objects are served meanwhile") {
  Harness h("reconcile_lost");
  const std::vector<RegionSpec> regions = {{0, 1 << 20, 64, true}};
  const uint32_t a = h.Register("a", 9, regions);
  h.Put({"k0", "k1", "k2", "k3", "k4"}, 100);
  const uint64_t used = h.UsedBytes(a);
  auto listed = h.Listed(a);
  REQUIRE(listed.size() == 5);

  // The node crashes and comes back with the same incarnation (a hybrid
  // node re-adopting its capacity file) without k3 and k4 (lost from its
  // write buffer), plus an extent the master never committed.
  auto back = Reg(h.svc.get(), NodeReq("a", 9, regions));
  REQUIRE(back.ok());
  CHECK(back->objects_retained());
  CHECK(back->reconcile());
  // Until it has reconciled its objects are served, every listing as
  // before (a reader refused for k3 would report it), but it takes no
  // placements (a put is asked to retry shortly) and is not alive.
  CHECK(h.Found({"k0", "k1", "k2", "k3", "k4"}) == "11111");
  CHECK(h.svc->ListNodes().nodes(0).awaiting_reconcile());
  CHECK_FALSE(h.svc->ListNodes().nodes(0).alive());
  const absl::Status waiting = h.svc->PutStart(PutReq({"z"}, {64})).status();
  CHECK(waiting.code() == StatusCode::kUnavailable);
  CHECK(ReasonOf(waiting) == StatusReason::kNodesRejoining);

  // The put allocated in key order: k3 and k4 have the highest
  // generations.
  std::vector<v1::Location> held = listed;
  std::sort(held.begin(), held.end(), [](const auto& x, const auto& y) {
    return x.generation() < y.generation();
  });
  held.resize(3);
  const v1::Location stray = At(0, (1 << 20) - 4096, 100, 1000000);
  held.push_back(stray);
  auto r = h.ReconcileWith(a, 9, held);
  CHECK(r.listed() == 5);
  CHECK(r.held() == 4);
  CHECK(r.matched() == 3);
  CHECK(r.dropped_listings() == 2);
  CHECK(r.unlisted_count() == 1);
  REQUIRE(r.unlisted_size() == 1);
  CHECK(r.unlisted(0).generation() == stray.generation());
  CHECK(r.unlisted(0).addr() == stray.addr());

  // Served again; the lost keys are misses, their space is free, and they
  // can be stored again (no SLOT_EXISTS forever).
  CHECK(h.Found({"k0", "k1", "k2", "k3", "k4"}) == "11100");
  CHECK(h.UsedBytes(a) == used * 3 / 5);
  auto again = h.Start({"k3", "k4"}, {100, 100});
  CHECK(again.slots(0).state() == v1::SLOT_ALLOCATED);
  CHECK(again.slots(1).state() == v1::SLOT_ALLOCATED);
  auto c = h.svc->counters();
  CHECK(c.reconciliations == 1);
  CHECK(c.reconcile_dropped_listings == 2);
  CHECK(c.reconcile_unlisted_extents == 1);
  // Durable: a restart does not bring the dropped listings back.
  h.Restart();
  h.Rejoin("a", 9, regions);
  CHECK(h.Found({"k0", "k1", "k2", "k3", "k4"}) == "11100");
}

TEST_CASE(
    "A node whose reconciliation outlasts node_timeout is served as soon as it "
    "ends, not at its next heartbeat") {
  Harness h("reconcile_long");
  const std::vector<RegionSpec> regions = {{0, 1 << 20, 64, true}};
  const uint32_t a = h.Register("a", 9, regions);
  h.Put({"k0", "k1"}, 100);
  const std::vector<v1::Location> listed = h.Listed(a);
  auto back = Reg(h.svc.get(), NodeReq("a", 9, regions));
  REQUIRE(back.ok());
  REQUIRE(back->reconcile());
  auto r = h.svc->BeginReconcile(a, 9);
  REQUIRE(r.ok());
  google::protobuf::RepeatedPtrField<v1::Location> chunk(listed.begin(),
                                                         listed.end());
  REQUIRE((*r)->Add(chunk).ok());
  // A listing that takes longer than node_timeout (10 s) to stream, from
  // the registration and from the reconciliation's start: the node sends
  // no heartbeat meanwhile.
  h.clock.Advance(absl::Seconds(6));
  CHECK(h.Found({"k0", "k1"}) == "11");  // served while reconciling
  h.clock.Advance(absl::Seconds(6));
  CHECK(h.Found({"k0", "k1"}) == "00");  // silent past node_timeout
  REQUIRE(h.svc->FinishReconcile(std::move(*r)).ok());
  CHECK(h.Found({"k0", "k1"}) == "11");
}

TEST_CASE("Reconciliation does not judge commits made while it ran, nor pending puts") {
  Harness h("reconcile_race");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"old"}, 100);
  auto old_loc = h.Listed(a);
  REQUIRE(old_loc.size() == 1);

  auto rec = h.svc->BeginReconcile(a, 1);
  REQUIRE(rec.ok());
  // The node listed its extents before these writes landed.
  auto fresh = h.Start({"fresh"}, {100});
  h.Commit(fresh);
  auto pending = h.Start({"pending"}, {100});
  // The node reports the pending put's extent (written, not committed yet)
  // and not "old".
  google::protobuf::RepeatedPtrField<v1::Location> chunk;
  const v1::Location& p = pending.slots(0).location();
  *chunk.Add() = At(p.region_id(), p.addr(), p.length(), p.generation());
  REQUIRE((*rec)->Add(chunk).ok());
  auto r = h.svc->FinishReconcile(std::move(*rec));
  REQUIRE(r.ok());
  CHECK(r->listed() == 2);
  CHECK(r->skipped_recent() == 1);
  CHECK(r->dropped_listings() == 1);  // "old"
  CHECK(r->unlisted_count() == 0);    // the pending extent is not freed
  CHECK(h.Found({"old", "fresh"}) == "01");
  CHECK(h.Commit(pending) == 1);
  CHECK(h.Found({"pending"}) == "1");
}

TEST_CASE("A reconciliation superseded by another or by a re-registration changes nothing") {
  Harness h("reconcile_superseded");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"k"}, 100);
  auto first = h.svc->BeginReconcile(a, 1);
  REQUIRE(first.ok());
  auto second = h.svc->BeginReconcile(a, 1);
  REQUIRE(second.ok());
  CHECK(h.svc->FinishReconcile(std::move(*first)).status().code() ==
        StatusCode::kAborted);
  REQUIRE(Reg(h.svc.get(), NodeReq("a", 1, {{0, 1 << 20}})).ok());
  CHECK(h.svc->FinishReconcile(std::move(*second)).status().code() ==
        StatusCode::kAborted);
  // Another incarnation or an unknown node cannot begin one.
  CHECK(h.svc->BeginReconcile(a, 2).status().code() ==
        StatusCode::kFailedPrecondition);
  CHECK(h.svc->BeginReconcile(99, 1).status().code() == StatusCode::kNotFound);
  // Nothing was dropped: the node still awaits a real reconciliation.
  auto r = h.ReconcileWith(a, 1, h.Listed(a));
  CHECK(r.matched() == 1);
  CHECK(h.Found({"k"}) == "1");
}

TEST_CASE("Reconciliation rejects bad extent reports and bounds their number") {
  Harness h("reconcile_bad", [](MasterServiceOptions& o) {
    o.max_reconcile_extents = 2;
  });
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  auto rec = h.svc->BeginReconcile(a, 1);
  REQUIRE(rec.ok());
  google::protobuf::RepeatedPtrField<v1::Location> dup;
  *dup.Add() = At(0, 0, 64, 5);
  *dup.Add() = At(0, 64, 64, 5);
  CHECK((*rec)->Add(dup).code() == StatusCode::kInvalidArgument);
  auto rec2 = h.svc->BeginReconcile(a, 1);
  google::protobuf::RepeatedPtrField<v1::Location> zero;
  *zero.Add() = At(0, 0, 0, 5);
  CHECK((*rec2)->Add(zero).code() == StatusCode::kInvalidArgument);
  auto rec3 = h.svc->BeginReconcile(a, 1);
  google::protobuf::RepeatedPtrField<v1::Location> many;
  for (int i = 1; i <= 3; ++i) *many.Add() = At(0, 64 * i, 64, i);
  CHECK((*rec3)->Add(many).code() == StatusCode::kResourceExhausted);
}

TEST_CASE("A held extent with a listed generation but another range is no match") {
  Harness h("reconcile_mismatch");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"k"}, 100);
  auto listed = h.Listed(a);
  REQUIRE(listed.size() == 1);
  v1::Location wrong = listed[0];
  wrong.set_addr(wrong.addr() + 4096);
  auto r = h.ReconcileWith(a, 1, {wrong});
  CHECK(r.matched() == 0);
  CHECK(r.dropped_listings() == 1);
  REQUIRE(r.unlisted_size() == 1);
  CHECK(r.unlisted(0).addr() == wrong.addr());
  CHECK(h.Found({"k"}) == "0");
}

TEST_CASE("ReportMissing drops a listing only at the exact reported location") {
  Harness h("report_missing");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"k"}, 100);
  h.Put({"other"}, 100);  // not a continuation of k
  auto look = h.Lookup({"k"});
  REQUIRE(look.results(0).found());
  v1::ReportMissingRequest req;
  req.add_keys("k");
  v1::Location stale = look.results(0).location();
  stale.set_generation(stale.generation() + 1000);
  *req.add_locations() = stale;
  auto r = h.svc->ReportMissing(req);
  REQUIRE(r.ok());
  CHECK_FALSE(r->dropped(0));
  CHECK(h.Found({"k"}) == "1");

  *req.mutable_locations(0) = look.results(0).location();
  req.add_keys("k");  // repeated: dropped once
  *req.add_locations() = look.results(0).location();
  r = h.svc->ReportMissing(req);
  REQUIRE(r.ok());
  CHECK(r->dropped(0));
  CHECK_FALSE(r->dropped(1));
  CHECK(h.Found({"k", "other"}) == "01");
  CHECK(h.svc->counters().read_repairs == 1);
  CHECK(h.Start({"k"}, {100}).slots(0).state() == v1::SLOT_ALLOCATED);
  (void)a;

  v1::ReportMissingRequest bad;
  bad.add_keys("k");
  CHECK(h.svc->ReportMissing(bad).status().code() ==
        StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace service_test
}  // namespace master
}  // namespace hymcache
