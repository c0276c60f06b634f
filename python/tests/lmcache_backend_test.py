"""hymcache.lmcache against the installed lmcache's own classes and real
daemons: LMCache's RemoteBackend loads the connector through its Remote
Storage Plugin Framework (remote_storage_plugins + extra_config), chunks
allocated from a real LocalCPUBackend go to HyMCache and back
byte-identical (a partial last chunk keeps its token count), contains
counts a prefix, and a dead node or master is a miss, never an exception.

Run by tools/engines/backends_test.sh under the lmcache venv
(tools/engines/peers_venv.sh lmcache)."""

import asyncio
import threading

import pytest
import torch

from eventually import eventually
from hymcache_cluster import Cluster

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend import CreateStorageBackends
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.remote_backend import RemoteBackend

import hymcache.lmcache

LAYERS, HEADS, DIM, CHUNK = 4, 2, 16, 16
DTYPE = torch.bfloat16


def engine_config(master, **extra):
    return LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.05,
        remote_storage_plugins=["hymcache"],
        extra_config={
            "remote_storage_plugin.hymcache.module_path": "hymcache.lmcache",
            "remote_storage_plugin.hymcache.class_name": "HyMCacheConnector",
            "remote_storage_plugin.hymcache.master": master,
            "remote_storage_plugin.hymcache.transport": "tcp",
            "remote_storage_plugin.hymcache.deadline": 2.0,
            **extra})


def engine_metadata(model="tiny-llama", worker_id=0):
    return LMCacheMetadata(
        model_name=model, world_size=2, local_world_size=2,
        worker_id=worker_id, local_worker_id=worker_id, kv_dtype=DTYPE,
        kv_shape=(LAYERS, 2, CHUNK, HEADS, DIM), chunk_size=CHUNK)


class Engine:
    """LMCache's storage backends as its storage manager builds them from
    the config (CreateStorageBackends): the local CPU backend and a
    RemoteBackend for plugin "hymcache", on an event loop thread."""

    def __init__(self, master, model="tiny-llama", worker_id=0, **extra):
        self.config = engine_config(master, **extra)
        self.metadata = engine_metadata(model, worker_id)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever,
                                       daemon=True)
        self.thread.start()
        # LMCache's own construction of its storage backends from config.
        self.backends = CreateStorageBackends(self.config, self.metadata,
                                              self.loop, dst_device="cpu")
        self.cpu = self.backends["LocalCPUBackend"]
        self.remote = self.backends["RemoteBackend-hymcache"]
        assert isinstance(self.cpu, LocalCPUBackend)
        assert isinstance(self.remote, RemoteBackend)
        assert self.remote.connection is not None

    @property
    def connector(self):
        c = self.remote.connection
        return getattr(c, "connector", None) or getattr(c, "_connector", c)

    def chunk(self, seed, tokens=CHUNK):
        shapes = self.metadata.get_shapes(tokens)
        obj = self.cpu.allocate(shapes, self.metadata.get_dtypes())
        g = torch.Generator().manual_seed(seed)
        t = obj.tensor
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
        return obj

    def close(self):
        for b in self.backends.values():
            b.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def keys_of(name, n, model="tiny-llama", worker_id=0):
    return [CacheEngineKey(model, 2, worker_id, hash((name, i)), DTYPE)
            for i in range(n)]


def put_and_wait(engine, keys, objs, timeout=30.0, release=True):
    """LMCache's batched put, waited for through its per-key completion
    callback; then drops the caller's references, as LMCache's storage
    manager does."""
    done = threading.Semaphore(0)
    engine.remote.batched_submit_put_task(
        keys, objs, on_complete_callback=lambda key: done.release())
    for _ in keys:
        assert done.acquire(timeout=timeout), "put did not finish"
    for o in objs if release else ():
        o.ref_count_down()


@pytest.fixture(scope="module")
def cluster():
    with Cluster(nodes=1) as c:
        yield c


