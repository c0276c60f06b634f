#include "common/cli.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/build_info.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

// gflags reports a bad command line (an unknown flag, a bad value, a
// missing --flagfile) by calling this hook with status 1 (libgflags defines
// and exports it; its public header does not declare it).
namespace GFLAGS_NAMESPACE {
extern void (*gflags_exitfunc)(int);
}  // namespace GFLAGS_NAMESPACE

namespace hymcache {
namespace {

// Exit status 2 for a bad command line: what init systems treat as a
// configuration error not to restart on (RestartPreventExitStatus=2 in
// deploy/systemd) and what the daemons return for invalid options.
[[noreturn]] void ExitBadCommandLine(int) {
  // Not exit(): gflags calls this holding its registry lock, which static
  // destructors would take again.
  std::fflush(nullptr);
  std::_Exit(2);
}

// gflags reports the file as the compiler saw it: with Bazel a workspace-
// relative path such as "master/main.cc", elsewhere maybe absolute.
bool SameFile(const std::string& flag_file, const std::string& main_file) {
  return flag_file == main_file || absl::EndsWith(flag_file, "/" + main_file) ||
         absl::EndsWith(main_file, "/" + flag_file);
}

std::string FormatDefault(const gflags::CommandLineFlagInfo& f) {
  if (f.type == "string") return absl::StrCat("\"", f.default_value, "\"");
  return f.default_value;
}

void AppendFlag(const gflags::CommandLineFlagInfo& f, std::string* out) {
  absl::StrAppend(out, "  --", f.name, " (", f.type,
                  ", default: ", FormatDefault(f), ")\n");
  // Descriptions are one paragraph; wrap at ~76 columns, indented.
  std::string line = "      ";
  size_t start = 0;
  const std::string& d = f.description;
  while (start < d.size()) {
    size_t end = d.find(' ', start);
    if (end == std::string::npos) end = d.size();
    const std::string word = d.substr(start, end - start);
    if (line.size() > 6 && line.size() + 1 + word.size() > 78) {
      absl::StrAppend(out, line, "\n");
      line = "      ";
    }
    if (line.size() > 6) line += ' ';
    line += word;
    start = end + 1;
  }
  if (line.size() > 6) absl::StrAppend(out, line, "\n");
}

bool BoolFlag(const char* name) {
  std::string v;
  return gflags::GetCommandLineOption(name, &v) && v == "true";
}

bool FlagDefined(absl::string_view name) {
  gflags::CommandLineFlagInfo info;
  if (gflags::GetCommandLineFlagInfo(std::string(name).c_str(), &info)) {
    return true;
  }
  // --nofoo: boolean foo set to false.
  return absl::StartsWith(name, "no") &&
         gflags::GetCommandLineFlagInfo(std::string(name.substr(2)).c_str(),
                                        &info) &&
         info.type == "bool";
}

// gflags ignores flags it does not define when they come from a --flagfile
// (so that programs can share one); a daemon's configuration file with a
// typo must fail instead. Checks each --flagfile of argv (and the flag
// files those name) for flags this program does not define. gflags itself
// reports unreadable files and bad values.
void CheckFlagFiles(const std::string& program, int argc, char** argv) {
  std::vector<std::pair<std::string, int>> files;  // path, depth
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (a == "--") break;
    a = absl::StripPrefix(absl::StripPrefix(a, "-"), "-");
    if (absl::ConsumePrefix(&a, "flagfile=")) {
      files.emplace_back(std::string(a), 0);
    } else if (a == "flagfile" && i + 1 < argc) {
      files.emplace_back(argv[++i], 0);
    }
  }
  while (!files.empty()) {
    auto [path, depth] = files.back();
    files.pop_back();
    std::ifstream in(path);
    if (!in) continue;  // gflags says why
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      absl::string_view l = absl::StripAsciiWhitespace(line);
      // Comments, blank lines, and gflags' program-name filters.
      if (!absl::StartsWith(l, "-")) continue;
      l = absl::StripPrefix(absl::StripPrefix(l, "-"), "-");
      const absl::string_view name = l.substr(0, l.find('='));
      if (name == "flagfile") {
        if (depth < 8 && name.size() < l.size()) {
          files.emplace_back(std::string(l.substr(name.size() + 1)),
                             depth + 1);
        }
        continue;
      }
      if (!FlagDefined(name)) {
        std::fprintf(stderr, "%s: %s:%d: unknown flag --%s\n",
                     program.c_str(), path.c_str(), n,
                     std::string(name).c_str());
        std::exit(2);
      }
    }
  }
}

}  // namespace

