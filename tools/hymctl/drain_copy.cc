#include "tools/hymctl/drain_copy.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "master/replica_key.h"

namespace hymcache::hymctl {
namespace {

namespace v1 = ::hymcache::v1;

// One object the node holds, as listed.
struct Listed {
  std::string key;
  std::string parent;  // linked parent's key ("": none)
  uint64_t length = 0;
  int64_t last_read_ms = 0;
  bool chosen = false;
  std::vector<size_t> children;  // on the node, hottest first
};

absl::StatusOr<std::vector<Listed>> ListNode(v1::MasterService::Stub* master,
                                             uint32_t node_id,
                                             absl::Time deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(
      absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Minutes(2))));
  v1::ListObjectsRequest req;
  req.set_node_id(node_id);
  auto reader = master->ListObjects(&ctx, req);
  std::vector<Listed> out;
  v1::ListObjectsResponse page;
  while (reader->Read(&page)) {
    for (const v1::ListedObject& o : page.objects()) {
      if (o.unreachable()) continue;  // the master removes these itself
      // A block's copy (master/replica_key.h) is let go: its block is
      // elsewhere, and no caller may name it.
      if (master::IsReplicaKey(o.key())) continue;
      Listed l;
      l.key = o.key();
      l.parent = o.parent_key();
      l.length = o.location().length();
      l.last_read_ms = o.last_read_unix_ms();
      out.push_back(std::move(l));
    }
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return FromGrpcStatus(s);
  return out;
}

class Copier {
 public:
  Copier(Client* client, const DrainCopyOptions& options,
         const std::function<void(const DrainCopyReport&)>& progress,
         std::vector<Listed> objects)
      : client_(client),
        options_(options),
        progress_(progress),
        objects_(std::move(objects)) {}

  DrainCopyReport Run() {
    report_.listed = objects_.size();
    absl::flat_hash_map<absl::string_view, size_t> by_key;
    for (size_t i = 0; i < objects_.size(); ++i) by_key[objects_[i].key] = i;
    Choose(by_key);
    // Chains hottest first: roots (no parent on the node) by last read.
    std::vector<size_t> roots;
    for (size_t i = 0; i < objects_.size(); ++i) {
      Listed& o = objects_[i];
      if (!o.chosen) continue;
      auto p = by_key.find(o.parent);
      if (o.parent.empty() || p == by_key.end()) {
        roots.push_back(i);
      } else {
        objects_[p->second].children.push_back(i);
      }
    }
    auto hotter = [&](size_t a, size_t b) {
      return objects_[a].last_read_ms > objects_[b].last_read_ms;
    };
    std::sort(roots.begin(), roots.end(), hotter);
    for (Listed& o : objects_) {
      std::sort(o.children.begin(), o.children.end(), hotter);
    }
    // Depth first, in runs of linked blocks: a run follows each block's
    // hottest child; the other children start runs of their own, after it.
    std::vector<size_t> starts(roots.rbegin(), roots.rend());
    while (!starts.empty() && !report_.deadline_passed &&
           !report_.max_bytes_reached) {
      const size_t first = starts.back();
      starts.pop_back();
      std::vector<size_t> run{first};
      for (size_t cur = first; !objects_[cur].children.empty();) {
        const std::vector<size_t>& kids = objects_[cur].children;
        for (size_t k = kids.size(); k-- > 1;) starts.push_back(kids[k]);
        cur = kids[0];
        run.push_back(cur);
      }
      CopyRun(run);
    }
    return report_;
  }

 private:
  void Choose(const absl::flat_hash_map<absl::string_view, size_t>& by_key) {
    const int64_t since = absl::ToUnixMillis(absl::Now() - options_.hot_within);
    for (size_t i = 0; i < objects_.size(); ++i) {
      if (options_.which == DrainCopyOptions::Which::kAll ||
          objects_[i].last_read_ms >= since) {
        // With every block before it on the node: it is read through them.
        for (size_t j = i; !objects_[j].chosen;) {
          objects_[j].chosen = true;
          auto p = by_key.find(objects_[j].parent);
          if (objects_[j].parent.empty() || p == by_key.end()) break;
          j = p->second;
        }
      }
    }
    for (const Listed& o : objects_) {
      if (o.chosen) {
        ++report_.chosen;
      } else {
        ++report_.let_go;
      }
    }
  }

