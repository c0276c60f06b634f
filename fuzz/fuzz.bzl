"""hym_fuzz_target: a libFuzzer target and its corpus-replay regression test.

hym_fuzz_target(name = "foo_fuzz", srcs = ["foo_fuzz.cc"], deps = [...])

defines, from sources that implement LLVMFuzzerTestOneInput (and optionally
LLVMFuzzerInitialize):
  :foo_fuzz                  the fuzzer. Under --config=fuzz (clang-14) it
                             links libFuzzer's main (tools/fuzz.sh runs it);
                             under gcc it links //fuzz:replay_main and replays
                             the files or directories given as arguments.
  :foo_fuzz_corpus           the seed corpus, fuzz_corpus/foo_fuzz/* beside
                             the BUILD file.
  :foo_fuzz_regression_test  replays every corpus file once, under the
                             ordinary default/asan/tsan builds.
"""

def hym_fuzz_target(name, srcs, deps = [], test_size = "small", test_tags = [],
                    test_linkstatic = False):
    lib = name + "_lib"
    native.cc_library(
        name = lib,
        testonly = True,
        srcs = srcs,
        deps = deps,
        alwayslink = True,
    )
    native.cc_binary(
        name = name,
        testonly = True,
        deps = [":" + lib] + select({
            "//fuzz:fuzzing": [],
            "//conditions:default": ["//fuzz:replay_main"],
        }),
        linkopts = select({
            "//fuzz:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
    native.filegroup(
        name = name + "_corpus",
        testonly = True,
        srcs = native.glob(["fuzz_corpus/" + name + "/*"]),
    )
    native.cc_test(
        name = name + "_regression_test",
        size = test_size,
        tags = test_tags,
        # True for targets that run gRPC servers: //common:grpc_tsan_hooks
        # must be linked into the executable.
        linkstatic = test_linkstatic,
        deps = [
            ":" + lib,
            "//fuzz:replay_main",
        ],
        data = [":" + name + "_corpus"],
        args = ["$(rootpaths :" + name + "_corpus)"],
    )
