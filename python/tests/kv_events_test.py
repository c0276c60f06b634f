"""hymcache.kv_events against a real master and node, read back with vLLM's
own KV-event types (vllm.distributed.kv_events) over ZMQ: what a router
built for vLLM's events receives.

Runs in the engines' venv (tools/engines/venv.sh: vLLM, pyzmq, msgspec):
    HYMCACHE_BIN=$(bazel info -c opt bazel-bin) \\
      ~/.cache/hymcache/engines-venv/bin/python -m pytest \\
      python/tests/kv_events_test.py
(tools/engines/ci.sh does this.)
"""

import os
import sys

import msgspec
import pytest
import zmq

import hymcache
from hymcache import kv_events

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "engines"))
sys.path.insert(0, os.path.join(HERE, "..", "testing"))
import vllm_e2e  # noqa: E402  (start_cluster)
from eventually import eventually  # noqa: E402

from vllm.distributed.kv_events import (  # noqa: E402
    AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch)

DECODE = msgspec.msgpack.Decoder(type=KVEventBatch)
BLOCK = 4096


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    bin_dir = os.environ["HYMCACHE_BIN"]
    work = str(tmp_path_factory.mktemp("kv-events"))
    addr, daemons = vllm_e2e.start_cluster(bin_dir, work, 64 << 20)
    try:
        yield addr, f"{bin_dir}/tools/hymctl/hymctl"
    finally:
        for d in reversed(daemons):
            d.kill()


def _encode(batch):
    return msgspec.msgpack.encode(batch)


def test_each_event_converts_to_the_vllm_event_vllm_decodes():
    text = {"stream_id": 7, "sequence": 3, "kind": "BLOCK_STORED",
            "key": "ns/a", "key_encoding": "text", "parent_key": "00ff",
            "parent_key_encoding": "hex", "tier": "hybrid", "tenant": ""}
    removed = {"sequence": 4, "kind": "BLOCK_REMOVED", "key": "abcd",
               "key_encoding": "hex", "parent_key": "", "tier": "dram"}
    batch = kv_events.KVEventBatch(ts=1.5, events=[
        kv_events.convert(text, block_size=16), kv_events.convert(removed),
        kv_events.convert({"stream_id": 7, "missed_from": 1, "missed_to": 9})],
        data_parallel_rank=0)
    got = DECODE.decode(_encode(batch))
    assert got.ts == 1.5 and got.data_parallel_rank == 0
    stored, gone, cleared = got.events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [b"ns/a"]
    assert stored.parent_block_hash == b"\x00\xff"
    assert stored.block_size == 16 and stored.medium == "STORAGE"
    assert stored.token_ids == [] and stored.lora_id is None
    assert isinstance(gone, BlockRemoved)
    assert gone.block_hashes == [b"\xab\xcd"] and gone.medium == "CPU"
    assert isinstance(cleared, AllBlocksCleared)
    # A chain's first block has no parent; nodes coming and going carry
    # nothing for a router.
    first = dict(text, parent_key="")
    assert DECODE.decode(_encode(kv_events.KVEventBatch(
        ts=0, events=[kv_events.convert(first)]))).events[0].parent_block_hash is None
    assert kv_events.convert({"sequence": 5, "kind": "NODE_UP"}) is None


