#include "master/index_snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "common/thread.h"

namespace hymcache {
namespace master {
namespace {

constexpr char kMagic[8] = {'H', 'Y', 'M', 'I', 'D', 'X', '0', '1'};
constexpr size_t kHeader = 8 + 8 + 8;
constexpr size_t kTrailer = 8;

absl::Status ErrnoError(int err, absl::string_view what,
                        const std::string& path) {
  std::string msg = absl::StrCat("index snapshot: ", what, " ", path, ": ",
                                 strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// A read-only mapping of a whole file, unmapped when it goes.
class Mapping {
 public:
  ~Mapping() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  absl::Status Map(int fd, size_t size, const std::string& path) {
    if (size == 0) return absl::OkStatus();
    void* p =
        ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) return ErrnoError(errno, "map", path);
    data_ = static_cast<char*>(p);
    size_ = size;
    // One front-to-back pass: read ahead aggressively.
    ::madvise(data_, size_, MADV_SEQUENTIAL);
    return absl::OkStatus();
  }
  absl::string_view view() const { return absl::string_view(data_, size_); }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

uint64_t Mix(uint64_t h, uint64_t w) {
  w *= 0x87c37b91114253d5ull;
  w = (w << 31) | (w >> 33);
  h ^= w * 0x4cf5ad432745937full;
  return ((h << 27) | (h >> 37)) * 5 + 0x52dce729;
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

uint64_t IndexSnapshotChecksum(absl::string_view data) {
  // 8-byte words through a multiply-rotate mix (murmur3's), several GB/s:
  // it guards against torn or damaged files, not against forgery.
  uint64_t h = data.size();
  size_t i = 0;
  for (; i + 8 <= data.size(); i += 8) {
    h = Mix(h, absl::little_endian::Load64(data.data() + i));
  }
  uint64_t w = 0;
  for (size_t k = 0; i + k < data.size(); ++k) {
    w |= uint64_t{static_cast<uint8_t>(data[i + k])} << (8 * k);
  }
  h = Mix(h, w);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

absl::StatusOr<uint64_t> WriteIndexSnapshotTemp(const std::string& path,
                                                uint64_t sequence,
                                                const MetadataIndex& index) {
  const std::string tmp = path + ".tmp";
  const int fd =
      ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "create", tmp);
  // The header names the stream's length: a placeholder first, the real
  // one once the stream is written; then the checksum of both, in one
  // pass over the (page-cached) file.
  char header[kHeader];
  std::memcpy(header, kMagic, 8);
  absl::little_endian::Store64(header + 8, sequence);
  absl::little_endian::Store64(header + 16, 0);
  uint64_t bytes = kHeader;
  absl::Status s = WriteAll(fd, absl::string_view(header, kHeader), tmp);
  if (s.ok()) {
    s = index.Save([&](absl::string_view piece) {
      bytes += piece.size();
      return WriteAll(fd, piece, tmp);
    });
  }
  if (s.ok()) {
    absl::little_endian::Store64(header + 16, bytes - kHeader);
    if (::pwrite(fd, header, kHeader, 0) != static_cast<ssize_t>(kHeader)) {
      s = ErrnoError(errno, "write", tmp);
    }
  }
  if (s.ok()) {
    Mapping map;
    s = map.Map(fd, bytes, tmp);
    if (s.ok()) {
      char trailer[kTrailer];
      absl::little_endian::Store64(trailer, IndexSnapshotChecksum(map.view()));
      s = WriteAll(fd, absl::string_view(trailer, kTrailer), tmp);
      bytes += kTrailer;
    }
  }
  ::close(fd);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return bytes;
}

absl::Status CommitIndexSnapshot(const std::string& path) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open", tmp);
  const int synced = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (synced != 0) return ErrnoError(err, "fsync", tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoError(errno, "rename to", path);
  }
  const std::string dir = DirOf(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoError(errno, "open directory", dir);
  const int dsynced = ::fsync(dfd);
  const int derr = errno;
  ::close(dfd);
  if (dsynced != 0) return ErrnoError(derr, "fsync directory", dir);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ReadIndexSnapshot(
    const std::string& path, MetadataIndex* index,
    const std::function<void(absl::string_view stream)>& alongside) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, "stat", path);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  Mapping map;
  absl::Status s = map.Map(fd, size, path);
  ::close(fd);  // the mapping stays valid
  if (!s.ok()) return s;
  const absl::string_view file = map.view();
  auto corrupt = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("index snapshot ", path, ": ", why));
  };
  if (size < kHeader + kTrailer || std::memcmp(file.data(), kMagic, 8) != 0) {
    return corrupt("not a snapshot (short or wrong magic)");
  }
  const uint64_t sequence = absl::little_endian::Load64(file.data() + 8);
  const uint64_t stream = absl::little_endian::Load64(file.data() + 16);
  if (stream != size - kHeader - kTrailer) {
    return corrupt(absl::StrCat("stream of ", stream, " bytes in a file of ",
                                size));
  }
  const absl::string_view body = file.substr(0, kHeader + stream);
  const uint64_t want =
      absl::little_endian::Load64(file.data() + kHeader + stream);
  // The checksum, then `alongside`, run on a second thread while this one
  // restores the index; the index is only kept if the checksum matched.
  bool checked = false;
  auto check = [&] {
    checked = IndexSnapshotChecksum(body) == want;
    if (checked && alongside) alongside(body.substr(kHeader));
  };
  absl::StatusOr<Thread> helper = Thread::Start("snapshot-check", check);
  if (!helper.ok()) {
    check();  // no second thread: one after the other
  }
  s = index->Restore(body.substr(kHeader));
  if (helper.ok()) helper->Join();
  if (!checked) {
    index->Clear();
    return corrupt("checksum mismatch");
  }
  if (!s.ok()) return s;
  return sequence;
}

absl::Status RemoveIndexSnapshot(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError(errno, "remove", path);
  }
  return absl::OkStatus();
}

}  // namespace master
}  // namespace hymcache
