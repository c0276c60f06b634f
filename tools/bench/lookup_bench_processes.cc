#include "tools/bench/lookup_bench.h"

namespace hymcache::lookup_bench {

bool ReadAll(int fd, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteAll(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// --client_processes: `threads` clients, each this program run again with
// --worker=`kind` and `worker_flags`, connected and warmed up before all
// start their timed calls together. Fills the row; false if a client could
// not start or report.
bool RunProcesses(int threads, const std::string& kind,
                  const std::vector<std::string>& worker_flags, Row* row,
                  Tally* tally) {
  struct Child {
    pid_t pid = -1;
    int go = -1;      // its stdin
    int report = -1;  // its stdout
  };
  std::vector<Child> children(threads);
  bool ok = true;
  for (int t = 0; t < threads && ok; ++t) {
    int go[2], report[2];
    if (pipe2(go, O_CLOEXEC) != 0) return false;
    if (pipe2(report, O_CLOEXEC) != 0) {
      close(go[0]);
      close(go[1]);
      return false;
    }
    std::vector<std::string> args = {
        "lookup_bench",
        "--worker=" + kind,
        absl::StrCat("--worker_seed=", 1000 + t),
        absl::StrCat("--objects=", FLAGS_objects),
        absl::StrCat("--key_bytes=", FLAGS_key_bytes),
        absl::StrCat("--seconds=", FLAGS_seconds),
        absl::StrCat("--packed=", FLAGS_packed),
        absl::StrCat("--deadlock_detection=", FLAGS_deadlock_detection),
        "--client_poll_strategy=" + FLAGS_client_poll_strategy};
    args.insert(args.end(), worker_flags.begin(), worker_flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, go[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, report[1], STDOUT_FILENO);
    std::fflush(stdout);
    ok = posix_spawn(&children[t].pid, "/proc/self/exe", &actions, nullptr,
                     argv.data(), environ) == 0;
    posix_spawn_file_actions_destroy(&actions);
    close(go[0]);
    close(report[1]);
    children[t].go = go[1];
    children[t].report = report[0];
    if (!ok) children[t].pid = -1;
  }
  // Each writes 'R' once connected and warmed up; then all go at once.
  for (Child& c : children) {
    char r = 0;
    ok = ok && c.pid > 0 && ReadAll(c.report, &r, 1) && r == 'R';
  }
  for (Child& c : children) ok = ok && WriteAll(c.go, "G", 1);
  std::vector<std::vector<double>> lat(threads);
  double seconds = 0;
  for (int t = 0; t < threads && ok; ++t) {
    WorkerReport rep{};
    ok = ReadAll(children[t].report, &rep, sizeof(rep)) &&
         rep.calls < (uint64_t{1} << 32);
    if (!ok) break;
    lat[t].resize(rep.calls);
    ok = ReadAll(children[t].report, lat[t].data(), rep.calls * sizeof(double));
    tally->misses += rep.misses;
    tally->errors += rep.errors;
    seconds = std::max(seconds, rep.seconds);
  }
  for (Child& c : children) {
    if (c.go >= 0) close(c.go);  // a child still waiting for 'G' ends
    if (c.report >= 0) close(c.report);
    int status = 0;
    if (c.pid > 0) {
      ok = waitpid(c.pid, &status, 0) == c.pid && ok && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
    }
  }
  if (ok) Summarize(lat, seconds, row);
  return ok;
}

}  // namespace hymcache::lookup_bench
