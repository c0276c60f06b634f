"""An exact block store of bounded capacity under the master's chain rule,
with two eviction policies: the master's chain-aware LRU and a cost-aware
one (issue 33).

Chains. Block ids are prefix ids: block k of a request's hash_ids has block
k-1 as its parent. A block is stored only after its parent (a request
stores its full blocks head first), and only chain leaves (blocks without a
cached child) are evictable, so the cached set is closed under parents and
a chain shrinks from its tail (master/master_service_eviction.cc). The
blocks of the request being served are pinned (the master never evicts a
PutStart's existing keys or its parent); when every leaf is pinned the
store refuses the rest of the request's blocks.

lru: the master's order. A read touches the chain it hits so that the head
is the most recent and each block sits just below its parent; a store puts
a continuation just below its parent. That order is the key (tick of the
last request that touched the block, -depth); the victim is the leaf with
the smallest key (the master's walk from the least recent end takes the
first leaf it meets, which is the same block).

cost: the victim is the leaf with the lowest cost_score (below): prefill
seconds its presence saves x the probability it is read again, per byte,
per second it is expected to wait for that read. Scores depend on the time
and on the online statistics, so the leaves are rescored (a heap rebuilt
from the leaf set, O(leaves)) at the first eviction of each request; within
a request the time and the statistics are fixed and the heap is exact.
"""

import bisect
import dataclasses
import heapq
import math


def block_prefill_s(model, depth, block_tokens, flop_rate):
    """Seconds of prefill that a cached block saves: the FLOPs of its
    block_tokens tokens after depth * block_tokens tokens of context (the
    weights' 2 per parameter per token plus attention, which grows with the
    position) over the effective FLOP rate. Prefill FLOPs are additive
    (flops(c, n) = flops(c, b) + flops(c + b, n - b)), so this is exactly
    what the block's presence takes off a request that reads past it."""
    return model.prefill_flops(depth * block_tokens, block_tokens) / flop_rate


@dataclasses.dataclass
class CostParams:
    """The cost policy's terms (each can be switched off to measure it)."""
    # Weight blocks by their position-dependent prefill seconds (else all
    # blocks save the same, the weights' part).
    position: bool = True
    # Use the per-turn return probability (else 1 for every chain).
    turns: bool = True
    # Condition on the idle time and divide by the expected wait for the
    # next read (the "hit density" of Beckmann et al., NSDI'18: value per
    # byte per second of occupancy); else no time term.
    time: bool = True
    # Floor of the expected wait, seconds (one scheduling quantum).
    min_wait_s: float = 1.0


def cost_score(prefill_s, nbytes, p_turn, survival, residual_s, readers, p):
    """The cost policy's score of an evictable leaf; the lowest goes first.

    Inputs (all known to a master): prefill_s, the block's prefill seconds
    (block_prefill_s: its depth and block_tokens); nbytes, its size;
    p_turn, the tenant's probability that a conversation at the chain's
    turn comes back (ReturnStats.p_turn); survival = P(gap > idle) and
    residual_s = E[gap - idle | gap > idle] from the tenant's inter-turn
    gaps at the chain's idle time (now - last use; ReturnStats.gap_at);
    readers, the distinct conversations that read or wrote the block.

        q     = p_turn * S / (1 - p_turn + p_turn * S)   still coming back
        P     = 1 - (1 - q) ** readers                    any reader returns
        wait  = max(residual_s, min_wait_s) / readers
        score = prefill_s * P / (nbytes * wait)
    """
    q = p_turn if p.turns else 1.0
    if p.time:
        q = q * survival / max(1e-12, 1.0 - q + q * survival)
    prob = 1.0 - (1.0 - q) ** max(1, readers)
    wait = max(residual_s, p.min_wait_s) / max(1, readers) if p.time else 1.0
    return prefill_s * prob / (nbytes * wait)


