// Same-host shared memory: the storage node backs its exposed areas with
// memfds and publishes them (kShm*Param); a client on the same host maps
// them through /proc/<pid>/fd/<fd> and copies with memcpy. Mappings are
// cached per node instance and shared by all channels.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/direct_transport.h"
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
      uint8_t* remote = it->second->base + s.offset;
      if (s.write) {
        std::memcpy(remote, s.local, s.length);
      } else {
        std::memcpy(s.local, remote, s.length);
      }
    }
    return out;
  }

  bool healthy() const override { return true; }

 private:
  const std::shared_ptr<const AreaMap> areas_;
};

class ShmMover : public DirectMover {
 public:
  std::string_view name() const override { return "shm"; }

  absl::Status Usable(const PeerInfo& peer) override {
    const std::string host = Param(peer, kShmHostParam);
    if (host.empty() || Param(peer, kShmAreasParam).empty()) {
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
                                                      absl::Time) override {
    const std::string key = absl::StrCat(peer.node_id, "/",
                                         Param(peer, kShmPidParam), "/",
                                         Param(peer, kShmInstanceParam));
    MutexLock l(&mu_);
    auto it = maps_.find(key);
    if (it == maps_.end()) {
      absl::StatusOr<std::shared_ptr<const AreaMap>> m = MapAll(peer);
      if (!m.ok()) return m.status();
      it = maps_.emplace(key, *std::move(m)).first;
    }
    return std::unique_ptr<DirectChannel>(new ShmChannel(it->second));
  }

 private:
  static absl::StatusOr<std::shared_ptr<const AreaMap>> MapAll(
      const PeerInfo& peer) {
    const std::string pid = Param(peer, kShmPidParam);
    auto areas = std::make_shared<AreaMap>();
    for (absl::string_view item :
         absl::StrSplit(Param(peer, kShmAreasParam), ',', absl::SkipEmpty())) {
      std::vector<absl::string_view> f = absl::StrSplit(item, ':');
      uint32_t area = 0;
      int fd = -1;
      uint64_t length = 0;
      if (f.size() != 3 || !absl::SimpleAtoi(f[0], &area) ||
          !absl::SimpleAtoi(f[1], &fd) || !absl::SimpleAtoi(f[2], &length) ||
          length == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("shm: malformed area list from storage node ",
                         peer.node_id));
      }
      const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
      int mfd = open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (mfd < 0) {
        return absl::UnavailableError(absl::StrCat(
            "shm: cannot open ", path, ": ", strerror(errno)));
      }
      void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, mfd,
                     0);
      int e = errno;
      close(mfd);
      if (p == MAP_FAILED) {
        return absl::UnavailableError(
            absl::StrCat("shm: cannot map ", path, ": ", strerror(e)));
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
