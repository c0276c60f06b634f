"""Exact cache models: an LRU block cache, transfer/write-buffer admission,
and the staging-window prefetch pipeline of one request.

All sizes are in blocks (the caller divides capacities by the block size).
"""

import collections


class LruCache:
    """A block cache of `capacity` blocks with least-recently-used eviction.
    A lookup touches the blocks it hits; an insert touches or adds."""

    def __init__(self, capacity):
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._d = collections.OrderedDict()
        self.evictions = 0

    def __contains__(self, key):
        return key in self._d

    def __len__(self):
        return len(self._d)

    def prefix_hit(self, ids, start=0):
        """The number of blocks ids[start:] that are cached before the first
        miss; touches them (most recent last, in read order)."""
        n = start
        while n < len(ids) and ids[n] in self._d:
            self._d.move_to_end(ids[n])
            n += 1
        return n - start

    def access(self, key):
        """One read: True on a hit (touched), False on a miss (inserted)."""
        if key in self._d:
            self._d.move_to_end(key)
            return True
        self.insert(key)
        return False

    def insert(self, key):
        if self.capacity == 0:
            return
        if key in self._d:
            self._d.move_to_end(key)
            return
        self._d[key] = True
        while len(self._d) > self.capacity:
            self._d.popitem(last=False)
            self.evictions += 1


class WriteBuffer:
    """Opportunistic admission through a bounded buffer that drains at a
    fixed rate (HyMCache's device write buffer; Mooncake's transfer buffer).
    A store of `nbytes` at time `t` is admitted whole if the backlog left at
    `t` plus `nbytes` fits in `capacity_bytes`, else refused (skipped, never
    waited for). Unbounded when capacity_bytes is None."""

    def __init__(self, capacity_bytes, drain_bytes_per_s):
        self.capacity = capacity_bytes
        self.rate = drain_bytes_per_s
        self._backlog = 0.0
        self._t = 0.0
        self.admitted = 0
        self.refused = 0

    def offer(self, t, nbytes):
        if self.capacity is None:
            self.admitted += 1
            return True
        if t > self._t:
            self._backlog = max(0.0, self._backlog - (t - self._t) * self.rate)
            self._t = t
        if self._backlog + nbytes > self.capacity:
            self.refused += 1
            return False
        self._backlog += nbytes
        self.admitted += 1
        return True


def staged_load_time(n, depth, refill_s, read_s, latency_s=0.0):
    """Time to read n blocks in order through a staging window.

    Each block is first refilled from the capacity tier into the window
    (latency_s + refill_s, one refill at a time per request) and then read
    out (read_s, one at a time). With depth >= 1 (prefetch), block i's
    refill may start once block i-depth has been read (its window slot is
    released) and the previous refill is done; with depth == 0 (prefetch
    off) block i's refill starts on demand, after block i-1 was read.
    Returns (seconds, stalls): stalls counts reads that waited for their
    block (the first read always does)."""
    if n <= 0:
        return 0.0, 0
    refill_done = [0.0] * n
    read_done = [0.0] * n
    stalls = 0
    for i in range(n):
        prev_refill = refill_done[i - 1] if i else 0.0
        prev_read = read_done[i - 1] if i else 0.0
        if depth == 0:
            start = prev_read
        else:
            start = max(prev_refill, read_done[i - depth] if i >= depth else 0.0)
        refill_done[i] = start + latency_s + refill_s
        if refill_done[i] > prev_read:
            stalls += 1
        read_done[i] = max(prev_read, refill_done[i]) + read_s
    return read_done[-1], stalls
