"""kvengine against real daemons: the pool and its free list, the
deterministic block contents checked byte for byte after a load, hit blocks
that grow per turn, recompute-only never touching the cluster, TTFT with
HyMCache below recompute-only, a Mooncake-format trace through the CLI
(--local, --json, --plot), and a node dying mid-run."""

import json
import math
import sys

import numpy as np
import pytest

import sanitizer_runtime

sanitizer_runtime.reexec_if_needed()  # before hymcache loads the extension

import hymcache  # noqa: E402
from hymcache_cluster import Cluster, store_until_stored  # noqa: E402
from kvengine import (Engine, KvPool, PoolExhausted, block_seeds,  # noqa: E402
                      expected_block, fill_block)
from kvengine import cli, report, workload  # noqa: E402

T = 16  # tokens per block
DIMS = dict(num_layers=2, block_tokens=T, kv_heads=2, head_dim=16)
BLOCK_BYTES = 2 * 2 * T * 2 * 16 * 2


def small_pool(blocks=64):
    return KvPool(blocks, **DIMS)


def key_builder(salt):
    return hymcache.KeyBuilder(model="kvengine-test", dtype="bf16",
                               salt=salt, block_tokens=T)


def conversations(n=3, turns=4):
    return workload.synthetic(conversations=n, turns=turns,
                              system_prompt_tokens=2 * T, user_tokens=T + 5,
                              output_tokens=7, seed=1)


@pytest.fixture(scope="module")
def cluster():
    with Cluster(nodes=1) as c:
        with hymcache.Client(c.address, transport="tcp") as warm:
            store_until_stored(warm, [b"warm"], [bytearray(1)])
        yield c


@pytest.fixture
def client(cluster):
    with hymcache.Client(cluster.address, transport="tcp") as c:
        yield c


def expected_hits(requests, salt):
    """Per request, the blocks an engine that waits for its stores loads:
    the leading keys stored by earlier requests (all their full blocks),
    capped so that the last prompt token is computed."""
    kb = key_builder(salt)
    stored, hits = set(), []
    for r in requests:
        keys = kb.keys(r.tokens)
        usable = (r.input_length - 1) // T
        h = 0
        while h < usable and keys[h] in stored:
            h += 1
        hits.append(h)
        stored.update(keys)
    return hits


# The pool and the block contents ------------------------------------------

def test_pool_shape_and_free_list():
    pool = small_pool(blocks=5)
    assert pool.array.shape == (5, 2, 2, T, 2, 16)
    assert pool.array.dtype == np.uint16
    assert pool.block_bytes == BLOCK_BYTES
    assert pool.page(3).base is pool.array  # a view, not a copy
    assert pool.page(3).flags["C_CONTIGUOUS"]
    a = pool.allocate(3)
    assert len(set(a)) == 3 and pool.num_free == 2 and pool.num_in_use == 3
    with pytest.raises(PoolExhausted):
        pool.allocate(3)
    assert pool.num_free == 2  # a refused allocation takes nothing
    never = min(set(range(5)) - set(a))
    with pytest.raises(ValueError, match="not allocated"):
        pool.free([a[0], never])
    assert pool.num_in_use == 3  # nothing freed by a refused call
    with pytest.raises(ValueError, match="twice"):
        pool.free([a[0], a[0]])
    pool.free(a)
    with pytest.raises(ValueError):
        pool.free([a[0]])  # a double free
    assert (pool.num_free, pool.num_in_use) == (5, 0)
    assert sorted(pool.allocate(5)) == list(range(5))
    with pytest.raises(ValueError):
        KvPool(0, **DIMS)


def test_block_contents_depend_on_prefix_tokens_and_layer():
    tokens = np.arange(1, 3 * T + 1, dtype=np.int32)
    seeds = block_seeds(tokens, T)
    assert len(seeds) == 3
    other = tokens.copy()
    other[0] += 1  # a different first token changes every later block
    assert all(a != b for a, b in zip(seeds, block_seeds(other, T)))
    assert block_seeds(tokens[:2 * T], T) == seeds[:2]
    shape = small_pool(1).block_shape
    b = expected_block(shape, tokens[T:2 * T], seeds[1])
    assert np.array_equal(b, expected_block(shape, tokens[T:2 * T], seeds[1]))
    assert not np.array_equal(b[0], b[1])  # per layer
    assert not np.array_equal(b[:, 0], b[:, 1])  # K and V
    assert len(np.unique(b)) > b.size // 4  # not a constant pattern
    partial = expected_block(shape, tokens[:5], seeds[0])
    assert (partial[:, :, 5:] == 0).all() and (partial[:, :, :5] != 0).any()
    page = np.full(shape, 7, np.uint16)
    fill_block(page, tokens[:5], seeds[0])
    assert np.array_equal(page, partial)


