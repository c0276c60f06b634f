// Replays fuzz inputs without libFuzzer: every file named on the command line,
// and every regular file in a named directory, is passed once to
// LLVMFuzzerTestOneInput (after LLVMFuzzerInitialize, if the target has one).
// A crash, a sanitizer report or a failed check in the target ends the
// process, naming the input it was given last. Used by the fuzz targets'
// regression tests under the ordinary (gcc) builds, and to reproduce a
// finding: bazel-bin/PKG/NAME_fuzz crash-INPUT.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc,
                                                          char*** argv);

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!arg.empty() && arg[0] == '-') continue;  // libFuzzer flags
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      std::vector<std::string> in_dir;
      for (const auto& e : std::filesystem::directory_iterator(arg, ec)) {
        if (e.is_regular_file()) in_dir.push_back(e.path().string());
      }
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.push_back(arg);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "fuzz replay: no inputs given\n");
    return 1;
  }
  size_t bytes = 0;
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "fuzz replay: cannot read %s\n", f.c_str());
      return 1;
    }
    std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
    std::fprintf(stderr, "fuzz replay: %s (%zu bytes)\n", f.c_str(),
                 data.size());
    // A copy of exactly the input's size, so that ASan sees reads past it.
    std::vector<uint8_t> exact(data.begin(), data.end());
    // As libFuzzer does, never a null pointer (even for an empty input).
    static uint8_t empty_input;
    LLVMFuzzerTestOneInput(exact.empty() ? &empty_input : exact.data(),
                           exact.size());
    bytes += data.size();
  }
  std::printf("fuzz replay: %zu inputs (%zu bytes), no crash\n", files.size(),
              bytes);
  return 0;
}
