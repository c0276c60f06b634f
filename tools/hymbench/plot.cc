#include "tools/hymbench/plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace hymcache::hymbench {

absl::Status WritePlots(const PlotOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("plots: no output directory");
  if (options.reports.empty()) return absl::InvalidArgumentError("plots: no report to plot");
  // python3 -c SCRIPT --out=DIR REPORT...: sys.argv[0] is "-c".
  std::vector<std::string> args = {options.python, "-c", kPlotScript,
                                   "--out=" + options.out_dir, "--"};
  args.insert(args.end(), options.reports.begin(), options.reports.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawn(&pid, options.python.c_str(), nullptr, nullptr, argv.data(), environ);
  if (err != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("plots: cannot run ", options.python, ": ", std::strerror(err)));
  }
  int status = 0;
  pid_t waited;
  do {
    waited = waitpid(pid, &status, 0);
  } while (waited < 0 && errno == EINTR);
  if (waited != pid) {
    return absl::InternalError(absl::StrCat("plots: waitpid: ", std::strerror(errno)));
  }
  if (WIFEXITED(status)) {
    switch (WEXITSTATUS(status)) {
      case 0:
        return absl::OkStatus();
      case 2:
        return absl::InvalidArgumentError("plots: bad report (see the message above)");
      case 1:
        return absl::FailedPreconditionError("plots: not written (see the message above)");
      case 127:
        return absl::FailedPreconditionError(absl::StrCat("plots: cannot run ", options.python));
      default:
        return absl::InternalError(
            absl::StrCat("plots: ", options.python, " exited with ", WEXITSTATUS(status)));
    }
  }
  return absl::InternalError(absl::StrCat("plots: ", options.python, " killed by signal ",
                                          WIFSIGNALED(status) ? WTERMSIG(status) : -1));
}

}  // namespace hymcache::hymbench