class FakeClock:
    """A clock that moves only by `step` per reading and by the sleeps."""

    def __init__(self, step=0.0):
        self.now, self.step, self.sleeps = 100.0, step, []

    def __call__(self):
        self.now += self.step
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


def test_prefill_sleeps_for_the_rest_of_the_modelled_time():
    req = workload.Request(conversation=0, turn=0,
                           tokens=np.arange(1, 51, dtype=np.int32))
    clock = FakeClock()
    with Engine(small_pool(), prefill_tokens_per_s=1000.0, clock=clock,
                sleep=clock.sleep) as engine:
        rec = engine.serve(req)
    assert clock.sleeps == [pytest.approx(0.05)]  # 50 tokens at 1000/s
    assert rec["ttft_ms"] == pytest.approx(50.0)
    assert rec["modelled_prefill_ms"] == pytest.approx(50.0)
    assert not rec["prefill_overrun"] and rec["computed_tokens"] == 50
    # A fill slower than the model: no sleep, the real time counts.
    clock = FakeClock(step=1.0)
    with Engine(small_pool(), prefill_tokens_per_s=1000.0, clock=clock,
                sleep=clock.sleep) as engine:
        rec = engine.serve(req)
    assert clock.sleeps == [] and rec["prefill_overrun"]
    assert rec["ttft_ms"] > rec["modelled_prefill_ms"]


def test_a_failed_request_returns_its_pages(client):
    pool = small_pool(blocks=8)
    bad = workload.Request(conversation=0, turn=0,
                           tokens=np.full(3 * T, 2**40, dtype=np.int64))
    with Engine(pool, client, key_builder("bad")) as engine:
        with pytest.raises(hymcache.InvalidArgument, match="int32"):
            engine.serve(bad)  # the key builder refuses the token ids
        assert pool.num_free == 8
        with pytest.raises(PoolExhausted):
            engine.serve(workload.Request(0, 0, np.ones(9 * T, np.int32)))
        assert pool.num_free == 8


# Serving with HyMCache ----------------------------------------------------

def test_later_turns_load_their_prefix_byte_for_byte(client, request):
    salt = request.node.name
    reqs = conversations(3, 4)
    pool = small_pool()
    with Engine(pool, client, key_builder(salt), prefill_tokens_per_s=1e6,
                wait_stores=True, verify=True) as engine:
        recs = []
        for r in reqs:
            recs.append(engine.serve(r))
            # Only blocks of stores in flight stay allocated.
            assert pool.num_in_use == sum(
                s["blocks"] for s in (x["store"] for x in recs)
                if s and not s["done"])
    assert pool.num_free == pool.num_blocks and pool.num_in_use == 0

    want = expected_hits(reqs, salt)
    assert [r["loaded_blocks"] for r in recs] == want
    assert [r["hit_blocks"] for r in recs] == want
    assert sum(want) > 0
    for c in range(3):
        hits = [h for h, q in zip(want, reqs) if q.conversation == c]
        assert hits == sorted(hits) and hits[-1] > hits[0], hits
    for q, r in zip(reqs, recs):
        assert r["corrupt_blocks"] == 0
        assert r["computed_tokens"] == q.input_length - r["loaded_blocks"] * T
        new = q.input_length // T - r["loaded_blocks"]
        assert (r["store"] or {"blocks": 0})["blocks"] == new
        if new:
            assert r["store"]["stored"] + r["store"]["skipped"] == new

    # Independently of the engine: the last turn's blocks as HyMCache has
    # them are the deterministic fill of the prompt's tokens.
    last = reqs[-1]
    keys = key_builder(salt).keys(last.tokens)
    out = np.zeros((len(keys),) + pool.block_shape, np.uint16)
    assert client.load(keys, list(out)).loaded == len(keys)
    seeds = block_seeds(last.tokens, T)
    for i in range(len(keys)):
        assert np.array_equal(out[i], expected_block(
            pool.block_shape, last.tokens[i * T:(i + 1) * T], seeds[i])), i