def _replay(endpoint, start):
    """vLLM's replay protocol: every kept batch from `start`, in order, then
    the end marker (sequence -1). A DEALER, as it takes many replies."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    try:
        while True:
            assert sock.poll(10_000), "no replay answer"
            _, _, seq, payload = sock.recv_multipart()
            if seq == kv_events.END_SEQ:
                return out
            out.append((int.from_bytes(seq, "big"), payload))
    finally:
        sock.close(linger=0)


def test_a_vllm_subscriber_sees_every_store_and_removal_once_in_order(cluster):
    addr, hymctl = cluster
    kb = hymcache.KeyBuilder(model="kv-events-test", block_tokens=16)
    # Six chains of five blocks; the first three share their first two.
    chains = []
    for c in range(6):
        head = [1] * 32 if c < 3 else [100 + c] * 32
        chains.append(kb.keys(head + [c + 7] * 48))
    buf = bytearray(BLOCK)
    with kv_events.KvEventPublisher(addr, "tcp://127.0.0.1:*",
                                    "tcp://127.0.0.1:*", hymctl=hymctl,
                                    block_size=16) as pub, \
            hymcache.Client([addr], transport="tcp") as client:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub.endpoint)
        for i, keys in enumerate(chains):
            r = client.store(keys, [buf] * len(keys)).result(timeout=30)
            assert r.failed == 0 and r.refused == 0
            if i == 2:
                # hymctl dies mid-stream, once the 11 stores so far (chains
                # 1 and 2 share two blocks with chain 0) are out: the
                # publisher restarts it, resuming after the last event it
                # read (from the start, they would come twice).
                assert eventually(lambda: pub.published_events >= 11)
                pub.kill_follower_for_test()
                assert eventually(lambda: pub.hymctl_restarts >= 1)
        removed = chains[5][3:]
        assert client.remove(removed) == [True, True]
        stored = {k for keys in chains for k in keys}
        assert eventually(lambda: pub.published_events >= len(stored) + 2,
                          timeout=30)

        batches = _replay(pub.replay_endpoint, 0)
        assert [s for s, _ in batches] == list(range(len(batches)))
        events = [e for _, p in batches for e in DECODE.decode(p).events]
        puts = [e for e in events if isinstance(e, BlockStored)]
        gone = [e for e in events if isinstance(e, BlockRemoved)]
        assert not [e for e in events if isinstance(e, AllBlocksCleared)]
        # Every block stored once (the shared prefix too), with its parent.
        assert sorted(k for e in puts for k in e.block_hashes) == sorted(stored)
        parent = {}
        for keys in chains:
            for j, k in enumerate(keys):
                parent[k] = keys[j - 1] if j else None
        for e in puts:
            assert e.parent_block_hash == parent[e.block_hashes[0]]
            assert e.medium in ("CPU", "STORAGE") and e.block_size == 16
        # Each removal once, after its store.
        assert sorted(k for e in gone for k in e.block_hashes) == sorted(removed)
        stored_at = {e.block_hashes[0]: i for i, e in enumerate(events)
                     if isinstance(e, BlockStored)}
        for i, e in enumerate(events):
            if isinstance(e, BlockRemoved):
                assert i > stored_at[e.block_hashes[0]]

        # The live subscriber got the same batches (a late joiner misses the
        # first ones: that is what replay is for).
        live = []
        while sub.poll(1000):
            topic, seq, payload = sub.recv_multipart()
            live.append((int.from_bytes(seq, "big"), payload))
        sub.close(linger=0)
        assert live, "the subscriber received nothing"
        assert live == batches[len(batches) - len(live):]

        # A router following the events alone answers each chain's longest
        # cached prefix as the cluster does.
        present = set()
        for e in events:
            if isinstance(e, BlockStored):
                present.update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                present.difference_update(e.block_hashes)
        for keys in chains:
            n = 0
            while n < len(keys) and keys[n] in present:
                n += 1
            assert n == client.lookup(keys)["hit_prefix"]


def test_bad_options_and_a_missing_hymctl_are_clear(cluster):
    addr, _ = cluster
    with pytest.raises(ValueError):
        kv_events.KvEventPublisher(addr, "tcp://127.0.0.1:*", buffer_steps=0)
    with pytest.raises(zmq.ZMQError):
        kv_events.KvEventPublisher(addr, "nonsense://x")
    assert kv_events.main(["--master=" + addr, "--endpoint=nonsense://x"]) == 2
    # No hymctl: it keeps trying (logged), publishes nothing, stops cleanly.
    with kv_events.KvEventPublisher(addr, "tcp://127.0.0.1:*",
                                    hymctl="/nonexistent/hymctl") as pub:
        assert eventually(lambda: pub.hymctl_restarts >= 2)
    assert pub.published_events == 0
