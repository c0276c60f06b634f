// Standby replication: ReplicationSource and ReplicaFollower over real
// RocksDB directories in TEST_TMPDIR and real gRPC on loopback, and a
// standby's directory opened by a master (MasterService's restart path).

#include <grpcpp/grpcpp.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/eventually.h"
#include "common/mutex.h"
#include "common/security.h"
#include "common/test_identities.h"
#include "master/cq_server.h"
#include "master/master_service_test_fixture.h"
#include "master/metadata_store.h"
#include "master/replica_follower.h"
#include "master/replication_source.h"

namespace hymcache {
namespace master {
namespace {

using testing::Eventually;

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

// Every key and value of the database at `dir` but the replication
// position (read-only open: the follower must be stopped).
std::map<std::string, std::string> DumpDir(const std::string& dir) {
  RocksDbMetadataStoreOptions so;
  so.path = dir;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s =
      rocksdb::DB::OpenForReadOnly(MetadataStoreDbOptions(so), dir, &raw);
  INFO(s.ToString());
  REQUIRE(s.ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  std::map<std::string, std::string> out;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (it->key() == rocksdb::Slice(kReplicaPositionKey)) continue;
    out[it->key().ToString()] = it->value().ToString();
  }
  REQUIRE(it->status().ok());
  return out;
}

// The same for an open store.
std::map<std::string, std::string> DumpStore(RocksDbMetadataStore* store) {
  std::map<std::string, std::string> out;
  std::unique_ptr<rocksdb::Iterator> it(
      store->db()->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    out[it->key().ToString()] = it->value().ToString();
  }
  REQUIRE(it->status().ok());
  return out;
}

// Puts objects prefix/0..n-1, one write each, deletes every third and
// records a later use of every fifth; registers a node named prefix.
void WriteSome(MetadataStore* store, const std::string& prefix, int n) {
  v1::NodeInfo node;
  node.set_name(prefix);
  node.set_node_id(7);
  node.set_alive(true);
  REQUIRE(store->PutNode(node).ok());
  for (int i = 0; i < n; ++i) {
    ObjectRecord r;
    r.node_id = 7;
    r.addr = 4096 * i;
    r.length = 100 + i;
    r.generation = i + 1;
    r.parent_key = i > 0 ? absl::StrCat(prefix, "/", i - 1) : "";
    REQUIRE(store->PutObjects({{absl::StrCat(prefix, "/", i), r}}).ok());
  }
  MetadataMutation m;
  for (int i = 0; i < n; i += 3) {
    m.delete_objects.push_back(absl::StrCat(prefix, "/", i));
  }
  for (int i = 1; i < n; i += 5) {
    m.object_uses.emplace_back(absl::StrCat(prefix, "/", i), 1000 + i);
  }
  REQUIRE(store->Apply(m).ok());
}

// How the next Leader serves its source: as a synchronous gRPC service, or
// on a completion-queue poller as the master serves it. Each test that
// makes a leader runs both ways: it sets this first, from GENERATE.
bool g_on_poller = false;

// A leader's store, its ReplicationSource and a gRPC server on loopback.
struct Leader {
  explicit Leader(const std::string& name, uint64_t keep_wal_seconds = 3600,
                  const Authenticator* auth = nullptr,
                  absl::Duration batch_delay = absl::ZeroDuration(),
                  absl::Duration idle_poll_and_heartbeat = absl::ZeroDuration(),
                  absl::Duration ack_wait = ReplicationSourceOptions().ack_wait)
      : dir(TestDir(name + "_leader")) {
    RocksDbMetadataStoreOptions so;
    so.path = dir;
    so.keep_wal_seconds = keep_wal_seconds;
    auto s = RocksDbMetadataStore::Create(so);
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    owned = std::move(s).value();
    store = owned.get();
    ReplicationSourceOptions o;
    o.store = store;
    o.authenticator = auth;
    o.batch_delay = batch_delay;
    o.ack_wait = ack_wait;
    if (idle_poll_and_heartbeat > absl::ZeroDuration()) {
      o.idle_poll_interval = idle_poll_and_heartbeat;
      o.heartbeat_interval = idle_poll_and_heartbeat;
    }
    auto src = ReplicationSource::Create(o);
    INFO(src.status().ToString());
    REQUIRE(src.ok());
    source = std::move(src).value();
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                       &port);
    std::unique_ptr<grpc::ServerCompletionQueue> cq;
    if (g_on_poller) {
      b.RegisterService(source->async_service());
      cq = b.AddCompletionQueue();
    } else {
      b.RegisterService(source.get());
    }
    server = b.BuildAndStart();
    REQUIRE(server != nullptr);
    REQUIRE(port > 0);
    address = absl::StrCat("127.0.0.1:", port);
    if (cq != nullptr) {
      poller = std::make_unique<CqPoller>(std::move(cq));
      poller->Start("repl-poller", [this] { source->StartOn(poller.get()); });
    }
  }
  ~Leader() {
    source->Shutdown();
    server->Shutdown();
    if (poller != nullptr) poller->ShutdownAndJoin();
  }
  uint64_t Latest() { return store->LatestSequence(); }

