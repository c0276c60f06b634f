"""The engine: serves one request (a turn) at a time out of a KvPool.

With a client (HyMCache mode), per request:
  1. keys: KeyBuilder.keys(prompt tokens), one per full block;
  2. lookup of the keys the engine may take from the cache (all full
     blocks but the one holding the last prompt token: an engine must
     compute at least one token to produce logits, as vLLM caps it);
  3. load of the hit prefix straight into the request's pool pages;
  4. "prefill" of blocks [loaded, n) (the deterministic fill below, then a
     sleep for the rest of the modelled time);
  5. store of the new full blocks from the pool pages, with the last loaded
     key as parent_key; the future is kept, the pages stay allocated until
     it is done (reaped before later requests), the engine goes on.
Without a client (recompute-only mode) steps 1-3 and 5 are skipped.
TTFT = wall time of steps 1-4 (the first token is out when prefill ends).

Prefill model: prefill of `m` tokens takes m / prefill_tokens_per_s
seconds. The engine computes the blocks' contents for real (fill_block,
numpy) and then sleeps for what is left of that time; when the fill alone
takes longer (a slow machine, a tiny model time) the turn records
`prefill_overrun` and its TTFT is the real time. Decode is not modelled:
only prompt blocks are stored, and a request's pages are freed when its
first token is out (no engine-local prefix cache: reuse comes from HyMCache
only).

Block contents: block i of a prompt is a deterministic function of the
prompt's tokens through block i (as real KV is) and of the layer:
seed_i = BLAKE2b-64 chain over the blocks' token bytes, and element
[layer, kv, t, head, dim] = high 16 bits of the uint32 sum
seed_i + layer*A + kv*B + token[t]*C + t*D + (head*head_dim + dim)*E
(constants below); rows past a partial block's last token are 0. So a block
loaded from HyMCache can be checked byte for byte (`verify`).
"""

import hashlib
import math
import time

import numpy as np

import hymcache

_A = np.uint32(0x9E3779B1)
_B = np.uint32(0x85EBCA77)
_C = np.uint32(0x27D4EB2F)
_D = np.uint32(0x165667B1)
_E = np.uint32(0x61C88647)


