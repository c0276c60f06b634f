// Prints the TSan hooks of //common:grpc_tsan_hooks: the options line, then
// the suppressions. TSan reads those hooks from the executable, and python3
// has none, so sanitizer_runtime.py passes them to a Python test under
// --config=tsan through TSAN_OPTIONS instead. Prints nothing in the other
// configurations (the hooks are compiled only under HYMCACHE_TSAN).
#include <cstdio>

extern "C" const char* __tsan_default_options() __attribute__((weak));
extern "C" const char* __tsan_default_suppressions() __attribute__((weak));

int main() {
  if (__tsan_default_options != nullptr &&
      __tsan_default_suppressions != nullptr) {
    std::printf("%s\n%s", __tsan_default_options(),
                __tsan_default_suppressions());
  }
  return 0;
}