  std::string dir;
  std::unique_ptr<RocksDbMetadataStore> owned;  // unless moved to a master
  RocksDbMetadataStore* store = nullptr;
  std::unique_ptr<ReplicationSource> source;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<CqPoller> poller;  // g_on_poller
  std::string address;
};

std::unique_ptr<ReplicaFollower> Follow(const std::string& dir,
                                        const std::string& leader,
                                        const std::string& token = "") {
  ReplicaFollowerOptions o;
  o.leader = leader;
  o.store.path = dir;
  o.security.token = token;
  o.min_backoff = absl::Milliseconds(10);
  o.max_backoff = absl::Milliseconds(100);
  auto f = ReplicaFollower::Create(o);
  INFO(f.status().ToString());
  REQUIRE(f.ok());
  return std::move(f).value();
}

void WaitApplied(ReplicaFollower* f, uint64_t seq) {
  absl::Status s = f->WaitApplied(seq, Soon());
  INFO(s.ToString() << "; last error: " << f->GetStats().last_error);
  REQUIRE(s.ok());
}

// A standby of the test's own on a raw stream: it claims the leader's
// database up to its latest sequence (no full copy) and acknowledges only
// when told. Destroy it before the leader.
struct RawStandby {
  RawStandby(const Leader& leader, const std::string& name)
      : stub(v1::Replication::NewStub(grpc::CreateChannel(
            leader.address, grpc::InsecureChannelCredentials()))),
        stream(stub->Follow(&ctx)) {
    v1::FollowRequest first;
    first.set_follower(name);
    first.set_leader_db_id(leader.source->db_id());
    first.set_from_sequence(leader.store->LatestSequence());
    REQUIRE(stream->Write(first));
    v1::FollowResponse start = Next();
    REQUIRE(start.kind() == v1::FollowResponse::START);
    REQUIRE_FALSE(start.copy());
  }
  ~RawStandby() {
    Leave();
    stream->Finish();
  }
  // The leader's next message.
  v1::FollowResponse Next() {
    v1::FollowResponse m;
    REQUIRE(stream->Read(&m));
    return m;
  }
  void Ack(uint64_t seq) {
    v1::FollowRequest a;
    a.set_applied_sequence(seq);
    REQUIRE(stream->Write(a));
  }
  // Ends the stream: the leader sees the standby leave.
  void Leave() { ctx.TryCancel(); }

