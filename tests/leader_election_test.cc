// LeaderElection and LeaderObserver (common/leader_election.h) against real
// etcd clusters (tests/etcd_cluster.h): one leader among candidates,
// takeover with a larger epoch when the leader resigns, dies or loses its
// lease, no change when one of three etcd members dies, step-down within
// the lease when the leader is cut off from etcd, and a new election by
// itself once etcd has a quorum again. etcd is a test dependency
// (tools/setup.sh --test): without it these tests FAIL, they do not skip.
//
// Every candidate has its own EtcdClient, as separate masters would.
// Timings: leases of 2 s (4 s where etcd itself fails over), so every
// takeover below is bounded by a few seconds.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/etcd_client.h"
#include "common/eventually.h"
#include "common/fake_clock.h"
#include "common/leader_election.h"
#include "common/mutex.h"
#include "tests/etcd_cluster.h"

namespace hymcache {
namespace {

using ::hymcache::testing::EtcdCluster;
using ::hymcache::testing::EtcdClusterOptions;
using ::hymcache::testing::Eventually;

const bool kNoDeadlockDetector = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

constexpr char kKey[] = "/hymcache/test/master/leader";
constexpr absl::Duration kTtl = absl::Seconds(2);

// What the candidates' callbacks reported, in the order they ran.
struct Event {
  std::string who;
  bool elected;  // else lost
  int64_t epoch;
  absl::Status why;
  absl::Time at;
  // Lost: the candidate's UnendedTermEpoch() while on_lost ran.
  std::optional<int64_t> unended;
};

class Journal {
 public:
  void Add(Event e) {
    MutexLock l(&mu_);
    events_.push_back(std::move(e));
  }
  std::vector<Event> events() const {
    MutexLock l(&mu_);
    return events_;
  }
  // The last event of `who`, if any.
  std::optional<Event> Last(const std::string& who) const {
    MutexLock l(&mu_);
    for (auto it = events_.rbegin(); it != events_.rend(); ++it) {
      if (it->who == who) return *it;
    }
    return std::nullopt;
  }
  // Checks that terms never overlap: every election comes after the end of
  // the term before it (whoever held it), and epochs grow.
  void CheckTermsDoNotOverlap() const {
    MutexLock l(&mu_);
    std::optional<std::string> holder;
    int64_t last_epoch = 0;
    for (const Event& e : events_) {
      INFO(e.who << (e.elected ? " elected at " : " lost at ") << e.epoch);
      if (e.elected) {
        CHECK_FALSE(holder.has_value());
        CHECK(e.epoch > last_epoch);
        holder = e.who;
        last_epoch = e.epoch;
      } else {
        CHECK(holder == e.who);
        CHECK(e.epoch == last_epoch);
        holder.reset();
      }
    }
  }

