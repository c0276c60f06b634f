"""hymcache.vllm.HyMCacheConnector against vLLM's installed classes and real
HyMCache daemons, without an engine: the scheduler side and the worker side
of the connector driven as vLLM drives them (lookup, allocation, metadata,
load into paged KV tensors, save after prefill).

Runs in the engines' venv (tools/engines/venv.sh), which has vLLM and torch:
    HYMCACHE_BIN=$(bazel info -c opt bazel-bin) \
      ~/.cache/hymcache/engines-venv/bin/python -m pytest \
      python/tests/vllm_connector_test.py
(tools/engines/ci.sh does this.)
"""

import logging
import os
import sys
import time
from types import SimpleNamespace

import pytest
import torch

import hymcache

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "engines"))
sys.path.insert(0, os.path.join(HERE, "..", "testing"))
import vllm_e2e  # noqa: E402  (start_cluster)
from eventually import eventually  # noqa: E402

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)

from hymcache.vllm import HyMCacheConnector  # noqa: E402

BS = 32  # vLLM's CPU backend takes multiples of 32
LAYERS = 2
HEADS = 2
HEAD = 32
NUM_BLOCKS = 24


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("cluster"))
    addr, daemons = vllm_e2e.start_cluster(os.environ["HYMCACHE_BIN"], work,
                                           64 << 20)
    yield SimpleNamespace(address=addr, daemons=daemons)
    for d in daemons:
        d.kill()


def make_pair(master, model="m", dtype=torch.float32, salt="", seed=0,
              tp_size=1):
    """A scheduler-side and a worker-side connector of one configuration,
    the worker with its own paged KV tensors ([blocks, H, N, 2D] per
    layer, the CPU backend's layout)."""
    ktc = KVTransferConfig(
        kv_connector="HyMCacheConnector",
        kv_connector_module_path="hymcache.vllm", kv_role="kv_both",
        kv_connector_extra_config={"master": master, "transport": "tcp",
                                   "salt": salt, "model_id": model,
                                   "lookup_deadline": 1.0,
                                   "load_deadline": 2.0,
                                   "retry_interval": 30.0})
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS,
                             head_size=HEAD, dtype=dtype)
    kcc = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(names, spec)])
    vc = SimpleNamespace(
        kv_transfer_config=ktc,
        model_config=SimpleNamespace(model=model, revision=None),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp_size))
    sched = HyMCacheConnector(vc, KVConnectorRole.SCHEDULER, kcc)
    worker = HyMCacheConnector(vc, KVConnectorRole.WORKER, kcc)
    g = torch.Generator().manual_seed(seed)
    kv = {n: torch.randn(NUM_BLOCKS, HEADS, BS, 2 * HEAD, generator=g)
          .to(dtype) for n in names}
    worker.register_kv_caches(kv)
    return sched, worker, kv


def request(rid, tokens):
    return SimpleNamespace(request_id=rid, prompt_token_ids=list(tokens),
                           all_token_ids=list(tokens), num_computed_tokens=0)


def step(sched, worker, req, block_ids, local_tokens=0):
    """One prefill step of `req` as vLLM's scheduler and model runner make
    it: lookup, allocation, metadata, load, (forward), save. Returns the
    external tokens vLLM was told to load and the blocks reported failed."""
    ext, is_async = sched.get_num_new_matched_tokens(req, local_tokens)
    assert is_async is False
    sched.update_state_after_alloc(
        req, SimpleNamespace(get_block_ids=lambda: (list(block_ids),)), ext)
    new = SimpleNamespace(req_id=req.request_id, block_ids=(list(block_ids),),
                          num_computed_tokens=local_tokens + ext)
    out = SimpleNamespace(
        scheduled_new_reqs=[new],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[], resumed_req_ids=set(), new_block_ids=[],
            num_computed_tokens=[]),
        num_scheduled_tokens={req.request_id:
                              len(req.prompt_token_ids) - local_tokens - ext})
    meta = sched.build_connector_meta(out)
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)
    failed = worker.get_block_ids_with_load_errors()
    worker.wait_for_save()
    worker.clear_connector_metadata()
    sched.request_finished(req, list(block_ids))
    return ext, failed


