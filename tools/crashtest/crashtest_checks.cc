#include "tools/crashtest/crashtest_impl.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/thread.h"
#include "tools/crashtest/block_data.h"

namespace hymcache::crashtest {

// ---------------------------------------------------------------------------
// Recovery and the final checks

absl::Status CrashTest::Impl::Recover() {
  // Nodes must have talked to the current master after both their own and
  // the master's last start.
  absl::Time after = ready_at_[0];
  for (absl::Time t : ready_at_) after = std::max(after, t);
  const absl::Time t0 = absl::Now();
  RETURN_IF_ERROR(WaitNodesAlive(after, options_.alive_timeout));
  Log(absl::StrCat("every node alive ", absl::FormatDuration(absl::Now() - t0),
                   " after the last restart; waiting ",
                   absl::FormatDuration(options_.recovery_wait),
                   " for the cluster to converge"));
  RETURN_IF_ERROR(WatchFor(options_.recovery_wait));
  return absl::OkStatus();
}

// ==== HOOK: hymctl fsck ====
// After recovery: `hymctl fsck` compares the master's listings with every
// node's extents (tools/hymctl/fsck.h) and must find them consistent. With
// `repair`, `hymctl fsck --repair` fixes what it finds (after the final
// reads, so that those measure what the cluster converged to by itself);
// what it fixed is the summary's "repaired".
void CrashTest::Impl::RunFsck(bool repair) {
  const std::string out_path =
      cluster_->log_path(0) + (repair ? ".fsck-repair.json" : ".fsck.json");
  const std::string err_path = cluster_->log_path(0) + ".fsck.log";
  std::vector<std::string> args = {"--master=" + cluster_->master_address(),
                                   "--json"};
  if (!options_.token_file.empty()) {
    args.push_back("--token_file=" + options_.token_file);
  }
  if (repair) args.push_back("--repair");
  args.push_back("fsck");
  const absl::Time t0 = absl::Now();
  absl::StatusOr<int> st = testing::RunCommand(
      options_.hymctl_binary, args, out_path, err_path, absl::Seconds(300));
  std::string verdict;
  bool consistent = false;
  int64_t repaired = -1;
  std::map<std::string, uint64_t> findings;
  if (!st.ok()) {
    verdict = st.status().ToString();
  } else {
    std::ifstream in(out_path);
    nlohmann::json j =
        nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("consistent")) {
      verdict =
          absl::StrCat(testing::DescribeWaitStatus(*st), ", no JSON verdict");
    } else {
      consistent = j["consistent"].get<bool>();
      if (j.contains("findings") && j["findings"].is_array()) {
        for (const auto& f : j["findings"]) {
          ++findings[f.value("kind", std::string("?"))];
        }
      }
      if (repair && j.contains("repair")) {
        repaired = j["repair"].value("listings_dropped", int64_t{0});
      }
      std::vector<std::string> kinds;
      for (const auto& [k, n] : findings)
        kinds.push_back(absl::StrCat(k, "=", n));
      verdict = absl::StrCat(
          consistent ? "consistent" : "INCONSISTENT", kinds.empty() ? "" : " (",
          absl::StrJoin(kinds, " "), kinds.empty() ? "" : ")");
      if (repaired >= 0)
        absl::StrAppend(&verdict, ", listings dropped ", repaired);
    }
  }
  Log(absl::StrCat("hymctl ", absl::StrJoin(args, " "), ": ", verdict, " in ",
                   absl::FormatDuration(absl::Now() - t0), " (", out_path,
                   ")"));
  MutexLock l(&mu_);
  if (repair) {
    report_.repaired = repaired;
    return;
  }
  report_.fsck_ran = true;
  report_.fsck_clean = consistent;
  report_.fsck_findings = std::move(findings);
}

absl::StatusOr<LookupResult> CrashTest::Impl::Listed(
    const std::vector<std::string>& keys) {
  if (keys.empty()) return LookupResult();
  absl::StatusOr<LookupResult> look = absl::UnavailableError("not run");
  for (int attempt = 0; attempt < 5 && !look.ok(); ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(500));
    CallOptions call;
    call.deadline = absl::Now() + absl::Seconds(10);
    look = client_->BatchLookup(keys, call);
    NoteCall("BatchLookup", call.deadline, absl::Now());
    MutexLock l(&mu_);
    ++report_.other_calls;
  }
  return look;
}

