#include "client/rdma_mover.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/frame_io.h"
#include "common/mutex.h"
#include "common/rdma.h"
#include "common/status_macros.h"
#include "common/transport_params.h"
#include "common/wire.h"

namespace hymcache {
namespace {

// Bytes of the registered bounce buffer each channel stages transfers
// through (a transfer larger than this runs in several rounds).
constexpr size_t kBounceBytes = size_t{16} << 20;
// Work requests per Execute.
constexpr size_t kMaxOpsPerRound = 1024;

struct RemoteArea {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
};

std::string Param(const PeerInfo& peer, const char* name) {
  auto it = peer.params.find(name);
  return it == peer.params.end() ? "" : it->second;
}

absl::StatusOr<std::map<uint32_t, RemoteArea>> ParseAreas(
    const PeerInfo& peer) {
  std::map<uint32_t, RemoteArea> out;
  for (absl::string_view item :
       absl::StrSplit(Param(peer, kRdmaAreasParam), ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(item, ':');
    uint32_t area = 0;
    RemoteArea a;
    if (f.size() != 4 || !absl::SimpleAtoi(f[0], &area) ||
        !absl::SimpleAtoi(f[1], &a.addr) || !absl::SimpleAtoi(f[2], &a.length) ||
        !absl::SimpleAtoi(f[3], &a.rkey)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rdma: malformed area list from storage node ", peer.node_id));
    }
    out[area] = a;
  }
  if (out.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "rdma: storage node ", peer.node_id, " registers no memory"));
  }
  return out;
}

// Engine memory registered for in-place transfers (Client::RegisterMemory),
// shared by all channels of a mover.
class Registry {
 public:
  struct Entry {
    uintptr_t start = 0;
    size_t length = 0;
    std::shared_ptr<rdma::MemoryRegion> mr;
  };

  absl::Status Add(rdma::Device* device, void* data, size_t size) {
    const auto start = reinterpret_cast<uintptr_t>(data);
    {
      MutexLock l(&mu_);
      auto next = entries_.lower_bound(start);
      if ((next != entries_.end() && next->first < start + size) ||
          (next != entries_.begin() &&
           std::prev(next)->first + std::prev(next)->second.length > start)) {
        return absl::InvalidArgumentError(
            "RegisterMemory: the range overlaps a registered one");
      }
    }
    ASSIGN_OR_RETURN(std::unique_ptr<rdma::MemoryRegion> mr,
                     device->Register(data, size, /*remote_write=*/false));
    MutexLock l(&mu_);
    entries_[start] = Entry{start, size, std::move(mr)};
    return absl::OkStatus();
  }

  absl::Status Remove(void* data) {
    MutexLock l(&mu_);
    if (entries_.erase(reinterpret_cast<uintptr_t>(data)) == 0) {
      return absl::NotFoundError("UnregisterMemory: no registration starts there");
    }
    return absl::OkStatus();
  }

  // The registration holding all of [p, p + len), if any. The returned
  // entry keeps its memory region alive while a transfer uses it.
  std::optional<Entry> Find(const void* p, size_t len) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    MutexLock l(&mu_);
    auto it = entries_.upper_bound(a);
    if (it == entries_.begin()) return std::nullopt;
    --it;
    if (a + len > it->first + it->second.length) return std::nullopt;
    return it->second;
  }

 private:
  mutable Mutex mu_;
  std::map<uintptr_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// One queue pair to one node, with its own registered bounce buffer.
class RdmaChannel : public DirectChannel {
 public:
  RdmaChannel(rdma::Device* device, const Registry* registry,
              std::unique_ptr<rdma::QueuePair> qp,
              std::map<uint32_t, RemoteArea> areas, uint8_t* bounce,
              std::unique_ptr<rdma::MemoryRegion> bounce_mr)
      : device_(device),
        registry_(registry),
        qp_(std::move(qp)),
        areas_(std::move(areas)),
        bounce_(bounce),
        bounce_mr_(std::move(bounce_mr)) {}

  ~RdmaChannel() override {
    // The queue pair goes before the memory it may touch.
    qp_.reset();
    bounce_mr_.reset();
    munmap(bounce_, kBounceBytes);
  }