class ReturnStats:
    """One tenant's return statistics, learned online from arrivals.

    A request at turn k "returns" when a later request first extends its
    chain (its conversation's turn k+1, or a branch; a further branch is
    one more reader, not another return). The gap between the two arrivals
    goes into a histogram of log-spaced bins, whose CDF is F. Requests not
    yet extended are censored, not failed: a request reached `a` seconds
    ago has had the chance F(a) to show its return by now, so

        p_turn(k) = (R_k + 1) / (sum over turn-k requests i of F(now - t_i) + 2)

    (R_k returns seen; method of moments, E[R_k] = p_k * sum F, with a
    Laplace prior; capped at 1). It neither waits for a horizon nor needs
    the trace to outlast the longest gap. Turns above max_turn share the
    last counter; `now` is the latest arrival observed."""

    BINS = 64
    BASE_S = 1e-3
    RATIO = 2 ** 0.5

    def __init__(self, max_turn=16):
        self.max_turn = max_turn
        self.returned = [0] * (max_turn + 1)
        self.hist = [0] * self.BINS
        self._reach = [[] for _ in range(max_turn + 1)]  # arrival times
        self._open = {}       # request not yet extended -> turn
        self._reach_time = {}  # request -> arrival
        self._now = 0.0
        self._tables = None
        self._exposure = {}   # k -> sum F(now - t_i), for self._now

    def _k(self, turn):
        return min(max(turn, 1), self.max_turn)

    def observe(self, now, request, turn, parent=None):
        """`request` (any key), at `turn`, arrives at `now` (not before the
        previous arrival), extending the chain of the earlier request
        `parent` (None: a first turn)."""
        k = self._open.pop(parent, None) if parent is not None else None
        if k is not None:
            self.returned[k] += 1
            gap = max(0.0, now - self._reach_time[parent])
            self.hist[self._bin(gap)] += 1
            self._tables = None
        self._open[request] = self._k(turn)
        self._reach_time[request] = now
        self._reach[self._k(turn)].append(now)
        self._now = now
        self._exposure = {}

    def p_turn(self, turn):
        k = self._k(turn)
        e = self._exposure.get(k)
        if e is None:
            mids, cnt, _ = self._cdf()
            times = self._reach[k]
            e = 0.0
            if cnt[0]:
                for i in range(self.BINS):
                    if self.hist[i]:
                        e += self.hist[i] * bisect.bisect_left(
                            times, self._now - mids[i])
                e /= cnt[0]
            self._exposure[k] = e
        return min(1.0, (self.returned[k] + 1.0) / (e + 2.0))

    def _bin(self, gap):
        if gap <= self.BASE_S:
            return 0
        return min(self.BINS - 1, int(math.log(gap / self.BASE_S, self.RATIO)))

    def _mid(self, i):
        return self.BASE_S * self.RATIO ** (i + 0.5)

    def _cdf(self):
        if self._tables is None:
            mids = [self._mid(i) for i in range(self.BINS)]
            cnt = [0.0] * (self.BINS + 1)
            tot = [0.0] * (self.BINS + 1)
            for i in range(self.BINS - 1, -1, -1):
                cnt[i] = cnt[i + 1] + self.hist[i]
                tot[i] = tot[i + 1] + self.hist[i] * mids[i]
            self._tables = (mids, cnt, tot)
        return self._tables

    def gap_at(self, idle_s):
        """(survival, residual_s) of the inter-turn gap at `idle_s`: the
        share of gaps longer than idle_s and their mean excess over it
        (each gap at its bin's geometric middle; half a pseudo-gap at
        2 x idle_s keeps both defined past the longest gap seen)."""
        mids, cnt, tot = self._cdf()
        n = cnt[0]
        if n == 0:
            return 1.0, 0.0
        i = bisect.bisect_right(mids, idle_s)
        c = cnt[i] + 0.5
        excess = tot[i] - cnt[i] * idle_s + 0.5 * max(idle_s, self.BASE_S)
        return c / (n + 0.5), excess / c


@dataclasses.dataclass(slots=True)
class Block:
    parent: object      # parent block id, None for a chain head
    depth: int          # position in blocks (0: head)
    gen: int            # insertion number (heap entries name it)
    children: int = 0   # cached children
    tick: int = 0       # lru: the request that last touched it
    last_use: float = 0.0
    turn: int = 1
    version: int = 0    # cost: bumped on every change of the score's inputs
    readers: object = None  # set of conversations


class LruPolicy:
    name = "lru"

    def __init__(self):
        self._heap = []

    def begin(self, store, now, stats):
        pass

    def leaf(self, store, bid, b):
        heapq.heappush(self._heap, (b.tick, -b.depth, b.gen, bid))

    def victim(self, store, pinned):
        held = []
        out = None
        while self._heap:
            tick, nd, gen, bid = heapq.heappop(self._heap)
            b = store.blocks.get(bid)
            if b is None or b.gen != gen or b.children or b.tick != tick:
                continue
            if bid in pinned:
                held.append((tick, nd, gen, bid))
                continue
            out = bid
            break
        for e in held:
            heapq.heappush(self._heap, e)
        return out


class EndedPolicy(LruPolicy):
    """The master's LRU with conversation ends (BatchLookup ended,
    MetadataIndex::DemoteChain): an ended chain's unshared tail goes to the
    least recent end, the latest ended first, each chain tail first."""
    name = "ended"

    def __init__(self):
        super().__init__()
        self._ends = 0

    def demote(self, store, bids):
        """`bids`: the blocks to demote, tail first (BlockStore.end)."""
        self._ends += 1
        for bid in bids:
            b = store.blocks[bid]
            b.tick = -self._ends
            b.version += 1
            if not b.children:
                self.leaf(store, bid, b)


