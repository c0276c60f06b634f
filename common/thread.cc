#include "common/thread.h"

#include <pthread.h>

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hymcache {

Thread::Thread(std::string name, std::function<void()> fn)
    : t_([name = std::move(name), fn = std::move(fn)]() {
        pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
        fn();
      }) {}

absl::StatusOr<Thread> Thread::Start(std::string name,
                                     std::function<void()> fn) {
  // Copied for the message: the constructor consumes `name`.
  const std::string what = name;
  try {
    return Thread(std::move(name), std::move(fn));
  } catch (const std::exception& e) {
    // std::system_error at the thread or pid limit, std::bad_alloc.
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start thread ", what, ": ", e.what()));
  }
}

}  // namespace hymcache
