// hymbench's PNG plots: runs tools/hymbench/plot.py, embedded in the binary
// at build time, with an external Python 3 that has matplotlib (Debian's
// /usr/bin/python3 with python3-matplotlib). Nothing is looked up at run time
// but the interpreter, so an installed or copied hymbench plots as well as
// `bazel run` does.
//
// Thread safety: WritePlots forks a child and waits for it; call it from one
// thread at a time (it is meant for the end of a command-line run).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace hymcache::hymbench {

struct PlotOptions {
  // Python 3 interpreter with matplotlib. Default: /usr/bin/python3 (the
  // PATH python3 may lack Debian's matplotlib).
  std::string python = "/usr/bin/python3";
  // Directory for the PNGs (created if missing). Required.
  std::string out_dir;
  // `hymbench replay --json` reports, one line per report in each plot
  // (e.g. prefetch on and off). At least one.
  std::vector<std::string> reports;
};

// Writes out_dir/hymbench_hit_ratio.png and out_dir/hymbench_load_gbps.png
// (plot.py's docstring says what they show). The script's messages go to
// this process's stderr.
// Errors: InvalidArgument if the options are incomplete or a report is not
// hymbench JSON (the script's exit status 2); FailedPrecondition if the
// interpreter cannot be started or lacks matplotlib, or out_dir cannot be
// written (exit status 1); Internal if the script died otherwise.
absl::Status WritePlots(const PlotOptions& options);

// The embedded plot.py (generated from it by the :plot_script genrule).
extern const char kPlotScript[];

}  // namespace hymcache::hymbench
