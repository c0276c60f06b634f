"""Model and hardware presets. Every number says where it comes from:
"paper" numbers are from the HyMCache paper (arXiv 2607.18141, section 5
"Experimental setup" and section 6), "config" numbers from the models'
published configurations (config.json on the model hub), "spec" numbers
from vendor datasheets, and "assumption" marks what we chose and why."""

import dataclasses

GB = 1e9
MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    layers: int         # config: num_hidden_layers
    kv_heads: int       # config: num_key_value_heads
    head_dim: int       # config: hidden_size / num_attention_heads
    hidden: int         # config: hidden_size
    params: float       # config: total parameters
    dtype_bytes: int = 2  # paper: FP16/BF16 KV cache

    def kv_bytes_per_token(self):
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def prefill_flops(self, cached, new):
        """Forward FLOPs for `new` tokens after `cached` ones: 2 per
        parameter per token plus causal attention (QK^T and AV: 4 * hidden
        per query-key pair per layer, sum of positions ~ ((c+n)^2-c^2)/2)."""
        return (2.0 * self.params * new +
                2.0 * self.layers * self.hidden * ((cached + new) ** 2 - cached ** 2))


MODELS = {
    # Qwen2.5-32B: 64 layers, 40 query / 8 KV heads of 128, hidden 5120,
    # 32.5 B parameters -> 256 KiB of KV per token, 32 MiB per 128-token
    # block (the paper's "32 MB KV blocks").
    "qwen2.5-32b": Model("qwen2.5-32b", 64, 8, 128, 5120, 32.5e9),
    # Llama-3.1-8B: 32 layers, 32 query / 8 KV heads of 128, hidden 4096,
    # 8.03 B parameters -> 128 KiB per token, 16 MiB per block.
    "llama-3.1-8b": Model("llama-3.1-8b", 32, 8, 128, 4096, 8.03e9),
}


@dataclasses.dataclass
class Hardware:
    """One deployment: prefill workers and every tier the six systems use.
    Bandwidths in bytes/s, capacities in bytes, latencies in seconds."""
    name: str = "paper"
    # paper: 4P-1D-1S, four prefill workers (the decode worker is idle with
    # MAX_TOKENS = 1).
    prefill_workers: int = 4
    # spec: A100 dense BF16 peak 312 TFLOP/s. assumption: 50% of peak in
    # prefill (vLLM at long contexts reaches 45-60% MFU on A100).
    gpu_peak_flops: float = 312e12
    gpu_mfu: float = 0.5
    # paper: A100 80 GB. assumption: vLLM's gpu_memory_utilization 0.9; the
    # GPU prefix cache holds what the weights leave.
    gpu_hbm_bytes: float = 80 * GB
    gpu_memory_utilization: float = 0.9
    # paper: 100 Gbps NIC per prefill worker, 200 Gbps into the storage node.
    worker_nic_bps: float = 12.5 * GB
    storage_nic_bps: float = 25 * GB
    # paper: Distributed Mooncake, 1 TB of remote DRAM; "10 GB of additional
    # host DRAM" transfer buffer (its sensitivity study).
    mooncake_dram_bytes: float = 1e12
    mooncake_transfer_buffer_bytes: float = 10 * GB
    # paper: NVMe-oF raw 23 GB/s, ~6.5 GB/s through XFS. assumption: the
    # same 2 TB of SSD as HyMCache, writes at the XFS read rate.
    nvmeof_bps: float = 6.5 * GB
    nvmeof_bytes: float = 2e12
    # assumption: writes through XFS at its read rate. The paper reports
    # frequent fetch time-outs on this path but no rate; the model's
    # mechanisms for them (Mooncake's lease, reads sharing the device with
    # persistence writes, the connector deadline) are below and in sim.py
    # (docs/paper.md: NVMe-oF).
    nvmeof_write_bps: float = 6.5 * GB
    # assumption: a file open + XFS extent lookup per object.
    nvmeof_latency_s: float = 1e-3
    # Mooncake Store's persistence: "each file corresponds to one kvcache
    # object" (doc/en/mooncake-store.md, "Data Access Mechanism"). No
    # published per-file cost on XFS over NVMe-oF: 0 unless set (--hw).
    nvmeof_per_object_s: float = 0.0
    # Mooncake Store docs: "for each Put ... a synchronous memory pool write
    # and an asynchronous DFS persistence operation"; the persisted files
    # live on the XFS volume the Gets read from, so writes and reads share
    # the device's 6.5 GB/s.
    nvmeof_writes_share_reads: bool = True
    # Mooncake Store docs ("Lease"): a lease is granted when GetReplicaList
    # succeeds; "if the lease expires before a Get operation finishes
    # reading the data, the operation will be considered failed, and no
    # data will be returned". Default TTL 5 s (master flag
    # default_kv_lease_ttl, DEFAULT_DEFAULT_KV_LEASE_TTL = 5000 ms; later
    # mainline raised it to 10 s). 0 disables.
    mooncake_lease_s: float = 5.0
    # paper: Local LMCache, 64 GB of local DRAM per worker. spec: A100 on
    # PCIe Gen4 x16 (32 GB/s); assumption: 20 GB/s achieved host-to-device.
    lmcache_bytes_per_worker: float = 64 * GB
    lmcache_bps: float = 20 * GB
    # paper: CXL-HM prototype, 64 GB device DRAM, 2 x 1 TB Gen5 SSDs.
    hym_device_dram_bytes: float = 64 * GB
    hym_capacity_bytes: float = 2e12
    # spec: a Gen5 x4 SSD reads ~14 GB/s sequentially, two of them 28 GB/s.
    hym_ssd_read_bps: float = 28 * GB
    # assumption: SSD write ~10 GB/s each.
    hym_ssd_write_bps: float = 20 * GB
    # assumption: a 4 KiB-class first-byte latency of a flash read.
    hym_ssd_latency_s: float = 100e-6
    # paper ("fair comparison"): HyMCache's delivered performance ~30% below
    # 1 TB-DRAM Mooncake when both hold everything: the FPGA prototype
    # serves reads at 0.7 of line rate.
    hym_read_efficiency: float = 0.7
    # paper: KV Manager prefetch window up to ~128 MB per request.
    hym_prefetch_bytes_per_request: float = 128 * MiB
    # assumption: 8 GB of the device DRAM is the write buffer, the rest the
    # staging window.
    hym_write_buffer_bytes: float = 8 * GB
    # HyMCache's think-time hints (hymcache_hints; docs/prefetch.md): the
    # share of the staging window they may hold (the node's default) and how
    # long past its expected turn an unclaimed hint holds its blocks (the
    # vLLM connector's default hold).
    hym_hint_share: float = 0.5
    hym_hint_hold_s: float = 60.0
    # paper (Figure 5): a CMM-H LRU device past its DRAM falls to ~5 GB/s.
    lru_miss_bps: float = 5 * GB
    # paper: the KV connector falls back to recomputation after 10 s.
    load_deadline_s: float = 10.0
    # assumption: remote lookups (one batched metadata RPC) cost 1 ms.
    lookup_s: float = 1e-3
    # False: a request's external load starts when a prefill worker takes
    # it, and the worker waits for it (one load per worker in flight). True:
    # the load starts at arrival (vLLM v1's asynchronous KV-connector loads:
    # the request waits for remote KVs while the worker computes others),
    # so every waiting request's load queues on the tier at once.
    async_load: bool = False


