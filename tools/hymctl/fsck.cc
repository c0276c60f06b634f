#include "tools/hymctl/fsck.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "master/replica_key.h"
#include "proto/master.grpc.pb.h"
#include "proto/storage.grpc.pb.h"

namespace hymcache::hymctl {
namespace {

namespace v1 = ::hymcache::v1;

bool SameRange(const v1::Location& a, const v1::Location& b) {
  return a.region_id() == b.region_id() && a.addr() == b.addr() &&
         a.length() == b.length();
}

struct Listing {
  std::string key;
  v1::Location location;
  bool unreachable = false;
};

// One snapshot of both sides.
struct Pass {
  FsckReport report;  // counts and findings of this pass
};

class Fsck {
 public:
  explicit Fsck(const FsckOptions& o) : o_(o) {}

  absl::StatusOr<FsckReport> Run() {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                     CreateChannel(o_.master_address, o_.security, args));
    master_ = v1::MasterService::NewStub(channel);

    absl::StatusOr<FsckReport> first = OnePass();
    if (!first.ok()) return first.status();
    absl::SleepFor(o_.settle);
    absl::StatusOr<FsckReport> second = OnePass();
    if (!second.ok()) return second.status();
    FsckReport out = Confirm(*first, *second);
    if (!o_.repair || out.findings.empty()) return out;

    RETURN_IF_ERROR(Repair(&out));
    // What is left after the repair (again confirmed by two passes).
    absl::StatusOr<FsckReport> a = OnePass();
    if (!a.ok()) return a.status();
    absl::SleepFor(o_.settle);
    absl::StatusOr<FsckReport> b = OnePass();
    if (!b.ok()) return b.status();
    out.remaining = Confirm(*a, *b).findings.size();
    return out;
  }

