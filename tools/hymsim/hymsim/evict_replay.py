"""The eviction replay: a request sequence through eviction.BlockStore under
each policy, and the prefill time each saves (`hymsim eviction`).

Each request, in arrival order, reads its full blocks (min(len(hash_ids),
input_length // block_tokens)), counts the leading cached ones h, and
stores the rest. It saves prefill(0 cached, n) - prefill(h cached, n - h
blocks' tokens) FLOPs (n = input_length), turned into seconds at one
effective rate: the paper hardware's gpu_peak_flops x gpu_mfu (A100, 312
TFLOP/s x 0.5). The cost policy's statistics see each arrival (its
conversation and turn) before the request is served.

Arrival order. A Mooncake trace is open loop: its timestamps. The built-in
generator is closed loop: turn t+1 arrives think_s after turn t's first
token, taken here as arrival + its prefill with nothing cached (no
queueing, and independent of the policy, so every policy sees the same
sequence); sessions are admitted `concurrency` at a time as sim.simulate
does.

Capacity: a fraction of the workload's footprint, its distinct full blocks.
"""

import argparse
import bisect
import dataclasses
import heapq
import json
import sys

from . import eviction
from . import presets
from . import trace

POLICIES = ["lru", "ended", "cost", "oracle"]


class OraclePolicy(eviction.CostPolicy):
    """A reference, not a policy a store can run: the cost score with the
    future known (a block's prefill seconds over the time to its next read;
    0 when it is never read again), Belady's rule weighted by cost. It
    bounds what a return-probability estimate can gain."""
    name = "oracle"

    def __init__(self, requests, order, model, block_tokens, flop_rate):
        super().__init__(model, block_tokens,
                         model.kv_bytes_per_token() * block_tokens, flop_rate)
        self._reads = {}
        for t, i in order:
            for b in full_ids(requests[i], block_tokens):
                self._reads.setdefault(b, []).append(t)

    def score(self, bid, b):
        reads = self._reads[bid]
        k = bisect.bisect_right(reads, self._now)
        if k == len(reads):
            return 0.0
        return self.prefill_s(b.depth) / (reads[k] - self._now + 1e-3)


def synthetic_workload():
    """The eviction study's synthetic chat: the paper's Table 1 workload
    (presets.paper_workload: 300 open sessions of 3,000 new tokens per turn,
    64 shared 1,024-token documents, think times 200-3,800 s) with a
    heavy-tailed number of turns, 1 to 10, P(T = t) ~ 1/t (mean 3.4):
    without varied lengths every chain comes back the same number of times
    and a return probability has nothing to learn."""
    o = presets.paper_workload()
    o.turns = 10
    o.turns_zipf = 1.0
    return o


def closed_loop_order(requests, model, flop_rate, concurrency=None):
    """[(arrival, index)] of generator requests (parent / think_s), as
    described above."""
    children = {r.parent: i for i, r in enumerate(requests) if r.parent >= 0}
    roots = [i for i, r in enumerate(requests) if r.parent < 0]
    pending = list(reversed(roots[concurrency:])) if concurrency else []
    heap = [(requests[i].timestamp, n, i)
            for n, i in enumerate(roots[:concurrency] if concurrency else roots)]
    heapq.heapify(heap)
    seq = len(heap)
    out = []
    while heap:
        t, _, i = heapq.heappop(heap)
        out.append((t, i))
        r = requests[i]
        finish = t + model.prefill_flops(0, r.input_length) / flop_rate
        nxt = children.get(i)
        if nxt is not None:
            heapq.heappush(heap, (finish + requests[nxt].think_s, seq, nxt))
            seq += 1
        elif pending:
            j = pending.pop()
            heapq.heappush(heap, (max(finish, requests[j].timestamp), seq, j))
            seq += 1
    return out


