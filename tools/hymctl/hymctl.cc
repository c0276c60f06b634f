#include "tools/hymctl/hymctl.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/block_key.h"
#include "client/client.h"
#include "common/cluster_stats.h"
#include "common/etcd_client.h"
#include "common/grpc_status.h"
#include "common/leader_election.h"
#include "common/status_macros.h"
#include "common/status_reason.h"
#include "proto/master.grpc.pb.h"
#include "proto/storage.grpc.pb.h"
#include "tools/hymctl/drain_copy.h"
#include "tools/hymctl/events.h"
#include "tools/hymctl/fsck.h"
#include "tools/hymctl/replication_status.h"
#include "tools/hymctl/table.h"
#include "tools/hymctl/top.h"

namespace hymcache::hymctl {
namespace {

using nlohmann::json;

// Of several masters (--master=A,B,C; docs/ha.md), the one that leads: each
// is asked in turn (GetStats); a standby's NOT_LEADER names the leader,
// which is asked next. Rounds until `deadline`; the last error then.
absl::StatusOr<std::string> FindLeader(const std::string& masters,
                                       const ChannelSecurity& security,
                                       absl::Time deadline) {
  const std::vector<std::string> list =
      absl::StrSplit(masters, ',', absl::SkipEmpty());
  absl::Status last = absl::InvalidArgumentError("--master: no address");
  while (true) {
    std::vector<std::string> ask = list;
    for (size_t i = 0; i < ask.size() && i < 2 * list.size(); ++i) {
      auto channel = CreateChannel(ask[i], security);
      if (!channel.ok()) return channel.status();
      auto stub = hymcache::v1::MasterService::NewStub(*channel);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(
          std::min(deadline, absl::Now() + absl::Seconds(2))));
      hymcache::v1::GetStatsResponse resp;
      last = FromGrpcStatus(
          stub->GetStats(&ctx, hymcache::v1::GetStatsRequest(), &resp),
          ask[i]);
      if (last.ok()) return ask[i];
      if (std::optional<LeaderHint> hint = LeaderHintOf(last);
          hint.has_value() && !hint->address.empty()) {
        ask.insert(ask.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                   hint->address);
      }
    }
    if (absl::Now() + absl::Milliseconds(100) >= deadline) return last;
    absl::SleepFor(absl::Milliseconds(100));
  }
}

// The master the leader key of `cluster` names in etcd.
absl::StatusOr<std::string> LeaderFromEtcd(
    const std::vector<std::string>& endpoints, const std::string& cluster,
    absl::Time deadline) {
  EtcdClientOptions eo;
  eo.endpoints = endpoints;
  auto etcd = EtcdClient::Create(eo);
  if (!etcd.ok()) return etcd.status();
  auto leader = ReadLeader(etcd->get(), MasterLeaderKey(cluster), deadline);
  if (!leader.ok()) return leader.status();
  if (!leader->has_value()) {
    return absl::UnavailableError(absl::StrCat(
        "no master leads cluster '", cluster, "' (etcd key ",
        MasterLeaderKey(cluster), " is absent)"));
  }
  return (*leader)->candidate;
}

class Cli {
 public:
  Cli(const Options& o, std::ostream& out, std::ostream& err)
      : o_(o), out_(out), err_(err) {}

  int Run(const std::vector<std::string>& args) {
    if (args.empty()) return Usage("missing command");
    const std::string& cmd = args[0];
    std::vector<std::string> rest(args.begin() + 1, args.end());
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      out_ << HelpText();
      return 0;
    }
    if (!o_.etcd_endpoints.empty()) {
      auto leader = LeaderFromEtcd(
          o_.etcd_endpoints, o_.cluster,
          absl::Now() + absl::Seconds(o_.timeout_seconds));
      if (!leader.ok()) return Fail(leader.status());
      o_.master_address = *leader;
    } else if (o_.master_address.find(',') != std::string::npos) {
      // Every command talks to the leader.
      auto leader = FindLeader(
          o_.master_address, o_.security,
          absl::Now() + absl::Seconds(o_.timeout_seconds));
      if (!leader.ok()) return Fail(leader.status());
      o_.master_address = *leader;
    }
    if (cmd == "version") {
      return rest.empty() ? Version() : Usage("version takes no operands");
    }
    if (cmd == "token") return Token(rest);
    if (cmd == "tenant") return Tenant(rest);
    if (cmd == "drain" || cmd == "undrain") {
      return rest.size() == 1 ? Drain(rest[0], cmd == "drain")
                              : Usage(cmd + " NODE");
    }
    if (cmd == "forget") {
      return rest.size() == 1 ? ForgetNode(rest[0]) : Usage("forget NODE");
    }
    if (cmd == "inspect") {
      return rest.size() == 1 ? Inspect(rest[0]) : Usage("inspect KEY");
    }
    if (cmd == "top") return rest.empty() ? Top() : Usage("top takes no operands");
    if (cmd == "events") {
      if (!rest.empty()) return Usage("events takes no operands");
      absl::Status why;
      auto stub = MasterStub(&why);
      if (stub == nullptr) return Fail(why);
      EventsOptions eo = o_.events;
      eo.json = o_.json;
      return FollowEvents(stub.get(), eo, o_.timeout_seconds, out_, err_);
    }
    if (cmd == "status") return rest.empty() ? Status() : Usage("status takes no operands");
    if (absl::Status c = CreateClient(); !c.ok()) return Fail(c);
    if (cmd == "stats") return rest.empty() ? NodeStats() : Usage("stats takes no operands");
    if (cmd == "rebalance") {
      return rest.empty() ? RebalanceNodes()
                          : Usage("rebalance takes no operands");
    }
    if (cmd == "put") return rest.size() == 2 ? Put(rest[0], rest[1]) : Usage("put KEY FILE");
    if (cmd == "get") return rest.size() == 2 ? Get(rest[0], rest[1]) : Usage("get KEY FILE");
    if (cmd == "lookup") return rest.empty() ? Usage("lookup KEY...") : Lookup(rest);
    if (cmd == "rm") return rest.empty() ? Usage("rm KEY...") : Remove(rest);
    if (cmd == "fsck") return Fsck(rest);
    if (cmd == "node") {
      return rest.size() == 2 && rest[0] == "forget"
                 ? ForgetNode(rest[1])
                 : Usage("node forget NODE");
    }
    return Usage(absl::StrCat("unknown command '", cmd, "'"));
  }

