#include "tools/bench/device_bench.h"

namespace hymcache::device_bench {

// ------------------------------------------------------------ plumbing

absl::Status Fail(const std::string& what, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// Drops the file's page-cache pages. O_DIRECT bypasses the page cache, but a
// populate through a buffered path (or a previous run) must not help reads.
void DropPageCache(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

void RemoveFiles(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::filesystem::remove_all(path + ".meta", ec);
}

std::string FsDescription(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  struct statfs sf;
  if (statfs(dir.c_str(), &sf) != 0) return "unknown";
  constexpr long kTmpfs = 0x01021994;
  constexpr long kExt4 = 0xEF53;
  constexpr long kXfs = 0x58465342;
  constexpr long kBtrfs = 0x9123683E;
  switch (static_cast<long>(sf.f_type)) {
    case kTmpfs:
      return "tmpfs";
    case kExt4:
      return "ext4";
    case kXfs:
      return "xfs";
    case kBtrfs:
      return "btrfs";
  }
  return absl::StrFormat("fs 0x%x", static_cast<unsigned long>(sf.f_type));
}

BlockIoOptions IoOptions(const Config& cfg, const std::string& path,
                         uint64_t size) {
  BlockIoOptions o;
  o.path = path;
  o.size_bytes = size;
  o.engine = cfg.engine;
  o.queue_depth = cfg.queue_depth;
  o.direct = true;
  o.max_read_bytes_per_s = FLAGS_read_bps;
  o.max_write_bytes_per_s = FLAGS_write_bps;
  o.min_read_latency = absl::Microseconds(FLAGS_read_latency_us);
  o.submit = FLAGS_io_submit == "inline"  ? BlockIoOptions::Submit::kInline
             : FLAGS_io_submit == "async" ? BlockIoOptions::Submit::kAsync
                                          : BlockIoOptions::Submit::kAuto;
  return o;
}

// Block contents: the first 8 bytes name the block address (checked on
// read), the rest is a constant fill.
void FillBlock(uint8_t* p, uint64_t len, uint64_t addr) {
  std::memset(p, static_cast<int>(addr >> 20) & 0xFF, len);
  std::memcpy(p, &addr, sizeof(addr));
}
bool BlockOk(const uint8_t* p, uint64_t addr) {
  uint64_t got;
  std::memcpy(&got, p, sizeof(got));
  return got == addr;
}

// What a reader does with a block the device hands it (--consume): checks
// its header where it lies, or copies it out first. Returns whether the
// block is the one asked for.
bool Consume(const uint8_t* p, uint8_t* dst, uint64_t len, uint64_t addr) {
  if (FLAGS_consume == "copy") {
    std::memcpy(dst, p, len);
    return BlockOk(dst, addr);
  }
  return BlockOk(p, addr);
}

}  // namespace hymcache::device_bench