@pytest.fixture
def engine(cluster):
    e = Engine(cluster.address)
    yield e
    e.close()


def test_lmcache_loads_the_plugin_named_in_its_config(engine):
    assert isinstance(engine.connector, RemoteConnector)
    assert type(engine.connector).__name__ == "HyMCacheConnector"


def test_chunks_round_trip_byte_identical(engine):
    keys = keys_of("round-trip", 4)
    objs = [engine.chunk(seed=i) for i in range(4)]
    want = [bytes(o.byte_array) for o in objs]
    assert engine.remote.batched_contains(keys) == 0
    put_and_wait(engine, keys, objs, release=False)
    assert engine.remote.batched_contains(keys) == 4
    for o in objs:  # scribble over the sources: the loads must not see them
        o.tensor.zero_()
        o.ref_count_down()
    got = engine.remote.batched_get_blocking(keys)
    assert all(g is not None for g in got)
    for i, g in enumerate(got):
        assert bytes(g.byte_array) == want[i], f"chunk {i}"
    one = engine.remote.get_blocking(keys[2])
    assert bytes(one.byte_array) == want[2]


def test_a_partial_last_chunk_comes_back_with_its_token_count(engine):
    keys = keys_of("partial", 2)
    objs = [engine.chunk(seed=10), engine.chunk(seed=11, tokens=5)]
    want = [bytes(o.byte_array) for o in objs]
    put_and_wait(engine, keys, objs)
    got = engine.remote.batched_get_blocking(keys)
    assert bytes(got[1].byte_array) == want[1]
    assert got[1].meta.shape == objs[1].meta.shape


def test_contains_counts_the_leading_stored_chunks(engine):
    keys = keys_of("prefix", 4)
    put_and_wait(engine, keys, [engine.chunk(seed=20 + i) for i in range(4)])
    hole = keys_of("never-stored", 1)
    assert engine.remote.batched_contains(keys) == 4
    assert engine.remote.batched_contains(keys[:2] + hole + keys[3:]) == 2
    assert engine.remote.batched_contains(hole + keys) == 0
    assert engine.remote.contains(keys[1]) is True
    assert engine.remote.contains(hole[0]) is False
    got = engine.remote.batched_get_blocking(keys[:2] + hole + keys[3:])
    assert [g is not None for g in got] == [True, True, False, False]


def test_another_model_or_worker_never_sees_the_chunks(cluster, engine):
    keys = keys_of("namespace", 2)
    put_and_wait(engine, keys, [engine.chunk(seed=30 + i) for i in range(2)])
    assert engine.remote.batched_contains(keys) == 2
    assert engine.remote.batched_contains(
        keys_of("namespace", 2, worker_id=1)) == 0
    assert engine.remote.batched_contains(
        keys_of("namespace", 2, model="other")) == 0


def test_a_dead_node_is_a_miss_not_an_exception():
    with Cluster(nodes=1) as c:
        e = Engine(c.address)
        try:
            keys = keys_of("dead-node", 3)
            put_and_wait(e, keys, [e.chunk(seed=40 + i) for i in range(3)])
            assert e.remote.batched_contains(keys) == 3
            c.nodes["node-0"].kill()
            assert e.remote.batched_get_blocking(keys) == [None] * 3
            later = keys_of("after-death", 1)
            assert e.connector.batched_put_sync(later, [e.chunk(seed=43)]) \
                == [False]
        finally:
            e.close()


def test_an_unreachable_master_is_a_miss_not_an_exception():
    with Cluster(nodes=1) as c:
        e = Engine(c.address, **{"remote_storage_plugin.hymcache.deadline":
                                 0.5})
        try:
            keys = keys_of("dead-master", 2)
            put_and_wait(e, keys, [e.chunk(seed=50 + i) for i in range(2)])
            c.master.kill()
            assert e.remote.batched_contains(keys) == 0
            assert e.remote.contains(keys[0]) is False
            assert e.remote.batched_get_blocking(keys) == [None, None]
            assert e.connector.batched_put_sync(
                keys_of("later", 1), [e.chunk(seed=52)]) == [False]
            assert e.connector.remove_sync(keys[0]) is False
            assert e.connector.errors >= 3
        finally:
            e.close()


