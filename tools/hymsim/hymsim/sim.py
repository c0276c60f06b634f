"""The trace-driven TTFT model: prefill workers, each system's tiers as
exact cache simulations, tier bandwidth as FIFO lanes, and closed-loop
sessions for the built-in workload.

One request, dispatched at time s to the worker w that would finish it
first (KV-aware routing: the worker's own GPU / local caches count):
  g = leading blocks in w's GPU prefix cache (LRU, touched)
  h = g + leading blocks from g on in the system's external tier
  load = lookup + the tier's time for blocks [g, h) on the earliest-free
         lane (FIFO; a lane is a share of the tier's aggregate bandwidth);
         if it would end after s + deadline, the connector gives up at the
         deadline and recomputes from g; on Mooncake, if it ends more than
         the lease after the lookup, it fails at its end and recomputes
         (async_load: the load is timed from arrival, not from s)
  prefill = FLOPs(cached = h blocks, new = the rest) / (peak * MFU)
  finish = start + load + prefill - overlap * min(load, prefill)
  TTFT = finish - arrival (queueing included)
Stores: every full block computed goes into w's GPU cache and, through the
tier's admission (a write buffer draining at the write rate, block by block
in chain order up to the first refusal), into the external tier.
"""

import collections
import dataclasses
import heapq
import math

from . import cache
from . import presets


@dataclasses.dataclass
class Tier:
    name: str
    capacity_blocks: int
    # "shared": one tier for all workers (remote); "worker": one per worker.
    scope: str
    lanes: int
    lane_bps: float
    latency_s: float
    write_buffer_bytes: object  # None: unbounded
    write_bps: float
    # "shared": one write buffer at the tier (HyMCache's device buffer);
    # "worker": one per worker (Mooncake's transfer buffer in host DRAM),
    # each draining at write_bps / workers.
    write_buffer_scope: str = "shared"
    # "dram": loads at lane_bps; "staging": HyMCache's window over the
    # capacity tier; "lru_device": a transparent LRU device DRAM cache.
    device: str = "dram"
    prefetch: bool = True
    device_dram_blocks: int = 0
    refill_bps: float = 0.0
    prefetch_depth: int = 0
    miss_bps: float = 0.0
    # Mooncake Store's read lease (seconds, None: none): granted when the
    # lookup (GetReplicaList) returns; a Get whose transfer ends after it
    # fails after the transfer (LEASE_EXPIRED) and the connector recomputes.
    lease_s: object = None
    # Stores occupy the read lanes (one device serves both: Mooncake's
    # persistence writes every Put to the same file system it reads from).
    writes_share_lanes: bool = False
    # Fixed cost per block read (one file per object: open + extent lookup).
    per_block_latency_s: float = 0.0
    # Think-time hints (staging device): blocks of the window that hints may
    # hold (0: no hints), and how long an unclaimed hint holds them past its
    # expected turn.
    hint_blocks: int = 0
    hint_hold_s: float = 0.0


@dataclasses.dataclass
class System:
    name: str
    label: str
    gpu_cache: bool
    tier: object = None  # Tier or None
    overlap: float = 0.0


SYSTEMS = ["recompute", "gpu_prefix", "lmcache_local", "mooncake_dram",
           "mooncake_nvmeof", "hymcache"]
VARIANTS = ["hymcache_noprefetch", "hymcache_lru", "hymcache_dram_only",
            "hymcache_hints", "hymcache_all_dram"]
LABELS = {
    "recompute": "Recomputation",
    "gpu_prefix": "GPU Prefix Caching",
    "lmcache_local": "Local LMCache",
    "mooncake_dram": "Distributed Mooncake",
    "mooncake_nvmeof": "Mooncake NVMe-oF",
    "hymcache": "HyMCache",
    "hymcache_noprefetch": "HyMCache, prefetch off",
    "hymcache_lru": "HyMCache, LRU device",
    "hymcache_dram_only": "HyMCache, DRAM only",
    "hymcache_hints": "HyMCache, think-time hints",
    "hymcache_all_dram": "HyMCache, all DRAM of the same capacity",
}


