#!/usr/bin/env python3
"""HyMCache side by side with its peers on one machine, in one run
(tools/bench/peers.sh installs the peers, builds the daemons and runs this).

Systems, each on loopback, each in its recommended single-host setup, no
persistence, the same memory budget (--budget, DRAM):
  hymcache  a master and one DRAM storage node (hymcache-master,
            hymcache-storage --device=dram --dram_bytes=BUDGET); the Python
            client (hymcache.Client, transport="tcp").
  mooncake  mooncake_master (mooncake-transfer-engine-non-cuda) and a store
            process that lends the pool BUDGET bytes (MooncakeDistributedStore
            .setup with global_segment_size=BUDGET, protocol "tcp", P2P
            handshake, no metadata server); the benchmark clients lend
            nothing (global_segment_size=0), so every byte they move crosses
            TCP to the store process, as with HyMCache's node.
  redis     Debian's redis-server, --save "" --appendonly no,
            maxmemory BUDGET with allkeys-lru; redis-py with hiredis (its C
            reply parser).
  hybrid    (multi-turn only) HyMCache with a hybrid node: DRAM staging +
            write buffer totalling the same DRAM budget, plus SSD capacity.

Workloads, each the same through each system's own Python client library
(clients are processes, not threads: the GIL):
  put/get   objects of 256 KiB, 1 MiB and 16 MiB at 1 and 8 client
            processes; put: each client stores its own fresh keys; get: each
            reads its keys round robin for --seconds into a registered
            buffer (Mooncake: put_from/get_into with registered buffers;
            HyMCache: store/load with registered buffers; Redis: SET of a
            memoryview, GET returning bytes). GB/s = all bytes moved / wall
            time from the first client's start to the last one's end.
  lookup32  existence of 32 random stored keys per call (HyMCache: exists,
            Mooncake: batch_is_exist, Redis: EXISTS k1..k32), calls/s, at 1
            and 8 clients.
  multiturn a synthetic multi-turn chat (hymbench's shape: a shared system
            prompt, then per turn a user message and an answer appended to
            the history) replayed turn by turn by one client with a DRAM
            budget (--mt_budget) smaller than the footprint: per request,
            existence of the prompt's blocks, load of the hit prefix, store
            of the blocks not held. Reports per turn the prefix hit ratio
            (blocks loaded / prompt blocks) and load GB/s.

The last line is exactly
  peers: get16m_vs_mooncake=X.XX put16m_vs_mooncake=X.XX
         lookup32_vs_mooncake=X.XX get1m_vs_redis=X.XX
         multiturn_hit_vs_mooncake=X.XX        (one line)
where each *_vs_* is HyMCache's number over the peer's, each system's best of
its samples of that row (--repeat's key rows are measured --samples times,
3 by default; load on the host only slows a sample), the lower of the 1- and 8-client ratios (the
floors hold at both), and multiturn the DRAM node's overall hit ratio over
Mooncake's at the same DRAM budget. The table prints every sample.

--short: CI's smoke form: 256 KiB, one client, half a second per phase, a tiny
replay; it checks that every system answered (every get returned the stored
length, every lookup found every key) and its last line is
  peers-smoke: hymcache=ok mooncake=ok redis=ok ...
"""
import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import re
import socket
import subprocess
import sys
import time

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
SYSTEMS = ("hymcache", "mooncake", "redis")
# Measured beside them where it runs, with no floor of its own: LMCache's
# cache server.
EXTRA = ("lmcache",)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, ready, proc, log, timeout=180):
    """Polls ready() until true; fails at once if proc exited."""
    deadline = time.monotonic() + timeout
    while True:
        got = ready()
        if got:
            return got
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = open(log, errors="replace").read()[-2000:] if os.path.exists(log) else ""
            raise RuntimeError(f"{what} did not start (log {log}):\n{tail}")
        time.sleep(0.05)


def port_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
        return True
    except OSError:
        return False


def line_in(path, pattern):
    try:
        for line in open(path, errors="replace"):
            m = re.search(pattern, line)
            if m:
                return m
    except FileNotFoundError:
        pass
    return None