def test_verify_catches_a_block_that_is_not_the_fill(client, request):
    salt = request.node.name
    reqs = conversations(1, 2)
    keys = key_builder(salt).keys(reqs[0].tokens)
    wrong = np.zeros((len(keys),) + small_pool(1).block_shape, np.uint16)
    store_until_stored(client, keys, list(wrong))
    with Engine(small_pool(), client, key_builder(salt), verify=True,
                prefill_tokens_per_s=1e6, wait_stores=True) as engine:
        recs = [engine.serve(r) for r in reqs]
    assert recs[0]["loaded_blocks"] == (reqs[0].input_length - 1) // T
    assert recs[0]["corrupt_blocks"] == recs[0]["loaded_blocks"]


def test_recompute_only_never_touches_the_cluster(cluster):
    closed = hymcache.Client(cluster.address)
    closed.close()  # any call on it raises FailedPrecondition
    pool = small_pool()
    reqs = conversations(2, 3)
    results = cli.run_modes(reqs, pool, ["recompute"], client=closed,
                            key_builder=key_builder("unused"),
                            prefill_tokens_per_s=1e6)
    assert set(results) == {"recompute"}
    for q, r in zip(reqs, results["recompute"]):
        assert r["mode"] == "recompute"
        assert r["hit_blocks"] == r["loaded_blocks"] == 0
        assert r["store"] is None
        assert r["computed_tokens"] == q.input_length
    assert pool.num_free == pool.num_blocks


def test_ttft_with_hymcache_beats_recompute_when_prefill_is_slow(client,
                                                                request):
    reqs = conversations(3, 4)
    rate = 1000.0  # tokens/s: turn 3 recomputes 137 tokens, 137 ms
    results = cli.run_modes(reqs, small_pool(), ["recompute", "hymcache"],
                            client=client, key_builder=key_builder(
                                request.node.name),
                            prefill_tokens_per_s=rate, wait_stores=True)
    hym, rec = results["hymcache"], results["recompute"]
    late = [i for i, q in enumerate(reqs) if q.turn >= 2]
    assert all(hym[i]["loaded_blocks"] >= 5 for i in late)
    for r, q in zip(rec, reqs):  # recompute TTFT is at least the model's
        assert r["ttft_ms"] >= 1e3 * q.input_length / rate * 0.99
    # The model saves >= 5 blocks = 80 tokens = 80 ms per late request;
    # lookup + load of a few KiB must cost less than half of that. The
    # median request, so that one stall of a busy (or sanitized) machine
    # does not decide.
    saved = sorted(rec[i]["ttft_ms"] - hym[i]["ttft_ms"] for i in late)
    assert saved[len(saved) // 2] > 0.5 * 5 * T / rate * 1e3, (
        [(rec[i]["ttft_ms"], hym[i]["ttft_ms"]) for i in late])


def test_a_dead_node_mid_run_falls_back_to_recompute(request):
    reqs = conversations(2, 4)
    with Cluster(nodes=1) as cluster, \
            hymcache.Client(cluster.address, transport="tcp") as c:
        store_until_stored(c, [b"warm"], [bytearray(1)])
        kill_at = 4  # after turns 0 and 1 of both conversations

        def on_request(mode, i):
            if i == kill_at:
                cluster.nodes["node-0"].kill()

        pool = small_pool()
        results = cli.run_modes(reqs, pool, ["hymcache"], client=c,
                                key_builder=key_builder(request.node.name),
                                on_request=on_request, wait_stores=True,
                                prefill_tokens_per_s=1e6, load_deadline=2.0,
                                verify=True)
    recs = results["hymcache"]
    assert all(r["load_stop"] is None for r in recs[:kill_at])
    assert any(r["loaded_blocks"] for r in recs[:kill_at])
    for q, r in zip(reqs[kill_at:], recs[kill_at:]):
        assert r["loaded_blocks"] == 0
        assert r["computed_tokens"] == q.input_length
        if r["hit_blocks"]:  # the master had not noticed yet
            assert r["load_stop"] is not None
        if r["store"]:
            assert r["store"]["done"] and r["store"]["stored"] == 0
    assert all(r["corrupt_blocks"] == 0 for r in recs)
    assert pool.num_free == pool.num_blocks