def paper_hardware():
    return Hardware()


HARDWARE_FIELDS = [f.name for f in dataclasses.fields(Hardware)]


# paper, Table 1: PD-disaggregated TTFT in seconds per turn (Qwen2.5-32B,
# AIPerf synthetic), turns 1..7.
PAPER_TABLE1 = {
    "recompute": [1.92, 3.25, 5.10, 7.80, 11.50, 16.20, 22.40],
    "gpu_prefix": [1.85, 2.90, 4.50, 7.20, 10.80, 15.10, 20.50],
    "lmcache_local": [1.55, 2.10, 2.80, 3.90, 5.80, 8.50, 12.10],
    "mooncake_dram": [1.30, 1.65, 2.05, 2.55, 3.15, 3.85, 4.65],
    "mooncake_nvmeof": [1.90, 3.10, 4.80, 7.50, 11.00, 15.50, 21.80],
    "hymcache": [1.35, 1.70, 2.10, 2.50, 2.95, 3.35, 3.70],
}

# Other quantitative claims the model has a counterpart for (paper, sec. 6).
PAPER_PREFETCH_MICRO_GAIN = 0.37   # prefetch on vs off, microbenchmark
PAPER_PREFETCH_E2E_CUT = 0.14      # end-to-end time, LMSYS turn 6
PAPER_CROSSOVER_TURN = 4           # HyMCache overtakes 1 TB Mooncake
PAPER_SINGLE_NODE_GAIN = 3.0       # over local LMCache, single node
PAPER_PD_GAIN = 1.45               # over local LMCache, PD-disaggregated


def lmsys_workload():
    """The paper's single-node run (Llama-3.1-8B, LMSYS multi-turn, 512
    conversations, concurrency 32, turns to 10) with LMSYS-Chat-1M's
    published per-turn size: 260.37 tokens per turn (prompt + response,
    tiktoken; Magpie, arXiv 2406.08464, Table 4: 1M conversations, 2.01
    turns each, 496M tokens). MAX_TOKENS = 1, so each turn's new tokens are
    the previous response and the new prompt: 260 new tokens per turn, one
    output token. The paper's turn sizes are not published; its 10-turn
    conversations are a selection (the dataset averages 2.01 turns), and
    the per-turn mean of the whole dataset is the published number we have.
    Order: all 512 conversations open, 32 requests in flight (the benchmark
    client's concurrency), so turns interleave across conversations."""
    from . import trace
    return trace.MultiTurnOptions(
        conversations=512, turns=10, user_tokens=260, output_tokens=1,
        shared_prefixes=0, shared_tokens=0, think_s=0.0, think_jitter=0.0,
        concurrency=512, start_spread_s=0.0, seed=1)


LMSYS_INFLIGHT = 32


def paper_workload():
    """The Table 1 workload as the model runs it. The paper names it (AIPerf
    synthetic, Mooncake-trace shaped, MAX_TOKENS = 1) but not its sizes;
    these are assumptions chosen from the paper's statements, not fitted per
    cell: the reusable footprint crosses 1 TB during turn 4 and reaches
    ~1.6 TB (under HyMCache's 2 TB) at turn 7 ("grows to >1.5 TB"):
    300 conversations x 3,000 new tokens per turn x 256 KiB per token;
    turn 1 shares one of 64 documents of 1,024 tokens; sessions are all
    open with think times long enough (1,000-3,800 s) that the four prefill
    workers are not overloaded by the recomputation baseline."""
    from . import trace
    return trace.MultiTurnOptions(
        conversations=300, turns=7, user_tokens=3000, output_tokens=1,
        shared_prefixes=64, shared_tokens=1024, think_s=2000.0,
        think_jitter=0.9, concurrency=300, start_spread_s=1000.0, seed=1)