def wait_stored(master, worker, tokens, n_blocks, timeout=30.0):
    """Waits until the worker's store of the first n_blocks landed."""
    keys = worker._keys.keys(tokens[: n_blocks * BS])
    with hymcache.Client([master], transport="tcp") as c:
        assert eventually(
            lambda: c.lookup(keys)["hit_prefix"] == n_blocks,
            timeout=timeout), "the connector's store never landed"


def tokens_of(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 30000, (n,), generator=g).tolist()


def test_the_connector_is_a_kv_connector_base_v1_subclass():
    assert issubclass(HyMCacheConnector, KVConnectorBase_V1)


def test_the_host_copies_move_the_same_bytes_as_torch(cluster):
    # On the CPU layout the connector gathers and scatters blocks with numpy
    # (vLLM's OpenMP pool made torch's copies slow); the torch path serves
    # other layouts. Both must move the same bytes, with runs of consecutive
    # block ids (copied as one slice per layer) and lone blocks.
    _, worker, kv = make_pair(cluster.address, dtype=torch.bfloat16, seed=3)
    ids = [5, 6, 7, 1, 9, 10, 2]
    dest = [7, 3, 4, 0, 11, 12, 13]
    assert worker._host_views() is not None
    fast = worker._gather(ids)
    worker._np_layers = []  # the torch path from here on
    assert torch.equal(worker._gather(ids), fast)
    before = {n: t.clone() for n, t in kv.items()}
    worker._scatter(fast, dest)
    torch_written = {n: t.clone() for n, t in kv.items()}
    for n, t in kv.items():
        t.copy_(before[n])
    worker._np_layers = None  # back to the host views
    worker._scatter(fast, dest)
    for n, t in kv.items():
        assert torch.equal(t, torch_written[n])
        assert torch.equal(t[dest], before[n][ids])


def test_a_second_engine_loads_the_saved_blocks_byte_for_byte(cluster):
    prompt = tokens_of(1, 4 * BS + 5)
    s1, w1, kv1 = make_pair(cluster.address, seed=1)
    ext, failed = step(s1, w1, request("a", prompt), [0, 1, 2, 3, 4])
    assert ext == 0 and not failed  # a cold cluster
    wait_stored(cluster.address, w1, prompt, 4)

    s2, w2, kv2 = make_pair(cluster.address, seed=2)
    ext, failed = step(s2, w2, request("b", prompt), [10, 11, 12, 13, 14])
    assert ext == 4 * BS
    assert not failed
    for name in kv1:
        assert torch.equal(kv2[name][10:14], kv1[name][0:4])
    assert w2.loaded_blocks == 4


def test_vllm_own_prefix_hit_is_not_loaded_again(cluster):
    prompt = tokens_of(3, 5 * BS + 1)
    s1, w1, _ = make_pair(cluster.address, seed=3)
    step(s1, w1, request("a", prompt), [0, 1, 2, 3, 4, 5])
    wait_stored(cluster.address, w1, prompt, 5)
    s2, w2, kv2 = make_pair(cluster.address, seed=4)
    before = {n: t.clone() for n, t in kv2.items()}
    # vLLM already holds the first two blocks: only blocks 2..4 load.
    ext, failed = step(s2, w2, request("b", prompt), [7, 8, 9, 10, 11, 12],
                       local_tokens=2 * BS)
    assert ext == 3 * BS and not failed
    for n in kv2:
        assert torch.equal(kv2[n][7:9], before[n][7:9])
    assert w2.loaded_blocks == 3


@pytest.mark.parametrize("other", [
    dict(model="another-model"),
    dict(dtype=torch.bfloat16),
    dict(salt="tenant-b"),
])
def test_another_model_dtype_or_salt_never_sees_the_blocks(cluster, other):
    prompt = tokens_of(5, 3 * BS + 2)
    s1, w1, _ = make_pair(cluster.address, seed=5)
    step(s1, w1, request("a", prompt), [0, 1, 2, 3])
    wait_stored(cluster.address, w1, prompt, 3)
    s2, w2, kv2 = make_pair(cluster.address, seed=6, **other)
    before = {n: t.clone() for n, t in kv2.items()}
    ext, failed = step(s2, w2, request("b", prompt), [4, 5, 6, 7])
    assert ext == 0 and not failed
    for n in kv2:
        assert torch.equal(kv2[n], before[n])
    # The same configuration does see them.
    s3, w3, _ = make_pair(cluster.address, seed=7)
    assert s3.get_num_new_matched_tokens(request("c", prompt), 0) == (3 * BS,
                                                                       False)