 private:
  grpc::ClientContext* Ctx(grpc::ClientContext* ctx) const {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + o_.rpc_timeout));
    return ctx;
  }

  absl::StatusOr<std::unique_ptr<v1::StorageControl::Stub>> NodeStub(
      const std::string& address) const {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                     CreateChannel(address, o_.security, args));
    return v1::StorageControl::NewStub(channel);
  }

  absl::StatusOr<FsckReport> OnePass() {
    FsckReport r;
    v1::ListNodesResponse nodes;
    {
      grpc::ClientContext ctx;
      RETURN_IF_ERROR(FromGrpcStatus(
          master_->ListNodes(Ctx(&ctx), v1::ListNodesRequest(), &nodes),
          "ListNodes"));
    }
    // The master's listings first (see the header: ordering matters).
    absl::flat_hash_map<uint32_t, std::map<uint64_t, Listing>> listed;
    {
      grpc::ClientContext ctx;
      v1::ListObjectsRequest req;
      req.set_page_size(8192);
      auto reader = master_->ListObjects(Ctx(&ctx), req);
      v1::ListObjectsResponse page;
      while (reader->Read(&page)) {
        for (const v1::ListedObject& o : page.objects()) {
          listed[o.location().node_id()][o.location().generation()] =
              Listing{o.key(), o.location(), o.unreachable()};
        }
      }
      RETURN_IF_ERROR(FromGrpcStatus(reader->Finish(), "ListObjects"));
    }
    for (const v1::NodeInfo& n : nodes.nodes()) {
      auto& mine = listed[n.node_id()];
      if (!n.alive()) {
        r.unchecked += mine.size();
        continue;
      }
      auto stub = NodeStub(n.control_address());
      std::map<uint64_t, v1::Location> held;
      absl::Status s = stub.status();
      if (s.ok()) s = ListNode(stub->get(), n.node_id(), &held);
      if (s.ok()) s = CountChecksums(stub->get(), &r.checksum_failures);
      if (!s.ok()) {
        r.unreachable.push_back(
            absl::StrCat("node ", n.node_id(), " (", n.name(), "): ",
                         s.ToString()));
        r.unchecked += mine.size();
        continue;
      }
      ++r.nodes_checked;
      r.listed += mine.size();
      r.held += held.size();
      for (const auto& [gen, l] : mine) {
        if (l.unreachable) {
          r.findings.push_back({FsckFinding::Kind::kUnreachable, n.node_id(),
                                l.key, l.location, {}});
        }
        auto h = held.find(gen);
        if (h == held.end()) {
          r.findings.push_back({FsckFinding::Kind::kListedMissing,
                                n.node_id(), l.key, l.location, {}});
        } else if (!SameRange(h->second, l.location)) {
          r.findings.push_back({FsckFinding::Kind::kMismatched, n.node_id(),
                                l.key, l.location, h->second});
          held.erase(h);
        } else {
          ++r.matched;
          held.erase(h);
        }
      }
      for (const auto& [gen, loc] : held) {
        r.findings.push_back(
            {FsckFinding::Kind::kUnlisted, n.node_id(), "", {}, loc});
      }
    }
    return r;
  }

  absl::Status ListNode(v1::StorageControl::Stub* stub, uint32_t node_id,
                        std::map<uint64_t, v1::Location>* out) {
    grpc::ClientContext ctx;
    v1::ListExtentsRequest req;
    req.set_page_size(8192);
    auto reader = stub->ListExtents(Ctx(&ctx), req);
    v1::ListExtentsResponse page;
    while (reader->Read(&page)) {
      for (const v1::Location& l : page.extents()) {
        v1::Location loc = l;
        loc.set_node_id(node_id);
        (*out)[l.generation()] = loc;
      }
    }
    return FromGrpcStatus(reader->Finish(), "ListExtents");
  }

  absl::Status CountChecksums(v1::StorageControl::Stub* stub, uint64_t* sum) {
    grpc::ClientContext ctx;
    v1::StorageStatsResponse st;
    RETURN_IF_ERROR(FromGrpcStatus(
        stub->GetStats(Ctx(&ctx), v1::StorageStatsRequest(), &st),
        "GetStats"));
    auto it = st.device_stats().find("checksum_failures");
    if (it != st.device_stats().end()) *sum += static_cast<uint64_t>(it->second);
    return absl::OkStatus();
  }

  // The second pass's counts; the findings present in both passes.
  static FsckReport Confirm(const FsckReport& a, const FsckReport& b) {
    std::set<std::tuple<int, uint32_t, uint64_t>> seen;
    for (const FsckFinding& f : a.findings) {
      const uint64_t gen = f.kind == FsckFinding::Kind::kUnlisted
                               ? f.held.generation()
                               : f.listed.generation();
      seen.insert({static_cast<int>(f.kind), f.node_id, gen});
    }
    FsckReport out = b;
    out.findings.clear();
    for (const FsckFinding& f : b.findings) {
      const uint64_t gen = f.kind == FsckFinding::Kind::kUnlisted
                               ? f.held.generation()
                               : f.listed.generation();
      if (seen.count({static_cast<int>(f.kind), f.node_id, gen})) {
        out.findings.push_back(f);
      }
    }
    return out;
  }

  absl::Status Repair(FsckReport* report) {
    // Listings the node does not hold (exactly): read repair.
    v1::ReportMissingRequest missing;
    v1::RemoveRequest unreachable;
    std::set<uint32_t> reconcile;
    for (const FsckFinding& f : report->findings) {
      if (f.kind == FsckFinding::Kind::kUnreachable) {
        // A copy's key (master/replica_key.h) is not a key callers may
        // name, and Remove refuses the whole batch for one: the copy goes
        // with its block's Remove, or else with the master's own sweep of
        // unreachable objects (MasterService::SweepOrphansLocked).
        if (!master::IsReplicaKey(f.key)) unreachable.add_keys(f.key);
        continue;
      }
      if (f.kind != FsckFinding::Kind::kUnlisted) {
        missing.add_keys(f.key);
        *missing.add_locations() = f.listed;
      }
      if (f.kind != FsckFinding::Kind::kListedMissing) {
        reconcile.insert(f.node_id);
      }
    }
    for (int begin = 0; begin < missing.keys_size(); begin += 1024) {
      v1::ReportMissingRequest req;
      for (int i = begin; i < std::min(missing.keys_size(), begin + 1024);
           ++i) {
        req.add_keys(missing.keys(i));
        *req.add_locations() = missing.locations(i);
      }
      grpc::ClientContext ctx;
      v1::ReportMissingResponse resp;
      RETURN_IF_ERROR(FromGrpcStatus(master_->ReportMissing(Ctx(&ctx), req, &resp),
                                "ReportMissing"));
      for (bool d : resp.dropped()) report->listings_dropped += d;
    }
    for (int begin = 0; begin < unreachable.keys_size(); begin += 1024) {
      v1::RemoveRequest req;
      for (int i = begin; i < std::min(unreachable.keys_size(), begin + 1024);
           ++i) {
        req.add_keys(unreachable.keys(i));
      }
      grpc::ClientContext ctx;
      v1::RemoveResponse resp;
      RETURN_IF_ERROR(
          FromGrpcStatus(master_->Remove(Ctx(&ctx), req, &resp), "Remove"));
      for (bool d : resp.removed()) report->listings_dropped += d;
    }
    // Unlisted extents: the node's reconciliation frees them (the master
    // knows which are pending).
    if (reconcile.empty()) return absl::OkStatus();
    v1::ListNodesResponse nodes;
    {
      grpc::ClientContext ctx;
      RETURN_IF_ERROR(FromGrpcStatus(
          master_->ListNodes(Ctx(&ctx), v1::ListNodesRequest(), &nodes),
          "ListNodes"));
    }
    for (const v1::NodeInfo& n : nodes.nodes()) {
      if (!reconcile.count(n.node_id())) continue;
      ASSIGN_OR_RETURN(auto stub, NodeStub(n.control_address()));
      v1::RequestReconcileResponse asked;
      {
        grpc::ClientContext ctx;
        if (!stub->RequestReconcile(Ctx(&ctx), v1::RequestReconcileRequest(),
                                    &asked)
                 .ok()) {
          continue;
        }
      }
      // Wait for it (the node reconciles at its next heartbeat).
      const absl::Time deadline = absl::Now() + o_.rpc_timeout;
      while (absl::Now() < deadline) {
        grpc::ClientContext ctx;
        v1::StorageStatsResponse st;
        if (stub->GetStats(Ctx(&ctx), v1::StorageStatsRequest(), &st).ok() &&
            st.reconciliations() > asked.reconciliations()) {
          ++report->nodes_reconciled;
          break;
        }
        absl::SleepFor(absl::Milliseconds(50));
      }
    }
    return absl::OkStatus();
  }

  const FsckOptions o_;
  std::unique_ptr<v1::MasterService::Stub> master_;
};

}  // namespace

const char* FindingKindName(FsckFinding::Kind kind) {
  switch (kind) {
    case FsckFinding::Kind::kListedMissing:
      return "listed_missing";
    case FsckFinding::Kind::kUnlisted:
      return "unlisted";
    case FsckFinding::Kind::kMismatched:
      return "mismatched";
    case FsckFinding::Kind::kUnreachable:
      return "unreachable";
  }
  return "unknown";
}

absl::StatusOr<FsckReport> RunFsck(const FsckOptions& options) {
  Fsck f(options);
  return f.Run();
}

}  // namespace hymcache::hymctl
