"""The model of one kv_engine run (python/kvengine, docs/kv_engine.md) and
the reader of its JSON (schema "hymcache.kv_engine/1", documented in
python/kvengine/__init__.py).

kv_engine serves requests one at a time, back to back, on one engine with
no queueing, batching or decode, against one HyMCache storage node holding
the blocks in DRAM over loopback. Per request of n prompt tokens with
T tokens per block (u = (n - 1) // T full blocks the engine may take from
the cache; it always computes the last token):

  hit     = leading blocks of the request's first u block ids that are in
            the node (exact: an LRU of the node's capacity, unbounded when
            the JSON does not give it) *and* visible at the lookup (a store
            becomes visible once its bytes crossed at the store rate)
  lookup  = lookup_s                                 (when u >= 1)
  load    = load_latency_s + hit * block_bytes / load_bps   (when hit >= 1)
  prefill = (n - hit * T) / prefill_tokens_per_s
  TTFT    = lookup + load + prefill  (recompute only: n / prefill rate)

then the engine stores the new full blocks [hit, n // T) asynchronously,
visible at finish + blocks * block_bytes / store_bps, and the next request
starts at finish (the engine's verification and reaping between requests
are not modelled: a store is seen as late as possible).

Parameters (engine_params): block bytes, block tokens and the prefill rate
from the JSON's config; lookup_s, load_latency_s and load_bps from the run's
own HyMCache requests over the whole run (the mean lookup, and a least
squares line of load time on loaded bytes: both carry the run's stalls on
a busy machine into every turn alike), never per turn; store_bps =
load_bps (loopback, the same copy path each way). --hw / --bench_json
override them with this machine's benchmark numbers.

Block ids: the synthetic workload's prompt of conversation c is the
system prompt (shared across conversations unless shared_system_prompt is
false) followed by that conversation's tokens, each turn extending the
last; block j is shared ("s", j) when it lies inside a shared system
prompt, else (c, j). A Mooncake-format workload re-reads the trace named in
the JSON (hash ids are per block_tokens tokens, file order).
"""

import dataclasses
import json
import math

from . import cache
from . import sim

SCHEMA = "hymcache.kv_engine/1"


class EngineJsonError(ValueError):
    pass