  // Copies `run` (each block's parent is the one before it) in batches.
  void CopyRun(const std::vector<size_t>& run) {
    for (size_t b = 0; b < run.size(); b += options_.batch_keys) {
      if (absl::Now() >= options_.deadline) {
        report_.deadline_passed = true;
        return;
      }
      if (report_.copied_bytes >= options_.max_bytes) {
        report_.max_bytes_reached = true;
        return;
      }
      const size_t n = std::min(options_.batch_keys, run.size() - b);
      std::vector<std::string> keys;
      uint64_t total = 0;
      for (size_t k = b; k < b + n; ++k) {
        keys.push_back(objects_[run[k]].key);
        total += objects_[run[k]].length;
      }
      std::string bytes(total, '\0');
      std::vector<MutableBuffer> into;
      uint64_t at = 0;
      for (size_t k = b; k < b + n; ++k) {
        into.push_back({bytes.data() + at, objects_[run[k]].length});
        at += objects_[run[k]].length;
      }
      CallOptions call;
      call.deadline = CallDeadline();
      absl::StatusOr<LoadResult> got = client_->Get(keys, into, call);
      const size_t loaded = got.ok() ? got->loaded : 0;
      if (loaded > 0) Store(keys, into, loaded, objects_[run[b]].parent);
      if (loaded < n) {
        // Unreadable (gone, or refused): nothing reaches the blocks after.
        report_.skipped += run.size() - b - loaded;
        if (progress_) progress_(report_);
        return;
      }
      if (progress_) progress_(report_);
    }
  }

  void Store(const std::vector<std::string>& keys,
             const std::vector<MutableBuffer>& loaded_into, size_t loaded,
             const std::string& parent) {
    std::vector<ConstBuffer> from;
    for (size_t k = 0; k < loaded; ++k) {
      from.push_back({loaded_into[k].data, loaded_into[k].size});
    }
    StoreOptions so;
    so.deadline = CallDeadline();
    so.parent_key = parent;
    so.relocate_from_node = options_.node_id;
    absl::StatusOr<PutResult> put =
        client_->Store(absl::MakeConstSpan(keys).subspan(0, loaded), from, so)
            ->Wait();
    if (!put.ok()) {
      report_.failed += loaded;
      return;
    }
    for (size_t k = 0; k < loaded; ++k) {
      switch (put->outcomes[k]) {
        case PutOutcome::kStored:
          ++report_.copied;
          report_.copied_bytes += from[k].size;
          break;
        case PutOutcome::kAlreadyStored:
        case PutOutcome::kInProgress:
          ++report_.skipped;
          break;
        case PutOutcome::kFailed:
          ++report_.failed;
          break;
      }
    }
  }

  absl::Time CallDeadline() const {
    return std::min(options_.deadline, absl::Now() + absl::Seconds(30));
  }

  Client* const client_;
  const DrainCopyOptions& options_;
  const std::function<void(const DrainCopyReport&)>& progress_;
  std::vector<Listed> objects_;
  DrainCopyReport report_;
};

}  // namespace

std::string DrainCopyText(const DrainCopyReport& r) {
  return absl::StrCat("copied ", r.copied, " of ", r.chosen, " objects (",
                      r.copied_bytes, " bytes); ", r.skipped, " skipped, ",
                      r.failed, " failed, ", r.let_go, " let go",
                      r.deadline_passed ? ", deadline passed" : "",
                      r.max_bytes_reached ? ", share moved" : "");
}

