#include "tools/hymbench/replay.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/clock.h"
#include "common/mutex.h"
#include "common/status_reason.h"
#include "common/thread.h"
#include "tools/hymbench/block_data.h"
#include "tools/hymbench/trace.h"

namespace hymcache::hymbench {
namespace {

class FakeStoreHandle : public StoreHandle {
 public:
  bool Done() const override {
    MutexLock l(&mu_);
    return done_;
  }
  absl::StatusOr<PutResult> Wait(absl::Time deadline) override {
    MutexLock l(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(&done_), deadline)) {
      return absl::DeadlineExceededError("store still running");
    }
    return result_;
  }
  void Complete(absl::StatusOr<PutResult> r) {
    MutexLock l(&mu_);
    result_ = std::move(r);
    done_ = true;
  }

 private:
  mutable Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<PutResult> result_ ABSL_GUARDED_BY(mu_);
};

// An in-memory cluster behind the Client interface: Load returns the leading
// run of stored keys; Store copies the blocks now, or later on its own thread
// (store_delay > 0), refusing blocks beyond capacity_blocks.
class FakeClient : public Client {
 public:
  struct Options {
    size_t capacity_blocks = SIZE_MAX;
    // > 0: stores complete asynchronously after this delay.
    absl::Duration store_delay = absl::ZeroDuration();
    // Every Load fails with this status (when not OK).
    absl::Status load_error;
    // When not OK: a Load stops after load_stop_after blocks with this
    // stop_reason (hit_prefix is still what is stored).
    absl::Status load_stop;
    size_t load_stop_after = 0;
    // The first refuse_queue Store calls are refused as the client refuses
    // them when its store queue is full.
    int refuse_queue = 0;
    // The error of a block refused for lack of room.
    absl::Status full = absl::ResourceExhaustedError("no node has room");
  };
  explicit FakeClient(Options o) : options_(std::move(o)) {
    if (options_.store_delay > absl::ZeroDuration()) {
      thread_ = Thread("fake-store", [this] { StoreLoop(); });
    }
  }
  ~FakeClient() override {
    {
      MutexLock l(&mu_);
      stop_ = true;
    }
    thread_.Join();
  }

  absl::StatusOr<LoadResult> Load(absl::Span<const std::string> keys,
                                  absl::Span<const MutableBuffer> buffers,
                                  const LoadOptions& options) override {
    if (!options_.load_error.ok()) return options_.load_error;
    if (keys.empty() || keys.size() != buffers.size()) {
      return absl::InvalidArgumentError("bad Load");
    }
    MutexLock l(&mu_);
    ++loads_;
    prefetch_seen_ = options.prefetch;
    for (const MutableBuffer& b : buffers) {
      if (!InRegionLocked(b.data, b.size)) ++outside_regions_;
      buffer_addresses_.insert(b.data);
    }
    LoadResult r;
    while (r.hit_prefix < keys.size() && blocks_.contains(keys[r.hit_prefix])) ++r.hit_prefix;
    for (; r.loaded < r.hit_prefix; ++r.loaded) {
      if (!options_.load_stop.ok() && r.loaded == options_.load_stop_after) {
        r.stop_reason = options_.load_stop;
        break;
      }
      const std::string& b = blocks_[keys[r.loaded]];
      if (b.size() > buffers[r.loaded].size) {
        r.stop_reason = absl::OutOfRangeError("buffer too small");
        break;
      }
      std::memcpy(buffers[r.loaded].data, b.data(), b.size());
      r.lengths.push_back(b.size());
      r.bytes += b.size();
    }
    if (r.loaded < keys.size() && r.stop_reason.ok()) {
      r.stop_reason = absl::NotFoundError("miss");
    }
    return r;
  }

  std::shared_ptr<StoreHandle> Store(absl::Span<const std::string> keys,
                                     absl::Span<const ConstBuffer> buffers,
                                     const StoreOptions& options) override {
    auto h = std::make_shared<FakeStoreHandle>();
    Job job{h, std::vector<std::string>(keys.begin(), keys.end()),
            std::vector<ConstBuffer>(buffers.begin(), buffers.end()),
            absl::Now() + options_.store_delay};
    MutexLock l(&mu_);
    for (const ConstBuffer& b : buffers) {
      if (!InRegionLocked(b.data, b.size)) ++outside_regions_;
    }
    if (store_calls_++ < options_.refuse_queue) {
      // As the SDK does (client/store.cc): the reason, not the message,
      // says the queue was full.
      h->Complete(WithReason(absl::ResourceExhaustedError("queue full"),
                             StatusReason::kStoreQueueFull));
      return h;
    }
    parents_.push_back({keys.empty() ? "" : keys[0], options.parent_key});
    if (options_.store_delay > absl::ZeroDuration()) {
      jobs_.push_back(std::move(job));
    } else {
      Execute(job);
    }
    return h;
  }