class Daemons:
    """Processes this run started; kills them, newest first."""

    def __init__(self):
        self.procs = []

    def start(self, argv, log, **kw):
        p = subprocess.Popen(argv, stdout=open(log, "wb"),
                             stderr=subprocess.STDOUT, **kw)
        self.procs.append(p)
        return p

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def start_hymcache(d, a, work, name, dram=None, hybrid=None):
    """A master and one storage node; returns the client spec."""
    mlog = os.path.join(work, f"{name}-master.log")
    m = d.start([os.path.join(a.bin, "hymcache-master"),
                 "--listen=127.0.0.1:0",
                 f"--db_path={os.path.join(work, name + '-db')}"], mlog)
    master = wait_for(f"{name} master", lambda: line_in(mlog, r"^hymcache-master listening on (\S+)"),
                      m, mlog).group(1)
    node = [os.path.join(a.bin, "hymcache-storage"), f"--master={master}",
            f"--name={name}", "--data_port=0", "--control_port=0"]
    if hybrid:
        node += ["--device=hybrid", f"--capacity_path={hybrid['path']}",
                 f"--capacity_bytes={hybrid['capacity']}",
                 f"--staging_bytes={hybrid['dram'] // 2}",
                 f"--write_buffer_bytes={hybrid['dram'] // 2}"]
    else:
        node += ["--device=dram", f"--dram_bytes={dram}"]
    nlog = os.path.join(work, f"{name}-node.log")
    n = d.start(node, nlog)
    wait_for(f"{name} node", lambda: line_in(nlog, r"^hymcache-storage data="), n, nlog)
    return dict(kind="hymcache", master=master, transport=a.transport,
                location_cache=a.location_cache,
                settings=" ".join(node[5:]) +
                ("" if a.location_cache else " (client: location_cache_entries=0)"))


def start_mooncake(d, a, work, name, budget):
    port = free_port()
    log = os.path.join(work, f"{name}-master.log")
    argv = [os.path.join(a.peers, "mooncake", "mooncake_master"),
            f"--rpc_port={port}", f"--metrics_port={free_port()}",
            "--enable_http_metadata_server=false"]
    m = d.start(argv, log)
    wait_for("mooncake_master", lambda: port_open(port), m, log)
    spec = dict(kind="mooncake", master=f"127.0.0.1:{port}", segment=0,
                settings=" ".join(argv[3:]) +
                f"; store process: global_segment_size={budget} protocol=tcp "
                "metadata=P2PHANDSHAKE; clients: global_segment_size=0 "
                f"local_buffer_size={a.mc_local_buffer}")
    # The store process that lends the pool its memory.
    hlog = os.path.join(work, f"{name}-store.log")
    holder = dict(spec, segment=budget)
    h = d.start([sys.executable, os.path.abspath(__file__), "--mooncake_holder",
                 json.dumps(dict(holder, local_buffer=a.mc_local_buffer))],
                hlog, stdin=subprocess.PIPE)
    wait_for("mooncake store process", lambda: line_in(hlog, r"^holder ready"), h, hlog)
    return spec


def start_lmcache(d, a, work, name):
    """LMCache's cache server (`python -m lmcache.v1.server HOST PORT cpu`,
    the `lm://` remote backend that LMCache engines share). It has no
    memory bound: its store keeps every object (no evictor)."""
    port = free_port()
    log = os.path.join(work, f"{name}.log")
    argv = [sys.executable, "-m", "lmcache.v1.server", "127.0.0.1", str(port), "cpu"]
    m = d.start(argv, log)
    wait_for("lmcache server", lambda: port_open(port), m, log, timeout=60)
    return dict(kind="lmcache", port=port, settings=" ".join(argv[1:]) +
                " (no memory bound, no eviction)")


def start_redis(d, a, work, name, budget):
    port = free_port()
    log = os.path.join(work, f"{name}.log")
    argv = [a.redis_server, "--bind", "127.0.0.1", "--port", str(port),
            "--save", "", "--appendonly", "no", "--maxmemory", str(budget),
            "--maxmemory-policy", "allkeys-lru", "--dir", work]
    r = d.start(argv, log)
    wait_for("redis-server", lambda: port_open(port), r, log)
    return dict(kind="redis", port=port,
                settings=" ".join(x if x else '""' for x in argv[1:]))


# ------------------------------------------------------------ the clients
# Each is built inside a worker process. Interface:
#   put(key, view)  get(key, view) -> bytes read
#   put_many(keys, views)  get_many(keys, views) -> blocks read in order
#   exists(keys) -> [bool]  remove(keys)

class HymClient:
    def __init__(self, spec, bufs):
        import hymcache
        # The SDK's location cache unless --location_cache=0.
        kw = {} if spec.get("location_cache", 1) else dict(location_cache_entries=0)
        self.c = hymcache.Client(spec["master"], transport=spec["transport"], **kw)
        # The node registers before its first heartbeat makes it alive.
        deadline = time.monotonic() + 60
        while not any(n["alive"] for n in self.c.stats()["nodes"]):
            if time.monotonic() > deadline:
                raise RuntimeError("no alive HyMCache storage node after 60 s")
            time.sleep(0.05)
        for b in bufs:
            self.c.register_buffer(b)

    def put(self, key, view):
        r = self.c.store([key], [view]).result()
        if r.stored + r.skipped != 1:
            raise RuntimeError(f"hymcache store failed: {r.outcomes} {r.errors}")

    def get(self, key, view):
        return self.c.load([key], [view]).bytes

    def put_many(self, keys, views):
        if keys:
            self.c.store(keys, views).result()

    def get_many(self, keys, views):
        return self.c.load(keys, views).loaded if keys else 0

    def exists(self, keys):
        return self.c.exists(keys)

    def remove(self, keys):
        for i in range(0, len(keys), 1024):
            self.c.remove(keys[i:i + 1024])