std::string FlagsHelp(const CommandLineOptions& options) {
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  std::map<std::string, const gflags::CommandLineFlagInfo*> by_name;
  for (const auto& f : all) by_name[f.name] = &f;

  std::string out = absl::StrCat(VersionLine(options.program), "\n\n",
                                 options.usage, "\n");
  std::set<std::string> shown;
  for (const FlagGroup& g : options.groups) {
    std::string body;
    for (const std::string& name : g.flags) {
      auto it = by_name.find(name);
      if (it == by_name.end() || !shown.insert(name).second) continue;
      AppendFlag(*it->second, &body);
    }
    if (!body.empty()) absl::StrAppend(&out, "\n", g.title, ":\n", body);
  }
  std::string other;
  for (const auto& f : all) {  // GetAllFlags sorts by file, then name
    if (SameFile(f.filename, options.main_file) && !shown.count(f.name)) {
      AppendFlag(f, &other);
    }
  }
  if (!other.empty()) absl::StrAppend(&out, "\nOther flags:\n", other);
  absl::StrAppend(&out,
                  "\nGeneral:\n  --help  this text\n"
                  "  --helpfull  every flag, including those of the linked "
                  "libraries\n"
                  "  --version  version, git commit and build time\n");
  return out;
}

void ParseCommandLine(const CommandLineOptions& options, int* argc,
                      char*** argv) {
  if (options.daemon_logging) {
    // The default, not the value: is_default below still tells whether the
    // command line set it.
    gflags::SetCommandLineOptionWithMode("logtostderr", "true",
                                         gflags::SET_FLAGS_DEFAULT);
  }
  gflags::SetUsageMessage(options.usage);
  gflags::SetVersionString(BuildInfo().version);
  CheckFlagFiles(options.program, *argc, *argv);
  // Only errors exit from here (help flags are handled below).
  void (*const previous_exit)(int) = GFLAGS_NAMESPACE::gflags_exitfunc;
  GFLAGS_NAMESPACE::gflags_exitfunc = &ExitBadCommandLine;
  gflags::ParseCommandLineNonHelpFlags(argc, argv, /*remove_flags=*/true);
  GFLAGS_NAMESPACE::gflags_exitfunc = previous_exit;
  if (BoolFlag("help")) {
    std::fputs(FlagsHelp(options).c_str(), stdout);
    std::exit(0);
  }
  if (BoolFlag("version")) {
    std::printf("%s\n", VersionLine(options.program).c_str());
    std::exit(0);
  }
  gflags::HandleCommandLineHelpFlags();  // --helpfull, --helpmatch, ...

  if (options.daemon_logging && !FLAGS_log_dir.empty()) {
    if (access(FLAGS_log_dir.c_str(), W_OK | X_OK) != 0) {
      std::fprintf(stderr,
                   "%s: --log_dir=%s is not a writable directory (create "
                   "it, or leave --log_dir out to log to stderr)\n",
                   options.program.c_str(), FLAGS_log_dir.c_str());
      std::exit(2);
    }
    if (gflags::GetCommandLineFlagInfoOrDie("logtostderr").is_default) {
      FLAGS_logtostderr = false;
    }
  }
}

}  // namespace hymcache
