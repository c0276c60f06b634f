// Test harness: runs the real hymcache-master / hymcache-storage binaries as
// child processes on loopback with port 0, reading the bound ports back from
// the one line each daemon prints when it is serving. The processes are
// tests/child_process.h's (Run and RunResult come from there too).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/child_process.h"

namespace hymcache::testing {

// Path of a binary in this test's runfiles, e.g. "master/hymcache-master".
std::string RunfilePath(const std::string& workspace_relative);

// A fresh directory under TEST_TMPDIR.
std::string TempDir(const std::string& name);

// A movable ChildProcess with the tests' defaults: stderr stays the
// test's, and the child outlives the thread that started it.
class Daemon {
 public:
  Daemon() = default;
  // The ChildProcess SIGKILLs a still-running child.

  // Starts `binary` with `args` and waits (up to `timeout`) for its first
  // stdout line, returned by ready_line(). `env` ("NAME=VALUE") is added to
  // the child's environment.
  static absl::StatusOr<Daemon> Start(const std::string& binary,
                                      const std::vector<std::string>& args,
                                      absl::Duration timeout = absl::Seconds(30),
                                      const std::vector<std::string>& env = {});

  // Starts `binary` with `args`, its stdout and stderr appended to
  // `log_path`, and returns at once: for servers that print no ready line
  // (etcd); the caller checks readiness its own way.
  static absl::StatusOr<Daemon> Spawn(const std::string& binary,
                                      const std::vector<std::string>& args,
                                      const std::string& log_path);

  // Starts `binary` with `args` as `options` say (tests/child_process.h:
  // a log file, a network namespace, ...).
  static absl::StatusOr<Daemon> Launch(const std::string& binary,
                                       const std::vector<std::string>& args,
                                       const ChildOptions& options);

  const std::string& ready_line() const;
  pid_t pid() const { return child_ ? child_->pid() : -1; }
  bool running() const { return pid() > 0; }

  // Sends `sig` and waits for exit; returns the exit status (waitpid form).
  absl::StatusOr<int> Stop(int sig, absl::Duration timeout = absl::Seconds(30));
  // Whether the child is still alive (reaps it if it exited).
  bool Alive() { return child_ && child_->Alive(); }
  // Wait status of the child once Alive() or Stop() reaped it (-1 before).
  int exit_status() const { return child_ ? child_->exit_status() : -1; }

 private:
  std::unique_ptr<ChildProcess> child_;
};

// Value of "key=VALUE" in a ready line, or "" if absent.
std::string Field(const std::string& line, const std::string& key);

// What the daemons print once they serve, as this harness and the crash
// test's RestartableCluster (tests/cluster.h) both read it.
// The master's: "hymcache-master listening on HOST:PORT", or with --etcd
// "hymcache-master standing by on HOST:PORT"; returns HOST:PORT.
absl::StatusOr<std::string> ParseMasterReadyLine(const std::string& line);
// A storage node's: "hymcache-storage data=H:P control=H:P ...".
struct StorageReadyLine {
  std::string data_address;
  std::string control_address;
};
absl::StatusOr<StorageReadyLine> ParseStorageReadyLine(const std::string& line);

// The flags every harness starts the daemons with (tests, the crash
// test's cluster): the master's database and listen address; a storage
// node's master, name and port-0 data and control ports.
std::vector<std::string> MasterArgs(const std::string& db_path,
                                    const std::string& listen);
std::vector<std::string> StorageArgs(const std::string& master,
                                     const std::string& name);

// A master binary: parses "hymcache-master listening on HOST:PORT".
struct MasterProcess {
  Daemon daemon;
  std::string address;
  static absl::StatusOr<MasterProcess> Start(const std::string& db_path,
                                             const std::string& listen,
                                             std::vector<std::string> extra = {});
};

// A storage binary: parses "hymcache-storage data=H:P control=H:P".
struct StorageProcess {
  Daemon daemon;
  std::string data_address;
  std::string control_address;
  static absl::StatusOr<StorageProcess> Start(const std::string& master,
                                              const std::string& name,
                                              std::vector<std::string> extra = {});
};

}  // namespace hymcache::testing
