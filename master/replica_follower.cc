#include "master/replica_follower.h"

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/rocksdb_util.h"
#include "proto/replication.grpc.pb.h"

namespace hymcache {
namespace master {

namespace v1 = ::hymcache::v1;

namespace {

// The position record under kReplicaPositionKey, little-endian:
//   leader sequence u64 + local sequence u64 + flags u8 (1: copying) +
//   the leader database's identity.
constexpr size_t kPositionFixed = 8 + 8 + 1;

struct Position {
  uint64_t leader_seq = 0;
  uint64_t local_seq = 0;
  bool copying = false;
  std::string db_id;
};

std::string EncodePosition(const Position& p) {
  std::string v(kPositionFixed, '\0');
  absl::little_endian::Store64(v.data(), p.leader_seq);
  absl::little_endian::Store64(v.data() + 8, p.local_seq);
  v[16] = p.copying ? 1 : 0;
  v += p.db_id;
  return v;
}

absl::StatusOr<Position> DecodePosition(absl::string_view v) {
  if (v.size() < kPositionFixed) {
    return absl::DataLossError(absl::StrCat(
        "replica follower: position record of ", v.size(), " bytes"));
  }
  Position p;
  p.leader_seq = absl::little_endian::Load64(v.data());
  p.local_seq = absl::little_endian::Load64(v.data() + 8);
  p.copying = v[16] != 0;
  p.db_id = std::string(v.substr(kPositionFixed));
  return p;
}

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  return FromRocksDb(s, "replica follower", what);
}

// The write batches of a BATCH message as one. A batch's representation
// (RocksDB's write-log record: sequence u64, count u32, then the records)
// is stable across RocksDB versions; the records of several batches
// concatenate under one header with their summed count (what RocksDB's
// internal WriteBatchInternal::Append does).
constexpr size_t kBatchHeader = 12;
absl::StatusOr<rocksdb::WriteBatch> Concatenate(const v1::FollowResponse& m) {
  if (m.batches_size() == 1) {
    rocksdb::WriteBatch b(m.batches(0));
    if (b.Count() != m.count() || m.count() == 0) {
      return absl::DataLossError(absl::StrCat(
          "batch at sequence ", m.sequence(), " holds ", b.Count(),
          " records, announced ", m.count()));
    }
    return b;
  }
  size_t size = kBatchHeader;
  for (const std::string& rep : m.batches()) {
    if (rep.size() < kBatchHeader) {
      return absl::DataLossError(absl::StrCat(
          "a batch of ", rep.size(), " bytes at sequence ", m.sequence()));
    }
    size += rep.size() - kBatchHeader;
  }
  std::string all;
  all.reserve(size);
  all.append(kBatchHeader, '\0');
  uint64_t count = 0;
  for (const std::string& rep : m.batches()) {
    count += absl::little_endian::Load32(rep.data() + 8);
    all.append(rep, kBatchHeader, std::string::npos);
  }
  if (count != m.count() || count == 0 || count > UINT32_MAX) {
    return absl::DataLossError(absl::StrCat(
        "batches at sequence ", m.sequence(), " hold ", count,
        " records, announced ", m.count()));
  }
  absl::little_endian::Store32(all.data() + 8, static_cast<uint32_t>(count));
  rocksdb::WriteBatch b(std::move(all));
  if (b.Count() != count) {
    return absl::DataLossError("concatenated batches do not add up");
  }
  return b;
}

}  // namespace

absl::Status ReplicaFollowerOptions::Validate() const {
  absl::Status s = store.Validate();
  if (!s.ok()) return s;
  if (min_backoff <= absl::ZeroDuration() || max_backoff < min_backoff) {
    return absl::InvalidArgumentError(
        "replica follower: need 0 < min_backoff <= max_backoff");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ReplicaFollower>> ReplicaFollower::Create(
    const ReplicaFollowerOptions& options) {
  absl::Status s = options.Validate();
  if (!s.ok()) return s;
  mkdir(options.store.path.c_str(), 0755);
  ReleasePreallocatedSpace(options.store.path);
  rocksdb::DB* raw = nullptr;
  // The follow thread only writes: its one point read is the position at
  // start, and a full copy's scan. A vector memtable appends each write and
  // sorts once, at flush, where the default skip list searches for every
  // key's place: the standby's CPU per put fell by about a quarter with
  // asynchronous replication (docs/ha.md, "One message in flight"). It
  // takes a single writer.
  rocksdb::Options db_options = MetadataStoreDbOptions(options.store);
  db_options.memtable_factory = std::make_shared<rocksdb::VectorRepFactory>();
  db_options.allow_concurrent_memtable_write = false;
  s = FromRocks(rocksdb::DB::Open(db_options, options.store.path, &raw),
                absl::StrCat("open ", options.store.path));
  if (!s.ok()) return s;
  std::unique_ptr<ReplicaFollower> f(new ReplicaFollower(options));
  f->db_.reset(raw);

  std::string value;
  rocksdb::Status rs =
      f->db_->Get(rocksdb::ReadOptions(), kReplicaPositionKey, &value);
  if (rs.ok()) {
    absl::StatusOr<Position> p = DecodePosition(value);
    if (!p.ok()) return p.status();
    const uint64_t local = f->db_->GetLatestSequenceNumber();
    if (p->copying) {
      LOG(INFO) << "replica " << options.store.path
                << ": a full copy was interrupted; copying again";
    } else if (p->local_seq != local) {
      LOG(INFO) << "replica " << options.store.path
                << ": written since it followed (local sequence " << local
                << ", position at " << p->local_seq
                << "): taking a full copy";
    } else {
      MutexLock l(&f->mu_);
      f->stats_.applied_sequence = p->leader_seq;
      f->stats_.leader_db_id = p->db_id;
      LOG(INFO) << "replica " << options.store.path
                << " resumes after leader sequence " << p->leader_seq;
    }
  } else if (!rs.IsNotFound()) {
    return FromRocks(rs, "read the position");
  }
  {
    MutexLock l(&f->mu_);
    f->leader_ = options.leader;
    f->stats_.leader = options.leader;
  }
  absl::StatusOr<Thread> t =
      Thread::Start("repl-follow", [p = f.get()] { p->Run(); });
  if (!t.ok()) return t.status();
  f->thread_ = std::move(t).value();
  return f;
}

ReplicaFollower::ReplicaFollower(const ReplicaFollowerOptions& options)
    : options_(options) {}

ReplicaFollower::~ReplicaFollower() {
  absl::Status s = Stop();
  if (!s.ok()) LOG(WARNING) << "replica follower: " << s;
}

void ReplicaFollower::SetLeader(const std::string& leader) {
  {
    MutexLock l(&mu_);
    if (leader == leader_) return;
    leader_ = leader;
    stats_.leader = leader;
    ++leader_changes_;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  changed_.SignalAll();
}

absl::Status ReplicaFollower::Stop() {
  MutexLock stop(&stop_mu_);
  {
    MutexLock l(&mu_);
    if (stopped_) return absl::OkStatus();
    stopping_ = true;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  changed_.SignalAll();
  thread_.Join();
  absl::Status s;
  if (db_ != nullptr) {
    s = FromRocks(db_->Close(), "close");
    db_.reset();
  }
  MutexLock l(&mu_);
  stopped_ = true;
  stats_.streaming = false;
  return s;
}

ReplicaFollower::Stats ReplicaFollower::GetStats() const {
  MutexLock l(&mu_);
  return stats_;
}

absl::Status ReplicaFollower::WaitApplied(uint64_t seq,
                                          absl::Time deadline) const {
  MutexLock l(&mu_);
  for (;;) {
    if (!stats_.copying && stats_.applied_sequence >= seq &&
        !stats_.leader_db_id.empty()) {
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("replica follower: sequence ", seq, " not applied (at ",
                       stats_.applied_sequence, ")"));
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

void ReplicaFollower::Run() {
  absl::Duration backoff = options_.min_backoff;
  for (;;) {
    std::string leader;
    uint64_t changes = 0;
    {
      MutexLock l(&mu_);
      while (!stopping_ && leader_.empty()) changed_.Wait(&mu_);
      if (stopping_) return;
      leader = leader_;
      changes = leader_changes_;
    }
    bool progressed = false;
    absl::Status s = FollowOnce(leader, &progressed);
    if (progressed) backoff = options_.min_backoff;
    {
      MutexLock l(&mu_);
      stats_.streaming = false;
      stats_.last_error = s.ToString();
      if (stopping_) return;
      if (leader_changes_ != changes) {
        backoff = options_.min_backoff;
        continue;
      }
      LOG(WARNING) << "replica follower: following " << leader << ": " << s
                   << "; again in " << backoff;
      const absl::Time until = absl::Now() + backoff;
      while (!stopping_ && leader_changes_ == changes && absl::Now() < until) {
        changed_.WaitWithDeadline(&mu_, until);
      }
    }
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Status ReplicaFollower::ApplyWithPosition(rocksdb::WriteBatch* batch,
                                                const std::string& db_id,
                                                uint64_t leader_seq,
                                                bool copying) {
  // The follow thread is the database's only writer: the write takes the
  // next Count() sequences, the position's own put included.
  const uint64_t after = db_->GetLatestSequenceNumber() + batch->Count() + 1;
  Position p;
  p.leader_seq = leader_seq;
  p.local_seq = after;
  p.copying = copying;
  p.db_id = db_id;
  rocksdb::Status rs = batch->Put(kReplicaPositionKey, EncodePosition(p));
  if (!rs.ok()) return FromRocks(rs, "position");
  rocksdb::WriteOptions wo;
  wo.sync = options_.store.sync_writes;
  absl::Status s = FromRocks(db_->Write(wo, batch), "apply");
  if (!s.ok()) return s;
  if (db_->GetLatestSequenceNumber() != after) {
    // Only a restart can tell; it then takes a full copy.
    LOG(WARNING) << "replica follower: local sequence "
                 << db_->GetLatestSequenceNumber() << " after a write, "
                 << "expected " << after;
  }
  return absl::OkStatus();
}

// What one stream has applied so far.
struct ReplicaFollower::StreamState {
  std::string leader;    // whose stream
  std::string db_id;     // the leader database's identity
  uint64_t applied = 0;  // the last leader sequence applied
  bool copying = false;  // in a full copy
};

void ReplicaFollower::Publish(const StreamState& st, uint64_t batches) {
  {
    MutexLock l(&mu_);
    stats_.applied_sequence = st.applied;
    stats_.leader_db_id = st.copying ? "" : st.db_id;
    stats_.data_leader = st.leader;
    stats_.copying = st.copying;
    stats_.streaming = !st.copying;
    stats_.batches_applied += batches;
    if (batches > 0) stats_.lag_sequences = 0;
  }
  changed_.SignalAll();
}

absl::Status ReplicaFollower::BeginCopy(const std::string& db_id,
                                        StreamState* st) {
  // Everything goes, in one write with the position "copying".
  st->db_id = db_id;
  st->copying = true;
  st->applied = 0;
  rocksdb::WriteBatch b;
  b.DeleteRange(rocksdb::Slice(""), rocksdb::Slice("\xff", 1));
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(rocksdb::Slice("\xff", 1)); it->Valid(); it->Next()) {
    b.Delete(it->key());
  }
  absl::Status s = FromRocks(it->status(), "scan before a copy");
  if (s.ok()) s = ApplyWithPosition(&b, "", 0, true);
  Publish(*st, 0);
  LOG(INFO) << "replica follower: taking a full copy of the leader's store";
  return s;
}

absl::Status ReplicaFollower::Handle(const v1::FollowResponse& m,
                                     StreamState* st, bool* ack) {
  *ack = false;
  switch (m.kind()) {
    case v1::FollowResponse::START:
      if (m.copy()) return BeginCopy(m.db_id(), st);
      if (m.db_id() != st->db_id) {
        return absl::InternalError("leader resumed another database");
      }
      Publish(*st, 0);
      return absl::OkStatus();
    case v1::FollowResponse::COPY_CHUNK: {
      if (!st->copying || m.keys_size() != m.values_size()) {
        return absl::InternalError("unexpected copy chunk");
      }
      rocksdb::WriteBatch b;
      for (int i = 0; i < m.keys_size(); ++i) b.Put(m.keys(i), m.values(i));
      return FromRocks(db_->Write(rocksdb::WriteOptions(), &b), "copy");
    }
    case v1::FollowResponse::COPY_END: {
      if (!st->copying) return absl::InternalError("unexpected end of copy");
      rocksdb::WriteBatch b;
      absl::Status s = ApplyWithPosition(&b, st->db_id, m.sequence(), false);
      if (!s.ok()) return s;
      st->copying = false;
      st->applied = m.sequence();
      {
        MutexLock l(&mu_);
        ++stats_.full_copies;
      }
      Publish(*st, 0);
      LOG(INFO) << "replica follower: full copy done at leader sequence "
                << st->applied;
      *ack = true;
      return absl::OkStatus();
    }
    case v1::FollowResponse::BATCH: {
      if (st->copying || m.sequence() != st->applied + 1) {
        return absl::InternalError(absl::StrCat(
            "batch at sequence ", m.sequence(), " after ", st->applied));
      }
      absl::StatusOr<rocksdb::WriteBatch> b = Concatenate(m);
      if (!b.ok()) return b.status();
      absl::Status s =
          ApplyWithPosition(&*b, st->db_id, st->applied + m.count(), false);
      if (!s.ok()) return s;
      st->applied += m.count();
      Publish(*st, m.batches_size());
      *ack = true;
      return absl::OkStatus();
    }
    case v1::FollowResponse::HEARTBEAT: {
      MutexLock l(&mu_);
      stats_.lag_sequences =
          m.sequence() > st->applied ? m.sequence() - st->applied : 0;
      return absl::OkStatus();
    }
    default:
      return absl::InternalError(
          absl::StrCat("unknown message kind ", m.kind()));
  }
}

absl::Status ReplicaFollower::FollowOnce(const std::string& leader,
                                         bool* progressed) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreateChannel(leader, options_.security);
  if (!channel.ok()) return channel.status();
  std::unique_ptr<v1::Replication::Stub> stub =
      v1::Replication::NewStub(*channel);
  grpc::ClientContext ctx;
  StreamState st;
  st.leader = leader;
  {
    MutexLock l(&mu_);
    if (stopping_ || leader_ != leader) {
      return absl::CancelledError("leader changed");
    }
    ctx_ = &ctx;
    ++stats_.connects;
    st.applied = stats_.applied_sequence;
    st.db_id = stats_.leader_db_id;
  }
  v1::FollowRequest first;
  first.set_follower(options_.name);
  first.set_leader_db_id(st.db_id);
  first.set_from_sequence(st.applied);
  auto stream = stub->Follow(&ctx);
  absl::Status local;  // a failure on this side
  v1::FollowResponse m;
  bool open = stream->Write(first);
  while (open && local.ok() && stream->Read(&m)) {
    bool ack = false;
    local = Handle(m, &st, &ack);
    if (ack) {
      *progressed = true;
      v1::FollowRequest a;
      a.set_applied_sequence(st.applied);
      open = stream->Write(a);  // a broken stream also shows at Read
    }
  }
  if (!local.ok()) ctx.TryCancel();
  grpc::Status gs = stream->Finish();
  {
    MutexLock l(&mu_);
    ctx_ = nullptr;
  }
  if (!local.ok()) return local;
  if (gs.ok()) return absl::UnavailableError("the leader ended the stream");
  return FromGrpcStatus(gs, absl::StrCat("follow ", leader));
}

}  // namespace master
}  // namespace hymcache