 private:
  absl::Status CreateClient() {
    ClientOptions co;
    co.master_address = o_.master_address;
    co.auth_token = o_.security.token;
    co.tls_ca_file = o_.security.tls.ca_file;
    co.tls_cert_file = o_.security.tls.cert_file;
    co.tls_key_file = o_.security.tls.key_file;
    co.tls_server_name = o_.security.tls.server_name;
    co.default_deadline = absl::Seconds(o_.timeout_seconds);
    auto client = Client::Create(co);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
    return absl::OkStatus();
  }

  int Usage(const std::string& why) {
    err_ << "hymctl: " << why << "\n" << HelpText();
    return 2;
  }

  std::unique_ptr<hymcache::v1::MasterService::Stub> MasterStub(
      absl::Status* status) {
    auto channel = CreateChannel(o_.master_address, o_.security);
    if (!channel.ok()) {
      *status = channel.status();
      return nullptr;
    }
    return hymcache::v1::MasterService::NewStub(*channel);
  }

  void SetDeadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Seconds(o_.timeout_seconds)));
  }

  absl::StatusOr<hymcache::v1::GetStatsResponse> MasterStats(
      hymcache::v1::MasterService::Stub* stub) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    hymcache::v1::GetStatsResponse resp;
    grpc::Status s = stub->GetStats(&ctx, hymcache::v1::GetStatsRequest(), &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    return resp;
  }

  // NODE on the command line: a node's name, or else its id.
  absl::StatusOr<hymcache::v1::NodeInfo> ResolveNode(
      hymcache::v1::MasterService::Stub* stub, const std::string& arg) {
    auto st = MasterStats(stub);
    if (!st.ok()) return st.status();
    for (const auto& n : st->nodes()) {
      if (n.name() == arg) return n;
    }
    uint32_t id = 0;
    if (absl::SimpleAtoi(arg, &id)) {
      for (const auto& n : st->nodes()) {
        if (n.node_id() == id) return n;
      }
    }
    return absl::NotFoundError(absl::StrCat(
        "no node named '", arg, "' (or with that id); see hymctl status"));
  }

  // token new ROLE TENANT NAME TOKEN_FILE [--nodes=A,B]: the token goes to
  // a file only its owner reads, never to the terminal; stdout gets the
  // line for the daemons' identities file. --nodes binds a node identity to
  // the node names it may register as.
  int Token(const std::vector<std::string>& args) {
    std::vector<std::string> nodes;
    if (!o_.token_nodes.empty()) {
      nodes = absl::StrSplit(o_.token_nodes, ',');
      for (const std::string& n : nodes) {
        if (n.empty() || n.size() > 128 ||
            n.find_first_of(" \t\n#") != std::string::npos) {
          return Usage(
              "--nodes takes node names of 1..128 bytes without "
              "spaces or '#', comma-separated");
        }
      }
    }
    if (args.size() != 5 || args[0] != "new") {
      return Usage("token new ROLE TENANT NAME TOKEN_FILE [--nodes=A,B]");
    }
    auto role = ParseRole(args[1]);
    if (!role.ok()) return Usage(std::string(role.status().message()));
    if (!nodes.empty() && *role != Role::kNode) {
      return Usage("--nodes is for role node only");
    }
    for (const std::string& f : {args[2], args[3]}) {
      if (f.empty() || f.find_first_of(" \t\n#") != std::string::npos) {
        return Usage("TENANT and NAME are single words without '#'");
      }
    }
    auto token = NewToken();
    if (!token.ok()) return Fail(token.status());
    const int fd = ::open(args[4].c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          args[4], ": ", std::strerror(errno), " (the token file must be new)")));
    }
    const std::string text = *token + "\n";
    const bool written =
        ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    const bool closed = ::close(fd) == 0;
    if (!written || !closed) {
      ::unlink(args[4].c_str());
      return Fail(absl::InternalError(absl::StrCat(args[4], ": write failed")));
    }
    out_ << IdentityLine(*role, args[2] == "-" ? "" : args[2], args[3], *token,
                         nodes)
         << "\n";
    return 0;
  }

  // tenant list | usage TENANT | set-quota TENANT MAX_OBJECTS MAX_BYTES
  // (docs/security.md, "Tenants").
  int Tenant(const std::vector<std::string>& args) {
    const bool list = args.size() == 1 && args[0] == "list";
    const bool usage = args.size() == 2 && args[0] == "usage";
    const bool set = args.size() == 4 && args[0] == "set-quota";
    const bool replicas = args.size() == 3 && args[0] == "set-replicas";
    if (!list && !usage && !set && !replicas) {
      return Usage(
          "tenant list | usage TENANT | set-quota TENANT MAX_OBJECTS "
          "MAX_BYTES | set-replicas TENANT N");
    }
    auto channel = CreateChannel(o_.master_address, o_.security);
    if (!channel.ok()) return Fail(channel.status());
    auto stub = hymcache::v1::MasterService::NewStub(*channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Seconds(o_.timeout_seconds)));
    if (replicas) {
      hymcache::v1::SetTenantQuotaRequest req;
      uint32_t n = 0;
      if (!absl::SimpleAtoi(args[2], &n))
        return Usage("set-replicas: N is 0..2");
      req.set_tenant(args[1]);
      req.set_replicas(n);
      req.set_set_replicas(true);
      hymcache::v1::SetTenantQuotaResponse resp;
      grpc::Status s = stub->SetTenantQuota(&ctx, req, &resp);
      if (!s.ok()) return Fail(FromGrpcStatus(s));
      out_ << (o_.json ? json{{"tenant", args[1]}, {"replicas", n}}.dump()
                       : absl::StrCat("tenant ", args[1], ": replicas ", n))
           << "\n";
      return 0;
    }
    if (set) {
      hymcache::v1::SetTenantQuotaRequest req;
      uint64_t objects = 0, bytes = 0;
      if (!absl::SimpleAtoi(args[2], &objects) ||
          !absl::SimpleAtoi(args[3], &bytes)) {
        return Usage("set-quota: MAX_OBJECTS and MAX_BYTES are integers");
      }
      req.set_tenant(args[1]);
      req.set_max_objects(objects);
      req.set_max_bytes(bytes);
      hymcache::v1::SetTenantQuotaResponse resp;
      grpc::Status s = stub->SetTenantQuota(&ctx, req, &resp);
      if (!s.ok()) return Fail(FromGrpcStatus(s));
      if (o_.json) {
        out_ << json{{"tenant", args[1]}, {"max_objects", objects},
                     {"max_bytes", bytes}}.dump() << "\n";
      } else {
        out_ << "tenant " << args[1] << ": quota " << objects << " objects, "
             << bytes << " bytes (0 = unlimited)\n";
      }
      return 0;
    }
    hymcache::v1::ListTenantsRequest req;
    if (usage) req.set_tenant(args[1]);
    hymcache::v1::ListTenantsResponse resp;
    grpc::Status s = stub->ListTenants(&ctx, req, &resp);
    if (!s.ok()) return Fail(FromGrpcStatus(s));
    if (o_.json) {
      json all = json::array();
      for (const auto& t : resp.tenants()) {
        all.push_back(json{{"tenant", t.tenant()},
                           {"objects", t.objects()},
                           {"bytes", t.bytes()},
                           {"max_objects", t.max_objects()},
                           {"max_bytes", t.max_bytes()},
                           {"quota_refusals", t.quota_refusals()},
                           {"quota_evictions", t.quota_evictions()},
                           {"replicas", t.replicas()}});
      }
      out_ << json{{"tenants", all}}.dump(2) << "\n";
      return 0;
    }
    auto limit = [](uint64_t v, bool bytes) -> std::string {
      if (v == 0) return "-";
      return bytes ? Human(v) : absl::StrCat(v);
    };
    std::vector<std::vector<std::string>> rows = {
        {"TENANT", "OBJECTS", "BYTES", "MAX OBJECTS", "MAX BYTES",
         "REFUSED PUTS", "EVICTED", "REPLICAS"}};
    for (const auto& t : resp.tenants()) {
      rows.push_back({t.tenant(), absl::StrCat(t.objects()), Human(t.bytes()),
                      limit(t.max_objects(), false), limit(t.max_bytes(), true),
                      absl::StrCat(t.quota_refusals()),
                      absl::StrCat(t.quota_evictions()),
                      absl::StrCat(std::max(t.replicas(), 1u))});
    }
    Table(out_, rows);
    return 0;
  }

  int Fail(const absl::Status& s) {
    if (o_.json) {
      out_ << json{{"error", std::string(absl::StatusCodeToString(s.code()))},
                   {"message", std::string(s.message())}}
                  .dump()
           << "\n";
    } else {
      err_ << "hymctl: " << s.ToString() << "\n";
    }
    return 1;
  }

  bool Key(const std::string& arg, std::string* key) {
    if (!o_.hex_keys) {
      *key = arg;
      return true;
    }
    if (arg.size() % 2 != 0 ||
        arg.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
      err_ << "hymctl: '" << arg << "' is not hex\n";
      return false;
    }
    *key = absl::HexStringToBytes(arg);
    return true;
  }

  bool Keys(const std::vector<std::string>& args, std::vector<std::string>* keys) {
    for (const auto& a : args) {
      std::string k;
      if (!Key(a, &k)) return false;
      keys->push_back(k);
    }
    return true;
  }

  // Whether the master answered read-only (an HA master whose term ended
  // without an answer from etcd: docs/ha.md, "etcd faults").
  static bool MasterReadOnly(const hymcache::v1::GetStatsResponse& st) {
    auto it = st.stats().find("leader_read_only");
    return it != st.stats().end() && it->second != 0;
  }

  int Status() {
    absl::Status why;
    auto stub = MasterStub(&why);
    if (stub == nullptr) return Fail(why);
    auto st = MasterStats(stub.get());
    if (!st.ok()) return Fail(st.status());
    const int64_t now_ms = absl::ToUnixMillis(absl::Now());
    if (o_.json) {
      json nodes = json::array();
      for (const auto& n : st->nodes()) {
        const uint64_t free =
            n.capacity_bytes() - std::min(n.used_bytes(), n.capacity_bytes());
        nodes.push_back(
            {{"node_id", n.node_id()},
             {"name", n.name()},
             {"host", n.host()},
             {"data_address", n.data_address()},
             {"control_address", n.control_address()},
             {"state", NodeState(n)},
             {"alive", n.alive()},
             {"draining", n.draining()},
             {"awaiting_reconcile", n.awaiting_reconcile()},
             {"device", DeviceKind(n)},
             {"capacity_bytes", n.capacity_bytes()},
             {"used_bytes", n.used_bytes()},
             {"free_bytes", free},
             {"objects", n.object_count()},
             {"last_heartbeat_unix_ms", n.last_heartbeat_unix_ms()}});
      }
      // Every cluster stat under its name (common/cluster_stats.h), and
      // "objects", the name object_count had here first.
      json j{{"nodes", nodes}, {"objects", st->object_count()}};
#define HYM_JSON_GAUGE_(field, metric, help) j[#field] = st->field();
#define HYM_JSON_COUNTER_(field) j[#field] = st->field();
      HYM_CLUSTER_STATS(HYM_JSON_GAUGE_, HYM_JSON_COUNTER_)
#undef HYM_JSON_GAUGE_
#undef HYM_JSON_COUNTER_
      j["master"] = o_.master_address;
      if (st->stats().count("placement_imbalance") != 0)
        j["placement_imbalance"] = st->stats().at("placement_imbalance");
      j["master_epoch"] = st->master_epoch();
      j["master_read_only"] = MasterReadOnly(*st);
      if (auto r = ParseReplicationStatus(
              {st->stats().begin(), st->stats().end()})) {
        json standbys = json::array();
        for (const StandbyLag& s : r->standbys) {
          json one{{"name", s.name}, {"lag_sequences", s.lag_sequences}};
          if (s.lag_seconds) one["lag_seconds"] = *s.lag_seconds;
          standbys.push_back(one);
        }
        j["replication"] = {{"mode", r->mode},
                            {"followers", r->followers},
                            {"copying", r->copying},
                            {"lag_sequences", r->lag_sequences},
                            {"standbys", standbys}};
        if (r->lag_seconds) j["replication"]["lag_seconds"] = *r->lag_seconds;
      }
      out_ << j.dump(2) << "\n";
      return 0;
    }
    auto seen = [&](const hymcache::v1::NodeInfo& n) -> std::string {
      if (n.last_heartbeat_unix_ms() <= 0) return "never";
      return ShortAge(absl::Milliseconds(now_ms - n.last_heartbeat_unix_ms()));
    };
    std::vector<std::vector<std::string>> rows;
    if (o_.wide) {
      rows.push_back({"NODE", "NAME", "HOST", "DATA", "CONTROL", "STATE",
                      "DEVICE", "CAPACITY", "USED", "FREE", "OBJECTS",
                      "LAST HEARTBEAT"});
      for (const auto& n : st->nodes()) {
        rows.push_back(
            {absl::StrCat(n.node_id()), n.name(), n.host(), n.data_address(),
             n.control_address(), NodeState(n), DeviceKind(n),
             Human(n.capacity_bytes()), Human(n.used_bytes()),
             Human(n.capacity_bytes() -
                   std::min(n.used_bytes(), n.capacity_bytes())),
             absl::StrCat(n.object_count()),
             n.last_heartbeat_unix_ms() > 0
                 ? absl::StrFormat(
                       "%.1fs ago",
                       (now_ms - n.last_heartbeat_unix_ms()) / 1000.0)
                 : "never"});
      }
    } else {
      // Every column but NAME is bounded (ids aside): NAME gets what is
      // left of 80 columns and is cut short with '~'.
      rows.push_back({"NODE", "NAME", "STATE", "DEVICE", "USED", "SIZE",
                      "USE%", "OBJECTS", "SEEN"});
      for (const auto& n : st->nodes()) {
        const double pct =
            n.capacity_bytes() == 0
                ? 0
                : 100.0 * static_cast<double>(n.used_bytes()) /
                      static_cast<double>(n.capacity_bytes());
        rows.push_back({absl::StrCat(n.node_id()), n.name(), NarrowState(n),
                        DeviceKind(n).substr(0, 6), ShortBytes(n.used_bytes()),
                        ShortBytes(n.capacity_bytes()),
                        absl::StrFormat("%.0f%%", pct),
                        ShortNumber(static_cast<double>(n.object_count())), seen(n)});
      }
      size_t others = 2 * (rows[0].size() - 1);
      for (size_t c = 0; c < rows[0].size(); ++c) {
        if (c == 1) continue;
        size_t w = 0;
        for (const auto& r : rows) w = std::max(w, r[c].size());
        others += w;
      }
      const size_t name_width = others + 8 < 80 ? 80 - others : 8;
      for (auto& r : rows) {
        if (r[1].size() > name_width) r[1] = r[1].substr(0, name_width - 1) + "~";
      }
    }
    Table(out_, rows);
    out_ << "\n"
         << st->object_count() << " objects, " << Human(st->object_bytes())
         << ", " << st->pending_puts() << " puts pending, "
         << st->evicted_objects() << " evicted ("
         << Human(st->evicted_bytes()) << ")\n"
         << "reconciliations: " << st->reconciliations() << " ("
         << st->reconcile_dropped_listings()
         << " listings dropped); read repairs: " << st->read_repairs()
         << "\n";
    if (const auto& m = st->stats(); m.count("placement_imbalance") != 0) {
      out_ << absl::StrFormat(
          "placement: imbalance %.2f (largest node's used bytes / mean), "
          "%.0f chain spills\n",
          m.at("placement_imbalance"),
          m.count("placements_spilled") ? m.at("placements_spilled") : 0.0);
    }
    if (st->master_epoch() != 0 && MasterReadOnly(*st)) {
      out_ << "master " << o_.master_address << " is read-only: its term of "
           << "epoch " << st->master_epoch()
           << " ended without an answer from etcd (lookups served, writes "
              "refused)\n";
    } else if (st->master_epoch() != 0) {
      out_ << "master " << o_.master_address << " leads, epoch "
           << st->master_epoch() << "\n";
    }
    if (auto r =
            ParseReplicationStatus({st->stats().begin(), st->stats().end()})) {
      out_ << FormatReplicationStatus(*r) << "\n";
    }
    return 0;
  }

  // Admin: the master removes a dead node's record and its objects.
  int ForgetNode(const std::string& arg) {
    absl::Status why;
    auto stub = MasterStub(&why);
    if (stub == nullptr) return Fail(why);
    auto node = ResolveNode(stub.get(), arg);
    if (!node.ok()) return Fail(node.status());
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    hymcache::v1::ForgetNodeRequest req;
    req.set_name(node->name());
    hymcache::v1::ForgetNodeResponse resp;
    grpc::Status s = stub->ForgetNode(&ctx, req, &resp);
    if (!s.ok()) return Fail(FromGrpcStatus(s));
    if (o_.json) {
      out_ << json{{"node_id", resp.node_id()},
                   {"name", node->name()},
                   {"objects_removed", resp.objects_removed()}}
                  .dump()
           << "\n";
    } else {
      out_ << "forgot node " << resp.node_id() << " '" << node->name()
           << "' and its " << resp.objects_removed() << " objects\n";
    }
    return 0;
  }

  // Admin: drain (no new placements) or undrain a node; with --wait, until
  // it holds no objects or timeout_seconds pass.
  int Drain(const std::string& arg, bool draining) {
    const absl::Time deadline = absl::Now() + absl::Seconds(o_.timeout_seconds);
    absl::Status why;
    auto stub = MasterStub(&why);
    if (stub == nullptr) return Fail(why);
    auto node = ResolveNode(stub.get(), arg);
    if (!node.ok()) return Fail(node.status());
    hymcache::v1::SetNodeDrainingRequest req;
    req.set_name(node->name());
    req.set_draining(draining);
    hymcache::v1::SetNodeDrainingResponse resp;
    {
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      grpc::Status s = stub->SetNodeDraining(&ctx, req, &resp);
      if (!s.ok()) return Fail(FromGrpcStatus(s));
    }
    std::optional<DrainCopyReport> copy;
    if (draining && !o_.drain_copy.empty()) {
      auto copied = CopyOff(stub.get(), resp.node_id());
      if (!copied.ok()) return Fail(copied.status());
      copy = *copied;
      resp.set_object_count(copy->listed - copy->copied);
    }
    uint64_t objects = resp.object_count();
    bool forgotten = false;
    const bool wait = draining && o_.wait;
    while (wait && objects > 0 && absl::Now() < deadline) {
      absl::SleepFor(std::min(absl::Milliseconds(200), deadline - absl::Now()));
      auto st = MasterStats(stub.get());
      if (!st.ok()) return Fail(st.status());
      forgotten = true;
      for (const auto& n : st->nodes()) {
        if (n.node_id() != resp.node_id()) continue;
        forgotten = false;
        objects = n.object_count();
      }
      if (forgotten) objects = 0;
    }
    const bool empty = objects == 0;
    if (o_.json) {
      json j{{"node_id", resp.node_id()},
             {"name", node->name()},
             {"draining", draining},
             {"changed", resp.changed()},
             {"objects", objects}};
      if (wait) j["drained"] = empty;
      if (forgotten) j["forgotten"] = true;
      if (copy) j["copy"] = DrainCopyJson(*copy);
      out_ << j.dump() << "\n";
    } else {
      out_ << "node " << resp.node_id() << " '" << node->name() << "' "
           << (draining ? "draining: no new placements, reads continue"
                        : "undrained: placements resume")
           << (resp.changed() ? "" : " (already so)") << "; " << objects
           << " objects\n";
      if (copy) out_ << DrainCopyText(*copy) << "\n";
      if (wait) {
        out_ << (empty ? "drained: the node holds no objects"
                       : absl::StrCat(objects,
                                      " objects remain after --timeout=",
                                      o_.timeout_seconds, "s"))
             << "\n";
      }
    }
    return wait && !empty ? 1 : 0;
  }

  // drain --copy: the node's objects (or its hot chains) to other nodes,
  // with a progress line on stderr every second.
  absl::StatusOr<DrainCopyReport> CopyOff(
      hymcache::v1::MasterService::Stub* stub, uint32_t node_id) {
    DrainCopyOptions dc;
    dc.node_id = node_id;
    if (o_.drain_copy == "hot") {
      dc.which = DrainCopyOptions::Which::kHot;
    } else if (o_.drain_copy != "all") {
      return absl::InvalidArgumentError(absl::StrCat(
          "drain --copy takes 'all' or 'hot', not '", o_.drain_copy, "'"));
    }
    dc.hot_within = absl::Seconds(o_.hot_within_seconds);
    dc.deadline = absl::Now() + absl::Seconds(o_.timeout_seconds);
    RETURN_IF_ERROR(CreateClient());
    return CopyOffNode(stub, client_.get(), dc, ProgressLine("drain --copy"));
  }

  // A progress line on stderr at most every second.
  std::function<void(const DrainCopyReport&)> ProgressLine(
      const std::string& what) {
    return [this, what, shown = absl::Now()](const DrainCopyReport& r) mutable {
      if (absl::Now() - shown < absl::Seconds(1)) return;
      shown = absl::Now();
      err_ << what << ": " << DrainCopyText(r) << "\n";
    };
  }

  // Admin: chains off the fullest nodes, onto the emptiest (a node that
  // joined); --copy=hot: only chains read within --hot_within.
  int RebalanceNodes() {
    absl::Status why;
    auto stub = MasterStub(&why);
    if (stub == nullptr) return Fail(why);
    RebalanceOptions ro;
    if (o_.drain_copy == "hot") {
      ro.which = DrainCopyOptions::Which::kHot;
    } else if (!o_.drain_copy.empty() && o_.drain_copy != "all") {
      return Usage("rebalance --copy takes 'all' or 'hot'");
    }
    ro.hot_within = absl::Seconds(o_.hot_within_seconds);
    ro.deadline = absl::Now() + absl::Seconds(o_.timeout_seconds);
    auto steps =
        Rebalance(stub.get(), client_.get(), ro, ProgressLine("rebalance"));
    if (!steps.ok()) return Fail(steps.status());
    out_ << (o_.json ? RebalanceJson(*steps).dump() : RebalanceText(*steps))
         << "\n";
    for (const RebalanceStep& s : *steps) {
      if (s.copy.failed > 0) return 1;
    }
    return 0;
  }

  // Admin: everything the master knows about one key.
  int Inspect(const std::string& key_arg) {
    std::string key;
    if (!Key(key_arg, &key)) return 2;
    absl::Status why;
    auto stub = MasterStub(&why);
    if (stub == nullptr) return Fail(why);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    hymcache::v1::InspectKeyRequest req;
    req.set_key(key);
    hymcache::v1::InspectKeyResponse r;
    grpc::Status s = stub->InspectKey(&ctx, req, &r);
    if (!s.ok()) return Fail(FromGrpcStatus(s));
    const int64_t now_ms = absl::ToUnixMillis(absl::Now());
    const auto& l = r.location();
    const auto& n = r.node();
    if (o_.json) {
      json j{{"found", r.found()},
             {"tenant", r.tenant()},
             {"put_in_progress", r.put_in_progress()}};
      PutKey(j, "key", key);
      if (r.found()) {
        j["location"] = json{{"node_id", l.node_id()},
                             {"region_id", l.region_id()},
                             {"addr", l.addr()},
                             {"length", l.length()},
                             {"generation", l.generation()}};
        j["node"] = json{{"node_id", n.node_id()},
                         {"name", n.name()},
                         {"data_address", n.data_address()},
                         {"state", NodeState(n)},
                         {"alive", n.alive()},
                         {"draining", n.draining()},
                         {"awaiting_reconcile", n.awaiting_reconcile()},
                         {"last_heartbeat_unix_ms", n.last_heartbeat_unix_ms()}};
        j["last_read_unix_ms"] = r.last_read_unix_ms();
        j["leased"] = r.lease_expires_unix_ms() > now_ms;
        j["lease_expires_unix_ms"] = r.lease_expires_unix_ms();
        json chain{{"parent_on_other_node", r.parent_on_other_node()},
                   {"children", r.children()},
                   {"cross_children", r.cross_children()},
                   {"unreachable", r.unreachable()}};
        if (!r.parent_key().empty()) PutKey(chain, "parent_key", r.parent_key());
        j["chain"] = chain;
      }
      out_ << j.dump(2) << "\n";
      return r.found() ? 0 : 1;
    }
    std::vector<std::vector<std::string>> rows;
    rows.push_back({"key", Printable(key) + (Printable(key) == key ? "" : " (hex)")});
    rows.push_back({"tenant", r.tenant()});
    if (!r.found()) {
      rows.push_back({"found", r.put_in_progress()
                                   ? "no (a put of it is in progress)"
                                   : "no"});
      Table(out_, rows);
      return 1;
    }
    rows.push_back({"node", absl::StrCat(n.node_id(), " '", n.name(), "' ",
                                         NodeState(n), ", data ",
                                         n.data_address())});
    rows.push_back({"location", absl::StrCat("region ", l.region_id(), " addr ",
                                             l.addr(), " length ", l.length(),
                                             " generation ", l.generation())});
    rows.push_back(
        {"served", n.alive() ? "yes" : "no: its node is not alive (a miss)"});
    std::string read = "never (since it was stored or the master started)";
    if (r.last_read_unix_ms() > 0) {
      read = absl::StrCat(
          ShortAge(absl::Milliseconds(now_ms - r.last_read_unix_ms())), " ago");
      if (r.lease_expires_unix_ms() > now_ms) {
        absl::StrAppend(&read, "; leased (not evicted) for ",
                        ShortAge(absl::Milliseconds(r.lease_expires_unix_ms() -
                                                    now_ms)));
      }
    }
    rows.push_back({"last read", read});
    std::string chain =
        r.parent_key().empty()
            ? "chain head (or unlinked)"
            : absl::StrCat("parent ", Printable(r.parent_key()),
                           r.parent_on_other_node() ? " (on another node)" : "");
    absl::StrAppend(&chain, "; ", r.children(), " children",
                    r.cross_children() > 0
                        ? absl::StrCat(" + ", r.cross_children(),
                                       " on other nodes")
                        : "",
                    r.unreachable() ? "; UNREACHABLE (a block before it is gone)"
                                    : "");
    rows.push_back({"chain", chain});
    if (r.put_in_progress()) rows.push_back({"put", "a new put of it is in progress"});
    Table(out_, rows);
    return 0;
  }

  // One snapshot for top.
  absl::StatusOr<TopSample> Sample(hymcache::v1::MasterService::Stub* stub) {
    auto st = MasterStats(stub);
    if (!st.ok()) return st.status();
    TopSample sample;
    sample.objects = st->object_count();
    sample.pending_puts = st->pending_puts();
    sample.evicted_objects = st->evicted_objects();
    for (const auto& n : st->nodes()) {
      NodeSample ns;
      ns.node_id = n.node_id();
      ns.name = n.name();
      ns.state = NodeState(n);
      ns.objects = n.object_count();
      ns.used_bytes = n.used_bytes();
      ns.capacity_bytes = n.capacity_bytes();
      if (!n.alive() && !n.awaiting_reconcile()) {
        ns.error = "not alive";
        sample.nodes.push_back(std::move(ns));
        continue;
      }
      auto channel = CreateChannel(n.control_address(), o_.security);
      if (!channel.ok()) return channel.status();
      auto node_stub = hymcache::v1::StorageControl::NewStub(*channel);
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      hymcache::v1::StorageStatsResponse resp;
      grpc::Status s = node_stub->GetStats(
          &ctx, hymcache::v1::StorageStatsRequest(), &resp);
      if (!s.ok()) {
        ns.error = s.error_message();
      } else {
        ns.reachable = true;
        ns.read_ops = resp.read_ops();
        ns.write_ops = resp.write_ops();
        ns.bytes_read = resp.bytes_read();
        ns.bytes_written = resp.bytes_written();
        for (const auto& [k, v] : resp.device_stats()) ns.device[k] = v;
      }
      sample.nodes.push_back(std::move(ns));
    }
    sample.at = absl::Now();
    return sample;
  }

  // Refreshes a per-node view of rates every interval_seconds.
  int Top() {
    if (!(o_.interval_seconds > 0)) {
      return Usage("top: --interval must be > 0 seconds");
    }
    absl::Status why;
    auto stub = MasterStub(&why);
    if (stub == nullptr) return Fail(why);
    auto before = Sample(stub.get());
    if (!before.ok()) return Fail(before.status());
    for (int i = 0; o_.iterations <= 0 || i < o_.iterations; ++i) {
      absl::SleepFor(absl::Seconds(o_.interval_seconds));
      auto after = Sample(stub.get());
      if (!after.ok()) return Fail(after.status());
      const TopView view = ComputeTop(*before, *after);
      if (o_.json) {
        out_ << TopJson(view) << "\n";
      } else {
        if (o_.clear_screen) out_ << "\x1b[H\x1b[2J";
        PrintTop(out_, view);
      }
      out_.flush();
      before = std::move(after);
    }
    return 0;
  }

  // hymctl's own version and the master it talks to.
  int Version() {
    const std::string v = o_.version.empty() ? "unknown" : o_.version;
    if (o_.json) {
      out_ << json{{"hymctl", v}, {"protocol", "hymcache.v1"}}.dump() << "\n";
    } else {
      out_ << "hymctl " << v << " (protocol hymcache.v1)\n";
    }
    return 0;
  }

  // Asks every node's control service for its counters.
  int NodeStats() {
    auto st = client_->GetClusterStatus();
    if (!st.ok()) return Fail(st.status());
    json all = json::array();
    for (const auto& n : st->nodes) {
      json j{{"node_id", n.node_id}, {"name", n.name}, {"alive", n.alive}};
      auto channel = CreateChannel(n.control_address, o_.security);
      if (!channel.ok()) return Fail(channel.status());
      auto stub = hymcache::v1::StorageControl::NewStub(*channel);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(o_.timeout_seconds)));
      hymcache::v1::StorageStatsResponse resp;
      grpc::Status s = stub->GetStats(&ctx, hymcache::v1::StorageStatsRequest(), &resp);
      if (!s.ok()) {
        j["error"] = s.error_message();
      } else {
        j["bytes_read"] = resp.bytes_read();
        j["bytes_written"] = resp.bytes_written();
        j["read_ops"] = resp.read_ops();
        j["write_ops"] = resp.write_ops();
        j["stale_reads"] = resp.stale_reads();
        j["rejected_ops"] = resp.rejected_ops();
        j["open_connections"] = resp.open_connections();
        json dev = json::object();
        for (const auto& [k, v] : resp.device_stats()) dev[k] = v;
        j["device"] = dev;
      }
      all.push_back(j);
    }
    if (o_.json) {
      out_ << json{{"nodes", all}}.dump(2) << "\n";
      return 0;
    }
    for (const auto& j : all) {
      out_ << "node " << j["node_id"].get<uint32_t>() << " ("
           << j["name"].get<std::string>() << ")";
      if (j.contains("error")) {
        out_ << ": unreachable: " << j["error"].get<std::string>() << "\n";
        continue;
      }
      out_ << "\n";
      std::vector<std::vector<std::string>> rows = {{"  COUNTER", "VALUE"}};
      const std::vector<std::string> fixed = {"bytes_read", "bytes_written", "read_ops",
                                              "write_ops", "stale_reads", "rejected_ops",
                                              "open_connections"};
      for (const std::string& k : fixed) {
        rows.push_back({"  " + k, absl::StrCat(j[k].get<uint64_t>())});
      }
      std::map<std::string, double> dev = j["device"].get<std::map<std::string, double>>();
      for (const auto& [k, v] : dev) {
        // The node's map has every stat, these too.
        if (std::find(fixed.begin(), fixed.end(), k) != fixed.end()) continue;
        rows.push_back({"  device." + k, v == static_cast<double>(static_cast<uint64_t>(v))
                                             ? absl::StrCat(static_cast<uint64_t>(v))
                                             : absl::StrFormat("%.4g", v)});
      }
      Table(out_, rows);
    }
    return 0;
  }

  int Put(const std::string& key_arg, const std::string& file) {
    std::string key;
    if (!Key(key_arg, &key)) return 2;
    std::ifstream in(file, std::ios::binary);
    if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read ", file)));
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (data.empty()) return Fail(absl::InvalidArgumentError(absl::StrCat(file, " is empty")));
    ConstBuffer b{data.data(), data.size()};
    auto r = client_->Put({key}, {b});
    if (!r.ok()) return Fail(r.status());
    const char* what = r->outcomes[0] == PutOutcome::kStored          ? "stored"
                       : r->outcomes[0] == PutOutcome::kAlreadyStored ? "already stored"
                       : r->outcomes[0] == PutOutcome::kInProgress    ? "being stored by another writer"
                                                                      : "failed";
    if (o_.json) {
      json j{{"result", what}, {"bytes", data.size()},
             {"node_id", r->node_id},
             {"error", r->errors[0].ok() ? "" : r->errors[0].ToString()}};
      PutKey(j, "key", key);
      out_ << j.dump() << "\n";
    } else if (r->outcomes[0] == PutOutcome::kFailed) {
      err_ << "hymctl: put " << Printable(key) << " failed: " << r->errors[0].ToString() << "\n";
    } else {
      out_ << what << " " << Printable(key) << " (" << Human(data.size()) << ")";
      if (r->node_id != 0) out_ << " on node " << r->node_id;
      out_ << "\n";
    }
    return r->outcomes[0] == PutOutcome::kFailed ? 1 : 0;
  }

  int Get(const std::string& key_arg, const std::string& file) {
    std::string key;
    if (!Key(key_arg, &key)) return 2;
    auto look = client_->BatchLookup({key});
    if (!look.ok()) return Fail(look.status());
    if (!look->found[0]) return Fail(absl::NotFoundError(absl::StrCat("key ", Printable(key), " is not stored")));
    std::string data(look->locations[0].length, '\0');
    MutableBuffer b{data.data(), data.size()};
    auto r = client_->Get({key}, {b});
    if (!r.ok()) return Fail(r.status());
    if (r->loaded != 1) return Fail(r->stop_reason);
    data.resize(r->lengths[0]);
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!out) return Fail(absl::InternalError(absl::StrCat("cannot write ", file)));
    if (o_.json) {
      json j{{"bytes", data.size()}, {"file", file}};
      PutKey(j, "key", key);
      out_ << j.dump() << "\n";
    } else {
      out_ << "wrote " << Human(data.size()) << " of " << Printable(key) << " to " << file << "\n";
    }
    return 0;
  }

  int Lookup(const std::vector<std::string>& args) {
    std::vector<std::string> keys;
    if (!Keys(args, &keys)) return 2;
    auto r = client_->BatchLookup(keys);
    if (!r.ok()) return Fail(r.status());
    if (o_.json) {
      json items = json::array();
      for (size_t i = 0; i < keys.size(); ++i) {
        json j{{"found", static_cast<bool>(r->found[i])}};
        PutKey(j, "key", keys[i]);
        if (r->found[i]) {
          const auto& l = r->locations[i];
          j["node_id"] = l.node_id;
          j["region_id"] = l.region_id;
          j["addr"] = l.addr;
          j["length"] = l.length;
          j["generation"] = l.generation;
        }
        items.push_back(j);
      }
      out_ << json{{"results", items}, {"hit_prefix", r->hit_prefix}}.dump(2) << "\n";
      return 0;
    }
    std::vector<std::vector<std::string>> rows = {
        {"KEY", "FOUND", "NODE", "REGION", "ADDR", "LENGTH", "GENERATION"}};
    for (size_t i = 0; i < keys.size(); ++i) {
      const auto& l = r->locations[i];
      if (r->found[i]) {
        rows.push_back({Printable(keys[i]), "yes", absl::StrCat(l.node_id),
                        absl::StrCat(l.region_id), absl::StrCat(l.addr),
                        absl::StrCat(l.length), absl::StrCat(l.generation)});
      } else {
        rows.push_back({Printable(keys[i]), "no", "-", "-", "-", "-", "-"});
      }
    }
    Table(out_, rows);
    out_ << "\nhit prefix: " << r->hit_prefix << " of " << keys.size() << "\n";
    return 0;
  }

  int Remove(const std::vector<std::string>& args) {
    std::vector<std::string> keys;
    if (!Keys(args, &keys)) return 2;
    auto r = client_->Remove(keys);
    if (!r.ok()) return Fail(r.status());
    if (o_.json) {
      json items = json::array();
      for (size_t i = 0; i < keys.size(); ++i) {
        json j{{"removed", static_cast<bool>((*r)[i])}};
        PutKey(j, "key", keys[i]);
        items.push_back(j);
      }
      out_ << json{{"results", items}}.dump(2) << "\n";
      return 0;
    }
    std::vector<std::vector<std::string>> rows = {{"KEY", "REMOVED"}};
    for (size_t i = 0; i < keys.size(); ++i) {
      rows.push_back({Printable(keys[i]), (*r)[i] ? "yes" : "no (not stored)"});
    }
    Table(out_, rows);
    return 0;
  }

  // See fsck.h. Exit status 1 when anything inconsistent is confirmed
  // (after --repair: when anything is left).
  int Fsck(const std::vector<std::string>& args) {
    FsckOptions f;
    f.master_address = o_.master_address;
    f.security = o_.security;
    f.rpc_timeout = absl::Seconds(std::max(o_.timeout_seconds, 60.0));
    for (const std::string& a : args) {
      double settle = 0;
      if (a == "--repair") {
        f.repair = true;
      } else if (absl::StartsWith(a, "--settle=") &&
                 absl::SimpleAtod(a.substr(9), &settle) && settle >= 0) {
        f.settle = absl::Seconds(settle);
      } else {
        return Usage(absl::StrCat("fsck: unknown option '", a, "'"));
      }
    }
    absl::StatusOr<FsckReport> r = RunFsck(f);
    if (!r.ok()) return Fail(r.status());
    const bool inconsistent = f.repair ? r->remaining > 0 : !r->clean();
    auto loc = [](const hymcache::v1::Location& l) {
      return json{{"node_id", l.node_id()},   {"region_id", l.region_id()},
                  {"addr", l.addr()},         {"length", l.length()},
                  {"generation", l.generation()}};
    };
    if (o_.json) {
      json findings = json::array();
      for (const FsckFinding& x : r->findings) {
        json j{{"kind", FindingKindName(x.kind)}, {"node_id", x.node_id}};
        if (!x.key.empty()) PutKey(j, "key", x.key);
        if (x.kind != FsckFinding::Kind::kUnlisted) j["listed"] = loc(x.listed);
        if (x.kind == FsckFinding::Kind::kUnlisted ||
            x.kind == FsckFinding::Kind::kMismatched) {
          j["held"] = loc(x.held);
        }
        findings.push_back(j);
      }
      json out{{"consistent", !inconsistent},
               {"nodes_checked", r->nodes_checked},
               {"listed", r->listed},
               {"held", r->held},
               {"matched", r->matched},
               {"unchecked", r->unchecked},
               {"unreachable", r->unreachable},
               {"checksum_failures", r->checksum_failures},
               {"findings", findings}};
      if (f.repair) {
        out["repair"] = json{{"listings_dropped", r->listings_dropped},
                             {"nodes_reconciled", r->nodes_reconciled},
                             {"remaining", r->remaining}};
      }
      out_ << out.dump(2) << "\n";
      return inconsistent ? 1 : 0;
    }
    size_t counts[4] = {0, 0, 0, 0};
    for (const FsckFinding& x : r->findings) ++counts[static_cast<int>(x.kind)];
    out_ << "checked " << r->nodes_checked << " nodes: " << r->listed
         << " listings, " << r->held << " extents, " << r->matched
         << " matched\n"
         << "  listed but missing:      " << counts[0] << "\n"
         << "  present but unlisted:    " << counts[1] << "\n"
         << "  generation/range mismatch: " << counts[2] << "\n"
         << "  unreachable chain tails: " << counts[3] << "\n"
         << "  objects the nodes dropped for failing their checksum (since "
            "they started): "
         << r->checksum_failures << "\n";
    if (r->unchecked > 0) {
      out_ << "  not checked (node dead or unreachable): " << r->unchecked
           << " listings\n";
    }
    for (const std::string& u : r->unreachable) out_ << "  unreachable: " << u << "\n";
    size_t shown = 0;
    for (const FsckFinding& x : r->findings) {
      if (++shown > 20) {
        out_ << "  ... " << r->findings.size() - 20 << " more (--json lists all)\n";
        break;
      }
      const auto& l = x.kind == FsckFinding::Kind::kUnlisted ? x.held : x.listed;
      out_ << "  " << FindingKindName(x.kind) << " node " << x.node_id
           << (x.key.empty() ? "" : " key " + Printable(x.key)) << " region "
           << l.region_id() << " addr " << l.addr() << " length " << l.length()
           << " generation " << l.generation() << "\n";
    }
    if (f.repair) {
      out_ << "repair: dropped " << r->listings_dropped << " listings, "
           << r->nodes_reconciled << " nodes reconciled; " << r->remaining
           << " inconsistencies left\n";
    }
    out_ << (inconsistent ? "INCONSISTENT" : "clean") << "\n";
    return inconsistent ? 1 : 0;
  }

  Options o_;  // master_address: the leader of several (Run)
  std::ostream& out_;
  std::ostream& err_;
  std::unique_ptr<Client> client_;
};

}  // namespace

int Run(const Options& options, const std::vector<std::string>& args,
        std::ostream& out, std::ostream& err) {
  return Cli(options, out, err).Run(args);
}

}  // namespace hymcache::hymctl