def full_ids(r, block_tokens):
    return r.hash_ids[:min(len(r.hash_ids), r.input_length // block_tokens)]


def footprint(requests, block_tokens, reused=False):
    """Distinct full blocks of the workload (reused: only those that more
    than one request reads, the part a cache can turn into hits)."""
    seen = set()
    again = set()
    for r in requests:
        ids = full_ids(r, block_tokens)
        if reused:
            again.update(b for b in ids if b in seen)
        seen.update(ids)
    return len(again if reused else seen)


def make_policy(name, model, block_tokens, flop_rate, params=None,
                requests=None, order=None):
    if name == "oracle":
        return OraclePolicy(requests, order, model, block_tokens, flop_rate)
    if name == "lru":
        return eviction.LruPolicy()
    if name == "ended":
        return eviction.EndedPolicy()
    if name == "cost":
        return eviction.CostPolicy(model, block_tokens,
                                   model.kv_bytes_per_token() * block_tokens,
                                   flop_rate, params)
    raise ValueError("unknown policy %r" % name)


def parent_indices(requests):
    """Each request's parent (the earlier request whose chain it extends;
    -1: none): Request.parent where the generator set it, else the latest
    earlier request of the same conversation at the turn before."""
    last = {}
    out = []
    for i, r in enumerate(requests):
        out.append(r.parent if r.parent >= 0 else
                   last.get((r.conversation, r.turn - 1), -1))
        last[r.conversation, r.turn] = i
    return out


def saved_flops(model, r, h, block_tokens):
    """Prefill FLOPs request `r` saves when its first `h` blocks are cached."""
    return (model.prefill_flops(0, r.input_length) -
            model.prefill_flops(h * block_tokens, r.input_length - h * block_tokens))


def _totals(saved_flops_sum, hits, blocks, flop_rate):
    return {"saved_s": saved_flops_sum / flop_rate,
            "hit_ratio": hits / blocks if blocks else 0.0,
            "hit_blocks": hits, "blocks": blocks}


def last_turns(requests, order):
    """The requests that end their conversation: its highest turn, the
    latest in `order` on a tie (hymbench replay's rule)."""
    last = {}
    for _, i in order:
        c = requests[i].conversation
        if c is None or c < 0:
            continue
        j = last.get(c)
        if j is None or requests[i].turn >= requests[j].turn:
            last[c] = i
    return set(last.values())


def replay(requests, order, policy, capacity, model, block_tokens, flop_rate,
           parents=None):
    """Feeds `order` ([(time, index)]) through a store of `capacity` blocks;
    `parents` as parent_indices (its default). Returns {saved_s,
    hit_ratio, hit_blocks, blocks, evictions, refused}."""
    if parents is None:
        parents = parent_indices(requests)
    store = eviction.BlockStore(capacity, policy)
    stats = eviction.ReturnStats()
    last = last_turns(requests, order)
    saved = 0.0
    hits = blocks = 0
    for t, i in order:
        r = requests[i]
        stats.observe(t, i, r.turn, parents[i] if parents[i] >= 0 else None)
        ids = full_ids(r, block_tokens)
        h = store.serve(ids, t, r.conversation, r.turn, stats)
        if i in last:
            store.end(ids)  # as hymbench replay --hint_conversation_end
        saved += saved_flops(model, r, h, block_tokens)
        hits += h
        blocks += len(ids)
    return dict(_totals(saved, hits, blocks, flop_rate),
                evictions=store.evictions, refused=store.refused)


def measured(requests, path, model, block_tokens, flop_rate):
    """The same count for a real replay of the same trace (hymbench replay
    --json, one hash_id per block): each request's loaded prefix, capped at
    its full blocks as replay() caps its hits. Raises ValueError when the
    report is not of this trace."""
    with open(path) as f:
        recs = json.load(f).get("requests", [])
    if len(recs) != len(requests):
        raise ValueError("%s has %d requests, the trace %d" %
                         (path, len(recs), len(requests)))
    saved = 0.0
    hits = blocks = 0
    for rec in recs:
        i = rec.get("index", -1)
        if not 0 <= i < len(requests) or rec.get("blocks") != len(requests[i].hash_ids):
            raise ValueError("%s: request %r does not match the trace" % (path, i))
        r = requests[i]
        ids = full_ids(r, block_tokens)
        h = min(rec.get("loaded", 0), len(ids))
        saved += saved_flops(model, r, h, block_tokens)
        hits += h
        blocks += len(ids)
    return _totals(saved, hits, blocks, flop_rate)


def load_workload(args, model, flop_rate):
    """(label, requests, order, parents or None) for --trace or --synthetic."""
    if args.trace:
        reqs = trace.load_mooncake(args.trace)
        parents = None
        if any(q.turn < 0 for q in reqs):
            # Branches start conversations: keep who extends whom.
            parents = []
            trace.infer_turns(reqs, args.trace_block_tokens, parents)
        r = max(1, args.trace_block_tokens // args.block_tokens)
        for q in reqs:
            q.hash_ids = [h * r + k for h in q.hash_ids for k in range(r)]
        return ("trace", reqs, [(q.timestamp, i) for i, q in enumerate(reqs)],
                parents)
    o = synthetic_workload()
    for f in dataclasses.fields(trace.MultiTurnOptions):
        v = getattr(args, f.name)
        if v is not None:
            setattr(o, f.name, v)
    reqs = trace.generate_multiturn(o, args.block_tokens)
    return ("synthetic", reqs,
            closed_loop_order(reqs, model, flop_rate, o.concurrency), None)


def _parser():
    p = argparse.ArgumentParser(
        prog="hymsim eviction",
        description="Prefill time saved by chain-aware LRU vs cost-aware "
        "eviction in a store of a fraction of the workload's footprint.")
    w = p.add_mutually_exclusive_group(required=True)
    w.add_argument("--trace", help="Mooncake JSONL trace (held out: tune nothing on it)")
    w.add_argument("--synthetic", action="store_true",
                   help="the built-in chat (synthetic_workload; generator flags below)")
    p.add_argument("--model", default="qwen2.5-32b", choices=sorted(presets.MODELS))
    p.add_argument("--block_tokens", "--block-tokens", type=int, default=128)
    p.add_argument("--trace_block_tokens", "--trace-block-tokens", type=int,
                   default=512, help="tokens per hash_id in --trace (Mooncake: 512)")
    p.add_argument("--capacity_fraction", "--capacity-fraction", default="0.5",
                   help="comma list of fractions of the footprint")
    p.add_argument("--footprint", default="all", choices=["all", "reused"],
                   help="capacity basis: every distinct block, or those read "
                   "more than once")
    p.add_argument("--policies", default="lru,cost",
                   help="comma list of %s" % ",".join(POLICIES))
    p.add_argument("--no_position", action="store_true", help="cost: drop the position term")
    p.add_argument("--no_turns", action="store_true", help="cost: drop the return probability")
    p.add_argument("--no_time", action="store_true", help="cost: drop the idle-time term")
    p.add_argument("--min_wait_s", type=float, default=eviction.CostParams.min_wait_s)
    for f in dataclasses.fields(trace.MultiTurnOptions):
        p.add_argument("--" + f.name, type=type(f.default), default=None,
                       help="--synthetic generator: default as synthetic_workload")
    p.add_argument("--measured",
                   help="hymbench replay --json of the same --trace against a "
                   "cluster whose store holds the first capacity fraction "
                   "(block_tokens = trace_block_tokens): compared with lru")
    p.add_argument("--measured_ended", "--measured-ended",
                   help="as --measured, of a replay with "
                   "--hint_conversation_end: compared with ended, and with "
                   "the --measured run")
    p.add_argument("--measured_cost", "--measured-cost",
                   help="as --measured, of a replay against a master with "
                   "--eviction_policy=cost (and the --measured_ended run's "
                   "hints when that is given): compared with the model's "
                   "cost, and with the --measured (and --measured_ended) run")
    p.add_argument("--json", help="write the results here")
    return p


def main(argv):
    args = _parser().parse_args(argv)
    model = presets.MODELS[args.model]
    hw = presets.paper_hardware()
    flop_rate = hw.gpu_peak_flops * hw.gpu_mfu
    params = eviction.CostParams(position=not args.no_position,
                                 turns=not args.no_turns, time=not args.no_time,
                                 min_wait_s=args.min_wait_s)
    try:
        fractions = [float(x) for x in args.capacity_fraction.split(",")]
        policies = args.policies.split(",")
        if args.measured_ended and not args.measured:
            raise ValueError("--measured_ended needs --measured (the run "
                             "without ends)")
        if args.measured and "lru" not in policies:
            policies.insert(0, "lru")  # what the master runs
        if args.measured_ended and "ended" not in policies:
            policies.insert(1, "ended")
        if args.measured_cost and not args.measured:
            raise ValueError("--measured_cost needs --measured (the LRU run)")
        if args.measured_cost and "cost" not in policies:
            policies.append("cost")
        for name in policies:
            if name not in POLICIES:
                raise ValueError("unknown policy %r" % name)
        if any(not 0 <= f for f in fractions):
            raise ValueError("capacity fractions must be >= 0")
        if args.measured and (not args.trace or
                              args.block_tokens != args.trace_block_tokens):
            raise ValueError("--measured needs --trace and --block_tokens "
                             "equal to --trace_block_tokens (one block per "
                             "hash_id, as hymbench stores them)")
        label, reqs, order, parents = load_workload(args, model, flop_rate)
        real = (measured(reqs, args.measured, model, args.block_tokens, flop_rate)
                if args.measured else None)
        real_ended = (measured(reqs, args.measured_ended, model,
                               args.block_tokens, flop_rate)
                      if args.measured_ended else None)
        real_cost = (measured(reqs, args.measured_cost, model,
                              args.block_tokens, flop_rate)
                     if args.measured_cost else None)
    except (OSError, ValueError, trace.TraceError) as e:
        print("hymsim eviction: %s" % e, file=sys.stderr)
        return 2
    fp = footprint(reqs, args.block_tokens)
    base = footprint(reqs, args.block_tokens, True) if args.footprint == "reused" else fp
    convs = len({r.conversation for r in reqs})
    print("%s: %d requests, %d conversations, footprint %d blocks of %d tokens "
          "(%d read more than once; capacity basis: %s); %s, prefill at %.0f "
          "TFLOP/s" % (label, len(reqs), convs, fp, args.block_tokens,
                       footprint(reqs, args.block_tokens, True), args.footprint,
                       model.name, flop_rate / 1e12))
    print("%-9s %-8s %10s %9s %8s %10s" % ("capacity", "policy", "saved_s",
                                            "hit_ratio", "evicted", "vs_lru"))
    # Every policy's ceiling: a store that holds the whole footprint.
    ideal = replay(reqs, order, eviction.LruPolicy(), fp, model,
                   args.block_tokens, flop_rate, parents)
    print("%-9s %-8s %10.1f %9.3f %8d %10s" % ("1 (all)", "any", ideal["saved_s"],
                                             ideal["hit_ratio"], 0, "-"))
    results = []
    lines = []
    for frac in fractions:
        cap = int(frac * base)
        row = {}
        for name in policies:
            pol = make_policy(name, model, args.block_tokens, flop_rate, params,
                              reqs, order)
            row[name] = replay(reqs, order, pol, cap, model, args.block_tokens,
                               flop_rate, parents)
        for name in policies:
            x = row[name]
            rel = x["saved_s"] / row["lru"]["saved_s"] if "lru" in row and row["lru"]["saved_s"] else 0.0
            print("%-9s %-8s %10.1f %9.3f %8d %10s" % (
                "%.2f" % frac, name, x["saved_s"], x["hit_ratio"], x["evictions"],
                "%.2f" % rel if "lru" in row else "-"))
        results.append({"capacity_fraction": frac, "capacity_blocks": cap,
                        "policies": row})
        if "lru" in row and "cost" in row and row["lru"]["saved_s"]:
            ratio = row["cost"]["saved_s"] / row["lru"]["saved_s"]
            ceiling = ideal["saved_s"] / row["lru"]["saved_s"]
            results[-1]["cost_vs_lru_saved"] = ratio
            results[-1]["ceiling_vs_lru_saved"] = ceiling
            lines.append("eviction: cost_vs_lru_saved=%.2f (%s, capacity %.2f; "
                         "any policy <= %.2f)" % (ratio, label, frac, ceiling))
    agreement = None
    if real is not None and "lru" in results[0]["policies"]:
        model_lru = results[0]["policies"]["lru"]
        print("%-9s %-8s %10.1f %9.3f %8s %10s" % (
            "%.2f" % fractions[0], "measured", real["saved_s"],
            real["hit_ratio"], "-", "-"))
        agreement = {
            "saved": real["saved_s"] / model_lru["saved_s"] if model_lru["saved_s"] else 0.0,
            "hits": real["hit_blocks"] / model_lru["hit_blocks"] if model_lru["hit_blocks"] else 0.0,
            "measured": real}
        lines.append("eviction_agreement: measured_vs_model_saved=%.2f "
                     "measured_vs_model_hits=%.2f (lru, capacity %.2f)" %
                     (agreement["saved"], agreement["hits"], fractions[0]))
    if real_ended is not None:
        model_lru = results[0]["policies"]["lru"]
        model_ended = results[0]["policies"]["ended"]
        print("%-9s %-8s %10.1f %9.3f %8s %10s" % (
            "%.2f" % fractions[0], "meas-end", real_ended["saved_s"],
            real_ended["hit_ratio"], "-",
            "%.2f" % (real_ended["saved_s"] / real["saved_s"])
            if real["saved_s"] else "-"))

        def ratio(a, b):
            return a / b if b else 0.0
        agreement["ended"] = {
            "measured": real_ended,
            "measured_vs_lru_saved": ratio(real_ended["saved_s"], real["saved_s"]),
            "model_vs_lru_saved": ratio(model_ended["saved_s"], model_lru["saved_s"]),
            "measured_vs_model_saved": ratio(real_ended["saved_s"],
                                             model_ended["saved_s"])}
        lines.append("eviction_ended: measured_ended_vs_lru_saved=%.2f "
                     "model_ended_vs_lru_saved=%.2f measured_vs_model_saved=%.2f "
                     "(ended, capacity %.2f)" % (
                         agreement["ended"]["measured_vs_lru_saved"],
                         agreement["ended"]["model_vs_lru_saved"],
                         agreement["ended"]["measured_vs_model_saved"],
                         fractions[0]))
    if real_cost is not None:
        def ratio(a, b):
            return a / b if b else 0.0
        model_lru = results[0]["policies"]["lru"]
        model_cost = results[0]["policies"]["cost"]
        print("%-9s %-8s %10.1f %9.3f %8s %10s" % (
            "%.2f" % fractions[0], "meas-cost", real_cost["saved_s"],
            real_cost["hit_ratio"], "-",
            "%.2f" % ratio(real_cost["saved_s"], real["saved_s"])))
        agreement["cost"] = {
            "measured": real_cost,
            "measured_vs_lru_saved": ratio(real_cost["saved_s"], real["saved_s"]),
            "model_vs_lru_saved": ratio(model_cost["saved_s"], model_lru["saved_s"])}
        vs_ended = ""
        if real_ended is not None:
            agreement["cost"]["measured_vs_ended_saved"] = ratio(
                real_cost["saved_s"], real_ended["saved_s"])
            vs_ended = "measured_cost_vs_ended_saved=%.2f " % (
                agreement["cost"]["measured_vs_ended_saved"])
        lines.append("eviction_cost: measured_cost_vs_lru_saved=%.2f %s"
                     "model_cost_vs_lru_saved=%.2f (cost, capacity %.2f)" % (
                         agreement["cost"]["measured_vs_lru_saved"], vs_ended,
                         agreement["cost"]["model_vs_lru_saved"], fractions[0]))
    for line in lines:
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": label, "requests": len(reqs),
                       "footprint_blocks": fp, "capacity_basis": args.footprint,
                       "capacity_basis_blocks": base,
                       "block_tokens": args.block_tokens,
                       "model": model.name, "flop_rate": flop_rate,
                       "cost_params": dataclasses.asdict(params),
                       "ideal": ideal,
                       "results": results,
                       "agreement": agreement}, f, indent=1)
    return 0
