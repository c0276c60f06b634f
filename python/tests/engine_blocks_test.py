"""hymcache.engine_blocks against vLLM's own KV-event publisher
(vllm.distributed.kv_events.ZmqEventPublisher) and a real master and nodes:
what an engine's cache holds, as vLLM publishes it, reaches the master's
PrefixQuery under the engine's id.

Runs in the engines' venv (tools/engines/venv.sh: vLLM, pyzmq, msgspec):
    HYMCACHE_BIN=$(bazel info -c opt bazel-bin) \\
      ~/.cache/hymcache/engines-venv/bin/python -m pytest \\
      python/tests/engine_blocks_test.py
(tools/engines/ci.sh does this.)
"""

import os
import sys
import time

import msgspec
import pytest

import hymcache
from hymcache.engine_blocks import EngineBlocksReporter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "engines"))
sys.path.insert(0, os.path.join(HERE, "..", "testing"))
import vllm_e2e  # noqa: E402  (start_cluster, free_port)
from eventually import eventually  # noqa: E402

from vllm.distributed.kv_events import (  # noqa: E402
    AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch,
    ZmqEventPublisher)

BS = 16  # vLLM's block size here, and the keys' block_tokens


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    bin_dir = os.environ["HYMCACHE_BIN"]
    work = str(tmp_path_factory.mktemp("engine-blocks"))
    addr, daemons = vllm_e2e.start_cluster(bin_dir, work, 64 << 20)
    try:
        yield addr
    finally:
        for d in reversed(daemons):
            d.kill()


def _stored(hashes, tokens, parent=None, medium="GPU"):
    return BlockStored(block_hashes=hashes, parent_block_hash=parent,
                       token_ids=tokens, block_size=BS, lora_id=None,
                       medium=medium, lora_name=None)


class _Engine:
    """vLLM's publisher on a free port, and a reporter following it."""

    def __init__(self, addr, engine_id):
        port = vllm_e2e.free_port()
        self.pub = ZmqEventPublisher(data_parallel_rank=0,
                                     endpoint=f"tcp://*:{port}")
        self.client = hymcache.Client([addr], transport="tcp")
        self.keys = hymcache.KeyBuilder(model="engine-blocks-test",
                                        block_tokens=BS)
        self.reporter = EngineBlocksReporter(
            self.client, engine_id, self.keys, f"tcp://127.0.0.1:{port}",
            interval=0.05).start()
        # A SUB socket misses what was published before it joined: empty
        # batches until the reporter has one.
        assert eventually(lambda: self._probe() or self.reporter.batches)

    def _probe(self):
        self.pub.publish(KVEventBatch(ts=time.time(), events=[]))
        return False

    def publish(self, *events):
        before = self.reporter.batches
        self.pub.publish(KVEventBatch(ts=time.time(), events=list(events)))
        assert eventually(lambda: self.reporter.batches > before)

    def close(self):
        self.reporter.stop()
        self.pub.shutdown()
        self.client.close()


def _engines(client, keys):
    return {e["engine_id"]: e["longest_prefix"]
            for e in client.prefix_query(keys)["engines"]}


def test_the_prefix_query_names_the_engine_for_what_its_cache_holds(cluster):
    eng = _Engine(cluster, "engine-1")
    try:
        a = [3] * BS + [4] * BS + [5] * BS
        b = [3] * BS + [4] * BS + [9] * BS
        ka = eng.keys.keys(a)
        kb = eng.keys.keys(b)
        # Two blocks, then a third chained on the second, then chain b's own
        # third block; a block on vLLM's CPU tier is not the engine's cache;
        # one whose parent the reporter never saw has no key it can name.
        eng.publish(_stored([b"h1", b"h2"], a[:2 * BS]),
                    _stored([b"h3"], a[2 * BS:], parent=b"h2"),
                    _stored([b"hb3"], b[2 * BS:], parent=b"h2"),
                    _stored([b"c1"], [7] * BS, medium="CPU"),
                    _stored([b"x2"], [8] * BS, parent=b"unseen"))
        assert eng.reporter.unmapped_blocks == 1
        router = eng.client
        assert eventually(lambda: _engines(router, ka) == {"engine-1": 3})
        assert _engines(router, kb) == {"engine-1": 3}
        assert _engines(router, eng.keys.keys([7] * BS)) == {}
        # The store holds the first block of a: the same answer names the
        # node for it.
        r = router.store(ka[:1], [bytearray(4096)]).result(timeout=30)
        assert r.failed == 0
        q = router.prefix_query(ka)
        assert q["hit_prefix_length"] == 1 and len(q["nodes"]) == 1
        assert q["engines"] == [{"engine_id": "engine-1", "longest_prefix": 3}]

        # vLLM evicts a's third block.
        eng.publish(BlockRemoved(block_hashes=[b"h3"], medium="GPU"))
        assert eventually(lambda: _engines(router, ka) == {"engine-1": 2})
        assert _engines(router, kb) == {"engine-1": 3}

        # The master loses what it knew (a new leader, or the engine
        # forgotten): the reporter sees the count differ and resends it.
        resyncs = eng.reporter.resyncs
        assert router.report_engine_blocks("engine-1", cleared=True)[0] == 0
        assert eventually(lambda: eng.reporter.resyncs > resyncs and
                          _engines(router, ka) == {"engine-1": 2})

        # vLLM drops its whole cache.
        eng.publish(AllBlocksCleared())
        assert eventually(lambda: _engines(router, kb) == {})
    finally:
        eng.close()


def test_lost_events_make_the_reporter_forget_and_relearn(cluster):
    eng = _Engine(cluster, "engine-2")
    try:
        toks = [11] * BS + [12] * BS
        keys = eng.keys.keys(toks)
        eng.publish(_stored([b"g1", b"g2"], toks))
        assert eventually(lambda: _engines(eng.client, keys) ==
                          {"engine-2": 2})
        # A batch that skips a sequence number: what was lost may have
        # removed blocks, so the reporter forgets them all.
        pack = msgspec.msgpack.Encoder()
        eng.reporter.apply(eng.reporter._last_seq + 2, pack.encode(
            KVEventBatch(ts=0.0, events=[])))
        assert eng.reporter.gaps == 1 and eng.reporter.held_keys() == []
        assert eventually(lambda: _engines(eng.client, keys) == {})
        # New events teach it again.
        eng.reporter.apply(eng.reporter._last_seq + 1, pack.encode(
            KVEventBatch(ts=0.0, events=[_stored([b"g1"], toks[:BS])])))
        assert eventually(lambda: _engines(eng.client, keys) ==
                          {"engine-2": 1})
    finally:
        eng.close()


def test_bad_ids_are_refused_and_the_master_keeps_engines_per_id(cluster):
    with hymcache.Client([cluster], transport="tcp") as c:
        with pytest.raises(hymcache.InvalidArgument):
            c.report_engine_blocks("")
        with pytest.raises(ValueError):
            EngineBlocksReporter(c, "", hymcache.KeyBuilder(), "tcp://x:1")
        keys = hymcache.KeyBuilder(model="ids", block_tokens=BS).keys(
            [1] * (2 * BS))
        assert c.report_engine_blocks("a", stored=keys) == (2, 60.0)
        assert c.report_engine_blocks("b", stored=keys[:1])[0] == 1
        assert _engines(c, keys) == {"a": 2, "b": 1}
        assert c.report_engine_blocks("a", removed=keys[1:])[0] == 1
        assert _engines(c, keys) == {"a": 1, "b": 1}
