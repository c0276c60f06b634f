"""hymcache.sglang against the installed sglang's own classes and real
daemons: SGLang's StorageBackendFactory loads the backend as a dynamic
backend, pages of a real MHATokenToKVPoolHost (page_first and layer_first)
go to HyMCache and back through batch_set_v1 / batch_get_v1 (no copies) and
through the older batch_set / batch_get, batch_exists counts a prefix, and
a dead node or master is a miss, never an exception.

Run by tools/engines/backends_test.sh under the sglang venv
(tools/engines/peers_venv.sh sglang)."""

import pytest
import torch

from hymcache_cluster import Cluster

from sglang.srt.mem_cache.device_pool_info import (KVBufferLayout, KVBuffers,
                                                   MHABufferInfo, MLABufferInfo)
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage,
                                                  HiCacheStorageConfig,
                                                  HiCacheStorageExtraInfo)
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

import hymcache.sglang

LAYERS, HEADS, DIM, PAGE = 4, 2, 16, 8
TOKENS = 16 * PAGE  # device pool


def make_host_pool(layout, dtype=torch.bfloat16):
    """A real SGLang host pool over a CPU 'device' pool of TOKENS tokens."""
    k = tuple(torch.zeros(TOKENS + PAGE, HEADS, DIM, dtype=dtype)
              for _ in range(LAYERS))
    v = tuple(torch.zeros(TOKENS + PAGE, HEADS, DIM, dtype=dtype)
              for _ in range(LAYERS))
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts],
                                   dtype=torch.uint64)
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                          layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=HEADS, head_dim=DIM, v_head_dim=DIM,
        dtype=dtype, device=torch.device("cpu"))
    return MHATokenToKVPoolHost(
        info, host_to_device_ratio=2.0, host_size=0, page_size=PAGE,
        layout=layout, pin_memory=False, device="cpu",
        device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS)


def make_mla_host_pool(dtype=torch.bfloat16):
    """A real SGLang MLA host pool (one latent row per token and layer)."""
    width = 48
    bufs = tuple(torch.zeros(TOKENS + PAGE, 1, width, dtype=dtype)
                 for _ in range(LAYERS))
    info = MLABufferInfo(
        buffers=bufs,
        data_ptrs=torch.tensor([b.data_ptr() for b in bufs],
                               dtype=torch.uint64),
        layer_indices=tuple(range(LAYERS)), device_layer_num=LAYERS,
        page_size=PAGE, kv_lora_rank=32, qk_rope_head_dim=16,
        kv_cache_dim=width, dtype=dtype, device=torch.device("cpu"))
    return MLATokenToKVPoolHost(
        info, host_to_device_ratio=2.0, host_size=0, page_size=PAGE,
        layout="page_first", pin_memory=False, device="cpu",
        device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS,
        target_layer_num=LAYERS)


def storage_config(master, *, tp_rank=0, model="tiny-llama", v1=True,
                   mla=False, **extra):
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=True, model_name=model,
        extra_config={"backend_name": "hymcache",
                      "module_path": "hymcache.sglang",
                      "class_name": "HyMCacheStorage",
                      "interface_v1": 1 if v1 else 0, "master": master,
                      "transport": "tcp", "deadline": 2.0, **extra})


def make_backend(master, pool, **kw):
    """The backend as SGLang's cache controller makes it."""
    backend = StorageBackendFactory.create_backend(
        "dynamic", storage_config(master, **kw), pool)
    backend.register_mem_pool_host(pool)
    return backend


