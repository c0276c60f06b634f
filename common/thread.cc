#include "common/thread.h"

#include <pthread.h>

#include <utility>

namespace hymcache {

Thread::Thread(std::string name, std::function<void()> fn)
    : t_([name = std::move(name), fn = std::move(fn)]() {
        pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
        fn();
      }) {}

}  // namespace hymcache