# Mooncake traces, the CLI and its outputs ---------------------------------

def mooncake_trace(path, convs=2, turns=3, sys_blocks=2, user=T + 3,
                   out_tokens=5):
    """A Mooncake-format trace (hash_ids only, no turn fields) of `convs`
    conversations sharing a system prompt, turns interleaved."""
    next_id = [100]
    ids_of = {}  # token-prefix length per conversation -> chained ids

    def ids_for(conv, n_tokens):
        # Chained ids: shared system blocks, then per-conversation blocks
        # named by (conversation, block index); a partial block gets an id
        # of its own (its length is part of its name).
        ids = []
        for b in range(math.ceil(n_tokens / T)):
            full = (b + 1) * T <= n_tokens
            name = ("sys", b) if b < sys_blocks else (
                conv, b, full or n_tokens)
            if name not in ids_of:
                ids_of[name] = next_id[0]
                next_id[0] += 1
            ids.append(ids_of[name])
        return ids

    lines, lengths = [], [sys_blocks * T] * convs
    for t in range(turns):
        for c in range(convs):
            lengths[c] += user
            lines.append({"timestamp": 1000 * t + c,
                          "input_length": lengths[c],
                          "output_length": out_tokens,
                          "hash_ids": ids_for(c, lengths[c])})
            lengths[c] += out_tokens
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
        f.write("\n")
    return lines