# LMCacheEngine end to end ----------------------------------------------


def cpu_kv_connector(kv):
    """LMCache's MockGPUConnector (its standalone mode's) moving real bytes
    between `kv`, a CPU stand-in for the engine's paged KV cache shaped
    [2, layers, tokens, heads * dim] like a KV_2LTD chunk, and LMCache's
    MemoryObjs. The GPU is the one piece this machine lacks."""
    from lmcache.v1.gpu_connector.mock_gpu_connector import MockGPUConnector

    class CpuKV(MockGPUConnector):
        def from_gpu(self, memory_obj, start, end, **kwargs):
            memory_obj.tensor.copy_(kv[:, :, start:end])

        def to_gpu(self, memory_obj, start, end, **kwargs):
            kv[:, :, start:end].copy_(memory_obj.tensor)

        def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
            for o, s, e in zip(memory_objs, starts, ends):
                self.from_gpu(o, s, e)

        def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
            for o, s, e in zip(memory_objs, starts, ends):
                self.to_gpu(o, s, e)

    return CpuKV(kv_shape=(LAYERS, 2, CHUNK, HEADS, DIM))


def lmcache_engine(instance_id, master, kv):
    from lmcache.utils import mock_up_broadcast_fn, mock_up_broadcast_object_fn
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    config = engine_config(master)
    config.lmcache_instance_id = instance_id
    metadata = LMCacheMetadata(
        model_name="tiny-llama", world_size=1, local_world_size=1,
        worker_id=0, local_worker_id=0, kv_dtype=DTYPE,
        kv_shape=(LAYERS, 2, CHUNK, HEADS, DIM), chunk_size=CHUNK)
    engine = LMCacheEngineBuilder.get_or_create(
        instance_id, config, metadata, cpu_kv_connector(kv),
        mock_up_broadcast_fn, mock_up_broadcast_object_fn)
    engine.post_init()
    return engine


def test_an_lmcache_engine_retrieves_what_another_stored_in_hymcache(
        cluster):
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    n = 5 * CHUNK + 3  # five full chunks and a partial one
    tokens = torch.arange(1000, 1000 + n)
    g = torch.Generator().manual_seed(60)
    src = torch.randn(2, LAYERS, n, HEADS * DIM, generator=g).to(DTYPE)
    writer = lmcache_engine("hymcache-writer", cluster.address, src.clone())
    dst = torch.zeros_like(src)
    reader = lmcache_engine("hymcache-reader", cluster.address, dst)
    try:
        writer.store(tokens)
        # The remote puts are asynchronous: wait until the reader's lookup
        # (its local CPU cache is empty: HyMCache answers) sees them.
        assert eventually(lambda: reader.lookup(tokens) >= 5 * CHUNK,
                          timeout=30), reader.lookup(tokens)
        got = reader.retrieve(tokens)
        hit = int(got.sum())
        assert hit >= 5 * CHUNK
        assert torch.equal(dst[:, :, :hit], src[:, :, :hit])
        # Another conversation sharing the first three chunks.
        other = torch.cat([tokens[:3 * CHUNK], torch.arange(5000, 5000 + 40)])
        assert reader.lookup(other) == 3 * CHUNK
        # Nothing is shared inside the process: an engine on an empty
        # cluster finds none of it.
        with Cluster(nodes=1) as empty:
            third = lmcache_engine("hymcache-third", empty.address,
                                   torch.zeros_like(src))
            assert third.lookup(tokens) == 0
    finally:
        for name in ("hymcache-writer", "hymcache-reader", "hymcache-third"):
            LMCacheEngineBuilder.destroy(name)