class CostPolicy:
    name = "cost"

    def __init__(self, model, block_tokens, block_bytes, flop_rate, params=None):
        self.model = model
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.flop_rate = flop_rate
        self.params = params or CostParams()
        self._prefill = []    # prefill seconds by depth
        self._heap = []
        self._now = 0.0
        self._stats = None
        self._stale = True

    def prefill_s(self, depth):
        while len(self._prefill) <= depth:
            d = len(self._prefill)
            self._prefill.append(block_prefill_s(
                self.model, d if self.params.position else 0,
                self.block_tokens, self.flop_rate))
        return self._prefill[depth]

    def score(self, bid, b):
        s, r = self._stats.gap_at(self._now - b.last_use)
        return cost_score(self.prefill_s(b.depth), self.block_bytes,
                          self._stats.p_turn(b.turn), s, r, len(b.readers),
                          self.params)

    def begin(self, store, now, stats):
        # Every request may have moved the time or the statistics.
        self._stale = True
        self._now = now
        self._stats = stats

    def leaf(self, store, bid, b):
        if not self._stale:
            heapq.heappush(self._heap, (self.score(bid, b), b.gen, b.version, bid))

    def victim(self, store, pinned):
        if self._stale:
            self._heap = []
            for bid in store.leaves:
                b = store.blocks[bid]
                self._heap.append((self.score(bid, b), b.gen, b.version, bid))
            heapq.heapify(self._heap)
            self._stale = False
        held = []
        out = None
        while self._heap:
            e = heapq.heappop(self._heap)
            b = store.blocks.get(e[3])
            if b is None or b.gen != e[1] or b.version != e[2] or b.children:
                continue
            if e[3] in pinned:
                held.append(e)
                continue
            out = e[3]
            break
        for e in held:
            heapq.heappush(self._heap, e)
        return out


class BlockStore:
    """`capacity` blocks under `policy` (LruPolicy or CostPolicy)."""

    def __init__(self, capacity, policy):
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self.policy = policy
        self.blocks = {}
        self.leaves = set()
        self.evictions = 0
        self.refused = 0
        self._tick = 0
        self._gen = 0

    def __len__(self):
        return len(self.blocks)

    def __contains__(self, bid):
        return bid in self.blocks

    def serve(self, ids, now, conversation=0, turn=1, stats=None):
        """One request over its full blocks `ids` (head first): counts the
        leading cached blocks h, touches them, then stores ids[h:] in
        order, evicting leaves as needed. Returns h."""
        self._tick += 1
        self.policy.begin(self, now, stats)
        h = 0
        while h < len(ids) and ids[h] in self.blocks:
            self._touch(ids[h], now, conversation, turn)
            h += 1
        pinned = set(ids)
        for k in range(h, len(ids)):
            if self.capacity == 0:
                self.refused += len(ids) - k
                break
            while len(self.blocks) >= self.capacity:
                v = self.policy.victim(self, pinned)
                if v is None:
                    break
                self._evict(v)
            if len(self.blocks) >= self.capacity:
                self.refused += len(ids) - k
                break
            parent = ids[k - 1] if k else None
            self._gen += 1
            self.blocks[ids[k]] = Block(parent=parent, depth=k, gen=self._gen,
                                        readers=set())
            self.leaves.add(ids[k])
            if parent is not None:
                p = self.blocks[parent]
                p.children += 1
                self.leaves.discard(parent)
            self._touch(ids[k], now, conversation, turn)
        return h

    def end(self, ids):
        """The conversation whose chain is `ids` (head first) ended: the
        policy may demote its unshared tail (EndedPolicy), walked as
        MetadataIndex::DemoteChain walks it: from the last cached block (no
        children, or one: it stays), up while each block's only child is
        the next one. Returns the blocks demoted, tail first."""
        demote = getattr(self.policy, "demote", None)
        if demote is None:
            return []
        out = []
        child = None
        for k in range(len(ids) - 1, -1, -1):
            b = self.blocks.get(ids[k])
            if b is None:
                if child is None:
                    continue
                break
            if child is None:
                if b.children > 1:
                    break
                if b.children == 0:
                    out.append(ids[k])
            else:
                if b.children != 1 or self.blocks[child].parent != ids[k]:
                    break
                out.append(ids[k])
            child = ids[k]
        if out:
            demote(self, out)
        return out

    def _touch(self, bid, now, conversation, turn):
        b = self.blocks[bid]
        b.tick = self._tick
        b.last_use = now
        b.turn = turn
        b.version += 1
        if len(b.readers) < 64:
            b.readers.add(conversation)
        if not b.children:
            self.policy.leaf(self, bid, b)

    def _evict(self, bid):
        b = self.blocks.pop(bid)
        assert not b.children, "evicted a block with a cached child"
        self.leaves.discard(bid)
        self.evictions += 1
        if b.parent is not None:
            p = self.blocks[b.parent]
            p.children -= 1
            if not p.children:
                self.leaves.add(b.parent)
                p.version += 1
                self.policy.leaf(self, b.parent, p)

    def check(self):
        """The invariants: within capacity, every cached block's parent is
        cached, children counts and the leaf set are exact."""
        assert len(self.blocks) <= self.capacity
        kids = {}
        for bid, b in self.blocks.items():
            if b.parent is not None:
                assert b.parent in self.blocks, "orphan %r" % (bid,)
                kids[b.parent] = kids.get(b.parent, 0) + 1
        for bid, b in self.blocks.items():
            assert b.children == kids.get(bid, 0)
        assert self.leaves == {bid for bid, b in self.blocks.items() if not b.children}