  // Flips a byte of a stored block.
  void CorruptForTest(const std::string& key) {
    MutexLock l(&mu_);
    blocks_[key][3] ^= 1;
  }
  size_t stored_blocks() {
    MutexLock l(&mu_);
    return blocks_.size();
  }
  // (first key of each Store, its parent_key), in call order.
  std::vector<std::pair<std::string, std::string>> parents() {
    MutexLock l(&mu_);
    return parents_;
  }
  bool prefetch_seen() {
    MutexLock l(&mu_);
    return prefetch_seen_;
  }

  // Unused by hymbench.
  absl::StatusOr<LookupResult> BatchLookup(absl::Span<const std::string>,
                                           const CallOptions&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<ExistsResult> Exists(absl::Span<const std::string>,
                                      const CallOptions&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<std::vector<bool>> Remove(absl::Span<const std::string>,
                                           const CallOptions&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<PrefixAnswer> PrefixQuery(absl::Span<const std::string>,
                                           const CallOptions&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<EngineBlocksReply> ReportEngineBlocks(
      const EngineBlocksReport&, const CallOptions&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<ClusterStatus> GetClusterStatus(const CallOptions&) override {
    ClusterStatus s;
    s.nodes.push_back({});
    s.nodes[0].alive = alive_;
    return s;
  }
  absl::Status RegisterMemory(void* data, size_t size) override {
    MutexLock l(&mu_);
    regions_[data] = size;
    ++registrations_;
    return absl::OkStatus();
  }
  absl::Status UnregisterMemory(void* data) override {
    MutexLock l(&mu_);
    return regions_.erase(data) == 1 ? absl::OkStatus() : absl::NotFoundError("not registered");
  }
  // Think-time hints: the keys of each, and how many of them were stored
  // when it came.
  struct HintSeen {
    std::vector<std::string> keys;
    size_t stored = 0;
    absl::Duration hold;
  };
  absl::Status HintNextTurn(absl::Span<const std::string> keys,
                            const TurnHintOptions& options) override {
    MutexLock l(&mu_);
    HintSeen h{std::vector<std::string>(keys.begin(), keys.end()), 0,
               options.hold};
    for (const std::string& k : keys) h.stored += blocks_.contains(k) ? 1 : 0;
    hints_.push_back(std::move(h));
    return absl::OkStatus();
  }
  absl::Status HintConversationEnded(
      absl::Span<const std::string> keys) override {
    MutexLock l(&mu_);
    HintSeen h{std::vector<std::string>(keys.begin(), keys.end()), 0,
               absl::ZeroDuration()};
    for (const std::string& k : keys) h.stored += blocks_.contains(k) ? 1 : 0;
    ended_.push_back(std::move(h));
    return absl::OkStatus();
  }
  std::vector<HintSeen> hints() {
    MutexLock l(&mu_);
    return hints_;
  }
  std::vector<HintSeen> ended() {
    MutexLock l(&mu_);
    return ended_;
  }
  // What the client saw, for the pool checks.
  struct Counts {
    size_t registrations = 0;     // RegisterMemory calls
    size_t registered_now = 0;    // regions still registered
    size_t outside_regions = 0;   // Load / Store buffers outside every region
    size_t buffer_addresses = 0;  // distinct Load buffer addresses
    int store_calls = 0;
  };
  Counts counts() {
    MutexLock l(&mu_);
    return {registrations_, regions_.size(), outside_regions_, buffer_addresses_.size(),
            store_calls_};
  }
  bool alive_ = true;

 private:
  struct Job {
    std::shared_ptr<FakeStoreHandle> handle;
    std::vector<std::string> keys;
    std::vector<ConstBuffer> buffers;
    absl::Time due;
  };

  bool InRegionLocked(const void* p, size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto* a = static_cast<const uint8_t*>(p);
    for (const auto& [base, len] : regions_) {
      const auto* b = static_cast<const uint8_t*>(base);
      if (a >= b && a + size <= b + len) return true;
    }
    return false;
  }

  void Execute(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    PutResult r;
    for (size_t i = 0; i < job.keys.size(); ++i) {
      if (blocks_.contains(job.keys[i])) {
        r.outcomes.push_back(PutOutcome::kAlreadyStored);
        r.errors.push_back(absl::OkStatus());
        ++r.skipped;
      } else if (blocks_.size() >= options_.capacity_blocks) {
        r.outcomes.push_back(PutOutcome::kFailed);
        r.errors.push_back(options_.full);
        ++r.failed;
        ++r.refused;
      } else {
        const auto* p = static_cast<const char*>(job.buffers[i].data);
        blocks_[job.keys[i]] = std::string(p, job.buffers[i].size);
        r.outcomes.push_back(PutOutcome::kStored);
        r.errors.push_back(absl::OkStatus());
        ++r.stored;
      }
    }
    job.handle->Complete(std::move(r));
  }

  void StoreLoop() {
    MutexLock l(&mu_);
    while (!stop_ || !jobs_.empty()) {
      if (jobs_.empty()) {
        mu_.AwaitWithDeadline(absl::Condition(
                                  +[](FakeClient* c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                    return c->stop_ || !c->jobs_.empty();
                                  },
                                  this),
                              absl::Now() + absl::Milliseconds(100));
        continue;
      }
      const absl::Time due = jobs_.front().due;
      if (absl::Now() < due) {
        mu_.Unlock();
        absl::SleepFor(due - absl::Now());
        mu_.Lock();
        continue;
      }
      Job job = std::move(jobs_.front());
      jobs_.pop_front();
      Execute(job);
    }
  }

  const Options options_;
  Mutex mu_;
  absl::flat_hash_map<std::string, std::string> blocks_ ABSL_GUARDED_BY(mu_);
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::string>> parents_ ABSL_GUARDED_BY(mu_);
  size_t loads_ ABSL_GUARDED_BY(mu_) = 0;
  int store_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<HintSeen> hints_ ABSL_GUARDED_BY(mu_);
  std::vector<HintSeen> ended_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<void*, size_t> regions_ ABSL_GUARDED_BY(mu_);
  size_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  size_t outside_regions_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<void*> buffer_addresses_ ABSL_GUARDED_BY(mu_);
  bool prefetch_seen_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Thread thread_;
};

std::vector<Request> Workload(int conversations = 3, int turns = 4) {
  SyntheticOptions o;
  o.conversations = conversations;
  o.turns = turns;
  o.system_prompt_tokens = 600;
  o.user_tokens = 700;
  o.output_tokens = 200;
  auto r = GenerateSynthetic(o);
  REQUIRE(r.ok());
  return *r;
}

ReplayOptions Small() {
  ReplayOptions o;
  o.block_bytes = 4096;
  o.verify = true;
  o.progress_interval = absl::ZeroDuration();
  return o;
}

size_t UniqueBlocks(const std::vector<Request>& reqs) {
  absl::flat_hash_map<uint64_t, int> ids;
  for (const Request& r : reqs) {
    for (uint64_t id : r.hash_ids) ids[id] = 1;
  }
  return ids.size();
}

size_t Lost(const ReplayResult& res, LossReason why) {
  size_t n = 0;
  for (const RequestRecord& r : res.records) n += r.lost[static_cast<int>(why)];
  return n;
}

// Every ceiling hit that was not loaded has exactly one reason.
void CheckLossesAddUp(const ReplayResult& res) {
  for (const RequestRecord& r : res.records) {
    size_t lost = 0;
    for (size_t v : r.lost) lost += v;
    CHECK(lost == (r.ceiling_hits > r.loaded ? r.ceiling_hits - r.loaded : 0));
  }
}

TEST_CASE("sequential replay with waited stores reaches the ceiling exactly") {
  FakeClient client({});
  std::vector<Request> reqs = Workload();
  ReplayOptions o = Small();
  o.wait_stores = true;
  o.prefetch = false;
  auto res = Replay(&client, reqs, o);
  REQUIRE(res.ok());
  REQUIRE(res->records.size() == reqs.size());
  size_t stored = 0, loaded = 0, ceiling = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestRecord& r = res->records[i];
    CHECK(r.index == i);
    CHECK(r.turn == reqs[i].turn);
    CHECK(r.conversation == reqs[i].conversation);
    CHECK(r.blocks == reqs[i].hash_ids.size());
    CHECK(r.loaded == r.ceiling_hits);
    CHECK(r.hit_prefix == r.loaded);
    CHECK(r.loaded_bytes == r.loaded * 4096);
    CHECK(r.store_keys == r.blocks - r.loaded);
    CHECK(r.stored == r.store_keys);
    CHECK(r.corrupt_blocks == 0);
    CHECK(r.load_called);
    stored += r.stored;
    loaded += r.loaded;
    ceiling += r.ceiling_hits;
  }
  CHECK(loaded == ceiling);
  CHECK(loaded > 0);
  CHECK(stored == UniqueBlocks(reqs));
  CHECK(client.stored_blocks() == UniqueBlocks(reqs));
  CHECK(res->load_calls == reqs.size());
  CHECK(res->load_errors == 0);
  CHECK(res->corrupt_blocks == 0);
  CHECK_FALSE(client.prefetch_seen());

  // parent_key: the key of the last loaded block (none on a full miss).
  BlockCodec codec(o.key_namespace, o.block_bytes);
  auto parents = client.parents();
  REQUIRE(parents.size() == reqs.size());  // every request stored something
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestRecord& r = res->records[i];
    CHECK(parents[i].first == codec.Key(reqs[i].hash_ids[r.loaded]));
    CHECK(parents[i].second == (r.loaded == 0 ? "" : codec.Key(reqs[i].hash_ids[r.loaded - 1])));
  }

  // A second run in the same namespace hits everything (already stored);
  // a new namespace starts cold.
  auto again = Replay(&client, reqs, o);
  REQUIRE(again.ok());
  for (const RequestRecord& r : again->records) CHECK(r.loaded == r.blocks);
  o.key_namespace = "other";
  auto cold = Replay(&client, reqs, o);
  REQUIRE(cold.ok());
  CHECK(cold->records[0].loaded == 0);
}

TEST_CASE("with hint_next_turn each request's blocks are hinted once stored") {
  FakeClient::Options fo;
  fo.store_delay = absl::Milliseconds(2);  // stores finish after the request
  FakeClient client(fo);
  std::vector<Request> reqs = Workload();
  ReplayOptions o = Small();
  o.hint_next_turn = true;
  o.hint_hold = absl::Seconds(7);
  auto res = Replay(&client, reqs, o);
  REQUIRE(res.ok());
  CHECK(res->hints_sent == reqs.size());
  CHECK(res->hints_dropped == 0);
  BlockCodec codec(o.key_namespace, o.block_bytes);
  std::set<std::vector<std::string>> want, got;
  for (const Request& q : reqs) {
    std::vector<std::string> keys;
    for (uint64_t id : q.hash_ids) keys.push_back(codec.Key(id));
    want.insert(keys);
  }
  for (const auto& h : client.hints()) {
    got.insert(h.keys);
    CHECK(h.stored == h.keys.size());  // sent after the store was done
    CHECK(h.hold == absl::Seconds(7));
  }
  CHECK(got == want);
  // Hints naming another namespace's blocks (every one wrong).
  FakeClient decoy(fo);
  o.hint_namespace = "decoy";
  REQUIRE(Replay(&decoy, reqs, o).ok());
  BlockCodec decoy_codec("decoy", o.block_bytes);
  std::set<std::vector<std::string>> decoys;
  for (const Request& q : reqs) {
    std::vector<std::string> keys;
    for (uint64_t id : q.hash_ids) keys.push_back(decoy_codec.Key(id));
    decoys.insert(keys);
  }
  REQUIRE(decoy.hints().size() == reqs.size());
  for (const auto& h : decoy.hints()) {
    CHECK(h.stored == 0);  // none of this run's blocks
    CHECK(decoys.count(h.keys) == 1);
  }
  // Off by default.
  FakeClient quiet({});
  REQUIRE(Replay(&quiet, reqs, Small()).ok());
  CHECK(quiet.hints().empty());
}

TEST_CASE(
    "with hint_conversation_end each conversation's last request ends it, once "
    "stored") {
  FakeClient::Options fo;
  fo.store_delay = absl::Milliseconds(2);
  FakeClient client(fo);
  const std::vector<Request> reqs = Workload(3, 4);
  ReplayOptions o = Small();
  o.hint_next_turn = true;
  o.hint_conversation_end = true;
  auto res = Replay(&client, reqs, o);
  REQUIRE(res.ok());
  BlockCodec codec(o.key_namespace, o.block_bytes);
  std::set<std::vector<std::string>> last_turns, turns, ended, hinted;
  for (const Request& q : reqs) {
    std::vector<std::string> keys;
    for (uint64_t id : q.hash_ids) keys.push_back(codec.Key(id));
    (q.turn == 3 ? last_turns : turns).insert(keys);
  }
  REQUIRE(last_turns.size() == 3);
  CHECK(res->ended_hints_sent == 3);
  CHECK(res->hints_sent == reqs.size() - 3);
  for (const auto& h : client.ended()) {
    ended.insert(h.keys);
    CHECK(h.stored == h.keys.size());  // sent after the store was done
  }
  for (const auto& h : client.hints()) hinted.insert(h.keys);
  CHECK(ended == last_turns);
  CHECK(hinted == turns);
  // Alone: only the ends.
  FakeClient ends_only(fo);
  o.hint_next_turn = false;
  res = Replay(&ends_only, reqs, o);
  REQUIRE(res.ok());
  CHECK(res->ended_hints_sent == 3);
  CHECK(ends_only.hints().empty());
  CHECK(ends_only.ended().size() == 3);
}

TEST_CASE("concurrent replay with asynchronous stores finishes every store") {
  FakeClient::Options fo;
  fo.store_delay = absl::Milliseconds(2);
  FakeClient client(fo);
  std::vector<Request> reqs = Workload(6, 5);
  ReplayOptions o = Small();
  o.concurrency = 4;
  auto res = Replay(&client, reqs, o);
  REQUIRE(res.ok());
  size_t stored = 0;
  for (const RequestRecord& r : res->records) {
    CHECK(r.loaded <= r.blocks);
    CHECK(r.corrupt_blocks == 0);
    CHECK(r.store_keys == r.blocks - r.loaded);
    // Every store finished and was accounted for.
    CHECK(r.stored + r.skipped == r.store_keys);
    CHECK(r.store_error.empty());
    stored += r.stored;
  }
  CHECK(stored == UniqueBlocks(reqs));
  CHECK(client.prefetch_seen());
}

TEST_CASE("verify catches a corrupted block") {
  FakeClient client({});
  std::vector<Request> reqs = Workload(1, 2);
  ReplayOptions o = Small();
  o.wait_stores = true;
  REQUIRE(Replay(&client, reqs, o).ok());
  // The last block of turn 1 is in no other request.
  REQUIRE(reqs[1].hash_ids.size() == 5);
  client.CorruptForTest(BlockCodec(o.key_namespace, o.block_bytes).Key(reqs[1].hash_ids[4]));
  auto res = Replay(&client, reqs, o);
  REQUIRE(res.ok());
  CHECK(res->corrupt_blocks == 1);
  CHECK(res->records[1].corrupt_blocks == 1);
  CHECK(res->first_corruption.find("request 1 block 4") != std::string::npos);
  CHECK(res->first_corruption.find("offset 3") != std::string::npos);

  // Without verify nothing is checked.
  o.verify = false;
  res = Replay(&client, reqs, o);
  REQUIRE(res.ok());
  CHECK(res->corrupt_blocks == 0);
}

TEST_CASE("refused writes are counted, lower the hit ratio, and are lost to admission") {
  FakeClient::Options fo;
  fo.capacity_blocks = 5;
  SECTION("no room") {}
  SECTION("write buffer") {
    fo.full = WithReason(absl::ResourceExhaustedError("storage node refused write"),
                         StatusReason::kNodeRefusedWrite);
  }
  FakeClient client(fo);
  std::vector<Request> reqs = Workload();
  ReplayOptions o = Small();
  o.wait_stores = true;
  auto res = Replay(&client, reqs, o);
  REQUIRE(res.ok());
  size_t stored = 0, refused = 0, loaded = 0, ceiling = 0;
  for (const RequestRecord& r : res->records) {
    stored += r.stored;
    refused += r.refused;
    loaded += r.loaded;
    ceiling += r.ceiling_hits;
    CHECK(r.store_failed == 0);
  }
  CHECK(stored == 5);
  CHECK(refused > 0);
  CHECK(loaded < ceiling);
  // Every hit the refusals cost is lost to the refusal's kind of admission.
  CheckLossesAddUp(*res);
  const bool write_buffer = ReasonOf(fo.full) == StatusReason::kNodeRefusedWrite;
  CHECK(Lost(*res, write_buffer ? LossReason::kRefusedWriteBuffer : LossReason::kRefusedNoRoom) ==
        ceiling - loaded);
}

TEST_CASE("failed loads are recorded and the blocks still stored") {
  FakeClient::Options fo;
  fo.load_error = absl::UnavailableError("master down");
  FakeClient client(fo);
  std::vector<Request> reqs = Workload(2, 2);
  auto res = Replay(&client, reqs, Small());
  REQUIRE(res.ok());
  CHECK(res->load_calls == reqs.size());
  CHECK(res->load_errors == reqs.size());
  CHECK(absl::IsUnavailable(res->first_load_error));
  for (const RequestRecord& r : res->records) {
    CHECK(r.load_error.find("master down") != std::string::npos);
    CHECK(r.loaded == 0);
    CHECK(r.store_keys > 0);
  }
}

TEST_CASE("the in-flight store budget drops stores instead of blocking") {
  FakeClient::Options fo;
  fo.store_delay = absl::Seconds(1);
  FakeClient client(fo);
  std::vector<Request> reqs = {Request{}, Request{}, Request{}};
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].input_length = 1024;
    reqs[i].hash_ids = {10 * i, 10 * i + 1};
  }
  ReplayOptions o = Small();
  o.max_store_bytes_in_flight = 2 * 4096;  // one request's buffers
  auto res = Replay(&client, reqs, o);
  REQUIRE(res.ok());
  CHECK(res->records[0].stored == 2);
  CHECK(res->records[1].store_dropped == 2);
  CHECK(res->records[2].store_dropped == 2);
  CHECK(res->records[1].stored == 0);
}

TEST_CASE("time scale spaces requests by trace time") {
  FakeClient client({});
  std::vector<Request> reqs(3);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].timestamp_ms = 1000 + 1000.0 * i;  // relative to the first request
    reqs[i].input_length = 10;
    reqs[i].hash_ids = {i};
  }
  ReplayOptions o = Small();
  o.time_scale = 20;  // 2 s of trace in 100 ms
  auto res = Replay(&client, reqs, o);
  REQUIRE(res.ok());
  CHECK(res->wall_seconds >= 0.1);
  CHECK(res->wall_seconds < 5);
}

