"""The hymcache Python package against real daemons (master and storage
nodes on 127.0.0.1, port 0): round trips through numpy, bytearray,
memoryview and DLPack, in-place loads, key parity with the C++ SDK, the
errors a caller can make, deadlines, a node dying mid-load, and the store
future."""

import gc
import hashlib
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import sanitizer_runtime

sanitizer_runtime.reexec_if_needed()  # before hymcache loads the extension

import hymcache  # noqa: E402
from hymcache_cluster import (Cluster, Etcd, runfile,  # noqa: E402
                              store_until_stored)

BLOCK = 4096


def pattern(i, n=BLOCK):
    """Block i's bytes: (i * 131 + j) % 251, as tools/bench/sdk_load_bench."""
    return ((np.arange(n, dtype=np.uint32) + i * 131) % 251).astype(np.uint8)


def chain(name, blocks, block_tokens=16):
    return hymcache.keys(list(range(1, blocks * block_tokens + 1)),
                         model=name, block_tokens=block_tokens)


@pytest.fixture(scope="module")
def cluster():
    with Cluster(nodes=1) as c:
        yield c


@pytest.fixture(params=["tcp", "auto"])
def client(cluster, request):
    with hymcache.Client([cluster.address], transport=request.param) as c:
        yield c


def stored_chain(client, name, blocks=4):
    keys = chain(name, blocks)
    data = [pattern(i) for i in range(blocks)]
    store_until_stored(client, keys, data)
    return keys, data


# Keys ------------------------------------------------------------------

def test_keys_follow_the_namespace_and_the_chain():
    tokens = list(range(1, 16 * 3 + 5))  # 3 full blocks and a partial one
    kb = hymcache.KeyBuilder(model="m", dtype="bf16", layout="L",
                             block_tokens=16)
    keys = kb.keys(tokens)
    assert len(keys) == 3 and all(len(k) == 32 for k in keys)
    assert kb.keys(np.array(tokens, dtype=np.int32)) == keys
    assert kb.keys(np.array(tokens, dtype=np.int64)) == keys
    assert kb.keys(tokens[16:], parent=keys[0]) == keys[1:]
    assert hymcache.keys(tokens, model="m", dtype="bf16", layout="L",
                         block_tokens=16) == keys
    for other in (dict(tp_rank=1, tp_size=2), dict(salt="tenant-b"),
                  dict(dtype="fp8")):
        args = dict(model="m", dtype="bf16", layout="L", block_tokens=16)
        args.update(other)
        assert hymcache.keys(tokens, **args)[0] != keys[0], other
    assert len(hymcache.key_to_hex(keys[0])) == 64
    with pytest.raises(hymcache.InvalidArgument):
        hymcache.KeyBuilder(tp_rank=2, tp_size=2)
    with pytest.raises(hymcache.InvalidArgument):
        hymcache.KeyBuilder(block_tokens=0)
    with pytest.raises(hymcache.InvalidArgument, match="int32"):
        kb.keys([2 ** 40] * 16)


