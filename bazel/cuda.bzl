"""local_cuda: the CUDA toolkit installed on this machine, as @local_cuda.

local_cuda(name = "local_cuda") creates @local_cuda//:cudart (the CUDA
runtime's headers and -lcudart) from $CUDA_HOME (default /usr/local/cuda).
Nothing is downloaded. Only `--config=cuda` builds link it
(--define=hymcache_cuda=1 selects //client/cuda); where the toolkit is
missing the repository still loads, and building :cudart fails with a message
that says so, so the default build works without CUDA. Re-run when CUDA_HOME
changes, or with `bazel sync --configure`.
"""

def _local_cuda_impl(rctx):
    home = rctx.os.environ.get("CUDA_HOME", "") or "/usr/local/cuda"
    header = rctx.path(home + "/include/cuda_runtime.h")
    if header.exists:
        rctx.symlink(home + "/include", "include")
        rctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# The CUDA runtime of {home}.
cc_library(
    name = "cudart",
    hdrs = glob(["include/*.h", "include/*.hpp", "include/crt/**"]),
    includes = ["include"],
    linkopts = [
        "-L{home}/lib64",
        "-Wl,-rpath,{home}/lib64",
        "-lcudart",
    ],
)
""".format(home = home))
    else:
        rctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# No CUDA toolkit at {home} (set CUDA_HOME): building this fails.
genrule(
    name = "no_cuda",
    outs = ["no_cuda.cc"],
    cmd = "echo 'local_cuda: no CUDA toolkit at {home}/include/cuda_runtime.h; set CUDA_HOME or build without --config=cuda' >&2; exit 1",
)

cc_library(
    name = "cudart",
    srcs = [":no_cuda"],
)
""".format(home = home))

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
