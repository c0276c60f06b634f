"""python_load_bench: the Python package's load against the C++ SDK's, side
by side in one run, on the same cluster and the same stored blocks.

    bazel run -c opt //tools/bench:python_load_bench
    bazel run -c opt //tools/bench:python_load_bench -- --transport=tcp --trials=5

Starts a master and a storage node (DRAM) on 127.0.0.1 (port 0), stores
with the Python package
  big:   16 blocks of 16 MiB (an engine loading a long prefix), and
  small: 32 blocks of 256 KiB (per-call overhead dominates),
then, per trial and case, times `iterations` calls (after a warm-up) of
  python: hymcache.Client.load(keys, [pool[i] for i in range(n)]) into one
          preallocated numpy pool (building the views is inside the timing),
  c++:    Client::Load of the same keys into one pool, in the
          sdk_load_bench process (its keys from BlockKeyBuilder over the same
          namespace, so the run also checks key parity),
alternating the two. Both check every block's bytes after the timed calls.
Prints each trial's medians, then per case the best median of each side:
µs per call, GiB/s and Python's throughput as a share of C++'s. Numbers
taken while the machine is busy (builds) are noisy; the ratio of one run is
what counts. --floor=R exits 1 when the big-block ratio is below R.
"""

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np

import hymcache
from hymcache_cluster import Cluster, runfile, store_until_stored

CASES = {"big": (16, 16 << 20), "small": (32, 256 << 10)}
BLOCK_TOKENS = 16


def pattern(i, n):
    """Block i's bytes, as sdk_load_bench checks them."""
    return ((np.arange(n, dtype=np.uint32) + i * 131) % 251).astype(np.uint8)


def python_trial(client, keys, pool, expected, iterations):
    n = len(keys)
    times = []
    for it in range(iterations + 1):
        start = time.perf_counter()
        got = client.load(keys, [pool[i] for i in range(n)])
        took = time.perf_counter() - start
        if got.loaded != n:
            sys.exit(f"python load: {got}")
        if it:
            times.append(took * 1e6)
    for i in range(n):
        if not np.array_equal(pool[i], expected[i]):
            sys.exit(f"python load: block {i} differs")
    return statistics.median(times)


def cxx_trial(address, transport, model, blocks, block_bytes, iterations):
    out = subprocess.run(
        [runfile("tools/bench/sdk_load_bench"), f"--master={address}",
         f"--transport={transport}", f"--model={model}", f"--blocks={blocks}",
         f"--block_bytes={block_bytes}", f"--block_tokens={BLOCK_TOKENS}",
         f"--iterations={iterations}"],
        capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"sdk_load_bench: {out.stderr}")
    fields = dict(f.split("=") for f in out.stdout.split()[1:])
    return float(fields["us_per_call_median"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--transport", default="auto")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--iterations", type=int, default=8,
                   help="timed calls per trial and side (small: x8)")
    p.add_argument("--floor", type=float, default=0.0,
                   help="exit 1 if python/c++ throughput of big is below")
    args = p.parse_args()
    if args.trials < 1 or args.iterations < 1:
        p.error("--trials and --iterations must be at least 1")

    with Cluster(nodes=1, dram_bytes=768 << 20) as cluster, \
            hymcache.Client(cluster.address, transport=args.transport) as c:
        setup = {}
        for case, (blocks, block_bytes) in CASES.items():
            model = f"python-load-bench-{case}"
            keys = hymcache.keys(np.arange(1, blocks * BLOCK_TOKENS + 1),
                                 model=model, block_tokens=BLOCK_TOKENS)
            data = [pattern(i, block_bytes) for i in range(blocks)]
            for i in range(blocks):  # one block per store: 16 MiB chunks
                store_until_stored(c, keys[i:i + 1], data[i:i + 1],
                                   parent_key=keys[i - 1] if i else None)
            pool = np.zeros((blocks, block_bytes), np.uint8)
            setup[case] = (model, keys, data, pool)

        best = {case: [float("inf"), float("inf")] for case in CASES}
        print(f"python_load_bench transport={args.transport} "
              f"trials={args.trials} iterations={args.iterations}")
        for trial in range(args.trials):
            for case, (blocks, block_bytes) in CASES.items():
                model, keys, data, pool = setup[case]
                iterations = args.iterations * (8 if case == "small" else 1)
                py_us = python_trial(c, keys, pool, data, iterations)
                cc_us = cxx_trial(cluster.address, args.transport, model,
                                  blocks, block_bytes, iterations)
                best[case][0] = min(best[case][0], py_us)
                best[case][1] = min(best[case][1], cc_us)
                print(f"  trial {trial} {case:5s} python {py_us:9.1f} us  "
                      f"c++ {cc_us:9.1f} us")

        print()
        print("| case | python us/call | c++ us/call | python GiB/s | "
              "c++ GiB/s | python/c++ throughput |")
        print("|---|---:|---:|---:|---:|---:|")
        ratios = {}
        for case, (blocks, block_bytes) in CASES.items():
            py_us, cc_us = best[case]
            gib = blocks * block_bytes / (1 << 30)
            ratios[case] = cc_us / py_us
            label = f"{blocks} x {block_bytes >> 10} KiB"
            print(f"| {label} | {py_us:.1f} | {cc_us:.1f} | "
                  f"{gib / (py_us / 1e6):.2f} | {gib / (cc_us / 1e6):.2f} | "
                  f"{ratios[case]:.3f}x |")
        if ratios["big"] < args.floor:
            print(f"FAIL: big-block ratio {ratios['big']:.3f} < "
                  f"{args.floor}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
