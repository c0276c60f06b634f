"""The paged KV pool: one preallocated array of blocks and a free list.

A block holds the K and V of `block_tokens` tokens for every layer, laid
out as a serving engine's paged cache with a cross-layer block (vLLM's
"cross-layer" layout, SGLang's `page_first`):

    pool.array.shape == (num_blocks, num_layers, 2, block_tokens,
                         kv_heads, head_dim)       dtype uint16 (bf16-sized)

so one block is one contiguous byte range: one HyMCache key, one buffer.
`pool.page(b)` is a numpy view of block b (no copy) that `Client.load`
writes into and `Client.store` reads from.
"""

import numpy as np

ELEMENT_BYTES = 2  # bf16 / fp16; numpy has no bf16, uint16 has its size


class PoolExhausted(RuntimeError):
    """Fewer free blocks than a request needs."""


class KvPool:
    """`num_blocks` blocks of shape (num_layers, 2, block_tokens, kv_heads,
    head_dim), allocated once and touched once (every page faulted in
    before the first request, as an engine's pinned pool is), handed out
    by a free list. Not thread-safe: the engine's one thread owns it."""

    def __init__(self, num_blocks, num_layers, block_tokens, kv_heads,
                 head_dim):
        for name, v in (("num_blocks", num_blocks), ("num_layers", num_layers),
                        ("block_tokens", block_tokens),
                        ("kv_heads", kv_heads), ("head_dim", head_dim)):
            if int(v) < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        self.block_shape = (num_layers, 2, block_tokens, kv_heads, head_dim)
        self.array = np.empty((num_blocks,) + self.block_shape, np.uint16)
        self.array.fill(0)  # faults in every page now, not during a load
        # Lowest block first: LIFO pops from the end.
        self._free = list(range(num_blocks - 1, -1, -1))
        self._in_use = set()

    @property
    def num_blocks(self):
        return self.array.shape[0]

    @property
    def block_tokens(self):
        return self.block_shape[2]

    @property
    def block_bytes(self):
        return self.array[0].nbytes

    @property
    def num_free(self):
        return len(self._free)

    @property
    def num_in_use(self):
        return len(self._in_use)

    def page(self, block):
        """Block `block` as a contiguous view of shape block_shape."""
        return self.array[block]

    def allocate(self, n):
        """`n` block ids off the free list; PoolExhausted (nothing taken)
        when fewer are free."""
        if n > len(self._free):
            raise PoolExhausted(f"{n} blocks wanted, {len(self._free)} of "
                                f"{self.num_blocks} free")
        blocks = [self._free.pop() for _ in range(n)]
        self._in_use.update(blocks)
        return blocks

    def free(self, blocks):
        """Returns blocks to the free list. ValueError for a block that is
        not allocated (a double free), before any is freed."""
        for b in blocks:
            if b not in self._in_use:
                raise ValueError(f"block {b} is not allocated")
        if len(set(blocks)) != len(blocks):
            raise ValueError("a block freed twice in one call")
        for b in blocks:
            self._in_use.remove(b)
            self._free.append(b)