def block_seeds(tokens, block_tokens):
    """seed_i of every block (full and partial) of `tokens`."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    seeds = []
    prev = b""
    for start in range(0, len(tokens), block_tokens):
        prev = hashlib.blake2b(
            prev + tokens[start:start + block_tokens].tobytes(),
            digest_size=8).digest()
        seeds.append(int.from_bytes(prev[:4], "little"))
    return seeds


def fill_block(page, tokens, seed):
    """Writes the block's deterministic contents into `page` (shape
    (layers, 2, block_tokens, kv_heads, head_dim), uint16) in place."""
    layers, _, block_tokens, heads, dim = page.shape
    n = len(tokens)
    base = (np.uint32(seed) + np.arange(layers, dtype=np.uint32)[:, None] * _A
            + np.arange(2, dtype=np.uint32)[None, :] * _B)
    row = (np.asarray(tokens, dtype=np.int32).view(np.uint32) * _C
           + np.arange(n, dtype=np.uint32) * _D)
    col = np.arange(heads * dim, dtype=np.uint32).reshape(heads, dim) * _E
    x = base[:, :, None, None, None] + row[None, None, :, None, None] + col
    x >>= np.uint32(16)
    np.copyto(page[:, :, :n], x, casting="unsafe")
    if n < block_tokens:
        page[:, :, n:] = 0


def expected_block(shape, tokens, seed):
    """What fill_block writes, in a new array (for verification)."""
    out = np.empty(shape, np.uint16)
    fill_block(out, tokens, seed)
    return out


class Engine:
    """Serves requests one at a time from `pool`.

    client: a hymcache.Client (HyMCache mode) or None (recompute only).
    key_builder: the hymcache.KeyBuilder of the model's namespace; its
      block_tokens must be the pool's. Required with a client.
    prefill_tokens_per_s: the modelled prefill rate (> 0).
    load_deadline: seconds per lookup / load call.
    wait_stores: wait for the stores in flight before each request (outside
      TTFT), so that every request sees all earlier requests' blocks
      (deterministic hit counts for tests); an engine does not wait.
    verify: check every loaded block against fill_block (outside TTFT).
    Registers the pool with the client; close() drains the stores and
    unregisters it. Not thread-safe (one engine thread, as a scheduler).
    """

    def __init__(self, pool, client=None, key_builder=None,
                 prefill_tokens_per_s=20000.0, load_deadline=5.0,
                 wait_stores=False, verify=False, clock=time.perf_counter,
                 sleep=time.sleep):
        if prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be > 0")
        if client is not None:
            if key_builder is None:
                raise ValueError("a client needs a key_builder")
            if key_builder.block_tokens != pool.block_tokens:
                raise ValueError(
                    f"key_builder has {key_builder.block_tokens} tokens per "
                    f"block, the pool {pool.block_tokens}")
        self.pool = pool
        self.client = client
        self.key_builder = key_builder
        self.prefill_tokens_per_s = float(prefill_tokens_per_s)
        self.load_deadline = load_deadline
        self.wait_stores = wait_stores
        self.verify = verify
        self._clock = clock
        self._sleep = sleep
        self._pending = []  # (future, blocks, record) in issue order
        if client is not None:
            client.register_buffer(pool.array)

    @property
    def mode(self):
        return "recompute" if self.client is None else "hymcache"

    @property
    def pending_stores(self):
        return len(self._pending)

    def serve(self, request):
        """Serves one request; returns its record (a dict, see the package
        doc's JSON schema; "store" is filled in when its store finishes)."""
        self._reap()
        if self.wait_stores:
            self.drain()
        pool = self.pool
        T = pool.block_tokens
        tokens = request.tokens
        n = len(tokens)
        if n < 1:
            raise ValueError("a request needs at least one token")
        n_blocks = math.ceil(n / T)
        n_full = n // T
        blocks = self._allocate(n_blocks)
        try:
            rec = {"mode": self.mode, "blocks": n_blocks,
                   "full_blocks": n_full, "hit_blocks": 0,
                   "loaded_blocks": 0, "load_stop": None, "lookup_ms": 0.0,
                   "load_ms": 0.0, "store": None, "corrupt_blocks": 0}
            start = self._clock()
            keys = []
            loaded = 0
            if self.client is not None:
                keys = self.key_builder.keys(tokens)
                usable = (n - 1) // T
                hit = 0
                if usable:
                    t0 = self._clock()
                    try:
                        hit = hymcache.hit_prefix(self.client.exists(
                            keys[:usable], deadline=self.load_deadline
                        ))
                    except hymcache.Error as e:  # the master is away: a miss
                        rec["load_stop"] = e.code
                    t1 = self._clock()
                    rec["lookup_ms"] = (t1 - t0) * 1e3
                    if hit:
                        try:
                            got = self.client.load(
                                keys[:hit],
                                [pool.page(b) for b in blocks[:hit]],
                                deadline=self.load_deadline)
                            loaded = got.loaded
                            if got.stop_reason is not None:
                                rec["load_stop"] = got.stop_reason.code
                        except hymcache.Error as e:  # before anything landed
                            rec["load_stop"] = e.code
                        rec["load_ms"] = (self._clock() - t1) * 1e3
                rec["hit_blocks"] = hit
                rec["loaded_blocks"] = loaded

            # Prefill of tokens [loaded * T, n).
            computed = n - loaded * T
            t_prefill = self._clock()
            seeds = block_seeds(tokens, T)
            for i in range(loaded, n_blocks):
                fill_block(pool.page(blocks[i]), tokens[i * T:(i + 1) * T],
                           seeds[i])
            modelled = computed / self.prefill_tokens_per_s
            spent = self._clock() - t_prefill
            if spent < modelled:
                self._sleep(modelled - spent)
            end = self._clock()
            rec["computed_tokens"] = computed
            rec["compute_ms"] = spent * 1e3
            rec["modelled_prefill_ms"] = modelled * 1e3
            rec["prefill_ms"] = (end - t_prefill) * 1e3
            rec["prefill_overrun"] = spent > modelled
            rec["ttft_ms"] = (end - start) * 1e3

            if self.verify:
                for i in range(loaded):
                    want = expected_block(pool.block_shape,
                                          tokens[i * T:(i + 1) * T], seeds[i])
                    if not np.array_equal(pool.page(blocks[i]), want):
                        rec["corrupt_blocks"] += 1

            held = []
            if self.client is not None and n_full > loaded:
                held = blocks[loaded:n_full]
                rec["store"] = {"blocks": len(held), "stored": 0, "skipped": 0,
                                "failed": 0, "refused": 0, "error": None,
                                "done": False}
                try:
                    f = self.client.store(
                        keys[loaded:n_full], [pool.page(b) for b in held],
                        parent_key=keys[loaded - 1] if loaded else None)
                    self._pending.append((f, held, rec["store"]))
                except hymcache.Error as e:
                    rec["store"].update(error=e.code, failed=len(held),
                                        done=True)
                    held = []
        except BaseException:  # no page leaks out of a failed request
            pool.free(blocks)
            raise
        kept = set(held)
        pool.free([b for b in blocks if b not in kept])
        return rec

    def drain(self, timeout=30.0):
        """Waits for every store in flight and frees their blocks."""
        while self._pending:
            self._finish(0, timeout)

    def close(self):
        """Drains the stores and unregisters the pool. Idempotent."""
        self.drain()
        if self.client is not None:
            self.client.unregister_buffer(self.pool.array)
            self.client = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _allocate(self, n):
        while True:
            self._reap()
            if n <= self.pool.num_free or not self._pending:
                return self.pool.allocate(n)  # PoolExhausted if too few
            self._finish(0, 30.0)

    def _reap(self):
        i = 0
        while i < len(self._pending):
            if self._pending[i][0].done():
                self._finish(i, None)
            else:
                i += 1

    def _finish(self, i, timeout):
        f, blocks, rec = self._pending[i]
        try:
            r = f.result(timeout)
            rec.update(stored=r.stored, skipped=r.skipped, failed=r.failed,
                       refused=r.refused)
        except hymcache.DeadlineExceeded:
            if not f.done():
                raise  # still reading the pages: they cannot be freed
            rec.update(error="DEADLINE_EXCEEDED", failed=rec["blocks"])
        except hymcache.Error as e:
            rec.update(error=e.code, failed=rec["blocks"])
        rec["done"] = True
        del self._pending[i]
        self.pool.free(blocks)