nlohmann::json DrainCopyJson(const DrainCopyReport& r) {
  return nlohmann::json{{"listed", r.listed},
                        {"chosen", r.chosen},
                        {"copied", r.copied},
                        {"copied_bytes", r.copied_bytes},
                        {"skipped", r.skipped},
                        {"failed", r.failed},
                        {"let_go", r.let_go},
                        {"deadline_passed", r.deadline_passed},
                        {"max_bytes_reached", r.max_bytes_reached}};
}

std::string RebalanceText(const std::vector<RebalanceStep>& steps) {
  if (steps.empty()) return "balanced: no node holds more than its share";
  std::string out;
  for (const RebalanceStep& s : steps) {
    absl::StrAppend(&out, out.empty() ? "" : "\n", "node ", s.node_id, " '",
                    s.name, "' held ", s.used_bytes, " bytes (mean ",
                    s.mean_bytes, "): ", DrainCopyText(s.copy));
  }
  return out;
}

nlohmann::json RebalanceJson(const std::vector<RebalanceStep>& steps) {
  nlohmann::json moved = nlohmann::json::array();
  for (const RebalanceStep& s : steps) {
    moved.push_back(nlohmann::json{{"node_id", s.node_id},
                                   {"name", s.name},
                                   {"used_bytes", s.used_bytes},
                                   {"mean_bytes", s.mean_bytes},
                                   {"copy", DrainCopyJson(s.copy)}});
  }
  return nlohmann::json{{"moved", moved}};
}

absl::StatusOr<DrainCopyReport> CopyOffNode(
    v1::MasterService::Stub* master, Client* client,
    const DrainCopyOptions& options,
    const std::function<void(const DrainCopyReport&)>& progress) {
  if (options.node_id == 0 || options.batch_keys == 0) {
    return absl::InvalidArgumentError(
        "drain --copy: a node id and a batch size above 0 are needed");
  }
  absl::StatusOr<std::vector<Listed>> objects =
      ListNode(master, options.node_id, options.deadline);
  if (!objects.ok()) return objects.status();
  return Copier(client, options, progress, std::move(*objects)).Run();
}

absl::StatusOr<std::vector<RebalanceStep>> Rebalance(
    v1::MasterService::Stub* master, Client* client,
    const RebalanceOptions& options,
    const std::function<void(const DrainCopyReport&)>& progress) {
  v1::GetStatsResponse stats;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(
        std::min(options.deadline, absl::Now() + absl::Seconds(30))));
    grpc::Status s = master->GetStats(&ctx, v1::GetStatsRequest(), &stats);
    if (!s.ok()) return FromGrpcStatus(s);
  }
  std::vector<const v1::NodeInfo*> nodes;
  uint64_t total = 0;
  for (const v1::NodeInfo& n : stats.nodes()) {
    if (!n.alive() || n.draining()) continue;
    nodes.push_back(&n);
    total += n.used_bytes();
  }
  std::vector<RebalanceStep> steps;
  if (nodes.size() < 2) return steps;
  const uint64_t mean = total / nodes.size();
  // The fullest first.
  std::sort(nodes.begin(), nodes.end(), [](const auto* a, const auto* b) {
    return a->used_bytes() > b->used_bytes();
  });
  for (const v1::NodeInfo* n : nodes) {
    if (static_cast<double>(n->used_bytes()) <=
        static_cast<double>(mean) * (1 + options.slack)) {
      break;
    }
    RebalanceStep step;
    step.node_id = n->node_id();
    step.name = n->name();
    step.used_bytes = n->used_bytes();
    step.mean_bytes = mean;
    DrainCopyOptions dc;
    dc.node_id = n->node_id();
    dc.which = options.which;
    dc.hot_within = options.hot_within;
    dc.deadline = options.deadline;
    dc.max_bytes = n->used_bytes() - mean;
    absl::StatusOr<DrainCopyReport> copied =
        CopyOffNode(master, client, dc, progress);
    if (!copied.ok()) return copied.status();
    step.copy = *copied;
    steps.push_back(std::move(step));
    if (copied->deadline_passed) break;
  }
  return steps;
}

}  // namespace hymcache::hymctl
