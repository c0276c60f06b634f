"""kv_engine: TTFT per turn with HyMCache and with recomputation only.

    bazel run -c opt //python/kvengine:kv_engine -- --local
    bazel run -c opt //python/kvengine:kv_engine -- --master=HOST:PORT \\
        --conversations=8 --turns=6 --plot=/tmp/ttft.png --json=/tmp/ttft.json
    PYTHONPATH=python python3 -m kvengine --master=HOST:PORT --trace=t.jsonl

See the package doc (python/kvengine/__init__.py) for the model and the
JSON schema. Exit status: 0 success, 1 a run failure (no cluster, an
unreadable trace, a loaded block that differs from its fill, a hymcache mode
that stored and loaded nothing), 2 bad flags.
"""

import argparse
import contextlib
import math
import sys
import uuid

import hymcache

from . import report, workload
from .engine import Engine
from .pool import ELEMENT_BYTES, KvPool


def run_modes(requests, pool, modes, client=None, key_builder=None,
              on_request=None, **engine_options):
    """Serves `requests` once per mode ("recompute", then "hymcache"), one
    Engine per mode on the same pool; returns {mode: [record, ...]} with
    every store finished. on_request(mode, index) runs before each
    request (tests kill nodes from it)."""
    results = {}
    for mode in ("recompute", "hymcache"):
        if mode not in modes:
            continue
        engine = Engine(pool, client=client if mode == "hymcache" else None,
                        key_builder=key_builder, **engine_options)
        with engine:
            records = []
            for i, req in enumerate(requests):
                if on_request is not None:
                    on_request(mode, i)
                records.append(engine.serve(req))
        results[mode] = records
    return results