def test_another_tp_rank_never_loads_the_blocks(cluster):
    prompt = tokens_of(8, 3 * BS + 2)
    s1, w1, _ = make_pair(cluster.address, seed=8, tp_size=2)
    step(s1, w1, request("a", prompt), [0, 1, 2, 3])
    wait_stored(cluster.address, w1, prompt, 3)
    # Rank 0 has the blocks, so the scheduler says so; rank 1's worker names
    # them under its own rank, misses, and reports them for recomputation.
    s2, w2, kv2 = make_pair(cluster.address, seed=9, tp_size=2)
    w2.set_tp_rank_for_test(1)
    before = {n: t.clone() for n, t in kv2.items()}
    ext, failed = step(s2, w2, request("b", prompt), [4, 5, 6, 7])
    assert ext == 3 * BS
    assert failed == {4, 5, 6}
    for n in kv2:
        assert torch.equal(kv2[n], before[n])


def test_a_finished_request_hints_its_chain_for_the_next_turn(cluster):
    # Every TP rank's chain: each rank stores (and loads) its own blocks.
    sched, worker, _ = make_pair(cluster.address, model="hint", tp_size=2)
    prompt = tokens_of(7, 3 * BS + 5)
    step(sched, worker, request("h", prompt), [0, 1, 2, 3])
    assert sched.hints_sent == 2 and sched.hints_dropped == 0
    # Off with hint_hold 0.
    sched._cfg["hint_hold"] = 0
    step(sched, worker, request("h2", tokens_of(8, 2 * BS)), [4, 5])
    assert sched.hints_sent == 2
    # The last turn, as the application marks it: the conversation ended
    # (sent whatever hint_hold is), no next-turn hint.
    last = request("h3", tokens_of(9, 2 * BS))
    last.kv_transfer_params = {"hymcache_conversation_ended": True}
    step(sched, worker, last, [6, 7])
    assert sched.ended_hints_sent == 2 and sched.hints_sent == 2
    assert sched.hints_dropped == 0


def test_master_unreachable_means_no_hits_logged_once(caplog):
    caplog.set_level(logging.WARNING, logger="hymcache.vllm")
    s, _, _ = make_pair("127.0.0.1:1")
    t0 = time.monotonic()
    for i in range(20):
        assert s.get_num_new_matched_tokens(
            request(f"r{i}", tokens_of(i, 2 * BS + 1)), 0) == (0, False)
    took = time.monotonic() - t0
    down = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(down) == 1
    # One lookup waited for its deadline; the others did not try.
    assert took < 10.0
    assert s._lookup_calls == 1


def test_dead_storage_nodes_turn_the_load_into_recomputation(tmp_path):
    addr, daemons = vllm_e2e.start_cluster(os.environ["HYMCACHE_BIN"],
                                           str(tmp_path), 64 << 20)
    try:
        prompt = tokens_of(11, 4 * BS + 3)
        s1, w1, _ = make_pair(addr, seed=11)
        step(s1, w1, request("a", prompt), [0, 1, 2, 3, 4])
        wait_stored(addr, w1, prompt, 4)
        s2, w2, kv2 = make_pair(addr, seed=12)
        # The scheduler sees the blocks; then both nodes die before the load.
        ext, _ = s2.get_num_new_matched_tokens(request("b", prompt), 0)
        assert ext == 4 * BS
        for d in daemons[1:]:
            d.kill()
        before = {n: t.clone() for n, t in kv2.items()}
        t0 = time.monotonic()
        # vLLM asks again (the lookup is cached per request), allocates,
        # and the workers' load finds no node: every block is reported for
        # recomputation and nothing is written.
        ext, failed = step(s2, w2, request("b", prompt), [5, 6, 7, 8, 9])
        assert ext == 4 * BS
        assert failed == {5, 6, 7, 8}
        assert time.monotonic() - t0 < 15.0
        for n in kv2:
            assert torch.equal(kv2[n], before[n])
    finally:
        for d in daemons:
            d.kill()
