#include "tests/daemon.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace hymcache::testing {

std::string RunfilePath(const std::string& rel) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return rel;
  return absl::StrCat(srcdir, "/", ws ? ws : "hymcache", "/", rel);
}

std::string TempDir(const std::string& name) {
  static std::atomic<int> counter{0};
  const char* tmp = getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name, "-", getpid(),
                                 "-", counter.fetch_add(1));
  mkdir(dir.c_str(), 0755);
  return dir;
}

absl::StatusOr<Daemon> Daemon::Launch(const std::string& binary,
                                      const std::vector<std::string>& args,
                                      const ChildOptions& options) {
  Daemon d;
  d.child_ = std::make_unique<ChildProcess>();
  absl::Status s = d.child_->Start(binary, args, options);
  if (!s.ok()) return s;
  return d;
}

absl::StatusOr<Daemon> Daemon::Start(const std::string& binary,
                                     const std::vector<std::string>& args,
                                     absl::Duration timeout,
                                     const std::vector<std::string>& env) {
  ChildOptions o;
  o.env = env;
  o.ready_timeout = timeout;
  return Launch(binary, args, o);
}

absl::StatusOr<Daemon> Daemon::Spawn(const std::string& binary,
                                     const std::vector<std::string>& args,
                                     const std::string& log_path) {
  ChildOptions o;
  o.log_path = log_path;
  o.wait_for_ready_line = false;
  return Launch(binary, args, o);
}

const std::string& Daemon::ready_line() const {
  static const std::string* const kNone = new std::string;
  return child_ ? child_->ready_line() : *kNone;
}

absl::StatusOr<int> Daemon::Stop(int sig, absl::Duration timeout) {
  if (!child_) return absl::FailedPreconditionError("not running");
  return child_->Signal(sig, timeout);
}

std::string Field(const std::string& line, const std::string& key) {
  for (absl::string_view part : absl::StrSplit(line, ' ')) {
    if (absl::StartsWith(part, key + "=")) {
      return std::string(part.substr(key.size() + 1));
    }
  }
  return "";
}

absl::StatusOr<std::string> ParseMasterReadyLine(const std::string& line) {
  for (absl::string_view prefix :
       {"hymcache-master listening on ", "hymcache-master standing by on "}) {
    if (absl::StartsWith(line, prefix)) return line.substr(prefix.size());
  }
  return absl::InternalError("unexpected master line: " + line);
}

absl::StatusOr<StorageReadyLine> ParseStorageReadyLine(
    const std::string& line) {
  StorageReadyLine r{Field(line, "data"), Field(line, "control")};
  if (r.data_address.empty() || r.control_address.empty()) {
    return absl::InternalError("unexpected storage line: " + line);
  }
  return r;
}

std::vector<std::string> MasterArgs(const std::string& db_path,
                                    const std::string& listen) {
  return {"--db_path=" + db_path, "--listen=" + listen};
}

std::vector<std::string> StorageArgs(const std::string& master,
                                     const std::string& name) {
  return {"--master=" + master, "--name=" + name, "--data_port=0",
          "--control_port=0"};
}

absl::StatusOr<MasterProcess> MasterProcess::Start(
    const std::string& db_path, const std::string& listen,
    std::vector<std::string> extra) {
  std::vector<std::string> args = MasterArgs(db_path, listen);
  args.push_back("--logtostderr");
  args.insert(args.end(), extra.begin(), extra.end());
  auto d = Daemon::Start(RunfilePath("master/hymcache-master"), args);
  if (!d.ok()) return d.status();
  absl::StatusOr<std::string> address = ParseMasterReadyLine(d->ready_line());
  if (!address.ok()) return address.status();
  MasterProcess m;
  m.address = *address;
  m.daemon = std::move(*d);
  return m;
}

absl::StatusOr<StorageProcess> StorageProcess::Start(
    const std::string& master, const std::string& name,
    std::vector<std::string> extra) {
  std::vector<std::string> args = StorageArgs(master, name);
  args.push_back("--logtostderr");
  args.insert(args.end(), extra.begin(), extra.end());
  auto d = Daemon::Start(RunfilePath("storage_node/hymcache-storage"), args);
  if (!d.ok()) return d.status();
  absl::StatusOr<StorageReadyLine> line =
      ParseStorageReadyLine(d->ready_line());
  if (!line.ok()) return line.status();
  StorageProcess s;
  s.data_address = line->data_address;
  s.control_address = line->control_address;
  s.daemon = std::move(*d);
  return s;
}

}  // namespace hymcache::testing
