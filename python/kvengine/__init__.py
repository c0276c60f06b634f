"""kvengine: an engine-shaped KV manager on the hymcache package.

The reference integration for engine authors and the small-scale test bed
for TTFT per turn: a paged KV pool shaped like a serving engine's, serving
multi-turn conversations with HyMCache (lookup -> load into the pool's
pages -> prefill the rest -> asynchronous store from the pool) and with
recomputation only, and a report of TTFT per turn for both.

    pool = KvPool(num_blocks=64, num_layers=24, block_tokens=64,
                  kv_heads=2, head_dim=64)       # one array, pre-faulted
    kb = hymcache.KeyBuilder(model="m", dtype="bf16", block_tokens=64)
    with hymcache.Client(master) as client, \\
            Engine(pool, client, kb, prefill_tokens_per_s=20000) as engine:
        for req in workload.synthetic(conversations=8, turns=6):
            rec = engine.serve(req)      # rec["ttft_ms"], rec["loaded_blocks"]

Modules: pool (KvPool: the pool and its free list), engine (Engine: one
request at a time; the prefill model and the deterministic block contents),
workload (the synthetic generator, Mooncake-format traces), report (table,
JSON, PNG), cli (the kv_engine command; docs/kv_engine.md).

The model in one paragraph (details in engine.py): a block is num_layers x
2 (K, V) x block_tokens x kv_heads x head_dim 2-byte elements, contiguous
(cross-layer layout), one HyMCache key per full block (KeyBuilder over the
prompt's token ids). Prefill of m tokens is modelled as m /
prefill_tokens_per_s seconds, of which the real fill of the blocks'
contents (a deterministic function of the tokens through the block and of
the layer) is a part and a sleep the rest. TTFT = keys + lookup + load +
modelled prefill. Requests are served back to back, one at a time (no
queueing, no batching, no decode); only prompt blocks are stored.

JSON document (`kv_engine --json=PATH`; report.build), schema
"hymcache.kv_engine/1". Times are milliseconds, counts are blocks unless
named tokens:

    {
      "schema": "hymcache.kv_engine/1",
      "config": {
        "model_name": str, "num_layers": int, "kv_heads": int,
        "head_dim": int, "block_tokens": int, "element_bytes": 2,
        "block_bytes": int,          # num_layers*2*block_tokens*kv_heads*
                                     # head_dim*element_bytes
        "pool_blocks": int, "prefill_tokens_per_s": float,
        "load_deadline_s": float, "transport": str, "wait_stores": bool,
        "salt": str, "modes": ["recompute", "hymcache"],
        "workload": {"kind": "synthetic", "conversations": int,
                     "turns": int, "system_prompt_tokens": int,
                     "user_tokens": int, "output_tokens": int,
                     "shared_system_prompt": bool, "seed": int}
                  | {"kind": "mooncake", "trace": str}
      },
      "turns": [row, ...],           # one per turn, ascending
      "all": row,                    # every request
      "requests": [request, ...]     # in serving order
    }
    row = {
      "turn": int | "all", "requests": int, "blocks_mean": float,
      "hymcache": ttft | null, "recompute": ttft | null,   # null: mode off
      "hit_blocks_mean": float | null,   # loaded blocks per request
      "hit_blocks_total": int | null,
      "speedup_mean": float | null,      # recompute mean / hymcache mean
      "speedup_p50": float | null
    }
    ttft = {"p50_ms": float, "mean_ms": float, "max_ms": float}
    request = {
      "index": int, "conversation": int (-1: unknown), "turn": int,
      "timestamp_ms": float, "input_tokens": int, "output_tokens": int,
      "blocks": int,                 # ceil(input_tokens / block_tokens)
      "full_blocks": int,            # input_tokens // block_tokens (keyed)
      "hymcache": served | null, "recompute": served | null
    }
    served = {
      "mode": "hymcache" | "recompute",
      "blocks": int, "full_blocks": int,
      "hit_blocks": int,             # lookup's hit prefix (0 in recompute)
      "loaded_blocks": int,          # landed in the pool; the rest computed
      "load_stop": str | null,       # status code that ended the load early
                                     # or failed the lookup (e.g.
                                     # "UNAVAILABLE", "NOT_FOUND")
      "lookup_ms": float, "load_ms": float,
      "computed_tokens": int,        # input_tokens -
                                     # loaded_blocks * block_tokens
      "compute_ms": float,           # real time of the fill
      "modelled_prefill_ms": float,  # computed_tokens / prefill rate
      "prefill_ms": float,           # max(compute, modelled) + sleep slack
      "prefill_overrun": bool,       # compute_ms > modelled_prefill_ms
      "ttft_ms": float,              # keys + lookup + load + prefill
      "corrupt_blocks": int,         # loaded blocks != their fill (verify)
      "store": null | {              # null: nothing new to store
        "blocks": int, "stored": int, "skipped": int, "failed": int,
        "refused": int, "error": str | null, "done": true
      }
    }
"""

from .engine import Engine, block_seeds, expected_block, fill_block
from .pool import ELEMENT_BYTES, KvPool, PoolExhausted

__all__ = ["Engine", "KvPool", "PoolExhausted", "ELEMENT_BYTES",
           "block_seeds", "expected_block", "fill_block"]