  std::unique_ptr<v1::Replication::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::FollowRequest, v1::FollowResponse>>
      stream;
};

TEST_CASE("A follower catches up from empty with a full copy, then follows "
          "live writes") {
  g_on_poller = GENERATE(false, true);
  Leader leader("catch_up");
  WriteSome(leader.store, "before", 50);
  const std::string dir = TestDir("catch_up_standby");
  auto f = Follow(dir, leader.address);
  WaitApplied(f.get(), leader.Latest());
  CHECK(f->GetStats().full_copies == 1);
  CHECK(f->GetStats().batches_applied == 0);

  WriteSome(leader.store, "after", 40);
  WaitApplied(f.get(), leader.Latest());
  ReplicaFollower::Stats fs = f->GetStats();
  CHECK(fs.full_copies == 1);
  CHECK(fs.batches_applied > 40);
  CHECK(fs.applied_sequence == leader.Latest());
  CHECK(fs.leader_db_id == leader.source->db_id());

  // The acknowledgement reaches the leader after the follower applied.
  REQUIRE(leader.source->WaitReplicated(leader.Latest(), Soon()).ok());
  ReplicationSource::Stats ss = leader.source->GetStats();
  CHECK(ss.full_copies == 1);
  REQUIRE(ss.followers.size() == 1);
  CHECK(ss.followers[0].name == "standby");
  CHECK(ss.followers[0].acked_sequence == leader.Latest());
  CHECK(ss.followers[0].lag_sequences == 0);
  CHECK_FALSE(ss.followers[0].copying);

  REQUIRE(f->Stop().ok());
  const auto want = DumpStore(leader.store);
  CHECK(want.size() > 60);
  CHECK(DumpDir(dir) == want);
}

TEST_CASE(
    "With a batch delay a stream sends the writes of that time as one "
    "message, and a commit waiting for a follower cuts the delay") {
  g_on_poller = GENERATE(false, true);
  // A delay far longer than the writes or a round trip take, even under a
  // sanitizer.
  Leader leader("batch_delay", 3600, nullptr, absl::Seconds(1));
  WriteSome(leader.store, "before", 5);
  auto f = Follow(TestDir("batch_delay_standby"), leader.address);
  WaitApplied(f.get(), leader.Latest());
  const ReplicationSource::Stats s0 = leader.source->GetStats();

  // Each write notified, as a leader's commits are, and given up to 20 ms
  // to reach the follower: without the delay each goes out on its own;
  // with it none does before the delay ends (30 x 20 ms < 1 s).
  int applied_at_once = 0;
  for (int i = 0; i < 30; ++i) {
    ObjectRecord r;
    r.node_id = 7;
    r.length = 100;
    r.generation = i + 1;
    REQUIRE(leader.store->PutObjects({{absl::StrCat("after/", i), r}}).ok());
    leader.source->NotifyWrite();
    if (f->WaitApplied(leader.Latest(), absl::Now() + absl::Milliseconds(20))
            .ok()) {
      ++applied_at_once;
    }
  }
  WaitApplied(f.get(), leader.Latest());
  CHECK(applied_at_once < 15);
  const ReplicationSource::Stats s1 = leader.source->GetStats();
  const uint64_t batches = s1.batches_sent - s0.batches_sent;
  const uint64_t messages = s1.messages_sent - s0.messages_sent;
  INFO(batches << " batches in " << messages << " messages");
  CHECK(batches >= 30);
  CHECK(messages * 4 < batches);

  // One more write and a commit waiting for it: sent before the delay.
  WriteSome(leader.store, "last", 1);
  const absl::Time start = absl::Now();
  absl::Status held = leader.source->WaitReplicated(
      leader.Latest(), start + absl::Milliseconds(500));
  INFO(held.ToString());
  CHECK(held.ok());
  REQUIRE(f->Stop().ok());
}

TEST_CASE(
    "On a poller every write to the leader's store reaches a "
    "follower at once, with no commit to notify it and no idle poll") {
  g_on_poller = true;
  // Polls and heartbeats an hour apart: only the store's write listener
  // can wake the stream.
  Leader leader("write_listener", 3600, nullptr, absl::ZeroDuration(),
                absl::Hours(1));
  WriteSome(leader.store, "before", 5);
  auto f = Follow(TestDir("write_listener_standby"), leader.address);
  WaitApplied(f.get(), leader.Latest());
  // Writes as an eviction's or a registration's: nobody calls NotifyWrite.
  for (int round = 0; round < 3; ++round) {
    WriteSome(leader.store, absl::StrCat("after", round), 3);
    WaitApplied(f.get(), leader.Latest());
  }
  REQUIRE(f->Stop().ok());
}

// Puts one object `key`, as a commit would.
void PutOne(MetadataStore* store, const std::string& key) {
  ObjectRecord r;
  r.node_id = 7;
  r.length = 100;
  r.generation = 1;
  REQUIRE(store->PutObjects({{key, r}}).ok());
}

TEST_CASE(
    "A stream keeps one log message unacknowledged: the writes made "
    "meanwhile go out as one message when the follower acknowledges it, "
    "or at the ack wait without") {
  g_on_poller = GENERATE(false, true);
  // An ack wait far longer than the checks below take, even under a
  // sanitizer.
  Leader leader("ack_wait", 3600, nullptr, absl::ZeroDuration(),
                absl::ZeroDuration(), absl::Seconds(1));
  RawStandby slow(leader, "slow");

  // The first write goes out at once: nothing is unacknowledged.
  PutOne(leader.store, "one");
  v1::FollowResponse m = slow.Next();
  REQUIRE(m.kind() == v1::FollowResponse::BATCH);
  REQUIRE(m.batches_size() == 1);
  const uint64_t first_sent = leader.Latest();
  const uint64_t messages = leader.source->GetStats().messages_sent;

  // Nine more while it is unacknowledged: none is sent, not even for a
  // commit that waits for the follower (the wait's time is the check's).
  for (int i = 0; i < 9; ++i) PutOne(leader.store, absl::StrCat("more/", i));
  absl::Status held = leader.source->WaitReplicated(
      leader.Latest(), absl::Now() + absl::Milliseconds(200));
  CHECK(absl::IsDeadlineExceeded(held));
  CHECK(leader.source->GetStats().messages_sent == messages);

  // The acknowledgement releases them, as one message.
  slow.Ack(first_sent);
  m = slow.Next();
  REQUIRE(m.kind() == v1::FollowResponse::BATCH);
  CHECK(m.batches_size() == 9);
  CHECK(m.sequence() == first_sent + 1);

  // Left unacknowledged, a message holds the next only for the ack wait.
  PutOne(leader.store, "last");
  m = slow.Next();
  REQUIRE(m.kind() == v1::FollowResponse::BATCH);
  CHECK(m.batches_size() == 1);
}

TEST_CASE("A batch delay or ack wait outside [0, 1 s] is refused") {
  RocksDbMetadataStoreOptions so;
  so.path = TestDir("batch_delay_refused");
  auto store = RocksDbMetadataStore::Create(so);
  REQUIRE(store.ok());
  ReplicationSourceOptions o;
  o.store = store->get();
  o.batch_delay = absl::Seconds(2);
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o.batch_delay = -absl::Milliseconds(1);
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o.batch_delay = absl::Seconds(1);
  CHECK(o.Validate().ok());
  o.ack_wait = absl::Seconds(2);
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o.ack_wait = absl::ZeroDuration();
  CHECK(o.Validate().ok());
}

TEST_CASE("A restarted follower resumes from its position without a full "
          "copy") {
  g_on_poller = GENERATE(false, true);
  Leader leader("resume");
  WriteSome(leader.store, "one", 30);
  const std::string dir = TestDir("resume_standby");
  {
    auto f = Follow(dir, leader.address);
    WaitApplied(f.get(), leader.Latest());
    WriteSome(leader.store, "two", 10);  // some through the log
    WaitApplied(f.get(), leader.Latest());
    REQUIRE(f->Stop().ok());
  }
  WriteSome(leader.store, "three", 20);  // while it is down
  auto f = Follow(dir, leader.address);
  WaitApplied(f.get(), leader.Latest());
  CHECK(f->GetStats().full_copies == 0);
  CHECK(f->GetStats().batches_applied >= 20);
  const ReplicationSource::Stats ss = leader.source->GetStats();
  CHECK(ss.full_copies == 1);
  // What was written while it was down went out together (one message,
  // applied in one write).
  CHECK(ss.messages_sent < ss.batches_sent);
  REQUIRE(f->Stop().ok());
  CHECK(DumpDir(dir) == DumpStore(leader.store));
}

TEST_CASE("A follower whose position is no longer in the leader's log gets a "
          "full copy") {
  g_on_poller = GENERATE(false, true);
  Leader leader("trimmed", /*keep_wal_seconds=*/0);
  WriteSome(leader.store, "one", 30);
  const std::string dir = TestDir("trimmed_standby");
  uint64_t position = 0;
  {
    auto f = Follow(dir, leader.address);
    WaitApplied(f.get(), leader.Latest());
    position = f->GetStats().applied_sequence;
    REQUIRE(f->Stop().ok());
  }
  // Everything since `position` moves to table files and the old log goes.
  WriteSome(leader.store, "two", 30);
  rocksdb::FlushOptions fo;
  fo.wait = true;
  REQUIRE(leader.store->db()->Flush(fo).ok());
  WriteSome(leader.store, "three", 5);
  REQUIRE(Eventually([&] {
    return absl::IsNotFound(leader.store->ForEachObjectChangeSince(
        position, [](const MetadataStore::ObjectChange&) {}));
  }));

  auto f = Follow(dir, leader.address);
  WaitApplied(f.get(), leader.Latest());
  CHECK(f->GetStats().full_copies == 1);
  CHECK(leader.source->GetStats().full_copies == 2);
  REQUIRE(f->Stop().ok());
  CHECK(DumpDir(dir) == DumpStore(leader.store));
}

TEST_CASE("A directory written by a master since it followed gets a full "
          "copy") {
  g_on_poller = GENERATE(false, true);
  Leader leader("diverged");
  WriteSome(leader.store, "one", 20);
  const std::string dir = TestDir("diverged_standby");
  {
    auto f = Follow(dir, leader.address);
    WaitApplied(f.get(), leader.Latest());
    REQUIRE(f->Stop().ok());
  }
  {
    // Elected meanwhile: opened and written as a leader's store.
    RocksDbMetadataStoreOptions so;
    so.path = dir;
    auto s = RocksDbMetadataStore::Create(so);
    REQUIRE(s.ok());
    WriteSome(s->get(), "mine", 5);
  }
  auto f = Follow(dir, leader.address);
  WaitApplied(f.get(), leader.Latest());
  CHECK(f->GetStats().full_copies == 1);
  REQUIRE(f->Stop().ok());
  CHECK(DumpDir(dir) == DumpStore(leader.store));
}

TEST_CASE("WaitReplicated returns once a follower holds the sequence, and "
          "DEADLINE_EXCEEDED without one") {
  g_on_poller = GENERATE(false, true);
  Leader leader("wait");
  WriteSome(leader.store, "one", 5);
  CHECK(leader.source
            ->WaitReplicated(leader.Latest(),
                             absl::Now() + absl::Milliseconds(50))
            .code() == absl::StatusCode::kDeadlineExceeded);

  const std::string dir = TestDir("wait_standby");
  auto f = Follow(dir, leader.address);
  for (int i = 0; i < 20; ++i) {
    ObjectRecord r;
    r.node_id = 7;
    r.length = 1;
    r.generation = 100 + i;
    REQUIRE(leader.store->PutObjects({{absl::StrCat("w", i), r}}).ok());
    const uint64_t seq = leader.Latest();
    absl::Status s = leader.source->WaitReplicated(seq, Soon());
    INFO(s.ToString());
    REQUIRE(s.ok());
    // Acknowledged means applied by the follower.
    CHECK(f->GetStats().applied_sequence >= seq);
  }
  REQUIRE(f->Stop().ok());
  // The follower is gone: nothing newer is held anywhere else.
  REQUIRE(leader.store->PutObjects({{"late", ObjectRecord{}}}).ok());
  CHECK(leader.source
            ->WaitReplicated(leader.Latest(),
                             absl::Now() + absl::Milliseconds(50))
            .code() == absl::StatusCode::kDeadlineExceeded);
  leader.source->Shutdown();
  CHECK(leader.source->WaitReplicated(leader.Latest(), Soon()).code() ==
        absl::StatusCode::kUnavailable);
}

// OnReplicated's answer, once it comes (hymcache::Mutex: tsan sees its
// ordering, not that of Debian's uninstrumented absl::Notification).
struct Answer {
  void Set(absl::Status s) {
    MutexLock l(&mu);
    status = std::move(s);
    done = true;
  }
  bool Done() {
    MutexLock l(&mu);
    return done;
  }
  absl::Status Get() {
    MutexLock l(&mu);
    const absl::Time deadline = Soon();
    while (!done && absl::Now() < deadline) {
      mu.AwaitWithDeadline(absl::Condition(&done), deadline);
    }
    REQUIRE(done);
    return status;
  }
  Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
};

TEST_CASE(
    "With two standbys a commit is held only once both hold it; a "
    "standby that leaves stops counting") {
  g_on_poller = GENERATE(false, true);
  Leader leader("two");
  WriteSome(leader.store, "one", 5);
  auto f = Follow(TestDir("two_standby"), leader.address);
  WaitApplied(f.get(), leader.Latest());

  // A second standby that acknowledges only when the test says so. It
  // acknowledges its start once, so it is past its copy.
  RawStandby silent(leader, "silent");
  silent.Ack(leader.Latest());
  REQUIRE(Eventually([&] { return leader.source->FollowersPastCopy() == 2; }));

  REQUIRE(leader.store->PutObjects({{"x", ObjectRecord{}}}).ok());
  const uint64_t seq = leader.Latest();
  WaitApplied(f.get(), seq);
  // The real standby holds it; the silent one has not said so.
  CHECK(
      leader.source->WaitReplicated(seq, absl::Now() + absl::Milliseconds(100))
          .code() == absl::StatusCode::kDeadlineExceeded);
  Answer later;
  leader.source->OnReplicated(seq, Soon(),
                              [&](absl::Status s) { later.Set(s); });
  CHECK(!later.Done());
  silent.Ack(seq);
  CHECK(later.Get().ok());
  CHECK(leader.source->WaitReplicated(seq, Soon()).ok());

  // A commit the silent standby never acknowledges is answered when it
  // leaves: the standby left holds it.
  REQUIRE(leader.store->PutObjects({{"y", ObjectRecord{}}}).ok());
  const uint64_t seq2 = leader.Latest();
  Answer on_leave;
  leader.source->OnReplicated(seq2, Soon(),
                              [&](absl::Status s) { on_leave.Set(s); });
  WaitApplied(f.get(), seq2);
  silent.Leave();
  CHECK(on_leave.Get().ok());
  REQUIRE(f->Stop().ok());
}

TEST_CASE("OnReplicated answers once a follower holds the sequence, at its "
          "deadline without one, and at Shutdown") {
  g_on_poller = GENERATE(false, true);
  Leader leader("on_replicated");
  WriteSome(leader.store, "one", 5);
  {
    Answer late;
    leader.source->OnReplicated(leader.Latest(),
                                absl::Now() + absl::Milliseconds(50),
                                [&](absl::Status s) { late.Set(s); });
    CHECK(late.Get().code() == absl::StatusCode::kDeadlineExceeded);
  }

  auto f = Follow(TestDir("on_replicated_standby"), leader.address);
  // Waits past every write below, with a deadline later than theirs.
  Answer never;
  leader.source->OnReplicated(leader.Latest() + 1000000,
                              Soon() + absl::Hours(1),
                              [&](absl::Status s) { never.Set(s); });
  for (int i = 0; i < 10; ++i) {
    REQUIRE(leader.store->PutObjects({{absl::StrCat("o", i), ObjectRecord{}}})
                .ok());
    const uint64_t seq = leader.Latest();
    Answer held;
    leader.source->OnReplicated(seq, Soon(),
                                [&](absl::Status s) { held.Set(s); });
    absl::Status s = held.Get();
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(f->GetStats().applied_sequence >= seq);
  }
  CHECK_FALSE(never.Done());
  leader.source->Shutdown();
  CHECK(never.Get().code() == absl::StatusCode::kUnavailable);
  Answer after;
  leader.source->OnReplicated(1, Soon(), [&](absl::Status s) { after.Set(s); });
  CHECK(after.Get().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("Only an admin of the cluster may follow the leader") {
  g_on_poller = GENERATE(false, true);
  auto admin = NewToken();
  auto engine = NewToken();
  REQUIRE(admin.ok());
  REQUIRE(engine.ok());
  auto auth = IdentitiesFromText(
      IdentityLine(Role::kAdmin, "-", "master-b", *admin) + "\n" +
      IdentityLine(Role::kEngine, "acme", "vllm", *engine) + "\n");
  REQUIRE(auth.ok());
  Leader leader("auth", 3600, auth->get());
  WriteSome(leader.store, "one", 5);

  auto engine_follower = Follow(TestDir("auth_engine"), leader.address,
                                *engine);
  REQUIRE(Eventually([&] {
    return engine_follower->GetStats().last_error.find("PERMISSION_DENIED") !=
           std::string::npos;
  }));
  auto anonymous = Follow(TestDir("auth_anonymous"), leader.address);
  REQUIRE(Eventually([&] {
    return anonymous->GetStats().last_error.find("UNAUTHENTICATED") !=
           std::string::npos;
  }));
  CHECK(engine_follower->GetStats().applied_sequence == 0);
  CHECK(anonymous->GetStats().applied_sequence == 0);

  auto f = Follow(TestDir("auth_admin"), leader.address, *admin);
  WaitApplied(f.get(), leader.Latest());
  CHECK(leader.source->GetStats().streams_refused >= 2);
}

TEST_CASE("A follower moved to another leader with SetLeader follows it") {
  g_on_poller = GENERATE(false, true);
  Leader a("move_a");
  Leader b("move_b");
  WriteSome(a.store, "a", 10);
  WriteSome(b.store, "b", 12);
  const std::string dir = TestDir("move_standby");
  auto f = Follow(dir, a.address);
  WaitApplied(f.get(), a.Latest());
  f->SetLeader(b.address);
  REQUIRE(Eventually([&] {
    return f->GetStats().leader_db_id == b.source->db_id() &&
           f->GetStats().applied_sequence == b.Latest();
  }));
  CHECK(f->GetStats().full_copies == 2);  // another database: a full copy
  REQUIRE(f->Stop().ok());
  CHECK(DumpDir(dir) == DumpStore(b.store));
}

TEST_CASE(
    "A follower names the leader its data came from only once that "
    "leader's stream confirmed or changed its store") {
  g_on_poller = GENERATE(false, true);
  Leader a("data_leader_a");
  WriteSome(a.store, "a", 10);
  const std::string dir = TestDir("data_leader_standby");
  {
    auto f = Follow(dir, a.address);
    WaitApplied(f.get(), a.Latest());
    const ReplicaFollower::Stats st = f->GetStats();
    CHECK(st.data_leader == a.address);
    CHECK(st.leader == a.address);
    // Told to follow a leader it cannot reach, it still holds a's data,
    // and says so: a standby whose two names differ knows nothing of the
    // new leader's commits.
    f->SetLeader("127.0.0.1:1");
    const ReplicaFollower::Stats moved = f->GetStats();
    CHECK(moved.leader == "127.0.0.1:1");
    CHECK(moved.data_leader == a.address);
    REQUIRE(f->Stop().ok());
  }
  // Restarted, the store still has a's identity and position, but no
  // leader has confirmed them since: no data leader until a's stream does.
  auto f = Follow(dir, "127.0.0.1:1");
  CHECK(f->GetStats().leader_db_id == a.source->db_id());
  CHECK(f->GetStats().applied_sequence == a.Latest());
  CHECK(f->GetStats().data_leader.empty());
  f->SetLeader(a.address);
  REQUIRE(Eventually([&] { return f->GetStats().data_leader == a.address; }));
  CHECK(f->GetStats().full_copies == 0);  // confirmed by resuming, not copied
  REQUIRE(f->Stop().ok());
}

// -------------------------------------------- through the master, end to end

using service_test::Everything;

TEST_CASE("A standby's directory, opened by a master, lists exactly what the "
          "leader's master committed") {
  g_on_poller = GENERATE(false, true);
  using service_test::NodeReq;
  using service_test::PutReq;
  using service_test::Reg;
  FakeClock clock;
  MasterServiceOptions mo;
  mo.clock = &clock;
  mo.max_pending_share_per_caller = 1.0;
  Leader leader("e2e");
  auto svc = MasterService::Create(mo, std::move(leader.owned));
  REQUIRE(svc.ok());
  MasterService* m = svc->get();
  REQUIRE(Reg(m, NodeReq("node-a", 1, {{0, 1 << 24}})).ok());
  REQUIRE(Reg(m, NodeReq("node-b", 1, {{0, 1 << 24}}, 7100)).ok());

  const std::string dir = TestDir("e2e_standby");
  auto f = Follow(dir, leader.address);
  std::vector<std::string> keys;
  uint64_t max_generation = 0;
  for (int put = 0; put < 30; ++put) {
    std::vector<std::string> chunk;
    for (int i = 0; i < 4; ++i) chunk.push_back(absl::StrCat("k", put, "/", i));
    auto r = m->PutStart(PutReq(chunk, {100, 200, 300, 400}));
    REQUIRE(r.ok());
    for (const auto& s : r->slots()) {
      max_generation = std::max(max_generation, s.location().generation());
    }
    v1::PutCommitRequest c;
    c.set_put_id(r->put_id());
    service_test::AddReceipts(*r, &c);
    REQUIRE(m->PutCommit(c).ok());
    // A synchronous leader acknowledges the commit only now.
    REQUIRE(leader.source->WaitReplicated(leader.Latest(), Soon()).ok());
    keys.insert(keys.end(), chunk.begin(), chunk.end());
  }
  // Removed on the leader: gone on the standby too.
  v1::RemoveRequest rm;
  rm.add_keys("k3/0");
  REQUIRE(m->Remove(rm).ok());
  // Started, never committed: not on the standby.
  auto pending = m->PutStart(PutReq({"pending"}, {64}));
  REQUIRE(pending.ok());
  for (const auto& s : pending->slots()) {
    max_generation = std::max(max_generation, s.location().generation());
  }
  const std::vector<std::string> want = Everything(m);
  REQUIRE(want.size() == 30 * 4 - 4);  // k3/0 took its chain with it
  WaitApplied(f.get(), leader.Latest());

  // The leader dies; the standby is elected: stops following, opens the
  // directory with the master's own restart path.
  REQUIRE(f->Stop().ok());
  leader.source->Shutdown();
  RocksDbMetadataStoreOptions so;
  so.path = dir;
  auto store = RocksDbMetadataStore::Create(so);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  auto standby = MasterService::Create(mo, std::move(store).value());
  INFO(standby.status().ToString());
  REQUIRE(standby.ok());
  CHECK(Everything(standby->get()) == want);
  CHECK((*standby)->GetStats().object_count() == want.size());

  // The nodes come back to the new leader with the keys the old one issued
  // (replicated with their records), and what the new leader hands out
  // never repeats a generation of the old one.
  auto back = Reg(standby->get(), NodeReq("node-a", 1, {{0, 1 << 24}}));
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  const uint32_t a = back->node_id();
  if (back->reconcile()) {
    // It holds everything the new leader lists for it.
    google::protobuf::RepeatedPtrField<v1::Location> held;
    uint64_t cursor = 0;
    bool more = true;
    while (more) {
      v1::ListObjectsResponse page;
      more = (*standby)->ListObjects(a, &cursor, 100, &page);
      for (const auto& o : page.objects()) *held.Add() = o.location();
    }
    auto rec = (*standby)->BeginReconcile(a, 1);
    REQUIRE(rec.ok());
    REQUIRE((*rec)->Add(held).ok());
    REQUIRE((*standby)->FinishReconcile(std::move(*rec)).ok());
  }
  auto fresh = (*standby)->PutStart(PutReq({"fresh"}, {64}));
  INFO(fresh.status().ToString());
  REQUIRE(fresh.ok());
  REQUIRE(fresh->put_id() != 0);
  REQUIRE(fresh->slots_size() == 1);
  CHECK(fresh->slots(0).location().generation() > max_generation);
  standby->reset();
  leader.source->Shutdown();  // before its store goes with the master
  svc->reset();
}

}  // namespace
}  // namespace master
}  // namespace hymcache
