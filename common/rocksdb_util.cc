#include "common/rocksdb_util.h"

#include <rocksdb/env.h>
#include <rocksdb/options.h>
#include <rocksdb/status.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace hymcache {
namespace {

// RocksDB's info log, into glog. Warnings and errors always; the rest (the
// options dump at open, flushes, compactions) with --v=1.
class GlogLogger final : public rocksdb::Logger {
 public:
  explicit GlogLogger(absl::string_view name)
      : rocksdb::Logger(VLOG_IS_ON(1) ? rocksdb::InfoLogLevel::INFO_LEVEL
                                      : rocksdb::InfoLogLevel::WARN_LEVEL),
        name_(name) {}

  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }

  void Logv(const rocksdb::InfoLogLevel level, const char* format,
            va_list ap) override {
    // Header lines (the options dump at open) count as INFO.
    const rocksdb::InfoLogLevel effective =
        level == rocksdb::InfoLogLevel::HEADER_LEVEL
            ? rocksdb::InfoLogLevel::INFO_LEVEL
            : level;
    if (effective < GetInfoLogLevel()) return;
    char buf[1024];
    va_list copy;
    va_copy(copy, ap);
    int n = std::vsnprintf(buf, sizeof(buf), format, copy);
    va_end(copy);
    std::string msg;
    if (n >= static_cast<int>(sizeof(buf))) {
      msg.resize(static_cast<size_t>(n) + 1);
      std::vsnprintf(msg.data(), msg.size(), format, ap);
      msg.resize(static_cast<size_t>(n));
    } else if (n > 0) {
      msg.assign(buf, static_cast<size_t>(n));
    }
    if (effective >= rocksdb::InfoLogLevel::ERROR_LEVEL) {
      LOG(ERROR) << "rocksdb " << name_ << ": " << msg;
    } else if (effective == rocksdb::InfoLogLevel::WARN_LEVEL) {
      LOG(WARNING) << "rocksdb " << name_ << ": " << msg;
    } else {
      LOG(INFO) << "rocksdb " << name_ << ": " << msg;
    }
  }

 private:
  const std::string name_;
};

}  // namespace

rocksdb::Options SmallDbOptions(absl::string_view name,
                                size_t write_buffer_bytes) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.max_background_jobs = 2;
  // Nothing preallocated: not the WAL (write_buffer_size * 1.1 otherwise)
  // nor the MANIFEST (manifest_preallocation_size).
  o.allow_fallocate = false;
  o.manifest_preallocation_size = 64 << 10;
  o.write_buffer_size = write_buffer_bytes;
  o.max_manifest_file_size = 4 << 20;
  o.recycle_log_file_num = 0;
  // No LOG file (see the file comment). The level is the logger's: RocksDB
  // consults the logger, not info_log_level, once info_log is set.
  o.info_log = std::make_shared<GlogLogger>(name);
  o.info_log_level = o.info_log->GetInfoLogLevel();
  // The shutdown flush is not needed for durability (the WAL has it all) and
  // would switch memtables, which appends to the current WAL writer: after a
  // failed WAL write that is the same assertion. The recovery flush stays
  // (it lets an open retire old WALs); on a full disk DB::Open fails anyway.
  o.avoid_flush_during_shutdown = true;
  // A failed WAL write must stop the database (a background error) rather
  // than let the next write append to the failed writer.
  o.paranoid_checks = true;
  return o;
}

uint64_t ReleasePreallocatedSpace(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  uint64_t released = 0;
  while (struct dirent* e = readdir(d)) {
    const absl::string_view name(e->d_name);
    if (!absl::EndsWith(name, ".log") && !absl::StartsWith(name, "MANIFEST-")) {
      continue;
    }
    const std::string path = absl::StrCat(dir, "/", name);
    int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat before;
    if (fstat(fd, &before) == 0 && S_ISREG(before.st_mode)) {
      const uint64_t allocated = static_cast<uint64_t>(before.st_blocks) * 512;
      const uint64_t size = static_cast<uint64_t>(before.st_size);
      struct stat after;
      // Past one block of slack: the tail of a preallocation.
      if (allocated > size + 65536 && ftruncate(fd, before.st_size) == 0 &&
          fstat(fd, &after) == 0) {
        const uint64_t now = static_cast<uint64_t>(after.st_blocks) * 512;
        if (now < allocated) released += allocated - now;
      }
    }
    close(fd);
  }
  closedir(d);
  if (released > 0) {
    LOG(WARNING) << "rocksdb " << dir << ": released " << released
                 << " bytes preallocated past the end of WAL/MANIFEST files";
  }
  return released;
}

absl::Status FromRocksDb(const rocksdb::Status& s, absl::string_view prefix,
                         absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(prefix, ": ", what, ": ", s.ToString());
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsNoSpace() || (s.IsIOError() &&
                        s.subcode() == rocksdb::Status::kSpaceLimit)) {
    return absl::ResourceExhaustedError(msg);
  }
  if (s.IsIOError() || s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) {
    return absl::UnavailableError(msg);
  }
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

}  // namespace hymcache