def make_system(name, hw, block_bytes):
    blocks = lambda b: int(b // block_bytes)
    remote_lanes = max(1, int(round(hw.storage_nic_bps / hw.worker_nic_bps)))
    remote_lane_bps = min(hw.worker_nic_bps, hw.storage_nic_bps / remote_lanes)
    if name == "recompute":
        return System(name, LABELS[name], gpu_cache=False)
    if name == "gpu_prefix":
        return System(name, LABELS[name], gpu_cache=True)
    if name == "lmcache_local":
        return System(name, LABELS[name], True, Tier(
            "cpu_dram", blocks(hw.lmcache_bytes_per_worker), "worker", 1,
            hw.lmcache_bps, 0.0, None, hw.lmcache_bps))
    if name == "mooncake_dram":
        return System(name, LABELS[name], True, Tier(
            "remote_dram", blocks(hw.mooncake_dram_bytes), "shared",
            remote_lanes, remote_lane_bps, 0.0,
            hw.mooncake_transfer_buffer_bytes, hw.storage_nic_bps,
            write_buffer_scope="worker", lease_s=hw.mooncake_lease_s or None))
    if name == "mooncake_nvmeof":
        lanes = max(1, int(round(hw.nvmeof_bps / hw.worker_nic_bps)))
        return System(name, LABELS[name], True, Tier(
            "nvmeof", blocks(hw.nvmeof_bytes), "shared", lanes,
            min(hw.worker_nic_bps, hw.nvmeof_bps / lanes), hw.nvmeof_latency_s,
            hw.mooncake_transfer_buffer_bytes, hw.nvmeof_write_bps,
            write_buffer_scope="worker", lease_s=hw.mooncake_lease_s or None,
            writes_share_lanes=bool(hw.nvmeof_writes_share_reads),
            per_block_latency_s=hw.nvmeof_per_object_s))
    if name.startswith("hymcache"):
        window = hw.hym_device_dram_bytes - hw.hym_write_buffer_bytes
        depth = max(1, int(min(hw.hym_prefetch_bytes_per_request, window / remote_lanes)
                           // block_bytes))
        t = Tier("cxl_hm", blocks(hw.hym_capacity_bytes), "shared", remote_lanes,
                 remote_lane_bps * hw.hym_read_efficiency, hw.hym_ssd_latency_s,
                 hw.hym_write_buffer_bytes, hw.hym_ssd_write_bps, device="staging",
                 refill_bps=hw.hym_ssd_read_bps / remote_lanes, prefetch_depth=depth,
                 device_dram_blocks=blocks(hw.hym_device_dram_bytes),
                 miss_bps=hw.lru_miss_bps)
        if name == "hymcache_noprefetch":
            t.prefetch = False
        elif name == "hymcache_lru":
            t.device = "lru_device"
        elif name == "hymcache_dram_only":
            t.device = "dram"
            t.capacity_blocks = blocks(hw.hym_device_dram_bytes)
            t.latency_s = 0.0
        elif name == "hymcache_all_dram":
            # think_time_bench's reference: the capacity tier's size in
            # DRAM, read at the node's line rate.
            t.device = "dram"
            t.latency_s = 0.0
        elif name == "hymcache_hints":
            t.hint_blocks = blocks(hw.hym_hint_share * window)
            t.hint_hold_s = hw.hym_hint_hold_s
        elif name != "hymcache":
            raise ValueError("unknown system %r" % name)
        return System(name, LABELS[name], True, t)
    raise ValueError("unknown system %r" % name)


@dataclasses.dataclass
class Result:
    """One request's outcome."""
    turn: int
    ttft_s: float
    queue_s: float
    load_s: float
    prefill_s: float
    blocks: int
    gpu_hit: int
    tier_hit: int
    fallback: bool
    stored: int
    refused: int
    lease_expired: bool = False


class _TierState:
    def __init__(self, tier, workers):
        self.tier = tier
        n = workers if tier.scope == "worker" else 1
        self.caches = [cache.LruCache(tier.capacity_blocks) for _ in range(n)]
        if tier.write_buffer_scope == "worker":
            self.buffers = [cache.WriteBuffer(tier.write_buffer_bytes,
                                              tier.write_bps / workers)
                            for _ in range(workers)]
        else:
            self.buffers = [cache.WriteBuffer(tier.write_buffer_bytes, tier.write_bps)]
        self.lanes = [[0.0] * tier.lanes for _ in range(n)]
        self.device = (cache.LruCache(tier.device_dram_blocks)
                       if tier.device == "lru_device" else None)
        self._writes = [[] for _ in range(n)]  # heaps of (release, bytes)

    def queue_write(self, k, release, nbytes):
        heapq.heappush(self._writes[k], (release, nbytes))

    def release_writes(self, k, until):
        """Books the writes released by `until` on the read lanes, in
        release order, each on the earliest-free lane at the per-lane share
        of the tier's write rate."""
        lanes = self.lanes[k]
        heap = self._writes[k]
        while heap and heap[0][0] <= until:
            release, nbytes = heapq.heappop(heap)
            lane = min(range(len(lanes)), key=lanes.__getitem__)
            lanes[lane] = (max(release, lanes[lane]) +
                           nbytes * len(lanes) / self.tier.write_bps)

    def index(self, w):
        return w if self.tier.scope == "worker" else 0

    def transfer_s(self, ids, block_bytes, staged=0):
        """Seconds to read blocks `ids` (in order) once a lane is free; on a
        staging device the first `staged` are in the window already (a
        think-time hint staged them) and are read at line rate."""
        t = self.tier
        n = len(ids)
        read_s = block_bytes / t.lane_bps
        if t.device == "dram":
            return t.latency_s + n * (read_s + t.per_block_latency_s)
        if t.device == "staging":
            secs, _ = cache.staged_load_time(
                n - staged, t.prefetch_depth if t.prefetch else 0,
                block_bytes / t.refill_bps, read_s, t.latency_s)
            return staged * read_s + secs
        # lru_device: per block a device-DRAM hit reads at line rate, a miss
        # first refills at the collapsed rate the paper measured.
        secs = 0.0
        for k in ids:
            if not self.device.access(k):
                secs += t.latency_s + block_bytes / t.miss_bps
            secs += read_s
        return secs


def simulate(requests, system, model, hw, block_tokens=128, concurrency=None,
             inflight=None):
    """Replays `requests` through `system`. Requests with parent >= 0 are
    closed-loop (arrive think_s after the parent's first token); sessions
    (conversations of such requests) are admitted `concurrency` at a time in
    order (None: all). `inflight` (None: no limit) caps the requests sent and
    not yet answered, as a benchmark client's concurrency does: a request
    that arrives at the cap waits (FIFO) and is sent, and its TTFT timed,
    when an earlier one's first token is out. Returns a list of Result in
    request order."""
    block_bytes = model.kv_bytes_per_token() * block_tokens
    workers = hw.prefill_workers
    flops = hw.gpu_peak_flops * hw.gpu_mfu
    gpu_blocks = int(max(0.0, hw.gpu_hbm_bytes * hw.gpu_memory_utilization
                         - model.params * model.dtype_bytes) // block_bytes)
    gpu = [cache.LruCache(gpu_blocks) for _ in range(workers)]
    tier = _TierState(system.tier, workers) if system.tier else None
    free = [0.0] * workers
    results = [None] * len(requests)

    children = {}
    for i, r in enumerate(requests):
        if r.parent >= 0:
            children[r.parent] = i
    roots = [i for i, r in enumerate(requests) if r.parent < 0]
    closed = bool(children)
    heap = []
    seq = 0
    if closed and concurrency:
        pending = list(reversed(roots[concurrency:]))
        roots = roots[:concurrency]
    else:
        pending = []
    for i in roots:
        heapq.heappush(heap, (requests[i].timestamp, seq, i))
        seq += 1

    def prefill_s(cached_tokens, new_tokens):
        return model.prefill_flops(cached_tokens, new_tokens) / flops

    # Think-time hints (hymcache_hints): once a request is answered, the
    # chain it stored is hinted for its conversation's next turn and staged
    # into the window (on the earliest-free lane, at the refill rate) if the
    # hints' share of the window has room; the next turn reads those blocks
    # at line rate when they are staged by its lookup. An unclaimed hint
    # holds its blocks until think_s + hint_hold_s after its request.
    # Simplified: a hint without room is dropped, not queued; its refill
    # takes no lane time from requests (the node stages hints only while no
    # request waits and yields their space; think_time_bench measured no cost
    # to requests) and runs at one lane's refill rate.
    hint_blocks = system.tier.hint_blocks if system.tier else 0
    hints = {}  # request index -> (ready, blocks, n, expires)
    hint_used = 0

    outstanding = 0
    ready = collections.deque()
    while heap:
        arrival, _, i = heapq.heappop(heap)
        if i < 0:  # a first token under the in-flight cap
            outstanding -= 1
            if not ready:
                continue
            i = ready.popleft()
        elif inflight is not None and outstanding >= inflight:
            ready.append(i)
            continue
        heap_done = inflight is not None
        if heap_done:
            outstanding += 1
        r = requests[i]
        ids = r.hash_ids
        full = min(len(ids), r.input_length // block_tokens)
        # KV-aware routing: the worker that would finish first, counting its
        # own GPU cache (and local DRAM tier) but not touching them.
        best = None
        for w in range(workers):
            local = 0
            if system.gpu_cache:
                local = _peek(gpu[w], ids[:full])
            if tier and system.tier.scope == "worker":
                local = max(local, _peek(tier.caches[w], ids[:full]))
            est = max(arrival, free[w]) + prefill_s(local * block_tokens,
                                                   r.input_length - local * block_tokens)
            if best is None or est < best[0]:
                best = (est, w)
        w = best[1]
        start = max(arrival, free[w])
        g = gpu[w].prefix_hit(ids[:full]) if system.gpu_cache else 0
        h = g
        load = 0.0
        fallback = expired = False
        # Where the load is timed from: the worker taking the request, or
        # (async_load) its arrival, the load running while the worker
        # computes other requests.
        t0 = arrival if hw.async_load else start
        if tier is not None:
            k = tier.index(w)
            h = g + tier.caches[k].prefix_hit(ids[:full], g)
            load = hw.lookup_s
            staged = 0
            if hint_blocks:
                for j in [j for j, x in hints.items() if x[3] <= t0]:
                    hint_used -= hints.pop(j)[2]
                hint = hints.pop(r.parent, None) if r.parent >= 0 else None
                if hint is not None:
                    hint_used -= hint[2]
                    if hint[0] <= t0 + load:
                        while g + staged < h and ids[g + staged] in hint[1]:
                            staged += 1
            if h > g:
                tier.release_writes(k, t0 + load)
                lanes = tier.lanes[k]
                lane = min(range(len(lanes)), key=lanes.__getitem__)
                begin = max(t0 + load, lanes[lane])
                end = begin + tier.transfer_s(ids[g:h], block_bytes, staged)
                lease = system.tier.lease_s
                if end - t0 > hw.load_deadline_s:
                    fallback = True
                    load = hw.load_deadline_s
                    lanes[lane] = t0 + hw.load_deadline_s
                    h = g
                elif lease is not None and end - (t0 + hw.lookup_s) > lease:
                    # The transfer ran to its end, then the lease check
                    # failed it: the link time is spent, nothing loaded.
                    fallback = expired = True
                    lanes[lane] = end
                    load = end - t0
                    h = g
                else:
                    lanes[lane] = end
                    load = end - t0
        cached_tokens = h * block_tokens
        pre = prefill_s(cached_tokens, max(1, r.input_length - cached_tokens))
        finish = (max(start, t0 + load) + pre -
                  system.overlap * min(load, pre))
        free[w] = finish
        # Stores: the computed full blocks.
        if system.gpu_cache:
            for b in ids[:full]:
                gpu[w].insert(b)
        stored = refused = 0
        if tier is not None and full > h:
            k = tier.index(w)
            new = ids[h:full]
            buf = tier.buffers[w if len(tier.buffers) > 1 else 0]
            # Block by block in chain order; the first refusal ends the
            # store (a block after a gap could never be a prefix hit).
            # Block i reaches the buffer once the blocks before it crossed
            # the link.
            for n, b in enumerate(new):
                if not buf.offer(finish + n * block_bytes / system.tier.lane_bps,
                                 block_bytes):
                    break
                tier.caches[k].insert(b)
                if tier.device is not None:
                    tier.device.insert(b)
                stored += 1
            refused = len(new) - stored
            if stored and system.tier.writes_share_lanes:
                # The admitted blocks' writes take the device once released
                # (at `finish`); a read requested before then goes first.
                tier.queue_write(k, finish, stored * block_bytes)
        if hint_blocks:
            k = tier.index(w)
            n = _peek(tier.caches[k], ids[:full])
            if n and hint_used + n <= hint_blocks:
                t = system.tier
                ready = finish + t.latency_s + n * block_bytes / t.refill_bps
                hints[i] = (ready, set(ids[:n]), n,
                            finish + r.think_s + t.hint_hold_s)
                hint_used += n
        results[i] = Result(turn=r.turn, ttft_s=finish - arrival,
                            queue_s=start - arrival, load_s=load,
                            prefill_s=pre, blocks=full, gpu_hit=g,
                            tier_hit=h - g, fallback=fallback,
                            stored=stored, refused=refused, lease_expired=expired)
        if heap_done:
            heapq.heappush(heap, (finish, seq, -1))
            seq += 1
        nxt = children.get(i)
        if nxt is not None:
            heapq.heappush(heap, (finish + requests[nxt].think_s, seq, nxt))
            seq += 1
        elif closed and pending:
            j = pending.pop()
            heapq.heappush(heap, (max(finish, requests[j].timestamp), seq, j))
            seq += 1
    return results


def _peek(lru, ids):
    n = 0
    while n < len(ids) and ids[n] in lru:
        n += 1
    return n


def per_turn(results, max_turn=None):
    """Aggregates per 1-based turn: mean/p50 TTFT (ms), hit ratios."""
    by = {}
    for r in results:
        if r is None or r.turn < 1 or (max_turn and r.turn > max_turn):
            continue
        by.setdefault(r.turn, []).append(r)
    rows = []
    for t in sorted(by):
        rs = by[t]
        ttft = sorted(x.ttft_s for x in rs)
        blocks = sum(x.blocks for x in rs)
        rows.append({
            "turn": t,
            "requests": len(rs),
            "ttft_ms_mean": 1000 * sum(ttft) / len(ttft),
            "ttft_ms_p50": 1000 * ttft[(len(ttft) - 1) // 2],
            "queue_ms_mean": 1000 * sum(x.queue_s for x in rs) / len(rs),
            "load_ms_mean": 1000 * sum(x.load_s for x in rs) / len(rs),
            "prefill_ms_mean": 1000 * sum(x.prefill_s for x in rs) / len(rs),
            "hit_ratio": (sum(x.gpu_hit + x.tier_hit for x in rs) / blocks
                          if blocks else 0.0),
            "tier_hit_ratio": sum(x.tier_hit for x in rs) / blocks if blocks else 0.0,
            "fallbacks": sum(x.fallback for x in rs),
            "lease_expired": sum(x.lease_expired for x in rs),
            "refused_blocks": sum(x.refused for x in rs),
        })
    return rows