  // Segments in registered engine memory move in place; the others go
  // through the bounce buffer (reads land there and are copied out; writes
  // are copied in first). Pieces are at most the device's largest message.
  std::vector<absl::Status> Move(absl::Span<const DirectSegment> segs,
                                 absl::Time deadline) override {
    std::vector<absl::Status> out(segs.size());
    struct Piece {
      size_t seg;
      uint64_t seg_offset;
      uint64_t length;
      bool in_place;
    };
    // Registrations in use stay alive until the transfer is done.
    std::vector<std::shared_ptr<rdma::MemoryRegion>> pinned;
    std::vector<Piece> round;
    std::vector<rdma::OneSidedOp> ops;
    uint64_t used = 0;
    const uint64_t max_piece =
        std::min<uint64_t>(kBounceBytes, std::max<uint32_t>(device_->max_msg_size(), 4096));

    auto flush = [&]() {
      if (ops.empty()) return;
      std::vector<absl::Status> st = qp_->Execute(ops, deadline);
      for (size_t k = 0; k < round.size(); ++k) {
        const Piece& p = round[k];
        const DirectSegment& s = segs[p.seg];
        if (!st[k].ok()) {
          if (out[p.seg].ok()) out[p.seg] = st[k];
          continue;
        }
        if (!s.write && !p.in_place && out[p.seg].ok()) {
          std::memcpy(static_cast<uint8_t*>(s.local) + p.seg_offset,
                      static_cast<uint8_t*>(ops[k].local), p.length);
        }
      }
      round.clear();
      ops.clear();
      used = 0;
    };

    for (size_t i = 0; i < segs.size(); ++i) {
      const DirectSegment& s = segs[i];
      auto a = areas_.find(s.area);
      if (a == areas_.end() || s.offset > a->second.length ||
          s.length > a->second.length - s.offset) {
        out[i] = absl::OutOfRangeError(absl::StrCat(
            "rdma: area ", s.area, " offset ", s.offset, " length ", s.length,
            " outside the node's registered memory"));
        continue;
      }
      // The key the node granted for this object; else (nodes that grant
      // none) the area's.
      const uint32_t rkey = s.rkey != 0 ? s.rkey : a->second.rkey;
      if (rkey == 0) {
        out[i] = absl::UnavailableError(absl::StrCat(
            "rdma: the storage node granted no key for area ", s.area));
        continue;
      }
      std::optional<Registry::Entry> reg = registry_->Find(s.local, s.length);
      if (reg.has_value()) pinned.push_back(reg->mr);
      for (uint64_t off = 0; off < s.length;) {
        const uint64_t len = std::min(max_piece, s.length - off);
        rdma::OneSidedOp op;
        op.kind = s.write ? rdma::OneSidedOp::Kind::kWrite
                          : rdma::OneSidedOp::Kind::kRead;
        op.remote_addr = a->second.addr + s.offset + off;
        op.rkey = rkey;
        op.length = static_cast<uint32_t>(len);
        if (reg.has_value()) {
          if (ops.size() >= kMaxOpsPerRound) flush();
          if (!qp_->healthy()) break;
          op.local = static_cast<uint8_t*>(s.local) + off;
          op.lkey = reg->mr->lkey();
          ops.push_back(op);
          round.push_back(Piece{i, off, len, true});
          off += len;
          continue;
        }
        if (used + len > kBounceBytes || ops.size() >= kMaxOpsPerRound) flush();
        if (!qp_->healthy()) break;
        uint8_t* local = bounce_ + used;
        if (s.write) {
          std::memcpy(local, static_cast<const uint8_t*>(s.local) + off, len);
        }
        op.local = local;
        op.lkey = bounce_mr_->lkey();
        ops.push_back(op);
        round.push_back(Piece{i, off, len, false});
        used += len;
        off += len;
      }
    }
    flush();
    for (size_t i = 0; i < segs.size(); ++i) {
      if (out[i].ok() && !qp_->healthy()) {
        // Not every piece ran before the queue pair broke.
        out[i] = absl::UnavailableError("rdma: queue pair failed");
      }
    }
    return out;
  }

  bool healthy() const override { return qp_->healthy(); }