CrashTest::Impl::Read CrashTest::Impl::ReadKey(const std::string& key,
                                               uint64_t length,
                                               std::string* why) {
  const size_t stride = options_.max_block_bytes;
  std::vector<uint8_t> buf(stride);
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(250));
    std::fill(buf.begin(), buf.end(), 0xA5);
    MutableBuffer mb{buf.data(), buf.size()};
    CallOptions call;
    call.deadline = absl::Now() + absl::Seconds(5);
    absl::StatusOr<LoadResult> g = client_->Get(
        absl::MakeConstSpan(&key, 1), absl::MakeConstSpan(&mb, 1), call);
    NoteCall("Get", call.deadline, absl::Now());
    {
      MutexLock l(&mu_);
      ++report_.other_calls;
    }
    if (g.ok() && g->loaded == 1) {
      // Served; wrong bytes are counted (and fail the run) separately.
      VerifyLoaded("Get", {key}, {length}, 0, 1, g->lengths, buf.data(),
                   stride);
      return Read::kServed;
    }
    *why = g.ok() ? g->stop_reason.ToString() : g.status().ToString();
    // NotFound is an answer (not listed, or the node refused the read);
    // other errors may pass.
    if (g.ok() && absl::IsNotFound(g->stop_reason)) {
      return g->hit_prefix == 0 ? Read::kNotListed : Read::kUnreadable;
    }
  }
  return Read::kUnreadable;
}

std::vector<CrashTest::Impl::MustServe> CrashTest::Impl::MustBeServed(
    uint64_t slack) {
  const std::vector<uint64_t> kills = KillCounts();
  std::vector<MustServe> out;
  MutexLock l(&mu_);
  // Whether `rec` is still where its Store put it, as far as this test can
  // tell: its node was not killed since `since` (kill counts when a Store
  // began) and never needed to evict.
  auto kept = [&](const KeyRecord& rec, const std::vector<uint64_t>& since)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                    if (!rec.committed || rec.node < 0) return false;
                    const uint64_t epoch = rec.kills_at_store[rec.node];
                    if (kills[rec.node] != epoch ||
                        kills[rec.node] != since[rec.node]) {
                      return false;
                    }
                    return Bound(placed_[rec.node],
                                 cluster_->keeps_objects(rec.node), epoch) +
                               slack <=
                           capacity_[rec.node];
                  };
  for (const auto& [key, rec] : ledger_) {
    if (!kept(rec, rec.kills_at_store)) continue;
    // Every block before it in its chain must be kept too: a block after a
    // lost one is unreachable, and the master may drop it.
    bool chain_kept = true;
    std::string parent = rec.parent;
    for (int depth = 0; chain_kept && !parent.empty(); ++depth) {
      auto it = ledger_.find(parent);
      chain_kept = depth < 1024 && it != ledger_.end() &&
                   kept(it->second, rec.kills_at_store);
      if (chain_kept) parent = it->second.parent;
    }
    if (!chain_kept) continue;
    out.push_back(
        {key, rec.length, rec.node, rec.store_began, rec.store_returned});
  }
  std::sort(out.begin(), out.end(), [](const MustServe& a, const MustServe& b) {
    return a.key < b.key;
  });
  return out;
}

void CrashTest::Impl::ReportLost(const char* when, const MustServe& m,
                                 const std::string& what) {
  bool print = false;
  {
    MutexLock l(&mu_);
    if (!lost_keys_.insert(m.key).second)
      return;  // counted by an earlier check
    ++report_.lost_on_live_node;
    ++report_.lost_by_node[cluster_->name(m.node)];
    print = examples_.lost++ < kMaxExamples;
  }
  if (print) {
    Log(absl::StrCat(
        "LOST ON A LIVE NODE (", when, "): key ", KeyToHex(m.key),
        " committed on ", cluster_->name(m.node), " by a Store run from ",
        absl::ToDoubleSeconds(m.store_began - start_), " s to ",
        absl::ToDoubleSeconds(m.store_returned - start_),
        " s; the node was never killed since and never full enough to evict; ",
        what));
  }
}