def test_mooncake_trace_parsing(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = mooncake_trace(path)
    reqs = workload.read_mooncake(str(path), T)
    assert [r.turn for r in reqs] == [0, 0, 1, 1, 2, 2]
    assert [r.input_length for r in reqs] == [x["input_length"]
                                              for x in lines]
    # Shared hash ids, shared tokens: the system blocks of conversation 1
    # are conversation 0's, and turn 1 extends turn 0.
    assert np.array_equal(reqs[0].tokens[:2 * T], reqs[1].tokens[:2 * T])
    assert not np.array_equal(reqs[0].tokens[2 * T:3 * T],
                              reqs[1].tokens[2 * T:3 * T])
    full0 = reqs[0].input_length // T * T
    assert np.array_equal(reqs[2].tokens[:full0], reqs[0].tokens[:full0])
    assert len(workload.read_mooncake(str(path), T, max_requests=4)) == 4
    bad = [("{", "not JSON"), ("[]", "not a JSON object"),
           ('{"timestamp": 1, "input_length": 20, "output_length": 1}',
            "missing \"hash_ids\""),
           ('{"timestamp": 1, "input_length": 20, "output_length": 1, '
            '"hash_ids": [1]}', "1 hash_ids for input_length 20"),
           ('{"timestamp": 1, "input_length": -1, "output_length": 1, '
            '"hash_ids": []}', "negative"),
           ('{"timestamp": 1, "input_length": 5, "output_length": 1, '
            '"hash_ids": [true]}', "non-negative integers"),
           ('{"timestamp": "x", "input_length": 5, "output_length": 1, '
            '"hash_ids": [1]}', "wrong type")]
    for i, (line, why) in enumerate(bad):
        p = tmp_path / f"bad{i}.jsonl"
        p.write_text(line + "\n")
        with pytest.raises(ValueError, match=why) as e:
            workload.read_mooncake(str(p), T)
        assert f"bad{i}.jsonl:1" in str(e.value)


ROW_KEYS = {"turn", "requests", "blocks_mean", "hymcache", "recompute",
            "hit_blocks_mean", "hit_blocks_total", "speedup_mean",
            "speedup_p50"}
SERVED_KEYS = {"mode", "blocks", "full_blocks", "hit_blocks",
               "loaded_blocks", "load_stop", "lookup_ms", "load_ms",
               "computed_tokens", "compute_ms", "modelled_prefill_ms",
               "prefill_ms", "prefill_overrun", "ttft_ms", "corrupt_blocks",
               "store"}
REQUEST_KEYS = {"index", "conversation", "turn", "timestamp_ms",
                "input_tokens", "output_tokens", "blocks", "full_blocks",
                "hymcache", "recompute"}
CONFIG_KEYS = {"model_name", "num_layers", "kv_heads", "head_dim",
               "block_tokens", "element_bytes", "block_bytes", "pool_blocks",
               "prefill_tokens_per_s", "load_deadline_s", "transport",
               "wait_stores", "salt", "modes", "workload"}


def check_schema(doc):
    """The document has the fields the package doc promises."""
    assert doc["schema"] == report.SCHEMA
    assert set(doc["config"]) == CONFIG_KEYS
    c = doc["config"]
    assert c["block_bytes"] == (c["num_layers"] * 2 * c["block_tokens"] *
                                c["kv_heads"] * c["head_dim"] *
                                c["element_bytes"])
    for row in doc["turns"] + [doc["all"]]:
        assert set(row) == ROW_KEYS
        for mode in report.MODES:
            assert set(row[mode]) == {"p50_ms", "mean_ms", "max_ms"}
    assert [r["turn"] for r in doc["turns"]] == sorted(
        r["turn"] for r in doc["turns"])
    assert doc["all"]["turn"] == "all"
    for i, e in enumerate(doc["requests"]):
        assert set(e) == REQUEST_KEYS and e["index"] == i
        for mode in report.MODES:
            assert set(e[mode]) == SERVED_KEYS and e[mode]["mode"] == mode
            s = e[mode]["store"]
            assert s is None or set(s) == {"blocks", "stored", "skipped",
                                           "failed", "refused", "error",
                                           "done"}


def test_cli_on_a_mooncake_trace_with_a_local_cluster(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    mooncake_trace(trace, convs=2, turns=3)
    out_json, out_png = tmp_path / "out.json", tmp_path / "ttft.png"
    rc = cli.main(["--local", "--local_dram_bytes=67108864",
                   "--transport=tcp", f"--trace={trace}",
                   f"--block_tokens={T}", "--num_layers=2", "--kv_heads=2",
                   "--head_dim=16", "--prefill_tokens_per_s=100000",
                   "--wait_stores", f"--json={out_json}",
                   f"--plot={out_png}"])
    table = capsys.readouterr().out
    assert rc == 0, table
    assert "TTFT per turn" in table and "speedup" in table
    assert [ln.split()[0] for ln in table.splitlines()[2:]] == [
        "0", "1", "2", "all"]
    doc = json.loads(out_json.read_text())
    check_schema(doc)
    assert doc["config"]["workload"] == {"kind": "mooncake",
                                         "trace": str(trace)}
    hits = [r["hit_blocks_mean"] for r in doc["turns"]]
    assert hits[0] < hits[1] < hits[2], hits
    # Turn 0 of conversation 1 loads the shared system prompt (2 blocks).
    assert doc["requests"][1]["hymcache"]["loaded_blocks"] == 2
    assert all(e["recompute"]["loaded_blocks"] == 0 for e in doc["requests"])
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_flags_are_checked(capsys):
    for argv in (["--modes=nope", "--local"], [],
                 ["--local", "--master=127.0.0.1:1"],
                 ["--local", "--block_tokens=0"],
                 ["--local", "--prefill_tokens_per_s=0"],
                 ["--local", "--pool_blocks=1"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2, argv
    assert cli.main(["--master=127.0.0.1:1", "--load_deadline=1",
                     "--conversations=1", "--turns=1"]) == 1
    assert "kv_engine:" in capsys.readouterr().err


def test_a_hymcache_run_that_stored_and_loaded_nothing_is_a_failure():
    def doc(*records):
        return {"requests": [{"hymcache": r} for r in records]}

    def served(loaded=0, stored=0, skipped=0, store=True):
        return {"loaded_blocks": loaded,
                "store": {"blocks": 2, "stored": stored, "skipped": skipped,
                          "failed": 2 - stored - skipped, "refused": 0,
                          "error": None, "done": True} if store else None}

    # Every store failed and nothing was loaded: recomputation, not a run.
    assert not cli.cache_used(doc(served(), served()))
    assert not cli.cache_used(doc(served(store=False), {**served(),
                                                         "store": None}))
    assert not cli.cache_used({"requests": [{"hymcache": None}]})
    assert cli.cache_used(doc(served(), served(stored=1)))
    assert cli.cache_used(doc(served(skipped=2)))
    assert cli.cache_used(doc(served(loaded=1, store=False)))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"] +
                         sys.argv[1:]))