def load(path):
    """Reads and checks a kv_engine JSON document. Raises EngineJsonError
    (or OSError) on a file that is not one."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise EngineJsonError("%s: not JSON: %s" % (path, e)) from None
    if not is_engine_doc(doc):
        raise EngineJsonError("%s: not a %s document" % (path, SCHEMA))
    try:
        c = doc["config"]
        for k in ("block_tokens", "block_bytes", "prefill_tokens_per_s", "workload"):
            c[k]
        for r in doc["turns"]:
            int(r["turn"])
        for q in doc["requests"]:
            int(q["input_tokens"]), int(q["turn"])
    except (KeyError, TypeError, ValueError) as e:
        raise EngineJsonError("%s: missing or bad field: %r" % (path, e)) from None
    if c["block_tokens"] < 1 or c["block_bytes"] < 1 or c["prefill_tokens_per_s"] <= 0:
        raise EngineJsonError("%s: block_tokens, block_bytes and "
                              "prefill_tokens_per_s must be > 0" % path)
    return doc


def is_engine_doc(doc):
    return isinstance(doc, dict) and doc.get("schema") == SCHEMA


def measured_rows(doc):
    """{mode: [{turn, ttft_ms_mean, ttft_ms_p50, hit_blocks_mean}]} from a
    kv_engine document; turns become 1-based (kv_engine's turn t is
    hymsim's t + 1)."""
    out = {}
    for r in doc["turns"]:
        for mode in ("hymcache", "recompute"):
            t = r.get(mode)
            if t is None:
                continue
            out.setdefault(mode, []).append({
                "turn": int(r["turn"]) + 1,
                "ttft_ms_mean": float(t["mean_ms"]),
                "ttft_ms_p50": float(t["p50_ms"]),
                "hit_blocks_mean": (r.get("hit_blocks_mean") or 0.0
                                    if mode == "hymcache" else 0.0)})
    return out


@dataclasses.dataclass
class EngineParams:
    block_tokens: int
    block_bytes: int
    prefill_tokens_per_s: float
    lookup_s: float = 1e-3
    load_latency_s: float = 0.0
    load_bps: float = 1e9
    store_bps: float = 1e9
    capacity_blocks: object = None  # None: unbounded
    sources: list = dataclasses.field(default_factory=list)


def engine_params(doc):
    """The run's parameters (module doc). Whole-run numbers only."""
    c = doc["config"]
    p = EngineParams(int(c["block_tokens"]), int(c["block_bytes"]),
                     float(c["prefill_tokens_per_s"]))
    p.sources.append("block_bytes=%d, block_tokens=%d, prefill %.0f tokens/s: config"
                     % (p.block_bytes, p.block_tokens, p.prefill_tokens_per_s))
    if c.get("local_dram_bytes"):
        p.capacity_blocks = int(c["local_dram_bytes"]) // p.block_bytes
    served = [q["hymcache"] for q in doc["requests"] if q.get("hymcache")]
    lookups = sorted(s["lookup_ms"] for s in served if s.get("lookup_ms"))
    if lookups:
        # The mean, stalls included: the model predicts mean TTFT.
        p.lookup_s = sum(lookups) / len(lookups) / 1e3
        p.sources.append("lookup_s=%.2f ms: mean of the run's %d lookups (median "
                         "%.2f ms)" % (1e3 * p.lookup_s, len(lookups),
                                       lookups[(len(lookups) - 1) // 2]))
    pts = [(s["loaded_blocks"] * p.block_bytes, s["load_ms"] / 1e3)
           for s in served if s.get("loaded_blocks")]
    if pts:
        latency, bps = _fit_load(pts)
        p.load_latency_s, p.load_bps = latency, bps
        p.sources.append("load %.3f ms + bytes / %.2f GB/s: least squares over "
                         "the run's %d loads" % (1e3 * latency, bps / 1e9, len(pts)))
    p.store_bps = p.load_bps
    return p


def _fit_load(pts):
    """(latency_s, bytes/s) of load time = latency + bytes / bps over
    (bytes, seconds) points; the aggregate rate with no latency when the
    line is degenerate (one size, or a negative slope or intercept)."""
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx > 0:
        slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
        icept = my - slope * mx
        if slope > 0 and icept >= 0:
            return icept, 1.0 / slope
    total = sum(y for _, y in pts)
    return 0.0, (sum(x for x, _ in pts) / total if total > 0 else 1e9)


def block_ids(doc):
    """Per request (in serving order): its block ids (full and partial)."""
    c = doc["config"]
    T = int(c["block_tokens"])
    w = c["workload"]
    reqs = doc["requests"]
    if w.get("kind") == "synthetic":
        shared = int(w["system_prompt_tokens"]) // T if w.get("shared_system_prompt") else 0
        out = []
        for q in reqs:
            n = math.ceil(int(q["input_tokens"]) / T)
            conv = int(q["conversation"])
            out.append([("s", j) if j < shared else (conv, j) for j in range(n)])
        return out
    if w.get("kind") == "mooncake":
        out = []
        with open(w["trace"]) as f:
            for line in f:
                if line.strip():
                    out.append([int(h) for h in json.loads(line)["hash_ids"]])
                if len(out) == len(reqs):
                    break
        if len(out) != len(reqs):
            raise EngineJsonError("%s: %d requests, the JSON has %d"
                                  % (w["trace"], len(out), len(reqs)))
        return out
    raise EngineJsonError("unknown workload kind %r" % w.get("kind"))


def simulate(doc, params, mode="hymcache"):
    """Replays the run's requests; returns sim.Result per request, turns
    1-based."""
    T = params.block_tokens
    bb = params.block_bytes
    node = cache.LruCache(params.capacity_blocks) if params.capacity_blocks else None
    stored = set() if node is None else None
    visible = {}  # block id -> time its store is done
    now = 0.0
    out = []
    for q, ids in zip(doc["requests"], block_ids(doc)):
        n = int(q["input_tokens"])
        full = n // T
        usable = (n - 1) // T
        lookup = load = 0.0
        hit = 0
        if mode == "hymcache" and usable:
            lookup = params.lookup_s
            at = now + lookup
            while hit < usable:
                b = ids[hit]
                present = (b in stored) if node is None else (b in node)
                if not present or visible[b] > at:
                    break
                hit += 1
            if hit:
                if node is not None:
                    node.prefix_hit(ids[:hit])  # touch
                load = params.load_latency_s + hit * bb / params.load_bps
        prefill = (n - hit * T) / params.prefill_tokens_per_s
        finish = now + lookup + load + prefill
        new = 0
        if mode == "hymcache":
            for k, b in enumerate(ids[hit:full], 1):
                if b not in visible or visible[b] > finish + k * bb / params.store_bps:
                    visible[b] = finish + k * bb / params.store_bps
                if node is None:
                    stored.add(b)
                else:
                    node.insert(b)
                new += 1
        out.append(sim.Result(turn=int(q["turn"]) + 1, ttft_s=finish - now, queue_s=0.0,
                              load_s=load, prefill_s=prefill, blocks=full,
                              gpu_hit=0, tier_hit=hit, fallback=False,
                              stored=new, refused=0))
        now = finish
    return out


def per_turn(results):
    """sim.per_turn's rows plus hit_blocks_mean."""
    rows = sim.per_turn(results)
    for r in rows:
        rs = [x for x in results if x.turn == r["turn"]]
        r["hit_blocks_mean"] = sum(x.tier_hit for x in rs) / len(rs)
    return rows