 private:
  rdma::Device* const device_;
  const Registry* const registry_;
  std::unique_ptr<rdma::QueuePair> qp_;
  const std::map<uint32_t, RemoteArea> areas_;
  uint8_t* const bounce_;
  std::unique_ptr<rdma::MemoryRegion> bounce_mr_;
};

class RdmaMover : public DirectMover {
 public:
  explicit RdmaMover(std::unique_ptr<rdma::Device> device)
      : device_(std::move(device)) {}

  absl::string_view name() const override { return "rdma"; }

  absl::Status RegisterMemory(void* data, size_t size) override {
    return registry_.Add(device_.get(), data, size);
  }
  absl::Status UnregisterMemory(void* data) override {
    return registry_.Remove(data);
  }

  absl::Status Usable(const PeerInfo& peer) override {
    if (Param(peer, kRdmaAreasParam).empty()) {
      return absl::UnavailableError(absl::StrCat(
          "rdma: storage node ", peer.node_id, " has no RDMA data plane"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<DirectChannel>> Open(
      const PeerInfo& peer, Socket& ctrl, const wire::OpDesc& grant,
      absl::Time deadline) override {
    ASSIGN_OR_RETURN(auto areas, ParseAreas(peer));
    void* mem = mmap(nullptr, kBounceBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      return absl::ResourceExhaustedError("rdma: cannot map a bounce buffer");
    }
    auto bounce = static_cast<uint8_t*>(mem);
    absl::StatusOr<std::unique_ptr<rdma::MemoryRegion>> mr =
        device_->Register(bounce, kBounceBytes, /*remote_write=*/false);
    if (!mr.ok()) {
      munmap(bounce, kBounceBytes);
      return mr.status();
    }
    absl::StatusOr<std::unique_ptr<rdma::QueuePair>> qp =
        rdma::QueuePair::Create(device_.get(), {});
    absl::Status st = qp.status();
    if (st.ok()) st = Handshake(ctrl, qp->get(), grant, deadline);
    if (!st.ok()) {
      qp = nullptr;
      mr->reset();
      munmap(bounce, kBounceBytes);
      return st;
    }
    return std::unique_ptr<DirectChannel>(new RdmaChannel(
        device_.get(), &registry_, std::move(*qp), std::move(areas), bounce,
        std::move(*mr)));
  }

 private:
  // Exchanges queue-pair descriptions over the data-plane connection.
  // `grant` (an object of the transfer, with its capability) authorizes
  // the queue pair.
  static absl::Status Handshake(Socket& ctrl, rdma::QueuePair* qp,
                                const wire::OpDesc& grant, absl::Time deadline) {
    const std::string mine = qp->local_info().Encode();
    const iovec payload[1] = {{const_cast<char*>(mine.data()), mine.size()}};
    RETURN_IF_ERROR(frame_io::SendRequest(
        ctrl, wire::FrameType::kRdmaConnectRequest, {&grant, 1}, mine.size(),
        payload, 1, deadline));
    uint8_t hb[wire::kHeaderBytes];
    RETURN_IF_ERROR(RecvAll(ctrl.fd(), hb, sizeof(hb), deadline));
    ASSIGN_OR_RETURN(wire::FrameHeader h, wire::DecodeHeader(hb));
    std::string body(h.payload_bytes, '\0');
    RETURN_IF_ERROR(RecvAll(ctrl.fd(), body.data(), body.size(), deadline));
    if (h.type == wire::FrameType::kError) {
      absl::StatusCode code = wire::FromWireCode(h.status);
      if (code == absl::StatusCode::kOk) code = absl::StatusCode::kInternal;
      return absl::Status(code, absl::StrCat("storage node: ", body));
    }
    if (h.type != wire::FrameType::kRdmaConnectResponse || h.request_id != 1) {
      return absl::UnavailableError("rdma: storage node answered out of protocol");
    }
    ASSIGN_OR_RETURN(rdma::QpInfo remote, rdma::QpInfo::Decode(body));
    return qp->Connect(remote);
  }

  // Before registry_: registrations end before the device closes.
  const std::unique_ptr<rdma::Device> device_;
  Registry registry_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DirectMover>> NewRdmaMover(
    const std::string& device) {
  rdma::DeviceOptions o;
  o.device_name = device;
  ASSIGN_OR_RETURN(std::unique_ptr<rdma::Device> d, rdma::Device::Open(o));
  return std::unique_ptr<DirectMover>(new RdmaMover(std::move(d)));
}

}  // namespace hymcache
