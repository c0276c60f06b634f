// Same-host shared memory: the storage node backs its exposed areas with
// memfds; a client on the same host connects to the node's abstract Unix
// socket (kShmSocketParam), which checks its credentials and passes it
// read-only descriptors of the areas; the client maps them PROT_READ and
// copies out with memcpy. Writes go over TCP. Mappings are cached per node
// instance and shared by all channels.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/direct_transport.h"
#include "common/fd_passing.h"
#include "common/mutex.h"

namespace hymcache {
namespace {

// One mapped area of a node.
struct Mapping {
  uint8_t* base = nullptr;
  uint64_t length = 0;
  ~Mapping() {
    if (base != nullptr) munmap(base, length);
  }
};

// All areas of one node instance.
using AreaMap = std::map<uint32_t, std::shared_ptr<Mapping>>;

std::string Param(const PeerInfo& peer, const char* name) {
  auto it = peer.params.find(name);
  return it == peer.params.end() ? "" : it->second;
}

class ShmChannel : public DirectChannel {
 public:
  explicit ShmChannel(std::shared_ptr<const AreaMap> areas)
      : areas_(std::move(areas)) {}

  std::vector<absl::Status> Move(absl::Span<const DirectSegment> segs,
                                 absl::Time) override {
    std::vector<absl::Status> out(segs.size());
    for (size_t i = 0; i < segs.size(); ++i) {
      const DirectSegment& s = segs[i];
      auto it = areas_->find(s.area);
      if (it == areas_->end() || s.offset > it->second->length ||
          s.length > it->second->length - s.offset) {
        out[i] = absl::OutOfRangeError(absl::StrCat(
            "shm: area ", s.area, " offset ", s.offset, " length ", s.length,
            " outside the node's mapped memory"));
        continue;
      }
      if (s.write) {
        out[i] = absl::UnimplementedError(
            "shm: the node's memory is mapped read-only; writes go over TCP");
        continue;
      }
      std::memcpy(s.local, it->second->base + s.offset, s.length);
    }
    return out;
  }

  bool healthy() const override { return true; }

 private:
  const std::shared_ptr<const AreaMap> areas_;
};

class ShmMover : public DirectMover {
 public:
  absl::string_view name() const override { return "shm"; }
  bool can_write() const override { return false; }

  absl::Status Usable(const PeerInfo& peer) override {
    const std::string host = Param(peer, kShmHostParam);
    if (host.empty() || Param(peer, kShmSocketParam).empty()) {
      return absl::UnavailableError(absl::StrCat(
          "shm: storage node ", peer.node_id, " exposes no shared memory"));
    }
    if (host != local_host_) {
      return absl::UnavailableError(absl::StrCat(
          "shm: storage node ", peer.node_id, " is on another host (", host,
          ")"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<DirectChannel>> Open(const PeerInfo& peer,
                                                      Socket&,
                                                      const wire::OpDesc&,
                                                      absl::Time deadline) override {
    const std::string key = absl::StrCat(peer.node_id, "/",
                                         Param(peer, kShmSocketParam), "/",
                                         Param(peer, kShmInstanceParam));
    MutexLock l(&mu_);
    auto it = maps_.find(key);
    if (it == maps_.end()) {
      absl::StatusOr<std::shared_ptr<const AreaMap>> m = MapAll(peer, deadline);
      if (!m.ok()) return m.status();
      it = maps_.emplace(key, *std::move(m)).first;
    }
    return std::unique_ptr<DirectChannel>(new ShmChannel(it->second));
  }

 private:
  // Asks the node for read-only descriptors of its areas and maps them.
  static absl::StatusOr<std::shared_ptr<const AreaMap>> MapAll(
      const PeerInfo& peer, absl::Time deadline) {
    absl::StatusOr<Socket> s =
        ConnectUnixAbstract(Param(peer, kShmSocketParam), deadline);
    if (!s.ok()) return s.status();
    std::string payload;
    std::vector<int> fds;
    absl::Status got = RecvWithFds(s->fd(), &payload, &fds, deadline);
    if (!got.ok()) return got;
    auto closer = absl::MakeCleanup([&fds] {
      for (int fd : fds) close(fd);
    });
    std::vector<absl::string_view> lines =
        absl::StrSplit(payload, '\n', absl::SkipEmpty());
    if (fds.empty() || lines.size() != fds.size()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "shm: storage node ", peer.node_id, " refused to share its memory (",
          absl::StripAsciiWhitespace(payload), ")"));
    }
    auto areas = std::make_shared<AreaMap>();
    for (size_t i = 0; i < lines.size(); ++i) {
      std::vector<absl::string_view> f = absl::StrSplit(lines[i], ':');
      uint32_t area = 0;
      uint64_t length = 0;
      if (f.size() != 2 || !absl::SimpleAtoi(f[0], &area) ||
          !absl::SimpleAtoi(f[1], &length) || length == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shm: malformed area list from storage node ", peer.node_id));
      }
      void* p = mmap(nullptr, length, PROT_READ, MAP_SHARED, fds[i], 0);
      if (p == MAP_FAILED) {
        return absl::UnavailableError(absl::StrCat(
            "shm: cannot map area ", area, ": ", strerror(errno)));
      }
      auto m = std::make_shared<Mapping>();
      m->base = static_cast<uint8_t*>(p);
      m->length = length;
      (*areas)[area] = std::move(m);
    }
    return std::shared_ptr<const AreaMap>(std::move(areas));
  }

  const std::string local_host_ = LocalHostIdentity();
  Mutex mu_;
  std::map<std::string, std::shared_ptr<const AreaMap>> maps_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<DirectMover> NewShmMover() {
  return std::make_unique<ShmMover>();
}

}  // namespace hymcache
