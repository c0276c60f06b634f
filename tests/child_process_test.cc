#include "tests/child_process.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/eventually.h"

namespace hymcache::testing {
namespace {

const char kSh[] = "/bin/sh";

std::string Tmp(const std::string& name) {
  const char* dir = getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name, "-", getpid());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Whether `p` exits (Alive() turns false) within 10 s.
bool ExitsWithin10s(ChildProcess& p) {
  return Eventually([&] { return !p.Alive(); }, absl::Seconds(10));
}

TEST_CASE("Start returns the child's first stdout line and Signal reaps it") {
  ChildProcess p;
  REQUIRE(
      p.Start(kSh, {"-c", "echo listening on 1.2.3.4:5; exec sleep 60"}).ok());
  CHECK(p.ready_line() == "listening on 1.2.3.4:5");
  CHECK(p.pid() > 0);
  CHECK(p.Alive());
  CHECK_FALSE(p.Start(kSh, {"-c", "echo x"}).ok());  // one child at a time
  absl::StatusOr<int> st = p.Signal(SIGTERM, absl::Seconds(10));
  REQUIRE(st.ok());
  CHECK(WIFSIGNALED(*st));
  CHECK(DescribeWaitStatus(*st).find("signal 15") == 0);
  CHECK(p.pid() == -1);
  CHECK_FALSE(p.Alive());
  CHECK(
      absl::IsFailedPrecondition(p.Signal(SIGTERM, absl::Seconds(1)).status()));
  // Started again, as the crash test restarts a daemon.
  REQUIRE(p.Start(kSh, {"-c", "echo again; exec sleep 60"}).ok());
  CHECK(p.ready_line() == "again");
}

TEST_CASE("a child that exits before its ready line is described") {
  ChildProcess p;
  absl::Status s = p.Start(kSh, {"-c", "exit 3"});
  CHECK(absl::IsUnavailable(s));
  CHECK(s.message().find("exit 3") != std::string::npos);
  CHECK(p.pid() == -1);
  CHECK(WEXITSTATUS(p.exit_status()) == 3);
}

TEST_CASE("a child with no ready line in time is killed") {
  ChildProcess p;
  ChildOptions o;
  o.ready_timeout = absl::Milliseconds(200);
  absl::Status s = p.Start(kSh, {"-c", "exec sleep 60"}, o);
  CHECK(absl::IsDeadlineExceeded(s));
  CHECK(p.pid() == -1);
  CHECK(WIFSIGNALED(p.exit_status()));
}

TEST_CASE(
    "env is added, stderr and (without a ready line) stdout go to "
    "the log, appended across starts") {
  const std::string log = Tmp("child-log");
  unlink(log.c_str());
  ChildOptions o;
  o.env = {"HYM_CHILD_TEST=bar"};
  o.log_path = log;
  ChildProcess p;
  REQUIRE(p.Start(kSh, {"-c", "echo err1 >&2; echo $HYM_CHILD_TEST"}, o).ok());
  CHECK(p.ready_line() == "bar");
  CHECK(ExitsWithin10s(p));
  o.wait_for_ready_line = false;
  REQUIRE(p.Start(kSh, {"-c", "echo out2; echo err2 >&2"}, o).ok());
  CHECK(ExitsWithin10s(p));
  CHECK(ReadFile(log) == "err1\nout2\nerr2\n");
}

TEST_CASE(
    "a child started with die_with_starting_thread dies with that "
    "thread") {
  ChildProcess p;
  ChildOptions o;
  o.die_with_starting_thread = true;
  absl::Status started;
  std::thread t([&] {
    started = p.Start(kSh, {"-c", "echo up; exec sleep 60"}, o);
  });
  t.join();
  REQUIRE(started.ok());
  CHECK(ExitsWithin10s(p));
  CHECK(WIFSIGNALED(p.exit_status()));
  CHECK(WTERMSIG(p.exit_status()) == SIGKILL);
}

TEST_CASE("Run captures the output and status, and kills at its deadline") {
  absl::StatusOr<RunResult> r =
      Run(kSh, {"-c", "echo out; echo err >&2; exit 4"});
  REQUIRE(r.ok());
  CHECK(WEXITSTATUS(r->status) == 4);
  CHECK(r->output == "out\nerr\n");
  r = Run(kSh, {"-c", "echo partial; exec sleep 60"}, absl::Milliseconds(300));
  CHECK(absl::IsDeadlineExceeded(r.status()));
  CHECK(r.status().message().find("partial") != std::string::npos);
}

TEST_CASE("RunCommand writes stdout to a file and appends stderr") {
  const std::string out = Tmp("child-out");
  const std::string err = Tmp("child-err");
  unlink(err.c_str());
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<int> st = RunCommand(
        kSh, {"-c", absl::StrCat("echo o", i, "; echo e", i, " >&2")}, out, err,
        absl::Seconds(10));
    REQUIRE(st.ok());
    CHECK(WEXITSTATUS(*st) == 0);
  }
  CHECK(ReadFile(out) == "o1\n");
  CHECK(ReadFile(err) == "e0\ne1\n");
  CHECK(absl::IsDeadlineExceeded(RunCommand(kSh, {"-c", "exec sleep 60"}, out,
                                            err, absl::Milliseconds(200))
                                     .status()));
}

TEST_CASE("A network namespace that does not exist is an error before fork") {
  // (Joining one needs root: tests/netns/virtual_network_test.)
  ChildProcess c;
  ChildOptions o;
  o.netns_path = "/run/netns/no-such-namespace";
  const absl::Status s = c.Start(kSh, {"-c", "echo ready"}, o);
  CHECK(absl::IsInternal(s));
  CHECK(absl::StrContains(s.message(), "no-such-namespace"));
  CHECK(c.pid() == -1);
}

}  // namespace
}  // namespace hymcache::testing
