"""Sanitizer runtime for Python tests of an instrumented extension.

Under --config=asan / --config=tsan, hymcache/_hymcache.so links the
sanitizer's runtime, which must be the first library of the process: an
uninstrumented python3 cannot load it otherwise. A test's main calls
reexec_if_needed() before it imports hymcache. Under TSan the test lists
//python/testing:tsan_hooks_dump in its data: python3 lacks the TSan hooks
that //common:grpc_tsan_hooks puts into our C++ executables (Debian's gRPC
is not instrumented), so they are passed through TSAN_OPTIONS.
"""

import importlib.util
import os
import subprocess
import sys

from runfiles import runfile


def reexec_if_needed():
    """Re-executes the interpreter with the ASan/TSan runtime preloaded when
    the extension was built with --config=asan/tsan (an instrumented shared
    object cannot be loaded into an uninstrumented python3 otherwise)."""
    if os.environ.get("HYMCACHE_SANITIZER_PRELOADED"):
        return
    spec = importlib.util.find_spec("hymcache")
    so = os.path.join(os.path.dirname(spec.origin), "_hymcache.so")
    ldd = subprocess.run(["ldd", so], capture_output=True, text=True).stdout
    paths = {}
    for line in ldd.splitlines():
        if "=>" in line:
            name = line.strip().split(" ")[0]
            paths[name.split(".so")[0]] = line.split("=>")[1].split("(")[0].strip()
    runtime = paths.get("libasan") or paths.get("libtsan")
    if runtime is None:
        return
    env = dict(os.environ)
    env["HYMCACHE_SANITIZER_PRELOADED"] = "1"
    # libstdc++ too: the runtime's C++ exception interceptors bind to it at
    # start-up, and python3 itself does not link it.
    env["LD_PRELOAD"] = " ".join([runtime, paths["libstdc++"]])
    # The interpreter's own allocations at exit are not the extension's leaks.
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    if runtime == paths.get("libtsan"):
        env["TSAN_OPTIONS"] = env.get("TSAN_OPTIONS", "") + _tsan_hooks()
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def _tsan_hooks():
    """TSAN_OPTIONS entries for //common:grpc_tsan_hooks' hooks."""
    out = subprocess.run([runfile("python/testing/tsan_hooks_dump")],
                         check=True, capture_output=True, text=True).stdout
    options, _, suppressions = out.partition("\n")
    path = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"),
                        f"tsan-suppressions-{os.getpid()}.txt")
    with open(path, "w") as f:
        f.write(suppressions)
    return f":{options}:suppressions={path}"
