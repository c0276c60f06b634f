#include "master/master_replication.h"

#include <glog/logging.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hymcache {
namespace master {

absl::StatusOr<ReplicationMode> ParseReplicationMode(absl::string_view s) {
  if (s == "off") return ReplicationMode::kOff;
  if (s == "async") return ReplicationMode::kAsync;
  if (s == "sync") return ReplicationMode::kSync;
  if (s == "confirm") return ReplicationMode::kConfirm;
  return absl::InvalidArgumentError(absl::StrCat(
      "replication must be off, async, sync or confirm, not '", s, "'"));
}

const char* ReplicationModeName(ReplicationMode mode) {
  switch (mode) {
    case ReplicationMode::kOff:
      return "off";
    case ReplicationMode::kAsync:
      return "async";
    case ReplicationMode::kSync:
      return "sync";
    case ReplicationMode::kConfirm:
      return "confirm";
  }
  return "?";
}

absl::Status MasterReplicationOptions::Validate() const {
  if (mode == ReplicationMode::kOff) {
    return absl::InvalidArgumentError(
        "master replication: mode off needs no replication");
  }
  if (store == nullptr) {
    return absl::InvalidArgumentError("master replication: store is required");
  }
  if (sync_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "master replication: sync_timeout must be positive");
  }
  if (absl::Status s = ValidateReplicationBatchDelay(
          async_batch_delay, "master replication: async_batch_delay");
      !s.ok()) {
    return s;
  }
  return ValidateReplicationBatchDelay(
      confirm_batch_delay, "master replication: confirm_batch_delay");
}

MasterReplication::MasterReplication(const MasterReplicationOptions& options,
                                     std::unique_ptr<ReplicationSource> source)
    : options_(options), source_(std::move(source)) {}

MasterReplication::~MasterReplication() { Shutdown(); }

absl::StatusOr<std::unique_ptr<MasterReplication>> MasterReplication::Create(
    const MasterReplicationOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  ReplicationSourceOptions ro;
  ro.store = options.store;
  ro.authenticator = options.authenticator;
  if (options.mode == ReplicationMode::kAsync) {
    ro.batch_delay = options.async_batch_delay;
  } else if (options.mode == ReplicationMode::kConfirm) {
    ro.batch_delay = options.confirm_batch_delay;
  }
  auto source = ReplicationSource::Create(ro);
  if (!source.ok()) return source.status();
  LOG(INFO) << "master: standby replication "
            << ReplicationModeName(options.mode) << " (database "
            << (*source)->db_id() << ")";
  return std::unique_ptr<MasterReplication>(
      new MasterReplication(options, std::move(source).value()));
}

void MasterReplication::AfterCommit(v1::PutCommitResponse* resp,
                                    std::function<void()> answer) {
  if (options_.mode == ReplicationMode::kConfirm) {
    // The commit's write is in the store: its sequence is at most the
    // latest. The client waits for the standbys, not this leader.
    std::vector<std::string> standbys = source_->FollowerNamesPastCopy();
    if (standbys.empty()) {
      Add(counters_.replication_sync_no_standby);
    } else {
      resp->set_replication_sequence(options_.store->LatestSequence());
      resp->set_replication_db_id(source_->db_id());
      for (std::string& s : standbys) resp->add_confirm_with(std::move(s));
      Add(counters_.replication_confirm_commits);
    }
    answer();
    return;
  }
  if (options_.mode != ReplicationMode::kSync) {
    answer();
    return;
  }
  if (source_->FollowersPastCopy() == 0) {
    // No standby past its copy: one is unlikely to hold the commit before
    // the timeout, and the answer would come anyway. Without this, every
    // commit after a failover would wait the timeout until the old leader
    // is back as a standby.
    Add(counters_.replication_sync_no_standby);
    answer();
    return;
  }
  // The commit's write is in the store: its sequence is at most the latest.
  const uint64_t seq = options_.store->LatestSequence();
  source_->OnReplicated(
      seq, absl::Now() + options_.sync_timeout,
      [this, answer = std::move(answer)](absl::Status held) {
        if (held.ok()) {
          Add(counters_.replication_sync_commits);
        } else {
          // Answered anyway: the commit is in the leader's store; only a
          // leader crash before a standby catches up loses it.
          Add(counters_.replication_sync_timeouts);
          LOG_EVERY_N(WARNING, 1000)
              << "master: a commit answered without a standby holding it ("
              << held << "; every 1000th logged)";
        }
        answer();
      });
}

void MasterReplication::VisitStats(StatsVisitor* v) const {
  const ReplicationSource::Stats st = source_->GetStats();
  MasterReplicationStats s = counters_.Load();
  s.replication_latest_sequence = st.latest_sequence;
  s.replication_messages_sent = st.messages_sent;
  s.replication_batches_sent = st.batches_sent;
  std::optional<ReplicationSource::FollowerStats> best;
  for (const ReplicationSource::FollowerStats& f : st.followers) {
    if (f.copying) {
      ++s.replication_copying;
      continue;
    }
    ++s.replication_followers;
    if (!best.has_value() || f.lag_sequences < best->lag_sequences) best = f;
    const StatLabel label{"follower", f.name};
    const absl::Span<const StatLabel> l(&label, 1);
    v->Gauge("replication_lag_sequences",
             "Leader writes the standby has not acknowledged",
             static_cast<double>(f.lag_sequences), l);
    v->Gauge("replication_lag_seconds",
             "How long the oldest write the standby has not acknowledged has "
             "been sent",
             absl::ToDoubleSeconds(f.lag_time), l);
  }
  s.Visit(v);
  const StatLabel mode{"mode", ReplicationModeName(options_.mode)};
  v->Gauge("replication_mode",
           "1 for the --replication mode this leader runs (label mode)", 1.0,
           absl::Span<const StatLabel>(&mode, 1));
  v->Gauge("replication_lag_sequences",
           "Leader writes the most up-to-date standby has not acknowledged "
           "(all of them without one)",
           static_cast<double>(best.has_value() ? best->lag_sequences
                                                : st.latest_sequence));
  if (best.has_value()) {
    v->Gauge("replication_lag_seconds",
             "How long the oldest write the most up-to-date standby has not "
             "acknowledged has been sent",
             absl::ToDoubleSeconds(best->lag_time));
  }
}

void MasterReplication::Shutdown() { source_->Shutdown(); }

}  // namespace master
}  // namespace hymcache
