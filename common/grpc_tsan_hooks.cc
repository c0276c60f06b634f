// ThreadSanitizer settings for binaries that use gRPC, in the tsan build
// (--config=tsan defines HYMCACHE_TSAN); empty otherwise.
//
// Debian's gRPC, protobuf and Abseil are not built with TSan, so the thread
// hand-offs inside them are invisible and TSan reports false races:
//   - in syscalls and memmoves made by those libraries (epoll fds, absl's
//     deadlock graph): interceptor calls from uninstrumented modules are
//     ignored;
//   - thread leaks of gRPC's internal threads, which it may leave unjoined
//     at exit (seen with the callback API's nexting threads);
//   - in grpcpp's inline templates and in proto messages that gRPC builds on
//     one thread and parses, serializes or destroys on another: suppressed
//     only when the racing access's top frame is gRPC or generated message
//     code, so our own code (handlers, services, clients) is still checked.
// The same holds for Debian's civetweb (prometheus-cpp's HTTP server),
// whose worker threads call the non-reentrant gmtime(): its static buffer is
// libc's, and only the interceptor, called from the uninstrumented library,
// sees the race.
// TSan reads both hooks from the executable at start-up, so this library is
// alwayslink and must be linked statically into each binary and test that
// uses gRPC (cc_test needs linkstatic = True).
#ifdef HYMCACHE_TSAN
extern "C" const char* __tsan_default_options() {
  return "ignore_noninstrumented_modules=1";
}
extern "C" const char* __tsan_default_suppressions() {
  return "race_top:^grpc::\n"
         "race_top:^grpc_core::\n"
         "race_top:^std::_Function_handler<*grpc::\n"
         // A callback gRPC wraps in a std::function on one thread and
         // destroys on another (a stream reset as soon as it opens).
         "race_top:^std::_Function_base::~_Function_base\n"
         "race_top:^hymcache::v1::\n"
         "race_top:^google::protobuf::\n"
         // Demangled templates start with their return type.
         "race_top:^void google::protobuf::\n"
         // gRPC's own threads (the callback API's "nexting_thread"s) that
         // it does not join before the process exits.
         "thread:^grpc_core::Thread::Thread\n";
}
#endif