class MooncakeClient:
    def __init__(self, spec, bufs):
        from mooncake.store import MooncakeDistributedStore
        self.s = MooncakeDistributedStore()
        rc = self.s.setup("127.0.0.1", "P2PHANDSHAKE", spec["segment"],
                          spec.get("local_buffer", 16 * MIB), "tcp", "",
                          spec["master"])
        if rc != 0:
            raise RuntimeError(f"mooncake setup returned {rc}")
        self.ptr = {}
        for b in bufs:
            rc = self.s.register_buffer(b.ctypes.data, b.nbytes)
            if rc != 0:
                raise RuntimeError(f"mooncake register_buffer returned {rc}")

    @staticmethod
    def _addr(view):
        import numpy as np
        return np.frombuffer(view, np.uint8).ctypes.data

    def put(self, key, view):
        rc = self.s.put_from(key, self._addr(view), len(view))
        if rc != 0:
            raise RuntimeError(f"mooncake put_from returned {rc}")

    def get(self, key, view):
        return max(0, self.s.get_into(key, self._addr(view), len(view)))

    def put_many(self, keys, views):
        if keys:
            self.s.batch_put_from(keys, [self._addr(v) for v in views],
                                  [len(v) for v in views])

    def get_many(self, keys, views):
        if not keys:
            return 0
        got = self.s.batch_get_into(keys, [self._addr(v) for v in views],
                                    [len(v) for v in views])
        n = 0
        for g, v in zip(got, views):
            if g != len(v):
                break
            n += 1
        return n

    def exists(self, keys):
        return [x == 1 for x in self.s.batch_is_exist(keys)]

    def remove(self, keys):
        self.s.remove_all()


class RedisClient:
    def __init__(self, spec, bufs):
        import redis
        self.r = redis.Redis(host="127.0.0.1", port=spec["port"])

    def put(self, key, view):
        self.r.set(key, view)

    def get(self, key, view):
        v = self.r.get(key)
        return len(v) if v is not None else 0

    def put_many(self, keys, views):
        if keys:
            p = self.r.pipeline(transaction=False)
            for k, v in zip(keys, views):
                p.set(k, v)
            p.execute()

    def get_many(self, keys, views):
        if not keys:
            return 0
        n = 0
        for v, view in zip(self.r.mget(keys), views):
            if v is None or len(v) != len(view):
                break
            n += 1
        return n

    def exists(self, keys):
        # EXISTS counts; a count of len(keys) is all found (what the lookup
        # rows check). One call, one round trip, like the others.
        n = self.r.exists(*keys)
        return [True] * n + [False] * (len(keys) - n)

    def remove(self, keys):
        self.r.flushall()