def _parser():
    p = argparse.ArgumentParser(
        prog="kv_engine", description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    where = p.add_argument_group("cluster")
    where.add_argument("--master", help="HOST:PORT of the master")
    where.add_argument("--local", action="store_true",
                       help="start a master and a storage node on 127.0.0.1 "
                       "for the run (under bazel run)")
    where.add_argument("--local_dram_bytes", type=int, default=1 << 30)
    where.add_argument("--transport", default="auto")
    m = p.add_argument_group("model (one block = num_layers x 2 x "
                             "block_tokens x kv_heads x head_dim x 2 bytes)")
    m.add_argument("--model_name", default="kv-engine-toy")
    m.add_argument("--num_layers", type=int, default=24)
    m.add_argument("--kv_heads", type=int, default=2)
    m.add_argument("--head_dim", type=int, default=64)
    m.add_argument("--block_tokens", type=int, default=64,
                   help="tokens per block (a trace's hash id covers this "
                   "many tokens; Mooncake's traces use 512)")
    m.add_argument("--pool_blocks", type=int, default=0,
                   help="0: 2 x the largest request's blocks, at least 16")
    m.add_argument("--prefill_tokens_per_s", type=float, default=20000.0,
                   help="modelled prefill rate (stands in for the GPU)")
    m.add_argument("--load_deadline", type=float, default=5.0)
    m.add_argument("--salt", default=None,
                   help="key namespace salt; default a fresh one per run "
                   "(a cold cache)")
    w = p.add_argument_group("workload (synthetic unless --trace)")
    w.add_argument("--trace", help="Mooncake-format JSONL trace")
    w.add_argument("--max_requests", type=int, default=0)
    w.add_argument("--conversations", type=int, default=8)
    w.add_argument("--turns", type=int, default=6)
    w.add_argument("--system_prompt_tokens", type=int, default=512)
    w.add_argument("--user_tokens", type=int, default=256)
    w.add_argument("--output_tokens", type=int, default=128)
    w.add_argument("--shared_system_prompt",
                   action=argparse.BooleanOptionalAction, default=True)
    w.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("run and output")
    r.add_argument("--modes", default="recompute,hymcache")
    r.add_argument("--wait_stores", action="store_true",
                   help="wait for stores in flight before each request")
    r.add_argument("--verify", action=argparse.BooleanOptionalAction,
                   default=True, help="check loaded blocks byte for byte")
    r.add_argument("--json", help="write the JSON document here")
    r.add_argument("--plot", help="write a PNG of TTFT per turn here")
    return p


def main(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in report.MODES for m in modes):
        p.error(f"--modes: a list of {', '.join(report.MODES)}")
    if "hymcache" in modes and bool(args.master) == args.local:
        p.error("give exactly one of --master and --local")
    for name in ("num_layers", "kv_heads", "head_dim", "block_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.prefill_tokens_per_s <= 0:
        p.error("--prefill_tokens_per_s must be > 0")
    T = args.block_tokens
    try:
        if args.trace:
            requests = workload.read_mooncake(args.trace, T,
                                              args.max_requests)
            kind = {"kind": "mooncake", "trace": args.trace}
        else:
            requests = workload.synthetic(
                args.conversations, args.turns, args.system_prompt_tokens,
                args.user_tokens, args.output_tokens,
                args.shared_system_prompt, args.seed)
            if args.max_requests:
                requests = requests[:args.max_requests]
            kind = {"kind": "synthetic", "conversations": args.conversations,
                    "turns": args.turns,
                    "system_prompt_tokens": args.system_prompt_tokens,
                    "user_tokens": args.user_tokens,
                    "output_tokens": args.output_tokens,
                    "shared_system_prompt": args.shared_system_prompt,
                    "seed": args.seed}
    except ValueError as e:
        p.error(str(e))
    except OSError as e:
        print(f"kv_engine: {e}", file=sys.stderr)
        return 1
    requests = [q for q in requests if q.input_length > 0]
    if not requests:
        print("kv_engine: no requests", file=sys.stderr)
        return 1
    most = max(math.ceil(q.input_length / T) for q in requests)
    pool_blocks = args.pool_blocks or max(2 * most, 16)
    if pool_blocks < most:
        p.error(f"--pool_blocks={pool_blocks}: a request needs {most}")
    salt = args.salt if args.salt is not None else uuid.uuid4().hex
    pool = KvPool(pool_blocks, args.num_layers, T, args.kv_heads,
                  args.head_dim)
    config = {
        "model_name": args.model_name, "num_layers": args.num_layers,
        "kv_heads": args.kv_heads, "head_dim": args.head_dim,
        "block_tokens": T, "element_bytes": ELEMENT_BYTES,
        "block_bytes": pool.block_bytes, "pool_blocks": pool_blocks,
        "prefill_tokens_per_s": args.prefill_tokens_per_s,
        "load_deadline_s": args.load_deadline, "transport": args.transport,
        "wait_stores": args.wait_stores, "salt": salt, "modes": modes,
        "workload": kind}

    with contextlib.ExitStack() as stack:
        client = kb = None
        if "hymcache" in modes:
            address = args.master
            if args.local:
                try:
                    from hymcache_cluster import Cluster, store_until_stored
                except ImportError:
                    print("kv_engine: --local needs the daemons of bazel run "
                          "//python/kvengine:kv_engine", file=sys.stderr)
                    return 1
                cluster = stack.enter_context(
                    Cluster(nodes=1, dram_bytes=args.local_dram_bytes))
                address = cluster.address
                with hymcache.Client(address, transport="tcp") as warm:
                    # Returns once the new node accepts writes.
                    store_until_stored(warm, [f"warm-{salt}".encode()],
                                       [bytearray(1)])
            try:
                client = stack.enter_context(
                    hymcache.Client(address, transport=args.transport,
                                    deadline=args.load_deadline))
                client.stats()  # fails now if the master is unreachable
            except hymcache.Error as e:
                print(f"kv_engine: {e!r}", file=sys.stderr)
                return 1
            kb = hymcache.KeyBuilder(
                model=args.model_name, dtype="bf16",
                layout=f"L{args.num_layers}/2/T{T}/H{args.kv_heads}"
                f"/D{args.head_dim}", salt=salt, block_tokens=T)
        results = run_modes(
            requests, pool, modes, client=client, key_builder=kb,
            prefill_tokens_per_s=args.prefill_tokens_per_s,
            load_deadline=args.load_deadline, wait_stores=args.wait_stores,
            verify=args.verify)
    doc = report.build(config, requests, results)
    print(report.format_table(doc))
    if args.json:
        report.write_json(doc, args.json)
    if args.plot:
        report.plot(doc, args.plot)
    corrupt = sum(e["hymcache"]["corrupt_blocks"] for e in doc["requests"]
                  if e["hymcache"])
    if corrupt:
        print(f"kv_engine: {corrupt} loaded blocks differ from their fill",
              file=sys.stderr)
        return 1
    if "hymcache" in modes and not cache_used(doc):
        # Every lookup, load and store failed: the hymcache column is
        # recomputation under another name, not a measurement.
        print("kv_engine: HyMCache stored and loaded nothing (every store "
              "and load failed)", file=sys.stderr)
        return 1
    return 0


def cache_used(doc):
    """True if the hymcache mode stored or loaded at least one block."""
    for e in doc["requests"]:
        rec = e["hymcache"]
        if not rec:
            continue
        store = rec.get("store") or {}
        if (rec["loaded_blocks"] or store.get("stored", 0)
                or store.get("skipped", 0)):
            return True
    return False
