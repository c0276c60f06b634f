#include "tools/hymctl/events.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/block_key.h"
#include "common/grpc_status.h"

namespace hymcache::hymctl {

namespace v1 = ::hymcache::v1;
using nlohmann::json;

std::string Printable(const std::string& key) {
  for (unsigned char c : key) {
    if (c < 0x20 || c > 0x7e) return KeyToHex(key);
  }
  return key;
}

void PutKey(json& j, const std::string& field, const std::string& key) {
  const std::string shown = Printable(key);
  j[field] = shown;
  j[field + "_encoding"] = shown == key ? "text" : "hex";
}

namespace {

const char* KindName(v1::KvEvent::Kind kind) {
  switch (kind) {
    case v1::KvEvent::BLOCK_STORED:
      return "BLOCK_STORED";
    case v1::KvEvent::BLOCK_REMOVED:
      return "BLOCK_REMOVED";
    case v1::KvEvent::NODE_UP:
      return "NODE_UP";
    case v1::KvEvent::NODE_DOWN:
      return "NODE_DOWN";
    default:
      return "UNKNOWN";
  }
}

// `stream_id` (JSON only): with the sequence, where a later
// `--stream=ID --after=SEQ` resumes.
void Print(const v1::KvEvent& e, uint64_t stream_id, bool as_json,
           std::ostream& out) {
  const bool block = e.kind() == v1::KvEvent::BLOCK_STORED ||
                     e.kind() == v1::KvEvent::BLOCK_REMOVED;
  if (as_json) {
    json j{{"stream_id", stream_id},
           {"sequence", e.sequence()},
           {"kind", KindName(e.kind())},
           {"node_id", e.node_id()},
           {"unix_ms", e.unix_ms()}};
    if (block) {
      PutKey(j, "key", e.key());
      PutKey(j, "parent_key", e.parent_key());
      j["tier"] = e.tier();
      j["tenant"] = e.tenant();
    }
    out << j.dump() << "\n";
    return;
  }
  out << e.sequence() << " " << KindName(e.kind()) << " node " << e.node_id();
  if (block) {
    out << " " << Printable(e.key());
    if (!e.parent_key().empty()) out << " after " << Printable(e.parent_key());
    if (!e.tier().empty()) out << " (" << e.tier() << ")";
  }
  out << "\n";
}

}  // namespace

int FollowEvents(v1::MasterService::Stub* stub, const EventsOptions& options,
                 double timeout_seconds, std::ostream& out,
                 std::ostream& err) {
  v1::WatchEventsRequest req;
  req.set_stream_id(options.stream_id);
  req.set_after_sequence(options.after_sequence);
  int printed = 0;
  absl::Time answered = absl::Now();
  while (true) {
    grpc::ClientContext ctx;
    auto reader = stub->WatchEvents(&ctx, req);
    v1::WatchEventsResponse resp;
    while (reader->Read(&resp)) {
      answered = absl::Now();
      req.set_stream_id(resp.stream_id());
      if (resp.missed_to() != 0) {
        if (options.json) {
          out << json{{"stream_id", resp.stream_id()},
                      {"missed_from", resp.missed_from()},
                      {"missed_to", resp.missed_to()}}
                     .dump()
              << "\n";
        } else {
          out << "missed events " << resp.missed_from() << ".."
              << resp.missed_to() << " (the master no longer holds them)\n";
        }
        req.set_after_sequence(resp.missed_to());
      }
      for (const v1::KvEvent& e : resp.events()) {
        Print(e, resp.stream_id(), options.json, out);
        req.set_after_sequence(e.sequence());
        if (options.count > 0 && ++printed >= options.count) {
          out.flush();
          ctx.TryCancel();
          reader->Finish().ok();  // cancelled: nothing to report
          return 0;
        }
      }
      out.flush();
    }
    const absl::Status s = FromGrpcStatus(reader->Finish());
    if (absl::Now() - answered > absl::Seconds(timeout_seconds)) {
      err << "hymctl events: the master stopped answering: " << s << "\n";
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(200));  // then resume after the last
  }
}

}  // namespace hymcache::hymctl
