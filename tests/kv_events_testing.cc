#include "tests/kv_events_testing.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"

namespace hymcache::testing {

absl::Status FollowEvents(v1::MasterService::Stub& stub, EventPosition* at,
                          uint64_t until, size_t max,
                          std::vector<v1::KvEvent>* out,
                          std::vector<std::pair<uint64_t, uint64_t>>* missed,
                          absl::Duration wait) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + wait));
  v1::WatchEventsRequest req;
  req.set_stream_id(at->stream);
  req.set_after_sequence(at->after);
  req.set_max_events(7);  // several messages
  auto reader = stub.WatchEvents(&ctx, req);
  v1::WatchEventsResponse resp;
  size_t got = 0;
  while (got < max && at->after < until && reader->Read(&resp)) {
    at->stream = resp.stream_id();
    if (resp.missed_to() != 0) {
      if (missed != nullptr) {
        missed->emplace_back(resp.missed_from(), resp.missed_to());
      }
      at->after = resp.missed_to();
    }
    for (const v1::KvEvent& e : resp.events()) {
      out->push_back(e);
      at->after = e.sequence();
      if (++got == max) break;
    }
  }
  const bool done = got == max || at->after >= until;
  if (done) ctx.TryCancel();  // else the stream has ended: its own status
  grpc::Status st = reader->Finish();
  if (!done && !st.ok() &&
      st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return FromGrpcStatus(st);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> LatestEvent(v1::MasterService::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::WatchEventsRequest req;
  req.set_max_events(1);
  auto reader = stub.WatchEvents(&ctx, req);
  v1::WatchEventsResponse resp;
  const bool read = reader->Read(&resp);
  ctx.TryCancel();
  grpc::Status st = reader->Finish();
  if (!read) {
    return st.ok() ? absl::UnavailableError("WatchEvents sent nothing")
                   : FromGrpcStatus(st);
  }
  return resp.latest_sequence();
}

std::vector<std::string> EventChainKeys(const std::string& prefix, int chain,
                                        int blocks) {
  std::vector<std::string> keys;
  for (int b = 0; b < blocks; ++b) {
    keys.push_back(absl::StrCat(prefix, "ch", chain, "-", b));
  }
  return keys;
}

absl::StatusOr<std::vector<std::vector<std::string>>> StoreChainsRemoveSome(
    Client& client, const std::string& prefix, int chains, int blocks) {
  std::vector<std::vector<std::string>> all;
  const std::string data(4096, 'x');
  for (int ch = 0; ch < chains; ++ch) {
    std::vector<std::string> keys = EventChainKeys(prefix, ch, blocks);
    for (int b = 0; b < blocks; b += 3) {
      std::vector<std::string> turn(keys.begin() + b,
                                    keys.begin() + std::min(b + 3, blocks));
      std::vector<ConstBuffer> bufs(turn.size(), {data.data(), data.size()});
      StoreOptions o;
      o.deadline = absl::Now() + absl::Seconds(10);
      if (b > 0) o.parent_key = keys[b - 1];
      auto r = client.Store(turn, bufs, o)->Wait(o.deadline);
      if (!r.ok()) return r.status();
      if (r->stored != turn.size()) {
        return absl::InternalError(absl::StrCat(
            turn[0], ": ", r->stored, " of ", turn.size(),
            " stored: ", r->errors.empty() ? "" : r->errors.back().ToString()));
      }
    }
    all.push_back(keys);
  }
  for (int ch = 0; ch < chains; ch += 3) {
    auto r = client.Remove({all[ch][blocks / 2]});
    if (!r.ok()) return r.status();
  }
  return all;
}

absl::Status CheckChainEvents(
    const std::vector<v1::KvEvent>& events, uint64_t latest,
    const std::vector<std::vector<std::string>>& chains) {
  auto fail = [](auto&&... what) {
    return absl::FailedPreconditionError(absl::StrCat(what...));
  };
  if (events.size() != latest) {
    return fail(events.size(), " events, the latest is number ", latest);
  }
  std::map<std::string, int> stored, removed;
  std::map<std::string, std::string> parent;
  for (size_t i = 0; i < events.size(); ++i) {
    const v1::KvEvent& e = events[i];
    if (e.sequence() != i + 1) {
      return fail("event ", i, " is number ", e.sequence());
    }
    if (e.kind() == v1::KvEvent::BLOCK_STORED) {
      if (removed.count(e.key()) != 0) {
        return fail(e.key(), " stored after its removal");
      }
      ++stored[e.key()];
      parent[e.key()] = e.parent_key();
    } else if (e.kind() == v1::KvEvent::BLOCK_REMOVED) {
      if (stored.count(e.key()) == 0) {
        return fail(e.key(), " removed before it was stored");
      }
      ++removed[e.key()];
    }
  }
  auto times = [](const std::map<std::string, int>& m, const std::string& k) {
    auto it = m.find(k);
    return it == m.end() ? 0 : it->second;
  };
  size_t want_stored = 0, want_removed = 0;
  for (size_t ch = 0; ch < chains.size(); ++ch) {
    const std::vector<std::string>& keys = chains[ch];
    for (size_t b = 0; b < keys.size(); ++b) {
      ++want_stored;
      if (times(stored, keys[b]) != 1) {
        return fail(keys[b], " stored ", times(stored, keys[b]), " times");
      }
      if (parent[keys[b]] != (b == 0 ? "" : keys[b - 1])) {
        return fail(keys[b], " stored with parent '", parent[keys[b]], "'");
      }
      const bool cut = ch % 3 == 0 && b >= keys.size() / 2;
      want_removed += cut;
      if (times(removed, keys[b]) != (cut ? 1 : 0)) {
        return fail(keys[b], " removed ", times(removed, keys[b]), " times");
      }
    }
  }
  if (stored.size() != want_stored || removed.size() != want_removed) {
    return fail(stored.size(), " keys stored and ", removed.size(),
                " removed; want ", want_stored, " and ", want_removed);
  }
  return absl::OkStatus();
}

std::map<std::string, uint32_t> RouterView(
    const std::vector<v1::KvEvent>& events) {
  std::map<std::string, uint32_t> where;
  for (const v1::KvEvent& e : events) {
    if (e.kind() == v1::KvEvent::BLOCK_STORED) where[e.key()] = e.node_id();
    if (e.kind() == v1::KvEvent::BLOCK_REMOVED) where.erase(e.key());
  }
  return where;
}

absl::StatusOr<bool> RouterAgrees(v1::MasterService::Stub& stub,
                                  const std::map<std::string, uint32_t>& where,
                                  const std::vector<std::string>& keys) {
  v1::PrefixQueryRequest req;
  for (const auto& k : keys) req.add_keys(k);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::PrefixQueryResponse resp;
  grpc::Status st = stub.PrefixQuery(&ctx, req, &resp);
  if (!st.ok()) return FromGrpcStatus(st);
  // The router's answer.
  uint32_t hit = 0;
  std::map<uint32_t, std::pair<uint32_t, uint32_t>> per;  // longest, blocks
  std::set<uint32_t> broke;
  for (const auto& k : keys) {
    auto w = where.find(k);
    if (w == where.end()) break;
    auto& p = per[w->second];
    ++p.second;
    for (auto& [id, q] : per) {
      if (id != w->second) broke.insert(id);
    }
    if (!broke.count(w->second)) p.first = hit + 1;
    ++hit;
  }
  bool same = resp.hit_prefix_length() == hit &&
              static_cast<size_t>(resp.nodes_size()) == per.size();
  for (const auto& n : resp.nodes()) {
    auto p = per.find(n.node_id());
    same = same && p != per.end() && p->second.first == n.longest_prefix() &&
           p->second.second == n.blocks();
  }
  return same;
}

}  // namespace hymcache::testing