def fill_pages(pool, first_page, count, seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.arange(first_page * PAGE, (first_page + count) * PAGE,
                       dtype=torch.int64)
    for p in range(count):
        page = pool.get_data_page(int(idx[p * PAGE]), flat=True)
        data = torch.randn(page.numel(), generator=g).to(pool.dtype)
        pool.set_from_flat_data_page(int(idx[p * PAGE]), data)
    return idx


def page_bytes(pool, idx):
    return [pool.get_data_page(int(idx[p * PAGE]), flat=True)
            .view(torch.uint8).clone() for p in range(len(idx) // PAGE)]


def page_keys(name, n):
    return [f"{name}-{i:04d}" for i in range(n)]


@pytest.fixture(scope="module")
def cluster():
    with Cluster(nodes=1) as c:
        yield c


def test_the_factory_loads_the_backend_named_in_extra_config(cluster):
    pool = make_host_pool("page_first")
    backend = make_backend(cluster.address, pool)
    assert isinstance(backend, HiCacheStorage)
    assert type(backend).__name__ == "HyMCacheStorage"
    assert backend.mem_pool_host is pool


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_pages_round_trip_byte_identical_through_the_v1_interface(
        cluster, layout):
    pool = make_host_pool(layout)
    backend = make_backend(cluster.address, pool)
    keys = page_keys(f"v1-{layout}", 5)
    src = fill_pages(pool, 0, 5, seed=1)
    want = page_bytes(pool, src)

    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, src) == [True] * 5
    assert backend.batch_exists(keys) == 5

    dst = torch.arange(8 * PAGE, 13 * PAGE, dtype=torch.int64)
    assert backend.batch_get_v1(keys, dst) == [True] * 5
    got = page_bytes(pool, dst)
    for p in range(5):
        assert torch.equal(got[p], want[p]), f"page {p}"


def test_v1_loads_land_in_the_host_pool_pages_themselves(cluster):
    pool = make_host_pool("page_first")
    backend = make_backend(cluster.address, pool)
    keys = page_keys("inplace", 2)
    src = fill_pages(pool, 0, 2, seed=2)
    assert backend.batch_set_v1(keys, src) == [True, True]
    dst = torch.arange(4 * PAGE, 6 * PAGE, dtype=torch.int64)
    before = pool.kv_buffer.data_ptr()
    assert backend.batch_get_v1(keys, dst) == [True, True]
    assert pool.kv_buffer.data_ptr() == before
    assert torch.equal(pool.kv_buffer[:, 4 * PAGE:6 * PAGE],
                       pool.kv_buffer[:, 0:2 * PAGE])


def test_batch_exists_counts_the_leading_stored_pages(cluster):
    pool = make_host_pool("page_first")
    backend = make_backend(cluster.address, pool)
    keys = page_keys("prefix", 4)
    src = fill_pages(pool, 0, 4, seed=3)
    assert all(backend.batch_set_v1(keys, src))
    assert backend.batch_exists(keys) == 4
    assert backend.batch_exists(keys[:2] + ["never-stored"] + keys[3:]) == 2
    assert backend.batch_exists(["never-stored"] + keys) == 0
    assert backend.exists(keys[0]) and not backend.exists("never-stored")
    # A load of a chain with a hole lands the prefix and reports it.
    dst = torch.arange(8 * PAGE, 12 * PAGE, dtype=torch.int64)
    assert backend.batch_get_v1(keys[:2] + ["never-stored", keys[3]],
                                dst) == [True, True, False, False]


def test_later_batches_chain_on_the_prefix_keys(cluster):
    pool = make_host_pool("page_first")
    backend = make_backend(cluster.address, pool)
    keys = page_keys("chained", 6)
    src = fill_pages(pool, 0, 6, seed=4)
    assert all(backend.batch_set_v1(keys[:3], src[:3 * PAGE]))
    assert all(backend.batch_set_v1(
        keys[3:], src[3 * PAGE:],
        HiCacheStorageExtraInfo(prefix_keys=keys[:3])))
    assert backend.batch_exists(keys) == 6


def test_pages_round_trip_through_the_copying_interface(cluster):
    pool = make_host_pool("page_first")
    backend = make_backend(cluster.address, pool, v1=False)
    keys = page_keys("generic", 3)
    src = fill_pages(pool, 0, 3, seed=5)
    # As HiCacheController._generic_page_set / _generic_page_get do.
    data = [pool.get_data_page(int(src[i * PAGE])) for i in range(3)]
    assert backend.batch_set(keys, data) is True
    assert backend.batch_exists(keys) == 3
    dummies = [pool.get_dummy_flat_data_page() for _ in keys]
    got = backend.batch_get(keys + ["never-stored"],
                            dummies + [pool.get_dummy_flat_data_page()])
    assert got[3] is None
    for i in range(3):
        assert torch.equal(got[i].view(torch.uint8),
                           data[i].view(torch.uint8))
    # The copying path's keys are not the zero-copy path's.
    v1 = make_backend(cluster.address, pool)
    assert v1.batch_exists(keys) == 0


def test_another_rank_model_or_dtype_never_sees_the_pages(cluster):
    pool = make_host_pool("page_first")
    keys = page_keys("namespace", 2)
    src = fill_pages(pool, 0, 2, seed=6)
    assert all(make_backend(cluster.address, pool).batch_set_v1(keys, src))
    assert make_backend(cluster.address, pool).batch_exists(keys) == 2
    assert make_backend(cluster.address, pool,
                        tp_rank=1).batch_exists(keys) == 0
    assert make_backend(cluster.address, pool,
                        model="other").batch_exists(keys) == 0
    assert make_backend(cluster.address, pool,
                        salt="tenant-b").batch_exists(keys) == 0
    fp16 = make_host_pool("page_first", dtype=torch.float16)
    assert make_backend(cluster.address, fp16).batch_exists(keys) == 0


def test_mla_pages_are_written_by_one_rank_and_read_by_every_rank(cluster):
    writer_pool, reader_pool = make_mla_host_pool(), make_mla_host_pool()
    writer = make_backend(cluster.address, writer_pool, mla=True, tp_rank=0)
    reader = make_backend(cluster.address, reader_pool, mla=True, tp_rank=1)
    keys = page_keys("mla", 3)
    src = fill_pages(writer_pool, 0, 3, seed=9)
    want = page_bytes(writer_pool, src)
    # Rank 1 is not MLA's storage writer: it reports success, stores nothing.
    assert reader.batch_set_v1(keys, src) == [True] * 3
    assert reader.batch_exists(keys) == 0
    assert writer.batch_set_v1(keys, src) == [True] * 3
    assert reader.batch_exists(keys) == 3
    dst = torch.arange(4 * PAGE, 7 * PAGE, dtype=torch.int64)
    assert reader.batch_get_v1(keys, dst) == [True] * 3
    got = page_bytes(reader_pool, dst)
    for p in range(3):
        assert torch.equal(got[p], want[p]), f"page {p}"


def test_a_dead_node_is_a_miss_not_an_exception():
    with Cluster(nodes=1) as c:
        pool = make_host_pool("page_first")
        backend = make_backend(c.address, pool)
        keys = page_keys("dead-node", 3)
        src = fill_pages(pool, 0, 3, seed=7)
        assert all(backend.batch_set_v1(keys, src))
        c.nodes["node-0"].kill()
        dst = torch.arange(8 * PAGE, 11 * PAGE, dtype=torch.int64)
        assert backend.batch_get_v1(keys, dst) == [False] * 3
        assert backend.batch_set_v1(page_keys("after", 1),
                                    src[:PAGE]) == [False]
        assert backend.batch_get(keys, [pool.get_dummy_flat_data_page()
                                        for _ in keys]) == [None] * 3


def test_an_unreachable_master_is_a_miss_not_an_exception():
    with Cluster(nodes=1) as c:
        pool = make_host_pool("page_first")
        backend = make_backend(c.address, pool, deadline=0.5)
        keys = page_keys("dead-master", 2)
        src = fill_pages(pool, 0, 2, seed=8)
        assert all(backend.batch_set_v1(keys, src))
        c.master.kill()
        assert backend.batch_exists(keys) == 0
        assert backend.exists(keys[0]) is False
        dst = torch.arange(8 * PAGE, 10 * PAGE, dtype=torch.int64)
        assert backend.batch_get_v1(keys, dst) == [False, False]
        assert backend.batch_set_v1(page_keys("later", 2), src) == [False,
                                                                   False]
        assert backend.batch_set(keys, [pool.get_data_page(0)] * 2) is False
        assert backend.errors >= 3


def test_a_backend_needs_a_master_address():
    cfg = storage_config("")
    cfg.extra_config.pop("master")
    with pytest.raises(ValueError, match="master"):
        hymcache.sglang.HyMCacheStorage(cfg, {})