class LMCacheClient:
    """LMCache's wire protocol (lmcache.v1.protocol: ClientMetaMessage,
    ServerMetaMessage) on one socket, as LMCache's own LMCServerConnector
    speaks it, without its asyncio loop and allocator: a GET reads the
    value straight into the caller's buffer. A PUT has no reply in that
    protocol, so each put here ends with a HEALTH round trip (the server
    answers in order): a put is its whole round trip, as in the others.
    The protocol has no batch existence check (32 EXIST round trips) and
    no delete."""

    def __init__(self, spec, bufs):
        import torch
        from lmcache.utils import CacheEngineKey
        from lmcache.v1.memory_management import MemoryFormat
        from lmcache.v1 import protocol
        self.torch, self.Key, self.proto = torch, CacheEngineKey, protocol
        self.fmt = MemoryFormat(1)
        self.sock = socket.create_connection(("127.0.0.1", spec["port"]))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reply_len = protocol.ServerMetaMessage.packlength()

    def _key(self, key):
        import zlib
        return self.Key("peers", 1, 0, zlib.crc32(key.encode()) << 32 | len(key),
                        self.torch.uint8)

    def _send(self, command, key, length=0, shape=(0, 0, 0, 0)):
        self.sock.sendall(self.proto.ClientMetaMessage(
            command, self._key(key), length, self.fmt, self.torch.uint8,
            self.torch.Size(shape)).serialize())

    def _reply(self):
        buf = bytearray(self.reply_len)
        view, got = memoryview(buf), 0
        while got < self.reply_len:
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise RuntimeError("lmcache server closed the connection")
            got += n
        return self.proto.ServerMetaMessage.deserialize(bytes(buf))

    def put(self, key, view):
        self._send(self.proto.ClientCommand.PUT, key, len(view), (len(view), 0, 0, 0))
        self.sock.sendall(view)
        self._send(self.proto.ClientCommand.HEALTH, key)
        self._reply()

    def get(self, key, view):
        self._send(self.proto.ClientCommand.GET, key)
        meta = self._reply()
        if meta.code != self.proto.ServerReturnCode.SUCCESS:
            return 0
        n, got = meta.length, 0
        if n > len(view):
            raise RuntimeError(f"lmcache value of {n} bytes for a {len(view)}-byte buffer")
        while got < n:
            r = self.sock.recv_into(view[got:n])
            if r == 0:
                raise RuntimeError("lmcache server closed the connection")
            got += r
        return n

    def put_many(self, keys, views):
        for k, v in zip(keys, views):
            self.put(k, v)

    def get_many(self, keys, views):
        n = 0
        for k, v in zip(keys, views):
            if self.get(k, v) != len(v):
                break
            n += 1
        return n

    def exists(self, keys):
        found = []
        for k in keys:
            self._send(self.proto.ClientCommand.EXIST, k)
            found.append(self._reply().code == self.proto.ServerReturnCode.SUCCESS)
        return found

    def remove(self, keys):
        pass  # the protocol has no delete


CLIENTS = dict(hymcache=HymClient, mooncake=MooncakeClient, redis=RedisClient,
               lmcache=LMCacheClient)


def worker(spec, max_bytes, conn, seed):
    """One client process: builds its client, then answers commands."""
    import numpy as np
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, max_bytes, dtype=np.uint8)
    dst = np.zeros(max_bytes, np.uint8)
    try:
        client = CLIENTS[spec["kind"]](spec, [src, dst])
        conn.send(("ready", None))
    except Exception as e:  # said to the parent, which stops the run
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            cmd, arg = conn.recv()
        except EOFError:  # the driver is gone
            return
        if cmd == "quit":
            return
        try:
            conn.send(("ok", run_phase(client, cmd, arg, src, dst)))
        except Exception as e:
            conn.send(("error", f"{cmd}: {type(e).__name__}: {e}"))


def run_phase(client, cmd, arg, src, dst):
    # Start together: every worker waits for the same wall-clock instant.
    time.sleep(max(0.0, arg["start_at"] - time.time()))
    t0 = time.perf_counter()
    ops = moved = bad = 0
    if cmd == "put":
        size = arg["size"]
        view = memoryview(src)[:size]
        for k in arg["keys"]:
            client.put(k, view)
            ops += 1
            moved += size
    elif cmd == "get":
        size = arg["size"]
        view = memoryview(dst)[:size]
        keys = arg["keys"]
        end = t0 + arg["seconds"]
        while True:
            for k in keys:
                n = client.get(k, view)
                bad += n != size
                ops += 1
                moved += n
            if time.perf_counter() >= end:
                break
    elif cmd == "exists":
        pool, batch = arg["keys"], arg["batch"]
        rnd = random.Random(arg["seed"])
        end = t0 + arg["seconds"]
        while time.perf_counter() < end:
            for _ in range(16):
                found = client.exists(rnd.sample(pool, batch))
                bad += not all(found)
                ops += 1
    elif cmd == "remove":
        client.remove(arg["keys"])
    elif cmd == "multiturn":
        return multiturn(client, arg, src, dst)
    return dict(ops=ops, bytes=moved, bad=bad, t0=t0, t1=time.perf_counter())