void CrashTest::Impl::Audit() {
  // Stores in flight may add one chain per conversation to a node meanwhile.
  const uint64_t chain_blocks =
      options_.system_prompt_blocks +
      static_cast<uint64_t>(options_.max_turns) * options_.max_new_blocks;
  const uint64_t slack =
      options_.conversations * chain_blocks * RoundUp(options_.max_block_bytes);
  std::vector<MustServe> must = MustBeServed(slack);
  if (must.empty()) return;
  std::vector<std::string> keys;
  for (const MustServe& m : must) keys.push_back(m.key);
  absl::StatusOr<LookupResult> listed = Listed(keys);
  if (!listed.ok()) {
    Log("audit skipped: BatchLookup failed: " + listed.status().ToString());
    return;
  }
  // A miss may be a node the master briefly thinks dead (late heartbeats):
  // look again for a while before calling it lost.
  std::vector<size_t> missing;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!listed->found[i]) missing.push_back(i);
  }
  for (int round = 0; round < 8 && !missing.empty(); ++round) {
    absl::SleepFor(absl::Milliseconds(500));
    std::vector<std::string> again;
    for (size_t i : missing) again.push_back(keys[i]);
    absl::StatusOr<LookupResult> l2 = Listed(again);
    if (!l2.ok()) continue;
    std::vector<size_t> still;
    for (size_t j = 0; j < missing.size(); ++j) {
      if (!l2->found[j]) still.push_back(missing[j]);
    }
    missing = std::move(still);
  }
  for (size_t i : missing) ReportLost("audit", must[i], "is no longer listed");

  // Read a sample of the listed ones.
  std::vector<size_t> found;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (std::find(missing.begin(), missing.end(), i) == missing.end())
      found.push_back(i);
  }
  std::shuffle(found.begin(), found.end(), audit_rng_);
  if (found.size() > static_cast<size_t>(options_.audit_reads)) {
    found.resize(options_.audit_reads);
  }
  for (size_t i : found) {
    std::string why;
    const Read r = ReadKey(keys[i], must[i].length, &why);
    if (r == Read::kServed) continue;
    ReportLost("audit", must[i],
               r == Read::kNotListed ? "is no longer listed"
                                     : "is listed but unreadable: " + why);
  }
  MutexLock l(&mu_);
  ++report_.audits;
  report_.live_node_checked += keys.size();
  report_.audit_reads += found.size();
}