 private:
  mutable Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<EtcdCluster> StartCluster(int members) {
  EtcdClusterOptions o;
  o.members = members;
  auto c = EtcdCluster::Start(o);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return std::move(*c);
}

// A master-to-be: its own etcd client and its election.
struct Candidate {
  std::string name;
  std::unique_ptr<EtcdClient> etcd;
  std::unique_ptr<LeaderElection> election;
};

std::unique_ptr<Candidate> Campaign(
    const EtcdCluster& cluster, const std::string& name, Journal* journal,
    Clock* clock = nullptr, absl::Duration ttl = kTtl,
    absl::Duration call_timeout = EtcdClientOptions().call_timeout,
    const std::function<void(LeaderElectionOptions&)>& configure = nullptr) {
  auto c = std::make_unique<Candidate>();
  c->name = name;
  EtcdClientOptions eo;
  eo.endpoints = cluster.endpoints();
  eo.attempt_timeout = absl::Milliseconds(500);
  eo.call_timeout = call_timeout;
  auto etcd = EtcdClient::Create(eo);
  REQUIRE(etcd.ok());
  c->etcd = std::move(*etcd);
  LeaderElectionOptions o;
  o.etcd = c->etcd.get();
  o.key = kKey;
  o.candidate = name;
  o.lease_ttl = ttl;
  o.clock = clock;
  o.thread_name = "elect-" + name;
  if (configure) configure(o);
  o.on_elected = [journal, name](int64_t epoch) {
    journal->Add({name, true, epoch, absl::OkStatus(), absl::Now()});
  };
  o.on_lost = [journal, name, raw = c.get()](int64_t epoch,
                                             const absl::Status& why) {
    journal->Add({name, false, epoch, why, absl::Now(),
                  raw->election->UnendedTermEpoch()});
  };
  auto e = LeaderElection::Create(o);
  INFO(e.status().ToString());
  REQUIRE(e.ok());
  c->election = std::move(*e);
  return c;
}

// Waits until exactly one of `cs` leads; returns it.
Candidate* WaitForLeader(const std::vector<Candidate*>& cs,
                         absl::Duration timeout = absl::Seconds(20)) {
  Candidate* leader = nullptr;
  const bool ok = Eventually(
      [&] {
        leader = nullptr;
        int n = 0;
        for (Candidate* c : cs) {
          if (c->election->IsLeader()) {
            leader = c;
            ++n;
          }
        }
        return n == 1;
      },
      timeout);
  REQUIRE(ok);
  return leader;
}

TEST_CASE("Election options without etcd, key, candidate or a whole-second TTL are refused") {
  auto cluster_less = EtcdClient::Create({.endpoints = {"127.0.0.1:1"}});
  REQUIRE(cluster_less.ok());
  LeaderElectionOptions o;
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o.etcd = cluster_less->get();
  o.key = kKey;
  o.candidate = "a";
  CHECK(o.Validate().ok());
  o.lease_ttl = absl::Milliseconds(1500);
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o.lease_ttl = absl::Milliseconds(500);
  CHECK(absl::IsInvalidArgument(LeaderElection::Create(o).status()));
  o.lease_ttl = absl::Seconds(1);
  o.candidate = "a\nepoch_base=7";  // would read as another epoch base
  CHECK(absl::IsInvalidArgument(o.Validate()));
}

TEST_CASE("Of two candidates exactly one leads and the other stands by, seeing it") {
  auto cluster = StartCluster(3);
  Journal journal;
  auto a = Campaign(*cluster, "a", &journal);
  auto b = Campaign(*cluster, "b", &journal);
  Candidate* leader = WaitForLeader({a.get(), b.get()});
  Candidate* standby = leader == a.get() ? b.get() : a.get();
  const int64_t epoch = *leader->election->LeaderEpoch();
  CHECK(epoch > 0);
  REQUIRE(Eventually([&] {
    auto seen = standby->election->ObservedLeader();
    return seen.has_value() && seen->candidate == leader->name;
  }));
  CHECK(standby->election->ObservedLeader()->epoch == epoch);
  CHECK_FALSE(standby->election->IsLeader());
  CHECK_FALSE(standby->election->LeaderEpoch().has_value());

  // Anyone can read it, and observers follow it.
  auto read = ReadLeader(a->etcd.get(), kKey);
  REQUIRE(read.ok());
  REQUIRE(read->has_value());
  CHECK((*read)->candidate == leader->name);
  CHECK((*read)->epoch == epoch);
  auto observer = LeaderObserver::Create(a->etcd.get(), kKey, nullptr);
  REQUIRE(observer.ok());
  CHECK((*observer)->current() == *read);
  CHECK((*observer)->highest_epoch() == epoch);

  // A write fenced with the leader key's revision applies; one fenced with
  // an older revision does not. (With no epoch base, they are the epoch.)
  CHECK((*read)->revision == epoch);
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = LeaderElection::FenceCompare(kKey, (*read)->revision);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key("/hymcache/test/config");
  put->set_value("by leader");
  auto fenced = leader->etcd->Txn(txn);
  REQUIRE(fenced.ok());
  CHECK(fenced->succeeded());
  *txn.mutable_compare(0) =
      LeaderElection::FenceCompare(kKey, (*read)->revision - 1);
  auto stale = leader->etcd->Txn(txn);
  REQUIRE(stale.ok());
  CHECK_FALSE(stale->succeeded());
  journal.CheckTermsDoNotOverlap();
}

TEST_CASE("When the leader resigns the standby takes over at once, with a larger epoch") {
  auto cluster = StartCluster(3);
  Journal journal;
  auto a = Campaign(*cluster, "a", &journal);
  auto b = Campaign(*cluster, "b", &journal);
  Candidate* leader = WaitForLeader({a.get(), b.get()});
  const std::string first = leader->name;
  auto standby = leader == a.get() ? std::move(b) : std::move(a);
  auto gone = leader == a.get() ? std::move(a) : std::move(b);
  const int64_t epoch = *gone->election->LeaderEpoch();

  std::vector<std::optional<LeaderInfo>> changes;
  Mutex changes_mu;
  auto observer = LeaderObserver::Create(
      standby->etcd.get(), kKey, [&](const std::optional<LeaderInfo>& l) {
        MutexLock lock(&changes_mu);
        changes.push_back(l);
      });
  REQUIRE(observer.ok());

  const absl::Time resigned = absl::Now();
  gone->election->Resign();
  CHECK_FALSE(gone->election->IsLeader());
  auto lost = journal.Last(first);
  REQUIRE(lost.has_value());
  CHECK_FALSE(lost->elected);
  CHECK(absl::IsCancelled(lost->why));

  REQUIRE(Eventually([&] { return standby->election->IsLeader(); }));
  // The lease was revoked: no wait for its TTL.
  CHECK(absl::Now() - resigned < kTtl);
  CHECK(*standby->election->LeaderEpoch() > epoch);
  REQUIRE(Eventually([&] { return (*observer)->highest_epoch() > epoch; }));
  {
    MutexLock lock(&changes_mu);
    // The first leader, none, the second leader.
    REQUIRE(changes.size() == 3);
    CHECK(changes[0]->candidate == first);
    CHECK_FALSE(changes[1].has_value());
    CHECK(changes[2]->candidate == standby->name);
    CHECK(changes[2]->epoch == *standby->election->LeaderEpoch());
  }
  journal.CheckTermsDoNotOverlap();
}

TEST_CASE("When the leader stops renewing, it stops leading before the standby takes over within the TTL") {
  // The leader's process frozen or cut off from etcd: no renewals, no
  // revocation.
  auto cluster = StartCluster(3);
  Journal journal;
  auto a = Campaign(*cluster, "a", &journal);
  auto b = Campaign(*cluster, "b", &journal);
  Candidate* leader = WaitForLeader({a.get(), b.get()});
  Candidate* standby = leader == a.get() ? b.get() : a.get();
  const int64_t epoch = *leader->election->LeaderEpoch();

  const absl::Time frozen = absl::Now();
  leader->election->FreezeForTest();
  REQUIRE(Eventually([&] { return standby->election->IsLeader(); }));
  const absl::Duration takeover = absl::Now() - frozen;
  // etcd expires the lease at most a TTL after the last renewal (plus its
  // expiry scan, every 500 ms); the standby's watch sees it at once.
  CHECK(takeover < kTtl + absl::Seconds(2));
  CHECK(*standby->election->LeaderEpoch() > epoch);
  CHECK_FALSE(leader->election->IsLeader());

  // The old leader's term ended (by its own deadline) before the new one
  // began.
  const auto events = journal.events();
  REQUIRE(events.size() == 3);
  CHECK(events[1].who == leader->name);
  CHECK(absl::IsDeadlineExceeded(events[1].why));
  CHECK(events[1].at - frozen <= kTtl);
  CHECK(events[2].who == standby->name);
  CHECK(events[1].at <= events[2].at);
  journal.CheckTermsDoNotOverlap();
}

TEST_CASE("A leader's term ends at its lease's local deadline on the injected clock") {
  auto cluster = StartCluster(1);
  Journal journal;
  FakeClock clock;
  auto a = Campaign(*cluster, "a", &journal, &clock);
  REQUIRE(Eventually([&] { return a->election->IsLeader(); }));
  a->election->FreezeForTest();
  // Frozen: no renewal moves the deadline any more. The fake clock decides.
  clock.Advance(kTtl * 0.8 - absl::Milliseconds(1));
  CHECK(a->election->IsLeader());
  clock.Advance(absl::Milliseconds(1));
  CHECK_FALSE(a->election->IsLeader());
  CHECK_FALSE(a->election->LeaderEpoch().has_value());
  // And the election thread notices too.
  REQUIRE(Eventually([&] { return journal.events().size() == 2; }));
  CHECK(absl::IsDeadlineExceeded(journal.events()[1].why));
  // While on_lost runs the term still counts as unended (a master serving
  // reads past its deadline decides there whether it goes on: a read in
  // between must not be refused), and once it returned no longer.
  CHECK(journal.events()[1].unended == journal.events()[0].epoch);
  CHECK_FALSE(a->election->UnendedTermEpoch().has_value());
}

TEST_CASE(
    "A campaign that etcd answers only after the lease's local deadline renews "
    "before its term starts") {
  // etcd without a quorum holds the grant; meanwhile more than the TTL
  // passes on the candidate's clock. When the quorum returns and the
  // campaign wins, its term must not start already ended (CI saw a master
  // elected and deposed in the same millisecond, then exit).
  auto cluster = StartCluster(3);
  REQUIRE(cluster->Freeze(1).ok());
  REQUIRE(cluster->Freeze(2).ok());
  Journal journal;
  FakeClock clock;
  // One grant call spans the freeze.
  auto c = Campaign(*cluster, "a", &journal, &clock, kTtl, absl::Seconds(60));
  // The first campaign is in flight (its grant waits on etcd)...
  REQUIRE(Eventually([&] { return c->election->stats().campaigns == 1; }));
  clock.Advance(kTtl * 2);  // ...and its lease's local deadline passes.
  REQUIRE(cluster->Thaw(1).ok());
  REQUIRE(cluster->Thaw(2).ok());
  REQUIRE(
      Eventually([&] { return c->election->IsLeader(); }, absl::Seconds(30)));
  // One campaign, won, renewed once before leading; never lost.
  CHECK(c->election->stats().campaigns == 1);
  CHECK(c->election->stats().renewals == 1);
  // on_elected runs just after IsLeader() turns true.
  REQUIRE(Eventually([&] { return !journal.events().empty(); }));
  auto events = journal.events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].elected);
  // The term runs from that renewal on the fake clock: 0.8 TTL from now.
  c->election->FreezeForTest();
  clock.Advance(kTtl * 0.8 - absl::Milliseconds(1));
  CHECK(c->election->IsLeader());
  clock.Advance(absl::Milliseconds(1));
  CHECK_FALSE(c->election->IsLeader());
}

TEST_CASE("Revoking the leader's lease ends its term and a new term begins with a larger epoch") {
  auto cluster = StartCluster(3);
  Journal journal;
  auto a = Campaign(*cluster, "a", &journal);
  auto b = Campaign(*cluster, "b", &journal);
  Candidate* leader = WaitForLeader({a.get(), b.get()});
  auto info = leader->election->ObservedLeader();
  REQUIRE(info.has_value());

  auto admin = EtcdClient::Create({.endpoints = cluster->endpoints()});
  REQUIRE(admin.ok());
  REQUIRE((*admin)->LeaseRevoke(info->lease).ok());
  // The old term ends (the key's deletion is watched)...
  REQUIRE(Eventually([&] {
    auto last = journal.Last(leader->name);
    return last.has_value() && !last->elected;
  }));
  CHECK((absl::IsAborted(journal.Last(leader->name)->why) ||
         absl::IsNotFound(journal.Last(leader->name)->why)));
  // ...and a new one begins: usually the standby's (the deposed leader
  // waits a retry interval before campaigning again), but either may win.
  Candidate* next = WaitForLeader({a.get(), b.get()});
  const int64_t next_epoch = *next->election->LeaderEpoch();
  CHECK(next_epoch > info->epoch);
  // No journal overlap check here: a revocation ends the term in etcd at
  // once, and the old leader hears of it a watch event later (the new
  // leader may be elected in between; seen under tsan). That window is
  // what the epoch fences: the old epoch's writes fail, the new one's
  // apply.
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = LeaderElection::FenceCompare(kKey, info->revision);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key("/hymcache/test/config");
  put->set_value("late write of the old leader");
  auto late = leader->etcd->Txn(txn);
  REQUIRE(late.ok());
  CHECK_FALSE(late->succeeded());
  *txn.mutable_compare(0) = LeaderElection::FenceCompare(
      kKey, next->election->ObservedLeader()->revision);
  auto current = next->etcd->Txn(txn);
  REQUIRE(current.ok());
  CHECK(current->succeeded());
}

TEST_CASE(
    "A standby ends the observed leader's term with RevokeLeaderLease, and "
    "only that leader's") {
  auto cluster = StartCluster(1);
  Journal journal;
  auto a = Campaign(*cluster, "a", &journal);
  auto b = Campaign(*cluster, "b", &journal);
  Candidate* leader = WaitForLeader({a.get(), b.get()});
  Candidate* standby = leader == a.get() ? b.get() : a.get();
  std::optional<LeaderInfo> info;
  REQUIRE(Eventually([&] {
    info = standby->election->ObservedLeader();
    return info.has_value() && info->candidate == leader->name;
  }));
  // Not the leader observed (another epoch), nor the standby itself.
  LeaderInfo stale = *info;
  stale.epoch -= 1;
  CHECK(
      absl::IsFailedPrecondition(standby->election->RevokeLeaderLease(stale)));
  CHECK(absl::IsFailedPrecondition(leader->election->RevokeLeaderLease(
      *leader->election->ObservedLeader())));
  CHECK(leader->election->IsLeader());

  REQUIRE(standby->election->RevokeLeaderLease(*info).ok());
  CHECK(standby->election->stats().leaders_revoked == 1);
  REQUIRE(Eventually([&] {
    auto last = journal.Last(leader->name);
    return last.has_value() && !last->elected;
  }));
  Candidate* next = WaitForLeader({a.get(), b.get()});
  CHECK(*next->election->LeaderEpoch() > info->epoch);
}

TEST_CASE("Killing one of three etcd members changes nothing for the leader and the standby") {
  auto cluster = StartCluster(3);
  Journal journal;
  // If member 0 led the etcd cluster, renewals fail until the others elect
  // a new raft leader (an election timeout or two, more when the machine is
  // busy: one CI run on two loaded cores took over 1.9 s) and the
  // candidates' clients give up on member 0 (an attempt timeout): a TTL of
  // 8 s leaves 6.4 - 2.7 s of slack after the last renewal before the
  // leader would stop trusting its lease.
  const absl::Duration ttl = absl::Seconds(8);
  auto a = Campaign(*cluster, "a", &journal, nullptr, ttl);
  auto b = Campaign(*cluster, "b", &journal, nullptr, ttl);
  Candidate* leader = WaitForLeader({a.get(), b.get()});
  Candidate* standby = leader == a.get() ? b.get() : a.get();
  const int64_t epoch = *leader->election->LeaderEpoch();
  // Both talk to member 0 first.
  REQUIRE(leader->etcd->preferred_endpoint() == 0);
  const uint64_t renewals = leader->election->stats().renewals;

  REQUIRE(cluster->Kill(0).ok());
  // Renewals go on through the other members for over a TTL (a renewal
  // every TTL / 3), past the time the lease held at the kill would have
  // run out...
  const bool renewed = Eventually(
      [&] { return leader->election->stats().renewals >= renewals + 4; });
  const LeaderElectionStats stats = leader->election->stats();
  INFO("renewals " << stats.renewals << " failures " << stats.renewal_failures
                   << " terms lost " << stats.terms_lost);
  REQUIRE(renewed);
  // ...and nobody's term changed.
  CHECK(leader->election->LeaderEpoch() == epoch);
  CHECK_FALSE(standby->election->IsLeader());
  CHECK(stats.terms_lost == 0);
  CHECK(standby->election->stats().terms_won == 0);
  CHECK(journal.events().size() == 1);
  CHECK(leader->etcd->preferred_endpoint() != 0);
}

TEST_CASE("A leader cut off from all of etcd steps down within its lease; the election resumes when etcd is back") {
  auto cluster = StartCluster(3);
  Journal journal;
  auto a = Campaign(*cluster, "a", &journal);
  auto b = Campaign(*cluster, "b", &journal);
  Candidate* leader = WaitForLeader({a.get(), b.get()});
  const int64_t epoch = *leader->election->LeaderEpoch();

  const absl::Time cut = absl::Now();
  for (int i = 0; i < 3; ++i) REQUIRE(cluster->Freeze(i).ok());
  REQUIRE(Eventually([&] {
    auto last = journal.Last(leader->name);
    return last.has_value() && !last->elected;
  }));
  // Within the lease: 80% of the TTL after the last renewal was sent.
  CHECK(journal.Last(leader->name)->at - cut <= kTtl);
  CHECK(absl::IsDeadlineExceeded(journal.Last(leader->name)->why));
  CHECK_FALSE(a->election->IsLeader());
  CHECK_FALSE(b->election->IsLeader());

  for (int i = 0; i < 3; ++i) REQUIRE(cluster->Thaw(i).ok());
  Candidate* next = WaitForLeader({a.get(), b.get()}, absl::Seconds(30));
  CHECK(*next->election->LeaderEpoch() > epoch);
  journal.CheckTermsDoNotOverlap();
}

// Ranking's pauses here: long enough that every standby hears of a
// vacancy within the window on a loaded machine (tsan).
constexpr absl::Duration kRankingWindow = absl::Seconds(1);
constexpr absl::Duration kRankingPatience = absl::Seconds(2);

// A standby that ranks vacancies, at `position` of group "db".
std::unique_ptr<Candidate> RankedStandby(const EtcdCluster& cluster,
                                         const std::string& name,
                                         uint64_t position, Journal* journal,
                                         absl::Duration ttl = kTtl) {
  return Campaign(
      cluster, name, journal, nullptr, ttl, EtcdClientOptions().call_timeout,
      [position](LeaderElectionOptions& o) {
        o.standing = [position] { return CandidateStanding{"db", position}; };
        o.ranking_window = kRankingWindow;
        o.ranking_patience = kRankingPatience;
      });
}

// Waits until `c`'s entry is under StandingPrefix (it stands by, present).
void RequirePresent(Candidate* c) {
  REQUIRE(Eventually([&] {
    auto kv = c->etcd->Get(StandingPrefix(kKey) + c->name);
    return kv.ok() && kv->has_value();
  }));
}

// Puts a standing for a candidate that never campaigns (one that died after
// publishing it), under a lease of its own TTL.
void PublishStanding(EtcdClient* etcd, const std::string& name,
                     const std::string& value) {
  auto lease = etcd->LeaseGrant(absl::Seconds(30));
  REQUIRE(lease.ok());
  etcdserverpb::PutRequest put;
  put.set_key(StandingPrefix(kKey) + name);
  put.set_value(value);
  put.set_lease(lease->id());
  REQUIRE(etcd->Put(put).ok());
}

TEST_CASE(
    "When the leader goes, the most up-to-date standby leads, not the first to "
    "campaign") {
  auto cluster = StartCluster(1);
  Journal journal;
  // Terms end by resigning here. A long lease keeps a renewal that a
  // loaded machine delays (asan CI: a 2 s lease ran out) from ending one
  // first, which would start an election this test does not follow.
  constexpr absl::Duration kLongTtl = absl::Seconds(10);
  auto a = Campaign(*cluster, "a", &journal, nullptr, kLongTtl);
  WaitForLeader({a.get()});
  // "b" sorts first (it would win ties) and is the least up to date.
  auto b = RankedStandby(*cluster, "b", 5, &journal, kLongTtl);
  auto c = RankedStandby(*cluster, "c", 9, &journal, kLongTtl);
  auto d = RankedStandby(*cluster, "d", 7, &journal, kLongTtl);
  for (Candidate* s : {b.get(), c.get(), d.get()}) {
    REQUIRE(
        Eventually([&] { return s->election->ObservedLeader().has_value(); }));
    RequirePresent(s);
  }

  const uint64_t b_campaigns = b->election->stats().campaigns;
  const uint64_t d_campaigns = d->election->stats().campaigns;
  a->election->Resign();
  Candidate* next = WaitForLeader({b.get(), c.get(), d.get()});
  CHECK(next->name == "c");
  // The others waited for it: neither campaigned. Each either yielded to
  // a better standing it saw, or was still waiting for the others' standings
  // (or had not ranked yet) when it saw "c" elected (tsan CI: "b" never
  // yielded).
  for (const auto& [standby, campaigns] :
       {std::pair{b.get(), b_campaigns}, std::pair{d.get(), d_campaigns}}) {
    Candidate* s = standby;  // a lambda may not capture a binding (C++17)
    REQUIRE(Eventually([&] {
      auto seen = s->election->ObservedLeader();
      return seen.has_value() && seen->candidate == c->name;
    }));
    const LeaderElectionStats st = s->election->stats();
    CHECK(st.yielded <= st.rankings);
    CHECK(st.rankings <= 1);
    CHECK(st.campaigns == campaigns);
  }
  CHECK(c->election->stats().yielded == 0);
  CHECK(c->election->stats().rankings == 1);

  // Again without it: of 5 and 7, 7.
  c->election->Resign();
  next = WaitForLeader({b.get(), d.get()});
  CHECK(next->name == "d");
  // The leaders withdrew their entries (revoked, not left to expire); the
  // standby's stays: its presence.
  REQUIRE(Eventually([&] {
    etcdserverpb::RangeRequest r;
    r.set_key(StandingPrefix(kKey));
    r.set_range_end(EtcdClient::PrefixEnd(StandingPrefix(kKey)));
    auto got = b->etcd->Range(r);
    return got.ok() && got->kvs_size() == 1 &&
           got->kvs(0).key() == StandingPrefix(kKey) + "b";
  }));
  journal.CheckTermsDoNotOverlap();
}

TEST_CASE("A lone standby leads at once: it waits out no ranking window") {
  auto cluster = StartCluster(1);
  Journal journal;
  auto a = Campaign(*cluster, "a", &journal);
  WaitForLeader({a.get()});
  auto b = RankedStandby(*cluster, "b", 4, &journal);
  REQUIRE(
      Eventually([&] { return b->election->ObservedLeader().has_value(); }));
  // b's presence is renewed while it stands by (TTL 2 s, renewed every
  // 2/3 s): after more renewals than one lease lasts, the entry is there
  // under the lease it was first put with.
  const std::string entry = StandingPrefix(kKey) + "b";
  int64_t lease = 0;
  REQUIRE(Eventually([&] {
    auto kv = b->etcd->Get(entry);
    if (!kv.ok() || !kv->has_value()) return false;
    lease = (*kv)->lease();
    return true;
  }));
  REQUIRE(
      Eventually([&] { return b->election->stats().presence_renewals >= 4; },
                 absl::Seconds(20)));
  auto kv = b->etcd->Get(entry);
  REQUIRE(kv.ok());
  REQUIRE(kv->has_value());
  CHECK((*kv)->lease() == lease);
  auto ttl = b->etcd->LeaseTimeToLive(lease);
  REQUIRE(ttl.ok());
  CHECK(ttl->ttl() > 0);

  const absl::Time resigned = absl::Now();
  a->election->Resign();
  WaitForLeader({b.get()});
  CHECK(absl::Now() - resigned < kRankingWindow);
  CHECK(b->election->stats().rankings == 1);
  CHECK(b->election->stats().yielded == 0);
  // The leader withdrew its entry.
  REQUIRE(Eventually([&] {
    auto gone = b->etcd->Get(entry);
    return gone.ok() && !gone->has_value();
  }));
  journal.CheckTermsDoNotOverlap();
}

TEST_CASE(
    "An outranked standby leads anyway when the better candidate never "
    "campaigns; other groups, silent candidates and bad entries are not "
    "waited for beyond the window") {
  auto cluster = StartCluster(1);
  Journal journal;
  auto a = Campaign(*cluster, "a", &journal);
  Candidate* first = WaitForLeader({a.get()});
  const int64_t e1 = *first->election->LeaderEpoch();
  auto b = RankedStandby(*cluster, "b", 1, &journal);
  REQUIRE(
      Eventually([&] { return b->election->ObservedLeader().has_value(); }));

  // For the vacancy of epoch e1: a better candidate of the same group that
  // died after ranking it (waited for: ranking_patience), one of another
  // database (not), and one present that never ranks (waited for until
  // the window ends).
  PublishStanding(b->etcd.get(), "z", absl::StrCat(e1, " 100 db"));
  PublishStanding(b->etcd.get(), "y", absl::StrCat(e1, " 1000 other"));
  PublishStanding(b->etcd.get(), "p", "");
  const absl::Time resigned = absl::Now();
  a->election->Resign();
  Candidate* second = WaitForLeader({b.get()});
  const absl::Duration took = absl::Now() - resigned;
  CHECK(b->election->stats().yielded == 1);
  CHECK(took >= kRankingWindow + kRankingPatience);
  const int64_t e2 = *second->election->LeaderEpoch();

  // The next vacancy: entries that ranked an older one (z, y) or none (p)
  // are waited for until the window ends, then ignored; malformed ones at
  // once; an empty group ranks below every other.
  auto e = RankedStandby(*cluster, "e", 3, &journal);
  REQUIRE(
      Eventually([&] { return e->election->ObservedLeader().has_value(); }));
  PublishStanding(e->etcd.get(), "x", "garbage");
  PublishStanding(e->etcd.get(), "w", absl::StrCat(e2, " 999 "));
  const absl::Time resigned_again = absl::Now();
  b->election->Resign();
  WaitForLeader({e.get()});
  CHECK(absl::Now() - resigned_again >= kRankingWindow);
  CHECK(e->election->stats().yielded == 0);
  journal.CheckTermsDoNotOverlap();
}

TEST_CASE("When etcd loses its quorum the leader steps down, and a leader is elected again once quorum is back") {
  auto cluster = StartCluster(3);
  Journal journal;
  auto a = Campaign(*cluster, "a", &journal);
  auto b = Campaign(*cluster, "b", &journal);
  Candidate* leader = WaitForLeader({a.get(), b.get()});
  const int64_t epoch = *leader->election->LeaderEpoch();

  REQUIRE(cluster->Kill(1).ok());
  REQUIRE(cluster->Kill(2).ok());
  REQUIRE(Eventually([&] {
    auto last = journal.Last(leader->name);
    return last.has_value() && !last->elected;
  }));
  CHECK_FALSE(a->election->IsLeader());
  CHECK_FALSE(b->election->IsLeader());

  REQUIRE(cluster->Restart(1, /*wait=*/false).ok());
  REQUIRE(cluster->Restart(2, /*wait=*/false).ok());
  Candidate* next = WaitForLeader({a.get(), b.get()}, absl::Seconds(30));
  CHECK(*next->election->LeaderEpoch() > epoch);
  journal.CheckTermsDoNotOverlap();
}

TEST_CASE(
    "A candidate that knows of epochs above etcd's revision leads above "
    "them, and later leaders of the same etcd stay above it") {
  // As after etcd was recreated empty: revisions start over, but a
  // master's store remembers the epochs its generations came from.
  auto cluster = StartCluster(1);
  Journal journal;
  constexpr int64_t kUsed = 5000;
  auto a = Campaign(
      *cluster, "a", &journal, nullptr, kTtl, EtcdClientOptions().call_timeout,
      [](LeaderElectionOptions& o) { o.epoch_floor = [] { return kUsed; }; });
  REQUIRE(Eventually([&] { return a->election->IsLeader(); }));
  const LeaderInfo first = *a->election->ObservedLeader();
  CHECK(first.revision < kUsed);
  CHECK(first.epoch > kUsed);
  CHECK(*a->election->LeaderEpoch() == first.epoch);
  CHECK(a->election->stats().epoch_base_raises == 1);
  // Everyone reading etcd computes the same epoch and candidate.
  auto read = ReadLeader(a->etcd.get(), kKey);
  REQUIRE(read.ok());
  REQUIRE(read->has_value());
  CHECK(**read == first);
  CHECK((*read)->candidate == "a");
  auto observer = LeaderObserver::Create(a->etcd.get(), kKey, nullptr);
  REQUIRE(observer.ok());
  CHECK((*observer)->highest_epoch() == first.epoch);
  // The fence is the key's revision, as without a base.
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = LeaderElection::FenceCompare(kKey, first.revision);
  txn.add_success()->mutable_request_put()->set_key("/hymcache/test/x");
  auto fenced = a->etcd->Txn(txn);
  REQUIRE(fenced.ok());
  CHECK(fenced->succeeded());

  // A candidate that knows nothing of the old epochs still leads above
  // them: the base stays in etcd.
  auto b = Campaign(*cluster, "b", &journal);
  a->election->Resign();
  REQUIRE(Eventually([&] { return b->election->IsLeader(); }));
  const LeaderInfo second = *b->election->ObservedLeader();
  CHECK(second.epoch > first.epoch);
  CHECK(second.epoch - second.revision == first.epoch - first.revision);
  CHECK(b->election->stats().epoch_base_raises == 0);
  // The observer followed both terms.
  REQUIRE(
      Eventually([&] { return (*observer)->highest_epoch() == second.epoch; }));
  journal.CheckTermsDoNotOverlap();
}

TEST_CASE(
    "A leader told of a higher epoch ends its term, and the next leader "
    "leads above that epoch") {
  auto cluster = StartCluster(1);
  Journal journal;
  auto a = Campaign(*cluster, "a", &journal);
  REQUIRE(Eventually([&] { return a->election->IsLeader(); }));
  const int64_t first = *a->election->LeaderEpoch();
  CHECK(absl::IsInvalidArgument(a->election->EndTermAbove(int64_t{1} << 31)));
  CHECK(a->election->EndTermAbove(first).ok());  // not above: nothing
  CHECK(a->election->IsLeader());
  auto b = Campaign(*cluster, "b", &journal);
  CHECK(absl::IsFailedPrecondition(b->election->EndTermAbove(9000)));
  // b campaigns no more, so the next leader is a. Otherwise b could win as
  // soon as a's Txn deletes the key, and its election be journaled before
  // a's loss, which a's own watch reports (seen once under tsan).
  b->election->FreezeForTest();

  // As a storage node would tell it after etcd was recreated.
  REQUIRE(a->election->EndTermAbove(9000).ok());
  // Over as soon as the Txn is: not when a's watch reports the deletion.
  CHECK_FALSE(a->election->IsLeader());
  CHECK_FALSE(a->election->LeaderEpoch().has_value());
  REQUIRE(Eventually([&] {
    auto last = journal.Last("a");
    return last.has_value() && !last->elected;
  }));
  CHECK(absl::IsAborted(journal.Last("a")->why));
  Candidate* next = WaitForLeader({a.get(), b.get()});
  const LeaderInfo info = *next->election->ObservedLeader();
  CHECK(info.epoch > 9000);
  CHECK(info.revision < 9000);
  auto read = ReadLeader(b->etcd.get(), kKey);
  REQUIRE(read.ok());
  REQUIRE(read->has_value());
  CHECK((*read)->epoch == info.epoch);
  journal.CheckTermsDoNotOverlap();
}

TEST_CASE(
    "Without epochs above etcd's revision the base stays 0 and the epoch is "
    "the leader key's revision") {
  auto cluster = StartCluster(1);
  Journal journal;
  auto a =
      Campaign(*cluster, "a", &journal, nullptr, kTtl,
               EtcdClientOptions().call_timeout, [](LeaderElectionOptions& o) {
                 o.epoch_floor = [] { return int64_t{1}; };
               });
  REQUIRE(Eventually([&] { return a->election->IsLeader(); }));
  const LeaderInfo first = *a->election->ObservedLeader();
  CHECK(first.epoch == first.revision);
  CHECK(a->election->stats().epoch_base_raises == 0);
  auto base = a->etcd->Get(EpochBaseKey(kKey));
  REQUIRE(base.ok());
  CHECK_FALSE(base->has_value());
  // Its own earlier epochs (seen in etcd) do not raise the base either:
  // later revisions pass them.
  a->election->Resign();
  auto again =
      Campaign(*cluster, "a", &journal, nullptr, kTtl,
               EtcdClientOptions().call_timeout, [&](LeaderElectionOptions& o) {
                 o.epoch_floor = [e = first.epoch] { return e; };
               });
  REQUIRE(Eventually([&] { return again->election->IsLeader(); }));
  const LeaderInfo second = *again->election->ObservedLeader();
  CHECK(second.epoch == second.revision);
  CHECK(second.epoch > first.epoch);
  CHECK(again->election->stats().epoch_base_raises == 0);
}

}  // namespace
}  // namespace hymcache
