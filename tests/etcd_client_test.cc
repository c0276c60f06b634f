// EtcdClient (common/etcd_client.h) against real etcd processes
// (tests/etcd_cluster.h): the KV, lease and watch calls round-trip through
// Debian's etcd 3.4, and calls and watches carry on across a killed or
// frozen member. etcd is a test dependency (tools/setup.sh --test): without
// it these tests FAIL, they do not skip.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/eventually.h"
#include "common/etcd_client.h"
#include "common/mutex.h"
#include "tests/etcd_cluster.h"

namespace hymcache {
namespace {

using ::hymcache::testing::EtcdCluster;
using ::hymcache::testing::EtcdClusterOptions;
using ::hymcache::testing::Eventually;

// gRPC's threads trip absl's deadlock detector (as in prometheus_test).
const bool kNoDeadlockDetector = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

std::unique_ptr<EtcdCluster> StartCluster(int members) {
  EtcdClusterOptions o;
  o.members = members;
  auto c = EtcdCluster::Start(o);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return std::move(*c);
}

std::unique_ptr<EtcdClient> Connect(const std::vector<std::string>& endpoints) {
  EtcdClientOptions o;
  o.endpoints = endpoints;
  auto c = EtcdClient::Create(o);
  REQUIRE(c.ok());
  return std::move(*c);
}

etcdserverpb::PutRequest PutOf(const std::string& k, const std::string& v,
                               int64_t lease = 0) {
  etcdserverpb::PutRequest p;
  p.set_key(k);
  p.set_value(v);
  p.set_lease(lease);
  return p;
}

TEST_CASE("Etcd client options without endpoints or with a malformed one are refused") {
  EtcdClientOptions o;
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o.endpoints = {"127.0.0.1"};
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o.endpoints = {"127.0.0.1:2379", "http://127.0.0.1:2380"};
  CHECK(o.Validate().ok());
  o.attempt_timeout = absl::ZeroDuration();
  CHECK(absl::IsInvalidArgument(o.Validate()));
  CHECK(absl::IsInvalidArgument(EtcdClient::Create(o).status()));
}

TEST_CASE("Prefix ends cover exactly the keys that start with the prefix") {
  CHECK(EtcdClient::PrefixEnd("a/") == "a0");
  CHECK(EtcdClient::PrefixEnd(std::string("a\xff", 2)) == "b");
  CHECK(EtcdClient::PrefixEnd("") == std::string(1, '\0'));
}

TEST_CASE("Put, Range, DeleteRange and Txn round-trip through a real etcd") {
  auto cluster = StartCluster(1);
  auto etcd = Connect(cluster->endpoints());

  auto put = etcd->Put(PutOf("a/1", "one"));
  REQUIRE(put.ok());
  const int64_t rev = put->header().revision();
  CHECK(rev > 0);
  REQUIRE(etcd->Put(PutOf("a/2", "two")).ok());
  REQUIRE(etcd->Put(PutOf("b", "bee")).ok());

  auto got = etcd->Get("a/1");
  REQUIRE(got.ok());
  REQUIRE(got->has_value());
  CHECK((*got)->value() == "one");
  CHECK((*got)->create_revision() == rev);
  CHECK((*got)->version() == 1);

  etcdserverpb::RangeRequest range;
  range.set_key("a/");
  range.set_range_end(EtcdClient::PrefixEnd("a/"));
  auto r = etcd->Range(range);
  REQUIRE(r.ok());
  REQUIRE(r->kvs_size() == 2);
  CHECK(r->kvs(0).key() == "a/1");
  CHECK(r->kvs(1).key() == "a/2");
  CHECK(r->kvs(1).value() == "two");
  CHECK(r->header().revision() == rev + 2);

  etcdserverpb::DeleteRangeRequest del;
  del.set_key("a/1");
  del.set_prev_kv(true);
  auto d = etcd->DeleteRange(del);
  REQUIRE(d.ok());
  CHECK(d->deleted() == 1);
  REQUIRE(d->prev_kvs_size() == 1);
  CHECK(d->prev_kvs(0).value() == "one");
  got = etcd->Get("a/1");
  REQUIRE(got.ok());
  CHECK_FALSE(got->has_value());

  // Create-if-absent: the first Txn creates, the second finds the key.
  etcdserverpb::TxnRequest txn;
  auto* cmp = txn.add_compare();
  cmp->set_key("c");
  cmp->set_target(etcdserverpb::Compare::CREATE);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_create_revision(0);
  *txn.add_success()->mutable_request_put() = PutOf("c", "first");
  txn.add_failure()->mutable_request_range()->set_key("c");
  auto t1 = etcd->Txn(txn);
  REQUIRE(t1.ok());
  CHECK(t1->succeeded());
  txn.mutable_success(0)->mutable_request_put()->set_value("second");
  auto t2 = etcd->Txn(txn);
  REQUIRE(t2.ok());
  CHECK_FALSE(t2->succeeded());
  REQUIRE(t2->responses_size() == 1);
  REQUIRE(t2->responses(0).response_range().kvs_size() == 1);
  CHECK(t2->responses(0).response_range().kvs(0).value() == "first");
  CHECK(t2->responses(0).response_range().kvs(0).create_revision() ==
        t1->header().revision());
}

TEST_CASE("A lease keeps its keys until it is revoked, and is gone afterwards") {
  auto cluster = StartCluster(1);
  auto etcd = Connect(cluster->endpoints());

  auto grant = etcd->LeaseGrant(absl::Seconds(3));
  REQUIRE(grant.ok());
  const int64_t lease = grant->id();
  CHECK(lease != 0);
  CHECK(grant->ttl() >= 3);
  REQUIRE(etcd->Put(PutOf("leased", "x", lease)).ok());

  auto ttl = etcd->LeaseTimeToLive(lease, /*keys=*/true);
  REQUIRE(ttl.ok());
  CHECK(ttl->ttl() > 0);
  CHECK(ttl->grantedttl() == grant->ttl());
  REQUIRE(ttl->keys_size() == 1);
  CHECK(ttl->keys(0) == "leased");

  auto ka = etcd->LeaseKeepAliveOnce(lease);
  REQUIRE(ka.ok());
  CHECK(ka->id() == lease);
  CHECK(ka->ttl() == grant->ttl());

  auto got = etcd->Get("leased");
  REQUIRE(got.ok());
  REQUIRE(got->has_value());
  CHECK((*got)->lease() == lease);

  REQUIRE(etcd->LeaseRevoke(lease).ok());
  got = etcd->Get("leased");
  REQUIRE(got.ok());
  CHECK_FALSE(got->has_value());
  CHECK(absl::IsNotFound(etcd->LeaseKeepAliveOnce(lease).status()));
  ttl = etcd->LeaseTimeToLive(lease);
  REQUIRE(ttl.ok());
  CHECK(ttl->ttl() == -1);
  CHECK(absl::IsNotFound(etcd->LeaseRevoke(lease)));
}

TEST_CASE("A lease that is not renewed expires with its keys") {
  auto cluster = StartCluster(1);
  auto etcd = Connect(cluster->endpoints());
  auto grant = etcd->LeaseGrant(absl::Seconds(1));
  REQUIRE(grant.ok());
  const absl::Time granted = absl::Now();
  REQUIRE(etcd->Put(PutOf("short", "x", grant->id())).ok());
  REQUIRE(Eventually([&] {
    auto got = etcd->Get("short");
    return got.ok() && !got->has_value();
  }));
  // Not before the TTL etcd granted.
  CHECK(absl::Now() - granted >= absl::Seconds(grant->ttl()));
}

// Events a watcher delivered, as "PUT key=value" / "DELETE key".
struct Seen {
  Mutex mu;
  std::vector<std::string> events ABSL_GUARDED_BY(mu);
  int errors ABSL_GUARDED_BY(mu) = 0;