def test_cxx_sdk_loads_what_python_stored(cluster):
    """Key parity: the C++ BlockKeyBuilder over the same namespace finds
    the blocks the Python KeyBuilder named, with their bytes."""
    ns = dict(model="parity", dtype="bf16", layout="NHD/2x4", tp_rank=1,
              tp_size=2, salt="s", block_tokens=8)
    keys = hymcache.keys(list(range(1, 3 * 8 + 1)), **ns)
    with hymcache.Client([cluster.address]) as c:
        store_until_stored(c, keys, [pattern(i) for i in range(3)])
    flags = [f"--{k}={v}" for k, v in ns.items()]
    run = subprocess.run(
        [runfile("tools/bench/sdk_load_bench"), f"--master={cluster.address}",
         "--blocks=3", f"--block_bytes={BLOCK}", "--iterations=1", *flags],
        capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "loaded=3" in run.stdout
    wrong = subprocess.run(
        [runfile("tools/bench/sdk_load_bench"), f"--master={cluster.address}",
         "--blocks=3", f"--block_bytes={BLOCK}", "--iterations=1",
         *flags, "--tp_rank=0"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and "loaded 0 of 3" in wrong.stderr


# Round trips -------------------------------------------------------------

def test_round_trip_through_every_buffer_kind(client, request):
    keys, data = stored_chain(client, request.node.name, blocks=4)
    pool = np.zeros((4, BLOCK), np.uint8)
    assert client.load(keys, list(pool)).loaded == 4
    assert (pool == np.stack(data)).all()

    arrays = [np.zeros(BLOCK // 2, np.float16) for _ in range(4)]
    got = client.load(keys, arrays)
    assert got.loaded == 4 and got.lengths == [BLOCK] * 4
    assert got.bytes == 4 * BLOCK and got.stop_reason is None
    for a, d in zip(arrays, data):
        assert a.tobytes() == d.tobytes()

    raw = [bytearray(BLOCK) for _ in range(4)]
    assert client.load(keys, raw).loaded == 4
    assert [bytes(r) for r in raw] == [d.tobytes() for d in data]

    backing = bytearray(4 * BLOCK + 100)
    views = [memoryview(backing)[100 + i * BLOCK:100 + (i + 1) * BLOCK]
             for i in range(4)]
    assert client.load(keys, views).loaded == 4
    assert bytes(backing[100:]) == b"".join(d.tobytes() for d in data)
    assert bytes(backing[:100]) == bytes(100)


def test_load_writes_into_the_callers_pool_in_place(client, request):
    keys, data = stored_chain(client, request.node.name, blocks=3)
    pool = np.full((8, BLOCK), 0xEE, np.uint8)
    address = pool.ctypes.data
    slots = [5, 1, 6]  # blocks land in the pool pages an engine hands out
    got = client.load(keys, [pool[s] for s in slots])
    assert got.loaded == 3
    assert pool.ctypes.data == address
    for s, d in zip(slots, data):
        assert (pool[s] == d).all()
    untouched = [s for s in range(8) if s not in slots]
    assert (pool[untouched] == 0xEE).all()


class DlpackOnly:
    """A tensor that speaks DLPack only (as a torch CPU tensor does)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_tensors_load_in_place_and_store(client, request):
    keys, data = stored_chain(client, request.node.name, blocks=2)
    targets = [np.zeros(BLOCK // 4, np.int32) for _ in range(2)]
    got = client.load(keys, [DlpackOnly(t) for t in targets])
    assert got.loaded == 2
    assert [t.tobytes() for t in targets] == [d.tobytes() for d in data]

    more = chain(request.node.name + "-dl-store", 2)
    src = [DlpackOnly(pattern(i + 7)) for i in range(2)]
    assert client.store(more, src).result().stored == 2
    out = [bytearray(BLOCK) for _ in range(2)]
    assert client.load(more, out).loaded == 2
    assert bytes(out[1]) == pattern(8).tobytes()


# Errors --------------------------------------------------------------------

def test_bad_buffers_are_refused_with_a_clear_error(client, request):
    keys, _ = stored_chain(client, request.node.name, blocks=1)
    cases = {
        "read-only": [b"\0" * BLOCK],
        "read-only ": [np.zeros(BLOCK, np.uint8)],
        "not contiguous": [np.zeros((2, BLOCK), np.uint8)[:, ::2]],
        "not plain data": [np.zeros(BLOCK // 8, object)],
        "neither the buffer protocol": [12345],
    }
    cases["read-only "][0].setflags(write=False)
    for why, buffers in cases.items():
        with pytest.raises(hymcache.InvalidArgument, match=why.strip()):
            client.load(keys, buffers)
    with pytest.raises(hymcache.InvalidArgument, match="1 keys but 2 buffers"):
        client.load(keys, [bytearray(BLOCK)] * 2)
    with pytest.raises(hymcache.InvalidArgument):
        client.load([], [])
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError too
        client.load(keys, [b"x"])
    with pytest.raises(hymcache.InvalidArgument, match="deadline"):
        client.load(keys, [bytearray(BLOCK)], deadline=-1)


def test_a_buffer_too_small_ends_the_loaded_prefix(client, request):
    keys, data = stored_chain(client, request.node.name, blocks=3)
    bufs = [bytearray(BLOCK), bytearray(BLOCK - 1), bytearray(BLOCK)]
    got = client.load(keys, bufs)
    assert got.loaded == 1
    assert isinstance(got.stop_reason, hymcache.OutOfRange)
    assert bytes(bufs[0]) == data[0].tobytes()


def test_a_miss_ends_the_loaded_prefix(client, request):
    keys = chain(request.node.name, 4)
    data = [pattern(i) for i in range(2)]
    store_until_stored(client, keys[:2], data)
    got = client.load(keys, [bytearray(BLOCK) for _ in keys])
    assert (got.loaded, got.hit_prefix) == (2, 2)
    assert isinstance(got.stop_reason, hymcache.NotFound)


def test_a_client_given_only_etcd_reaches_the_leader_it_names(request):
    with Etcd() as etcd, Cluster(nodes=1, etcd=etcd.endpoint,
                                 cluster_name="pytest") as cluster:
        with hymcache.Client(etcd=etcd.endpoint, cluster="pytest",
                             transport="tcp") as c:
            keys, data = stored_chain(c, request.node.name)
            pool = np.zeros((len(keys), BLOCK), np.uint8)
            assert c.load(keys, list(pool)).loaded == len(keys)
            assert (pool == np.stack(data)).all()
            assert [n["name"] for n in c.stats()["nodes"]] == ["node-0"]
        # A list of endpoints works the same; the master's address too.
        with hymcache.Client([cluster.address], etcd=[etcd.endpoint],
                             cluster="pytest", transport="tcp") as c:
            assert c.lookup(keys)["hit_prefix"] == len(keys)
        # A cluster nobody leads: calls wait for a leader within their
        # deadline, then raise Unavailable.
        with hymcache.Client(etcd=etcd.endpoint, cluster="nobody",
                             deadline=1.0) as c:
            with pytest.raises(hymcache.Unavailable):
                c.lookup(keys)
    with pytest.raises(hymcache.InvalidArgument, match="at least one"):
        hymcache.Client()
    with pytest.raises(hymcache.InvalidArgument, match="not one host:port"):
        hymcache.Client(etcd=["127.0.0.1:1,127.0.0.1:2"])


def test_options_and_closed_clients(cluster):
    with pytest.raises(hymcache.InvalidArgument, match="at least one"):
        hymcache.Client([])
    with pytest.raises(hymcache.InvalidArgument, match="not one host:port"):
        hymcache.Client(["127.0.0.1:1,127.0.0.1:2"])
    # Several masters, the first one down: calls go on to the next.
    several = hymcache.Client(["127.0.0.1:1", cluster.address], deadline=5.0)
    assert several.stats()["nodes"]
    several.close()
    several = hymcache.Client("127.0.0.1:1," + cluster.address, deadline=5.0)
    assert several.stats()["nodes"]
    several.close()
    with pytest.raises(hymcache.InvalidArgument, match="transport"):
        hymcache.Client(cluster.address, transport="carrier-pigeon")
    with pytest.raises(hymcache.InvalidArgument):
        hymcache.Client("no-port")
    down = hymcache.Client("127.0.0.1:1", deadline=1.0)
    with pytest.raises(hymcache.Unavailable):
        down.lookup([b"k"])
    down.close()
    down.close()
    with pytest.raises(hymcache.FailedPrecondition, match="closed"):
        down.load([b"k"], [bytearray(1)])


def test_lookups_from_threads_over_several_master_connections(cluster,
                                                              request):
    with pytest.raises(hymcache.InvalidArgument, match="master_connections"):
        hymcache.Client(cluster.address, master_connections=0)
    with pytest.raises(hymcache.InvalidArgument, match="grpc_poll_strategy"):
        hymcache.Client(cluster.address, grpc_poll_strategy="epollex")
    with hymcache.Client(cluster.address, transport="tcp") as c:
        keys, data = stored_chain(c, request.node.name)
    # A fresh interpreter, where nothing started gRPC yet: the poll strategy
    # applies (asked for, or by default), and threads look up over
    # connections of their own. An operator's GRPC_POLL_STRATEGY stays.
    for kwargs, env_strategy, want in [
            ("master_connections=4, grpc_poll_strategy='poll'", None, "poll"),
            ("", None, "poll"),
            ("", "epoll1", "epoll1")]:
        script = (
            "import ctypes, hashlib, threading, hymcache\n"
            f"keys = {keys!r}\n"
            f"c = hymcache.Client({cluster.address!r}, {kwargs})\n"
            "bad = []\n"
            "def run():\n"
            "    for _ in range(50):\n"
            "        if c.lookup(keys)['found'] != [True] * len(keys):\n"
            "            bad.append(1)\n"
            "threads = [threading.Thread(target=run) for _ in range(4)]\n"
            "[t.start() for t in threads]\n"
            "[t.join() for t in threads]\n"
            "assert not bad, bad\n"
            # Loads and stores run on this gRPC too.
            f"bufs = [bytearray({len(data[0])}) for _ in keys]\n"
            "r = c.load(keys, bufs)\n"
            "assert r.loaded == len(keys), r\n"
            f"new = [keys[-1] + b'-{want}-' + {kwargs!r}.encode()]\n"
            "assert c.store(new, [bufs[0]]).result().stored == 1\n"
            "assert c.lookup(new)['found'] == [True]\n"
            "c.close()\n"
            # The strategy gRPC runs with, by its own word (a C++ symbol:
            # grpc_get_poll_strategy_name()).
            "grpc = ctypes.CDLL('libgrpc.so.29')\n"
            "name = grpc._Z27grpc_get_poll_strategy_namev\n"
            "name.restype = ctypes.c_char_p\n"
            "print(name().decode())\n"
            # Taken back from the environment once gRPC runs (processes
            # this one starts choose their own); an operator's stays.
            "libc = ctypes.CDLL(None)\n"
            "libc.getenv.restype = ctypes.c_char_p\n"
            "print((libc.getenv(b'GRPC_POLL_STRATEGY') or b'-').decode())\n"
            "print(hashlib.sha256(b''.join(bufs)).hexdigest())\n")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        env.pop("GRPC_POLL_STRATEGY", None)
        if env_strategy:
            env["GRPC_POLL_STRATEGY"] = env_strategy
        run = subprocess.run([sys.executable, "-c", script],
                             capture_output=True, text=True, timeout=60,
                             env=env)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == [
            want, env_strategy or "-",
            hashlib.sha256(b"".join(data)).hexdigest()], (kwargs, env_strategy)


def test_deadline_returns_a_partial_load_with_the_gil_released(request):
    with Cluster(nodes=1) as cluster, \
            hymcache.Client(cluster.address, transport="tcp") as c:
        keys = chain(request.node.name, 2)
        store_until_stored(c, keys, [pattern(i) for i in range(2)])
        spins = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                spins[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        # What the spinning thread does in 0.1 s while this one sleeps.
        before = spins[0]
        time.sleep(0.1)
        per_100ms = spins[0] - before
        node = cluster.nodes["node-0"]
        node.pause()
        try:
            before = spins[0]
            start = time.monotonic()
            got = c.load(keys, [bytearray(BLOCK) for _ in keys], deadline=0.5)
            took = time.monotonic() - start
            during = spins[0] - before
        finally:
            node.resume()
            stop.set()
            t.join()
        assert got.loaded == 0
        assert isinstance(got.stop_reason, hymcache.DeadlineExceeded)
        assert 0.4 < took < 5
        # Another Python thread ran all through the 0.5 s load (with the GIL
        # held it would get a switch interval or two, 5 ms each).
        assert during > per_100ms, (during, per_100ms)
        # The node is back: the same load completes.
        assert c.load(keys, [bytearray(BLOCK) for _ in keys]).loaded == 2


def test_close_while_another_thread_loads(request):
    with Cluster(nodes=1) as cluster:
        c = hymcache.Client(cluster.address, transport="tcp")
        keys = chain(request.node.name, 2)
        store_until_stored(c, keys, [pattern(i) for i in range(2)])
        node = cluster.nodes["node-0"]
        node.pause()
        results = []
        started = threading.Event()

        def load():
            started.set()
            results.append(c.load(keys, [bytearray(BLOCK) for _ in keys],
                                  deadline=1.5))

        loading = threading.Thread(target=load)
        try:
            loading.start()
            started.wait()
            time.sleep(0.2)  # the load is waiting on the stopped node
            c.close()        # does not pull the client from under it
            assert loading.is_alive()  # and does not wait for the load
            loading.join()
        finally:
            node.resume()
        assert results[0].loaded == 0
        assert isinstance(results[0].stop_reason, hymcache.DeadlineExceeded)
        with pytest.raises(hymcache.FailedPrecondition):
            c.lookup(keys)


def test_a_client_left_open_at_exit_finishes_its_store(request):
    """The interpreter exits with a client that was never closed and a
    store in flight: no crash, and the store completes."""
    with Cluster(nodes=1) as cluster:
        keys = chain(request.node.name, 1)
        with hymcache.Client(cluster.address) as c:
            store_until_stored(c, chain("warm", 1), [pattern(0)])
        script = (
            "import hymcache\n"
            f"c = hymcache.Client({cluster.address!r})\n"
            f"f = c.store([{keys[0]!r}], [bytearray({BLOCK})])\n")
        run = subprocess.run([sys.executable, "-c", script],
                             capture_output=True, text=True, timeout=60,
                             env=dict(os.environ,
                                      PYTHONPATH=os.pathsep.join(sys.path)))
        assert run.returncode == 0, run.stderr
        with hymcache.Client(cluster.address) as c:
            assert c.lookup(keys)["found"] == [True]


def test_a_node_dying_mid_load_gives_the_prefix_not_an_exception(request):
    with Cluster(nodes=2) as cluster, \
            hymcache.Client(cluster.address, transport="tcp") as c:
        keys = chain(request.node.name, 8)
        data = [pattern(i) for i in range(8)]
        first = store_until_stored(c, keys[:4], data[:4])
        head_node = cluster.node_name(c, first.node_id)
        cluster.hymctl("drain", head_node)
        rest = store_until_stored(c, keys[4:], data[4:], parent_key=keys[3])
        assert rest.node_id != first.node_id
        cluster.nodes[cluster.node_name(c, rest.node_id)].kill()

        bufs = [bytearray(BLOCK) for _ in keys]
        got = c.load(keys, bufs, deadline=5)
        assert got.loaded == 4
        assert isinstance(got.stop_reason,
                          (hymcache.Unavailable, hymcache.NotFound))
        assert [bytes(b) for b in bufs[:4]] == [d.tobytes() for d in data[:4]]
        assert bufs[4] == bytearray(BLOCK)


# Store future --------------------------------------------------------------

def test_store_future_reports_stored_and_skipped(client, request):
    keys = chain(request.node.name, 3)
    data = [pattern(i) for i in range(3)]
    f = client.store(keys, data)
    r = f.result(timeout=10)
    assert f.done()
    assert (r.stored, r.skipped, r.failed) == (3, 0, 0)
    assert r.outcomes == ["stored"] * 3 and r.errors == [None] * 3
    assert f.result().stored == 3  # the result stays
    again = client.store(keys, data).result()
    assert again.skipped == 3 and again.outcomes == ["already_stored"] * 3
    # Whole-call errors arrive through the future.
    with pytest.raises(hymcache.InvalidArgument):
        client.store([keys[0]], [b""]).result()
    # Read-only buffers are fine to store from.
    more = chain(request.node.name + "-ro", 1)
    assert client.store(more, [pattern(9).tobytes()]).result().stored == 1


def test_store_lookup_remove_stats(client, request):
    keys, _ = stored_chain(client, request.node.name, blocks=3)
    found = client.lookup(keys + chain(request.node.name + "-none", 1))
    assert found["found"] == [True, True, True, False]
    assert found["hit_prefix"] == 3 and found["lengths"][:3] == [BLOCK] * 3
    # The existence check finds the same, and hit_prefix counts its lead.
    exists = client.exists(keys + chain(request.node.name + "-none", 1))
    assert exists == [True, True, True, False]
    assert hymcache.hit_prefix(exists) == 3
    assert hymcache.hit_prefix([False, True]) == 0
    with pytest.raises(hymcache.InvalidArgument):
        client.exists([])
    assert client.remove(keys[1:]) == [True, True]
    assert client.lookup(keys)["found"] == [True, False, False]
    assert client.exists(keys) == [True, False, False]
    stats = client.stats()
    assert stats["nodes"] and all(n["alive"] for n in stats["nodes"])
    assert stats["object_count"] >= 1
    # Every cluster stat of common/cluster_stats.h, the ones added last too.
    assert stats["nodes_alive"] == sum(n["alive"] for n in stats["nodes"])
    assert "reconcile_unlisted_extents" in stats
    assert stats["index_bytes_per_entry"] > 0


def test_think_time_hints_are_advice(client, request):
    keys, data = stored_chain(client, request.node.name, blocks=3)
    assert client.hint_next_turn(keys, expected_in=2.5, hold=30) is True
    assert client.hint_next_turn(keys) is True
    assert client.hint_conversation_ended(keys) is True
    with pytest.raises(hymcache.InvalidArgument):
        client.hint_next_turn([])
    with pytest.raises(hymcache.InvalidArgument):
        client.hint_next_turn(keys, hold=0)
    with pytest.raises(hymcache.InvalidArgument):
        client.hint_next_turn(keys, expected_in=-1)
    # The hinted chain loads as before.
    pool = [bytearray(BLOCK) for _ in keys]
    assert client.load(keys, pool).loaded == 3
    assert [bytes(p) for p in pool] == [d.tobytes() for d in data]


def test_prefix_query_names_the_nodes_and_the_engines_that_report(
        client, request):
    keys, _ = stored_chain(client, request.node.name, blocks=3)
    engine = request.node.name[-100:]
    assert client.report_engine_blocks(engine, stored=keys[:2]) == (2, 60.0)
    q = client.prefix_query(keys + chain("other", 1))
    assert q["hit_prefix_length"] == 3
    assert [n["longest_prefix"] for n in q["nodes"]] == [3]
    assert {"engine_id": engine, "longest_prefix": 2} in q["engines"]
    # Applied in order: cleared, removed, stored.
    assert client.report_engine_blocks(engine, stored=keys[1:],
                                       removed=keys[:1], cleared=True)[0] == 2
    assert all(e["engine_id"] != engine
               for e in client.prefix_query(keys)["engines"])
    with pytest.raises(hymcache.InvalidArgument):
        client.report_engine_blocks("")
    with pytest.raises(hymcache.InvalidArgument):
        client.prefix_query([])


def test_store_holds_its_buffers_until_done(request):
    with Cluster(nodes=1) as cluster, \
            hymcache.Client(cluster.address, transport="tcp") as c:
        store_until_stored(c, chain("warm", 1), [pattern(0)])
        keys = chain(request.node.name, 2)
        node = cluster.nodes["node-0"]
        node.pause()
        try:
            src = [bytearray(pattern(i).tobytes()) for i in range(2)]
            held = src[0]
            f = c.store(keys, src)
            with pytest.raises(hymcache.DeadlineExceeded):
                f.result(timeout=0.05)
            assert not f.done() and c.pending_stores() == 1
            with pytest.raises(BufferError):  # exported to the store
                held.extend(b"x")
            del src, held
            gc.collect()
        finally:
            node.resume()
        assert f.result(timeout=10).stored == 2
        assert c.pending_stores() == 0
        out = [bytearray(BLOCK) for _ in keys]
        assert c.load(keys, out).loaded == 2
        assert bytes(out[1]) == pattern(1).tobytes()


def test_register_buffer(client, request):
    keys, data = stored_chain(client, request.node.name, blocks=2)
    pool = np.zeros((2, BLOCK), np.uint8)
    client.register_buffer(pool)
    assert client.load(keys, list(pool)).loaded == 2
    assert (pool[1] == data[1]).all()
    client.unregister_buffer(pool)
    with pytest.raises(hymcache.NotFound):
        client.unregister_buffer(pool)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"] +
                         sys.argv[1:]))


def test_type_stub_defaults_match_the_extension():
    """Every default __init__.pyi declares for Client's methods is the one
    the extension takes (pybind11's signature line names each), so an
    editor's hints cannot drift from the code."""
    import ast
    stub = os.path.join(os.path.dirname(hymcache.__file__), "__init__.pyi")
    with open(stub) as f:
        tree = ast.parse(f.read())
    client = next(n for n in tree.body
                  if isinstance(n, ast.ClassDef) and n.name == "Client")
    checked = 0
    for fn in client.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        doc = getattr(hymcache.Client, fn.name).__doc__ or ""
        signature = doc.split("\n")[0] if "->" in doc else doc
        args = fn.args
        pairs = list(zip(args.args[len(args.args) - len(args.defaults):],
                         args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults)
                  if d is not None]
        for arg, default in pairs:
            value = ast.literal_eval(default)
            want = f"{arg.arg}: "
            assert want in signature, (fn.name, arg.arg, signature)
            declared = signature.split(want, 1)[1].split(",")[0]
            declared = declared.split(")")[0] if declared.count(")") > \
                declared.count("(") else declared
            assert declared.endswith(f"= {value!r}"), (fn.name, arg.arg,
                                                       declared, value)
            checked += 1
    assert checked >= 15, checked


def test_errors_carry_the_machine_readable_reason():
    e = hymcache.errors._from_status(8, "queue full", "store_queue_full")
    assert isinstance(e, hymcache.ResourceExhausted)
    assert e.reason == "store_queue_full"
    assert e.message == "queue full"
    assert hymcache.errors._from_status(5, "gone").reason == "none"
