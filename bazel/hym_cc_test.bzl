"""hym_cc_test: a Catch2 test of this repository.

hym_cc_test(name = "foo_test", srcs = ["foo_test.cc"], deps = [...],
            size = "small", grpc = True, daemons = True)

is a cc_test that
  * links //bazel:catch2_main (Catch2 v2's main, compiled once);
  * with grpc = True (the test runs gRPC servers or clients in its own
    process), links //common:grpc_tsan_hooks statically, so that the TSan
    hooks for Debian's uninstrumented gRPC land in the executable;
  * with daemons = True, has hymcache-master and hymcache-storage in its
    runfiles (tests/daemon.h starts them).
Everything else (size, timeout, tags, data, args, copts, ...) goes to
cc_test unchanged.
"""

_DAEMONS = [
    "//master:hymcache-master",
    "//storage_node:hymcache-storage",
]

def hym_cc_test(name, deps = [], data = [], grpc = False, daemons = False,
                **kwargs):
    if grpc:
        deps = deps + ["//common:grpc_tsan_hooks"]
        kwargs["linkstatic"] = True
    if daemons:
        data = _DAEMONS + data
    native.cc_test(
        name = name,
        deps = deps + ["//bazel:catch2_main"],
        data = data,
        **kwargs
    )