  void Add(absl::StatusOr<EtcdWatchBatch> b) {
    MutexLock l(&mu);
    if (!b.ok()) {
      ++errors;
      return;
    }
    for (const auto& ev : b->events) {
      events.push_back(ev.type() == mvccpb::Event::PUT
                           ? "PUT " + ev.kv().key() + "=" + ev.kv().value()
                           : "DELETE " + ev.kv().key());
    }
  }
  std::vector<std::string> Get() {
    MutexLock l(&mu);
    return events;
  }
};

TEST_CASE("A watcher sees every change in order, also across the death of its member") {
  auto cluster = StartCluster(3);
  auto etcd = Connect(cluster->endpoints());
  Seen seen;
  EtcdWatchOptions w;
  w.key = "w/";
  w.range_end = EtcdClient::PrefixEnd("w/");
  auto watcher = etcd->Watch(w, [&](auto b) { seen.Add(std::move(b)); });
  REQUIRE(watcher.ok());
  REQUIRE(Eventually([&] { return (*watcher)->connected(); }));
  REQUIRE(etcd->Put(PutOf("w/1", "a")).ok());
  REQUIRE(etcd->Put(PutOf("outside", "-")).ok());
  REQUIRE(etcd->Put(PutOf("w/2", "b")).ok());
  REQUIRE(Eventually([&] { return seen.Get().size() == 2; }));

  // The watch stream and the calls use member 0 first: kill it.
  REQUIRE(etcd->preferred_endpoint() == 0);
  REQUIRE(cluster->Kill(0).ok());
  REQUIRE(etcd->Put(PutOf("w/3", "c")).ok());
  etcdserverpb::DeleteRangeRequest del;
  del.set_key("w/1");
  REQUIRE(etcd->DeleteRange(del).ok());
  CHECK(etcd->failovers() >= 1);
  // A put retried during etcd's own failover may be applied twice (the
  // client's contract): compare without repeats.
  auto distinct = [&] {
    std::vector<std::string> out;
    for (const std::string& e : seen.Get()) {
      if (out.empty() || out.back() != e) out.push_back(e);
    }
    return out;
  };
  REQUIRE(Eventually([&] { return distinct().size() >= 4; }));
  CHECK(distinct() == std::vector<std::string>{"PUT w/1=a", "PUT w/2=b",
                                               "PUT w/3=c", "DELETE w/1"});
  MutexLock l(&seen.mu);
  CHECK(seen.errors == 0);
}

TEST_CASE("A watcher started at an old revision replays the changes since") {
  auto cluster = StartCluster(1);
  auto etcd = Connect(cluster->endpoints());
  auto p1 = etcd->Put(PutOf("r", "1"));
  REQUIRE(p1.ok());
  REQUIRE(etcd->Put(PutOf("r", "2")).ok());
  Seen seen;
  EtcdWatchOptions w;
  w.key = "r";
  w.start_revision = p1->header().revision();
  auto watcher = etcd->Watch(w, [&](auto b) { seen.Add(std::move(b)); });
  REQUIRE(watcher.ok());
  REQUIRE(Eventually([&] { return seen.Get().size() >= 2; }));
  CHECK(seen.Get() == std::vector<std::string>{"PUT r=1", "PUT r=2"});
}

TEST_CASE("Calls and watches skip a frozen member") {
  auto cluster = StartCluster(3);
  EtcdClientOptions o;
  o.endpoints = cluster->endpoints();
  o.attempt_timeout = absl::Milliseconds(500);
  auto etcd = EtcdClient::Create(o);
  REQUIRE(etcd.ok());
  Seen seen;
  EtcdWatchOptions w;
  w.key = "f";
  w.probe_interval = absl::Milliseconds(300);
  auto watcher = (*etcd)->Watch(w, [&](auto b) { seen.Add(std::move(b)); });
  REQUIRE(watcher.ok());
  REQUIRE(Eventually([&] { return (*watcher)->connected(); }));
  REQUIRE((*etcd)->Put(PutOf("f", "1")).ok());
  REQUIRE(Eventually([&] { return seen.Get().size() == 1; }));
  REQUIRE(cluster->Freeze(0).ok());
  const absl::Time start = absl::Now();
  auto put = (*etcd)->Put(PutOf("f", "2"), start + absl::Seconds(10));
  // When member 0 led the etcd cluster, a member can end the attempt with
  // UNKNOWN ("context deadline exceeded": the proposal waited for a new
  // raft leader past the attempt's deadline), which the client does not
  // retry: the caller does, as the election does.
  while (!put.ok() && absl::IsUnknown(put.status()) &&
         absl::Now() - start < absl::Seconds(5)) {
    put = (*etcd)->Put(PutOf("f", "2"), start + absl::Seconds(10));
  }
  INFO(put.status().ToString());
  REQUIRE(put.ok());
  // One attempt on the frozen member, then another member answers (etcd
  // may need an election first if member 0 led the cluster).
  CHECK(absl::Now() - start < absl::Seconds(5));
  // It moved off member 0 at least once. (Which member it prefers now is
  // not fixed: the watcher, failing over from member 0 and from members
  // without a raft leader yet, moves the same preference meanwhile.)
  CHECK((*etcd)->failovers() > 0);
  // The watch stream, still connected to the frozen member, goes silent;
  // its prober gives up on it and the watch resumes elsewhere.
  // (The put may have been applied twice: when member 0 led the etcd
  // cluster, an attempt that timed out during the new raft election still
  // commits after it, as the client's contract says.)
  REQUIRE(Eventually([&] { return seen.Get().size() >= 2; }));
  const std::vector<std::string> events = seen.Get();
  CHECK(events[0] == "PUT f=1");
  for (size_t i = 1; i < events.size(); ++i) CHECK(events[i] == "PUT f=2");
  REQUIRE(cluster->Thaw(0).ok());
}

TEST_CASE(
    "Each member's Status names it and the raft leader, and MoveLeader on the "
    "raft leader hands the leadership to the member named") {
  auto cluster = StartCluster(3);
  auto etcd = Connect(cluster->endpoints());
  auto members = etcd->MemberList();
  INFO(members.status().ToString());
  REQUIRE(members.ok());
  REQUIRE(members->members_size() == 3);
  std::vector<uint64_t> ids;
  uint64_t leader = 0;
  for (int i = 0; i < 3; ++i) {
    auto st = etcd->MemberStatus(i);
    INFO(st.status().ToString());
    REQUIRE(st.ok());
    ids.push_back(st->header().member_id());
    if (leader == 0) leader = st->leader();
    CHECK(st->leader() == leader);  // all agree
  }
  CHECK(ids[0] != ids[1]);
  CHECK(ids[1] != ids[2]);
  int from = -1;
  for (int i = 0; i < 3; ++i) {
    if (ids[i] == leader) from = i;
  }
  REQUIRE(from >= 0);
  const int to = (from + 1) % 3;
  // Only the raft leader can move its leadership.
  CHECK_FALSE(etcd->MoveLeader((from + 2) % 3, ids[to]).ok());
  REQUIRE(etcd->MoveLeader(from, ids[to]).ok());
  CHECK(Eventually([&] {
    auto st = etcd->MemberStatus(from);
    return st.ok() && st->leader() == ids[to];
  }));
  CHECK(absl::IsInvalidArgument(etcd->MemberStatus(3).status()));
}

TEST_CASE("Without quorum calls fail within their deadline; with quorum back they succeed again") {
  auto cluster = StartCluster(3);
  auto etcd = Connect(cluster->endpoints());
  REQUIRE(etcd->Put(PutOf("q", "1")).ok());
  REQUIRE(cluster->Kill(0).ok());
  REQUIRE(etcd->Put(PutOf("q", "2")).ok());  // 2 of 3: still a quorum
  REQUIRE(cluster->Kill(1).ok());

  const absl::Time start = absl::Now();
  auto put = etcd->Put(PutOf("q", "3"), start + absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  INFO(put.status().ToString());
  REQUIRE_FALSE(put.ok());
  CHECK((absl::IsUnavailable(put.status()) ||
         absl::IsDeadlineExceeded(put.status())));
  CHECK(took < absl::Seconds(3));

  REQUIRE(cluster->Restart(0, /*wait=*/false).ok());
  REQUIRE(cluster->Restart(1, /*wait=*/false).ok());
  REQUIRE(Eventually(
      [&] { return etcd->Put(PutOf("q", "4"), absl::Now() + absl::Seconds(2)).ok(); },
      absl::Seconds(30)));
  auto got = etcd->Get("q");
  REQUIRE(got.ok());
  REQUIRE(got->has_value());
  CHECK((*got)->value() == "4");
}

}  // namespace
}  // namespace hymcache