def multiturn(client, a, src, dst):
    """The synthetic chat, turn by turn: turn t of every conversation, then
    turn t + 1 (the others' turns come between a conversation's turns, as
    on a serving engine with many users)."""
    B, blk = a["block_tokens"], a["block_bytes"]
    sys_blocks = a["system_tokens"] // B
    rows = []
    for t in range(a["turns"]):
        blocks = hits = stored = 0
        load_s = load_bytes = 0.0
        for c in range(a["conversations"]):
            prompt = a["system_tokens"] + t * (a["user_tokens"] + a["output_tokens"]) + a["user_tokens"]
            after = prompt + a["output_tokens"]
            keys = [f"mt-sys-{i}" if i < sys_blocks else f"mt-c{c}-{i}"
                    for i in range(after // B)]
            n = prompt // B
            found = client.exists(keys[:n])
            hit = 0
            while hit < n and found[hit]:
                hit += 1
            views = [memoryview(dst)[i * blk:(i + 1) * blk] for i in range(hit)]
            t0 = time.perf_counter()
            got = client.get_many(keys[:hit], views)
            load_s += time.perf_counter() - t0
            load_bytes += got * blk
            blocks += n
            hits += got
            new = keys[got:]
            client.put_many(new, [memoryview(src)[(i % 8) * blk:(i % 8 + 1) * blk]
                                  for i in range(len(new))])
            stored += len(new)
        rows.append(dict(turn=t + 1, blocks=blocks, hits=hits, stored=stored,
                         load_bytes=load_bytes, load_s=load_s))
    return rows


def mooncake_holder(spec):
    """The store process lending Mooncake's pool its memory; lives until
    its stdin closes."""
    store = MooncakeClient(spec, [])  # held: dropping it unmounts the segment
    print("holder ready", flush=True)
    sys.stdin.read()
    store.s.close()


class Pool:
    """`n` client processes of one system."""

    def __init__(self, spec, n, max_bytes):
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for i in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker, args=(spec, max_bytes, child, 1000 + i),
                            daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:
            self._answer(c)

    @staticmethod
    def _answer(conn):
        what, val = conn.recv()
        if what != "ok" and what != "ready":
            raise RuntimeError(val)
        return val

    def run(self, cmd, args):
        """args: one dict per worker used; returns their answers."""
        start_at = time.time() + 0.3
        for c, arg in zip(self.conns, args):
            c.send((cmd, dict(arg, start_at=start_at)))
        return [self._answer(c) for c in self.conns[:len(args)]]

    def close(self):
        for c in self.conns:
            try:
                c.send(("quit", None))
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def aggregate(res):
    wall = max(r["t1"] for r in res) - min(r["t0"] for r in res)
    return dict(ops=sum(r["ops"] for r in res), bytes=sum(r["bytes"] for r in res),
                bad=sum(r["bad"] for r in res), wall=wall)


# ---------------------------------------------------------------- phases

def put_get(pools, a, size, clients, rnd_tag):
    """Put then get of `size` objects at `clients` processes, each system in
    turn (the same cell of every system back to back: load on the host hits
    all alike). Returns {system: {put: GB/s, get: GB/s, bad}}."""
    per_client = max(2, min(a.max_objects, a.cell_bytes // (size * clients)))
    out = {}
    for name, pool in pools.items():
        keys = [[f"{rnd_tag}-{size}-{clients}-{i}-{j}" for j in range(per_client)]
                for i in range(clients)]
        put = aggregate(pool.run("put", [dict(size=size, keys=k) for k in keys]))
        get = aggregate(pool.run("get", [dict(size=size, keys=k, seconds=a.seconds)
                                         for k in keys]))
        pool.run("remove", [dict(keys=[k for ks in keys for k in ks])])
        out[name] = dict(put=put["bytes"] / put["wall"] / 1e9,
                         get=get["bytes"] / get["wall"] / 1e9,
                         get_ops=get["ops"], bad=get["bad"])
    return out


def lookups(pools, a, clients):
    out = {}
    n = a.lookup_objects
    for name, pool in pools.items():
        if name not in SYSTEMS + EXTRA:
            continue  # the same master lookups as hymcache's
        keys = [f"lk-{i}" for i in range(n)]
        share = [keys[i::clients] for i in range(clients)]
        pool.run("put", [dict(size=a.lookup_value, keys=k) for k in share])
        r = aggregate(pool.run("exists", [dict(keys=keys, batch=32, seconds=a.seconds,
                                               seed=i) for i in range(clients)]))
        pool.run("remove", [dict(keys=keys)])
        out[name] = dict(calls=r["ops"] / r["wall"], bad=r["bad"], ops=r["ops"])
    return out


def fmt_rate(x):
    return f"{x:.2f}"


def ratio(a, b):
    return a / b if b > 0 else float("inf")


def load_avg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def versions(a):
    v = {}
    try:
        from importlib import metadata
        sys.path.insert(0, a.peers)
        for d in metadata.distributions():  # PYTHONPATH: the peers, redis-py
            name = d.metadata["Name"]
            if name.lower().startswith(("mooncake", "lmcache", "redis", "hiredis")):
                v[name] = d.version
    except Exception as e:  # versions are a note, never a failure
        v["error"] = str(e)
    try:
        v["redis-server"] = subprocess.run([a.redis_server, "--version"], capture_output=True,
                                           text=True).stdout.split()[2]
    except Exception:
        pass
    v["hymcache"] = a.hymcache_version
    return v


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", help="folder with hymcache-master, hymcache-storage")
    p.add_argument("--peers", help="folder holding mooncake (and redis-py, lmcache)")
    p.add_argument("--redis_server", default="redis-server")
    p.add_argument("--work", default="/tmp/hymcache-peers")
    p.add_argument("--short", action="store_true")
    p.add_argument("--transport", default="tcp", help="HyMCache's client transport")
    p.add_argument("--location_cache", type=int, default=1,
                   help="0: HyMCache's clients without the SDK's location cache "
                        "(client/location_cache.h), to show its share")
    p.add_argument("--shm", type=int, default=1,
                   help="also HyMCache's same-host shared-memory client (a column)")
    p.add_argument("--budget", type=int, default=1 * GIB, help="DRAM of each system (bytes)")
    p.add_argument("--sizes", default="256K,1M,16M")
    p.add_argument("--clients", default="1,8")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--cell_bytes", type=int, default=256 * MIB,
                   help="bytes each put/get cell stores (all clients)")
    p.add_argument("--max_objects", type=int, default=256)
    p.add_argument("--lookup_objects", type=int, default=4096)
    p.add_argument("--lookup_value", type=int, default=4096)
    p.add_argument("--samples", type=int, default=3,
                   help="samples of each --repeat row (the first included)")
    p.add_argument("--repeat", default="get16m,get1m,lookup32",
                   help="key rows measured --samples times (noise)")
    p.add_argument("--mc_local_buffer", type=int, default=16 * MIB)
    # Multi-turn replay.
    p.add_argument("--conversations", type=int, default=24)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--system_tokens", type=int, default=1024)
    p.add_argument("--user_tokens", type=int, default=1024)
    p.add_argument("--output_tokens", type=int, default=256)
    p.add_argument("--block_tokens", type=int, default=256)
    p.add_argument("--block_bytes", type=int, default=1 * MIB)
    p.add_argument("--mt_budget", type=int, default=256 * MIB,
                   help="DRAM of each system in the multi-turn replay")
    p.add_argument("--mt_capacity", type=int, default=2 * GIB,
                   help="SSD capacity of the hybrid node")
    p.add_argument("--capacity_dir", default=None, help="default: --work")
    p.add_argument("--hymcache_version", default="")
    p.add_argument("--mooncake_holder", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.mooncake_holder:
        return mooncake_holder(json.loads(a.mooncake_holder))
    if a.short:
        a.sizes, a.clients, a.seconds = "256K", "1", 0.5
        a.budget, a.cell_bytes, a.max_objects = 256 * MIB, 8 * MIB, 32
        a.lookup_objects, a.repeat = 256, ""
        a.conversations, a.turns, a.block_bytes = 2, 3, 64 * KIB
        a.mt_budget, a.mt_capacity = 64 * MIB, 256 * MIB
        a.shm = 0
    sizes = [int(s[:-1]) * {"K": KIB, "M": MIB}[s[-1]] for s in a.sizes.split(",")]
    clients = [int(c) for c in a.clients.split(",")]
    os.makedirs(a.work, exist_ok=True)
    capdir = a.capacity_dir or a.work

    print(f"peers: host {platform.node()}, {os.cpu_count()} cores, load average "
          f"{load_avg()} at start", flush=True)
    vers = versions(a)
    print("peers: versions " + " ".join(f"{k}={v}" for k, v in vers.items()), flush=True)
    d = Daemons()
    results = dict(cells={}, lookup={}, multiturn={})
    try:
        specs = dict(hymcache=start_hymcache(d, a, a.work, "hym", dram=a.budget),
                     mooncake=start_mooncake(d, a, a.work, "mc", a.budget),
                     redis=start_redis(d, a, a.work, "redis", a.budget))
        try:
            specs["lmcache"] = start_lmcache(d, a, a.work, "lmcache")
        except Exception as e:  # the rest of the run goes on
            print(f"peers: LMCache not run: {type(e).__name__}: {e}", flush=True)
        for k, s in specs.items():
            print(f"peers: settings {k}: {s['settings']}", flush=True)
        max_bytes = max(max(sizes), 8 * a.block_bytes, a.lookup_value)
        nmax = max(clients)
        if a.shm:
            # The same cluster through the node's shared memory (same host).
            specs["hymcache_shm"] = dict(specs["hymcache"], transport="shm")
        pools = {}
        for k, s in specs.items():
            try:
                pools[k] = Pool(s, nmax, max_bytes)
            except RuntimeError as e:
                if k not in EXTRA:
                    raise
                print(f"peers: LMCache not run: its client: {e}", flush=True)
        results["extra"] = [k for k in EXTRA if k in pools]
        for size in sizes:
            for c in clients:
                tag = f"{size // KIB}K" if size < MIB else f"{size // MIB}M"
                r = put_get(pools, a, size, c, "r1")
                results["cells"][(tag, c)] = [r]
                print(f"peers: {tag} x{c}: " + " ".join(
                    f"{k} put={v['put']:.2f} get={v['get']:.2f} GB/s" for k, v in r.items()) +
                    f" (load {load_avg()})", flush=True)
        for c in clients:
            results["lookup"][c] = [lookups(pools, a, c)]
            print(f"peers: lookup32 x{c}: " + " ".join(
                f"{k}={v['calls']:.0f}/s" for k, v in results["lookup"][c][0].items()) +
                f" (load {load_avg()})", flush=True)
        # The key rows again: more samples taken later in the same run.
        for rep in range(2, a.samples + 1):
            for row in filter(None, a.repeat.split(",")):
                for c in clients:
                    if row == "lookup32":
                        results["lookup"][c].append(lookups(pools, a, c))
                    else:
                        tag = row[3:].upper()
                        size = int(tag[:-1]) * {"K": KIB, "M": MIB}[tag[-1]]
                        if size in sizes:
                            results["cells"][(tag, c)].append(
                                put_get(pools, a, size, c, f"r{rep}"))
        for pool in pools.values():
            pool.close()
        d.stop()
        results["multiturn"] = run_multiturn(d, a, capdir)
    finally:
        d.stop()
    return report(a, results, sizes, clients, vers)


def run_multiturn(d, a, capdir):
    footprint = (a.system_tokens // a.block_tokens + a.conversations *
                 ((a.system_tokens + a.turns * (a.user_tokens + a.output_tokens))
                  // a.block_tokens - a.system_tokens // a.block_tokens)) * a.block_bytes
    print(f"peers: multiturn {a.conversations} conversations x {a.turns} turns, "
          f"{a.block_tokens}-token blocks of {a.block_bytes} B, footprint "
          f"{footprint / MIB:.0f} MiB, DRAM budget {a.mt_budget / MIB:.0f} MiB "
          f"(hybrid: {a.mt_capacity / GIB:.1f} GiB SSD)", flush=True)
    arg = dict(conversations=a.conversations, turns=a.turns, system_tokens=a.system_tokens,
               user_tokens=a.user_tokens, output_tokens=a.output_tokens,
               block_tokens=a.block_tokens, block_bytes=a.block_bytes)
    out = dict(footprint=footprint)
    cap = os.path.join(capdir, "peers-hybrid.cap")
    for name in ("hymcache", "hybrid", "mooncake", "redis"):
        try:
            if name == "hymcache":
                spec = start_hymcache(d, a, a.work, "mt-hym", dram=a.mt_budget)
            elif name == "hybrid":
                spec = start_hymcache(d, a, a.work, "mt-hybrid", hybrid=dict(
                    path=cap, capacity=a.mt_capacity, dram=a.mt_budget))
            elif name == "mooncake":
                spec = start_mooncake(d, a, a.work, "mt-mc", a.mt_budget)
            else:
                spec = start_redis(d, a, a.work, "mt-redis", a.mt_budget)
            pool = Pool(spec, 1, 8 * a.block_bytes + max(
                a.block_bytes * ((a.system_tokens + a.turns * (a.user_tokens + a.output_tokens))
                                 // a.block_tokens), 0))
            rows = pool.run("multiturn", [arg])[0]
            pool.close()
            out[name] = rows
            hits = sum(r["hits"] for r in rows)
            blocks = sum(r["blocks"] for r in rows)
            print(f"peers: multiturn {name}: hit ratio {hits / blocks:.3f} "
                  f"(load {load_avg()})", flush=True)
        finally:
            d.stop()
            if os.path.exists(cap):
                os.remove(cap)
    return out


def report(a, results, sizes, clients, vers):
    failed = set()
    print()
    shm = any("hymcache_shm" in s for ss in results["cells"].values() for s in ss)
    lmc = "lmcache" in results.get("extra", [])
    print("| workload | clients | HyMCache | Mooncake | Redis | HyMCache/Mooncake | HyMCache/Redis |"
          + (" HyMCache shm |" if shm else "") +
          (" LMCache server | HyMCache/LMCache |" if lmc else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if shm else "") + ("---|---|" if lmc else ""))

    def lmc_cells(s, h, field):
        if not lmc:
            return ""
        v = s["lmcache"][field]
        return f" {v:.0f} | {ratio(h, v):.2f} |" if field == "calls" else \
            f" {v:.2f} | {ratio(h, v):.2f} |"
    ratios = {}
    for (tag, c), samples in results["cells"].items():
        for op in ("put", "get"):
            for i, s in enumerate(samples):
                h, m, r = (s[k][op] for k in SYSTEMS)
                label = f"{op} {tag} GB/s" + (f" (repeat {i})" if i else "")
                print(f"| {label} | {c} | {h:.2f} | {m:.2f} | {r:.2f} | "
                      f"{ratio(h, m):.2f} | {ratio(h, r):.2f} |" +
                      (f" {s['hymcache_shm'][op]:.2f} |" if "hymcache_shm" in s else
                       (" |" if shm else "")) + lmc_cells(s, h, op))
            # Each system's best sample (load on the host only slows a
            # sample), then the ratio: one per client count.
            best = {k: max(s[k][op] for s in samples) for k in SYSTEMS}
            for peer in ("mooncake", "redis"):
                ratios.setdefault((op, tag, peer), []).append(
                    ratio(best["hymcache"], best[peer]))
            for k in samples[0]:
                if any(s[k]["bad"] for s in samples):
                    print(f"peers: {k} {op} {tag} x{c}: some gets returned the wrong length")
                    failed.add(k)
    for c, samples in results["lookup"].items():
        for i, s in enumerate(samples):
            h, m, r = (s[k]["calls"] for k in SYSTEMS)
            label = "lookup 32 keys, calls/s" + (f" (repeat {i})" if i else "")
            print(f"| {label} | {c} | {h:.0f} | {m:.0f} | {r:.0f} | {ratio(h, m):.2f} | "
                  f"{ratio(h, r):.2f} |" + (" |" if shm else "") + lmc_cells(s, h, "calls"))
            for k in SYSTEMS + tuple(results.get("extra", [])):
                if s[k]["bad"] or not s[k]["ops"]:
                    print(f"peers: {k} lookup x{c}: {s[k]['bad']} of {s[k]['ops']} calls missed keys")
                    failed.add(k)
        best = {k: max(s[k]["calls"] for s in samples) for k in SYSTEMS}
        ratios.setdefault(("lookup", "32", "mooncake"), []).append(
            ratio(best["hymcache"], best["mooncake"]))
    mt = results["multiturn"]
    print()
    print(f"Multi-turn replay (footprint {mt['footprint'] / MIB:.0f} MiB, DRAM budget "
          f"{a.mt_budget / MIB:.0f} MiB): prefix hit ratio / load GB/s per turn")
    names = [n for n in ("hymcache", "hybrid", "mooncake", "redis") if n in mt]
    print("| turn | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for t in range(a.turns):
        cells = []
        for n in names:
            r = mt[n][t]
            gbs = r["load_bytes"] / r["load_s"] / 1e9 if r["load_s"] > 0 else 0.0
            cells.append(f"{r['hits'] / r['blocks']:.3f} / {gbs:.2f}")
        print(f"| {t + 1} | " + " | ".join(cells) + " |")
    hit = {}
    for n in names:
        hit[n] = sum(r["hits"] for r in mt[n]) / sum(r["blocks"] for r in mt[n])
    print("| overall | " + " | ".join(f"{hit[n]:.3f}" for n in names) + " |")
    if lmc:
        print("(LMCache's cache server is not in the replay: it keeps every object, with no "
              "memory bound and no eviction, so it has no hit ratio at a budget.)")
    if "hybrid" in hit and "mooncake" in hit:
        print(f"peers: hybrid node hit ratio / Mooncake DRAM-only: "
              f"{ratio(hit['hybrid'], hit['mooncake']):.2f}")
    print(f"peers: load average {load_avg()} at end")
    print(f"peers: versions " + " ".join(f"{k}={v}" for k, v in vers.items()))
    for n in names:
        if hit[n] == 0 and a.turns > 1:
            print(f"peers: the {n} replay hit nothing")
            failed.add(n)

    def worst(key):
        v = ratios.get(key)
        return f"{min(v):.2f}" if v else "nan"
    if a.short:
        print("peers-smoke: " + " ".join(f"{k}={'FAILED' if k in failed else 'ok'}"
                                         for k in SYSTEMS + ("hybrid",)) +
              "".join(f" {k}={'FAILED' if k in failed else 'ok'}"
                      if k in results.get("extra", []) else f" {k}=not-run"
                      for k in EXTRA))
        return 1 if failed else 0
    print(f"peers: get16m_vs_mooncake={worst(('get', '16M', 'mooncake'))} "
          f"put16m_vs_mooncake={worst(('put', '16M', 'mooncake'))} "
          f"lookup32_vs_mooncake={worst(('lookup', '32', 'mooncake'))} "
          f"get1m_vs_redis={worst(('get', '1M', 'redis'))} "
          f"multiturn_hit_vs_mooncake={ratio(hit['hymcache'], hit['mooncake']):.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
