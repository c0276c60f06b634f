#include "common/cli.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

namespace hymcache {
namespace {

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
  gflags::ParseCommandLineNonHelpFlags(argc, argv, /*remove_flags=*/true);
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
