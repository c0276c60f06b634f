// Command-line handling shared by the daemons' and tools' main():
// gflags parsing with a --help that lists the program's own flags only
// (Debian's librocksdb registers ~230 unrelated flags with gflags), grouped
// and with their defaults; --helpfull for gflags' full list; --version from
// the build stamp (common/build_info.h); and glog's --log_dir honoured for
// daemons whose logs otherwise go to stderr (journald).
//
// Only main() calls these (flags live in main.cc, house style).
// Thread safety: call once, before any other thread starts.
#pragma once

#include <string>
#include <vector>

namespace hymcache {

// Flags shown together under a title in --help.
struct FlagGroup {
  std::string title;
  std::vector<std::string> flags;  // in the order shown
};

struct CommandLineOptions {
  // Program name for --version and --help, e.g. "hymcache-master".
  std::string program;
  // Usage text shown at the top of --help (one or more lines).
  std::string usage;
  // The groups of --help. Flags of `main_file` that no group names are
  // listed under "Other flags"; flags of other files only if a group names
  // them (e.g. glog's log_dir). Default: none.
  std::vector<FlagGroup> groups;
  // __FILE__ of the program's main.cc: its flags are the program's own.
  std::string main_file;
  // A daemon: logs go to stderr by default (--logtostderr defaults to
  // true), and --log_dir (an existing, writable directory) switches them to
  // files there unless --logtostderr is given too. Default: false.
  bool daemon_logging = false;
};

// Parses argv with gflags (removing the flags it parsed). --help prints
// FlagsHelp() to stdout and exits 0; --version prints VersionLine() and
// exits 0; gflags' other help flags (--helpfull, --helpmatch=S, ...) behave
// as gflags documents. A bad flag, or an unusable --log_dir, prints a
// message to stderr and exits 2.
void ParseCommandLine(const CommandLineOptions& options, int* argc,
                      char*** argv);

// The text --help prints: version line, usage, then each group's flags with
// their type, default and description.
std::string FlagsHelp(const CommandLineOptions& options);

}  // namespace hymcache