TEST_CASE("requests without blocks and bad options") {
  FakeClient client({});
  std::vector<Request> reqs(2);
  reqs[1].input_length = 5;
  reqs[1].hash_ids = {1};
  auto res = Replay(&client, reqs, Small());
  REQUIRE(res.ok());
  CHECK_FALSE(res->records[0].load_called);
  CHECK(res->records[1].load_called);
  CHECK(res->load_calls == 1);

  auto bad = [&](auto mutate) {
    ReplayOptions o = Small();
    mutate(o);
    return Replay(&client, reqs, o).status().code() == absl::StatusCode::kInvalidArgument;
  };
  CHECK(bad([](ReplayOptions& o) { o.block_bytes = 0; }));
  CHECK(bad([](ReplayOptions& o) { o.concurrency = 0; }));
  CHECK(bad([](ReplayOptions& o) { o.time_scale = -1; }));
  CHECK(bad([](ReplayOptions& o) { o.store_timeout = absl::ZeroDuration(); }));
}

TEST_CASE("CheckCluster wants a live node") {
  FakeClient client({});
  CHECK(CheckCluster(&client).ok());
  client.alive_ = false;
  CHECK(CheckCluster(&client).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("each worker reads into one registered pool, allocated once") {
  FakeClient::Options fo;
  fo.store_delay = absl::Milliseconds(1);
  FakeClient client(fo);
  std::vector<Request> reqs = Workload(6, 5);
  size_t largest = 0;
  for (const Request& r : reqs) largest = std::max(largest, r.hash_ids.size());
  ReplayOptions o = Small();
  o.concurrency = 2;
  auto res = Replay(&client, reqs, o);
  REQUIRE(res.ok());
  // One pool per worker, registered once each, unregistered at the end;
  // every Load and Store buffer lies inside one of them.
  CHECK(res->pools_allocated == 2);
  CHECK(res->pool_bytes == 2 * largest * o.block_bytes);
  CHECK(res->pools_registered == 2);
  CHECK(res->pool_registration_error.ok());
  CHECK(client.counts().registrations == 2);
  CHECK(client.counts().registered_now == 0);
  CHECK(client.counts().outside_regions == 0);
  // Blocks come from a fixed set of slots: no more distinct addresses than
  // the pools hold, however many requests ran.
  CHECK(client.counts().buffer_addresses <= 2 * 2 * largest);
  size_t blocks = 0;
  for (const Request& r : reqs) blocks += r.hash_ids.size();
  CHECK(client.counts().buffer_addresses < blocks);
  for (const RequestRecord& r : res->records) CHECK(r.corrupt_blocks == 0);

  // Without registration nothing is registered and the run is the same.
  FakeClient plain({});
  o.register_pool = false;
  auto unregistered = Replay(&plain, reqs, o);
  REQUIRE(unregistered.ok());
  CHECK(unregistered->pools_registered == 0);
  CHECK(plain.counts().registrations == 0);
}

TEST_CASE("a pool smaller than a request is reported, not truncated") {
  FakeClient client({});
  std::vector<Request> reqs = Workload(1, 3);  // 3, 5 and 7 blocks
  ReplayOptions o = Small();
  o.pool_bytes = 4 * o.block_bytes;
  auto res = Replay(&client, reqs, o);
  CHECK(res.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(res.status().message().find("request 2 has 7 blocks") != std::string::npos);
  // A pool of exactly the largest request: stores hold slots, so the worker
  // waits for them, and every request still runs in full.
  FakeClient::Options fo;
  fo.store_delay = absl::Milliseconds(50);  // outlasts a request: the stores hold slots
  FakeClient slow(fo);
  o.pool_bytes = 7 * o.block_bytes;
  res = Replay(&slow, reqs, o);
  REQUIRE(res.ok());
  CHECK(res->pool_waits > 0);
  for (const RequestRecord& r : res->records) {
    CHECK(r.load_error.empty());
    CHECK(r.stored + r.skipped == r.store_keys);
  }
}

TEST_CASE("a full client store queue is retried, or lost to admission") {
  FakeClient::Options fo;
  fo.refuse_queue = 3;
  std::vector<Request> reqs = Workload();
  ReplayOptions o = Small();
  o.wait_stores = true;
  SECTION("retried within store_queue_wait: the ceiling is reached") {
    FakeClient client(fo);
    auto res = Replay(&client, reqs, o);
    REQUIRE(res.ok());
    CHECK(res->store_queue_retries == 3);
    CHECK(client.counts().store_calls == static_cast<int>(reqs.size()) + 3);
    for (const RequestRecord& r : res->records) CHECK(r.loaded == r.ceiling_hits);
    CheckLossesAddUp(*res);
  }
  SECTION("no wait: refused, and the hits it costs are counted") {
    FakeClient client(fo);
    o.store_queue_wait = absl::ZeroDuration();
    auto res = Replay(&client, reqs, o);
    REQUIRE(res.ok());
    CHECK(res->store_queue_retries == 0);
    CHECK(res->records[0].refused == res->records[0].store_keys);
    CheckLossesAddUp(*res);
    size_t lost = 0;
    for (const RequestRecord& r : res->records) lost += r.ceiling_hits - r.loaded;
    CHECK(lost > 0);
    CHECK(Lost(*res, LossReason::kRefusedStoreQueue) == lost);
  }
}

TEST_CASE("a Load that stops short loses the rest to its stop reason") {
  FakeClient::Options fo;
  fo.load_stop_after = 1;
  std::vector<Request> reqs = Workload();
  ReplayOptions o = Small();
  o.wait_stores = true;
  for (auto [status, why] :
       {std::pair{absl::UnavailableError("node down"), LossReason::kNodeError},
        std::pair{absl::DeadlineExceededError("late"), LossReason::kDeadline}}) {
    fo.load_stop = status;
    FakeClient client(fo);
    // Populate, then replay: every block is stored, and every ceiling hit
    // past the first block of a request is lost to the stop reason.
    REQUIRE(Replay(&client, reqs, o).ok());
    auto res = Replay(&client, reqs, o);
    REQUIRE(res.ok());
    CheckLossesAddUp(*res);
    size_t want = 0;
    for (const RequestRecord& r : res->records) {
      CHECK(r.loaded == std::min<size_t>(1, r.blocks));
      want += r.ceiling_hits - std::min(r.ceiling_hits, r.loaded);
    }
    CHECK(want > 0);
    CHECK(Lost(*res, why) == want);
  }
}

}  // namespace
}  // namespace hymcache::hymbench