void CrashTest::Impl::FinalChecks() {
  std::vector<std::string> keys;
  absl::flat_hash_map<std::string, KeyRecord> ledger;
  std::vector<std::vector<std::string>> chains;
  {
    MutexLock l(&mu_);
    ledger = ledger_;
    chains = chains_;
  }
  keys.reserve(ledger.size());
  for (const auto& [k, rec] : ledger) keys.push_back(k);
  std::sort(keys.begin(), keys.end());

  // 1. What the master lists.
  absl::StatusOr<LookupResult> found = Listed(keys);
  if (!found.ok()) {
    Log("final BatchLookup failed: " + found.status().ToString());
    MutexLock l(&mu_);
    report_.failures.push_back("final BatchLookup failed: " +
                               found.status().ToString());
    return;
  }
  std::vector<bool> listed = found->found;

  // 2. Read every listed key (one Get per key: a stale listing must not
  // hide the keys after it).
  std::vector<bool> served(keys.size(), false);
  uint64_t n_listed = 0, n_readable = 0, n_stale = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!listed[i]) continue;
    ++n_listed;
    const KeyRecord& rec = ledger[keys[i]];
    std::string why;
    const Read r = ReadKey(keys[i], rec.length, &why);
    if (r == Read::kServed) {
      served[i] = true;
      ++n_readable;
      continue;
    }
    if (r == Read::kNotListed) {
      listed[i] = false;  // dropped since the lookup
      --n_listed;
      continue;
    }
    ++n_stale;
    bool print = false;
    {
      MutexLock l(&mu_);
      print = examples_.stale++ < kMaxExamples;
    }
    if (print) {
      Log(absl::StrCat(
          "STALE LISTING: key ", Hex(keys[i]),
          " is listed but unreadable: ", why,
          rec.committed
              ? absl::StrCat(" (committed on ",
                             rec.node >= 0 ? cluster_->name(rec.node) : "?",
                             ")")
              : " (never reported committed)"));
    }
  }

  // 3. Committed blocks: still served where they must be.
  absl::flat_hash_map<std::string, size_t> index;
  for (size_t i = 0; i < keys.size(); ++i) index[keys[i]] = i;
  const std::vector<MustServe> must = MustBeServed(0);
  for (const MustServe& m : must) {
    const size_t i = index.at(m.key);
    if (served[i]) continue;
    ReportLost("after recovery", m,
               listed[i] ? "is listed but unreadable" : "is no longer listed");
  }
  const std::vector<uint64_t> kills = KillCounts();
  uint64_t unverifiable = 0, maybe_evicted = 0, lost_killed = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyRecord& rec = ledger[keys[i]];
    if (!rec.committed) continue;
    if (rec.node >= 0 && kills[rec.node] != rec.kills_at_store[rec.node]) {
      if (!served[i]) ++lost_killed;
      continue;
    }
    if (std::binary_search(must.begin(), must.end(),
                           MustServe{keys[i], 0, 0, absl::Time(), absl::Time()},
                           [](const MustServe& a, const MustServe& b) {
                             return a.key < b.key;
                           })) {
      continue;
    }
    ++unverifiable;
    if (!served[i]) ++maybe_evicted;
  }

  // 4. Unreachable tails: listed blocks after an unlisted one in a chain,
  // by where the missing block was (last) committed: on the tail's node,
  // on another node, or nowhere (a Store that failed for it).
  absl::flat_hash_map<std::string, int> tails;  // key -> kind
  enum { kSameNode, kOtherNode, kNeverCommitted };
  for (const auto& chain : chains) {
    const KeyRecord* gap = nullptr;
    bool broken = false;
    for (const std::string& k : chain) {
      auto it = index.find(k);
      const bool l = it != index.end() && listed[it->second];
      if (!l) {
        if (!broken) {
          auto r = ledger.find(k);
          gap = r == ledger.end() ? nullptr : &r->second;
        }
        broken = true;
      } else if (broken) {
        int kind = kNeverCommitted;
        if (gap != nullptr && gap->committed && gap->node >= 0) {
          auto n = index_of_node_.find(found->locations[it->second].node_id);
          kind = n != index_of_node_.end() && n->second == gap->node
                     ? kSameNode
                     : kOtherNode;
        }
        tails.emplace(k, kind);
      }
    }
  }
  uint64_t tail_kinds[3] = {0, 0, 0};
  for (const auto& [k, kind] : tails) ++tail_kinds[kind];
  if (!tails.empty()) {
    Log(absl::StrCat("unreachable tails: ", tails.size(),
                     " listed blocks after an unlisted one in their chain; "
                     "the missing block was on the same node for ",
                     tail_kinds[kSameNode], ", on another node for ",
                     tail_kinds[kOtherNode], ", never committed for ",
                     tail_kinds[kNeverCommitted]));
  }

  std::vector<Placement> placed;
  {
    MutexLock l(&mu_);
    placed = placed_;
  }
  for (size_t i = cluster_->first_node(); i < cluster_->size(); ++i) {
    std::vector<std::string> epochs;
    for (const auto& [e, b] : placed[i].by_epoch) {
      epochs.push_back(absl::StrCat(b >> 20, b > capacity_[i] ? "!" : ""));
    }
    Log(absl::StrCat(
        cluster_->name(i), ": ", kills[i], " kills, capacity ",
        capacity_[i] >> 20, " MiB, ", placed[i].total >> 20,
        " MiB placed by this test; per epoch with stores (MiB, ! = "
        "may have evicted): ",
        absl::StrJoin(epochs, " ")));
  }
  MutexLock l(&mu_);
  report_.keys_stored = keys.size();
  report_.keys_listed = n_listed;
  report_.keys_readable = n_readable;
  report_.stale_listings = n_stale;
  report_.live_node_checked += must.size();
  report_.live_node_unverifiable = unverifiable;
  report_.live_node_missing_maybe_evicted = maybe_evicted;
  report_.lost_on_killed_node = lost_killed;
  report_.unreachable_tails = tails.size();
}

}  // namespace hymcache::crashtest
