"""A vLLM V1 KV connector on HyMCache.

Load it through vLLM's KV transfer config:

    --kv-transfer-config '{"kv_connector": "HyMCacheConnector",
        "kv_connector_module_path": "hymcache.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"master": "127.0.0.1:7070"}}'

What it does. vLLM splits a connector into a scheduler-side and a
worker-side instance of this class:

- Scheduler side: for every new request it names the full blocks of the
  prompt with `hymcache.KeyBuilder` (block_tokens = vLLM's block size; the
  model, KV dtype, block layout, TP rank and `salt` in the namespace, so two
  configurations sharing a cluster never load each other's blocks), asks the
  master how long a run of them is stored (`lookup`), and tells vLLM how many
  tokens beyond its own prefix cache can be loaded. It then hands the workers,
  step by step, which blocks to load into which of vLLM's pages and which
  newly computed full blocks to save (the prompt's, then the answer's as
  decoding fills them).
- Worker side: loads the hit blocks into vLLM's paged KV cache before the
  forward pass (synchronously: the load of one request is one `load` call
  with prefetch, a few milliseconds against a prefill of seconds), and after
  the forward pass saves the new full blocks as one chain per request with
  the block before them as `parent_key`, so the chain lands on one node.

A HyMCache key names one contiguous byte range; vLLM keeps a block in one
slice per layer. The connector gathers a block's slices of every layer into
one host staging row (all layers in one key) and scatters a loaded row back.
On vLLM's CPU backend the KV cache already is host memory and the copies are
memcpys; on a GPU the same code copies through the staging rows (a pinned
host pool is the documented next step, see docs/engine_adapters.md).

Failure never fails a request. A short load (miss, evicted block, dead
node, deadline) reports the blocks that did not land through
`get_block_ids_with_load_errors()` and vLLM recomputes them; the connector
sets vLLM's `kv_load_failure_policy` to "recompute" for that reason. A
master that cannot be reached makes lookups report no hits: it is logged
once (and once more when it is back), and lookups pause for
`retry_interval` seconds after each failure so requests do not each wait
for a deadline. Stores are best effort: a refused or failed store is a
later cache miss.

kv_connector_extra_config keys (all optional but `master`):
  master            the master's address, "host:port" (or a list)
  transport         "auto" (default), "tcp", "shm" or "rdma"
  salt              an extra namespace string (a tenant, a LoRA name)
  model_id          the name in the namespace (default: vLLM's model path
                    and revision)
  load_deadline     seconds a load may take (default 5.0)
  lookup_deadline   seconds a lookup may take (default 1.0)
  retry_interval    seconds lookups pause after the master failed (default 5.0)
  hint_hold         seconds a finished request's chain is held staged for
                    its conversation's next turn (default 60; 0: no hints)
  engine_id         report this engine's own prefix cache to the master
                    under this id (hymcache.engine_blocks), so that the
                    master's PrefixQuery names this engine for the prefixes
                    it holds; needs vLLM's KV events over ZMQ
                    (kv_events_config: enable_kv_cache_events, publisher
                    "zmq"), which the reporter follows (default "": none)

A request whose `kv_transfer_params` (the OpenAI API's per-request field)
has "hymcache_conversation_ended": true is its conversation's last turn:
when it finishes the connector sends HintConversationEnded instead of a
next-turn hint, and the master evicts the chain's own blocks first.

This module imports vLLM; `import hymcache` alone does not.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

import numpy as np
import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

import hymcache

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger("hymcache.vllm")

_DEFAULTS = {
    "transport": "auto",
    "salt": "",
    "model_id": "",
    "load_deadline": 5.0,
    "lookup_deadline": 1.0,
    "retry_interval": 5.0,
    # Think-time hints: when a request finishes, tell HyMCache its chain is
    # likely read again by the conversation's next turn (hybrid nodes stage
    # it meanwhile), held this many seconds. 0: send none.
    "hint_hold": 60.0,
    "engine_id": "",
}


@dataclass
class _LoadSpec:
    """Load the full blocks [start, start + len(block_ids)) of token_ids into
    vLLM's blocks block_ids. Each worker names the blocks itself: the keys
    carry its TP rank."""

    req_id: str
    token_ids: List[int]  # the blocks' tokens and every token before them
    start: int
    block_ids: List[int]


@dataclass
class _SaveSpec:
    """Store vLLM's blocks block_ids as the full blocks [start, ...) of
    token_ids: one chain, after the block start - 1 as parent."""

    req_id: str
    token_ids: List[int]
    start: int
    block_ids: List[int]


@dataclass
class HyMCacheConnectorMetadata(KVConnectorMetadata):
    """What the scheduler side hands the workers for one step."""

    loads: List[_LoadSpec] = field(default_factory=list)
    saves: List[_SaveSpec] = field(default_factory=list)


@dataclass
class _RequestState:
    """Scheduler-side bookkeeping of one request, until it finishes."""

    request: "Request"  # vLLM's own object: all_token_ids grows
    keys: List[bytes]  # full blocks named so far (TP rank 0 namespace)
    hit_blocks: int  # leading blocks HyMCache held at lookup
    block_ids: List[int] = field(default_factory=list)
    saved_upto: int = 0  # blocks [0, saved_upto) are stored or being stored
    load: Optional[Tuple[int, int]] = None  # blocks [start, end) to load
    local_tokens: int = 0  # vLLM's own prefix-cache hit, block aligned


def _extra(vllm_config: "VllmConfig") -> Dict[str, Any]:
    cfg = dict(_DEFAULTS)
    cfg.update(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
    if not cfg.get("master"):
        raise ValueError(
            "HyMCacheConnector: kv_connector_extra_config needs 'master' "
            '(e.g. {"master": "127.0.0.1:7070"})'
        )
    return cfg


def _namespace(
    vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig", cfg: Dict[str, Any]
) -> Dict[str, Any]:
    """KeyBuilder arguments less the TP rank: identical on both sides."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ValueError(
            "HyMCacheConnector supports models with one KV cache group "
            f"(full attention), this one has {len(groups)}"
        )
    spec = groups[0].kv_cache_spec
    from vllm.platforms import current_platform

    mc = vllm_config.model_config
    model = cfg["model_id"] or f"{mc.model}@{mc.revision or ''}"
    layout = (
        f"vllm-v1/{current_platform.device_type}/L={len(groups[0].layer_names)}"
        f"/H={getattr(spec, 'num_kv_heads', 0)}/N={spec.block_size}"
        f"/D={getattr(spec, 'head_size', 0)}"
    )
    return dict(
        model=model,
        dtype=str(spec.dtype),
        layout=layout,
        tp_size=vllm_config.parallel_config.tensor_parallel_size,
        salt=str(cfg["salt"]),
        block_tokens=spec.block_size,
    )


class HyMCacheConnector(KVConnectorBase_V1):
    """vLLM KV connector keeping requests' full KV blocks in HyMCache.

    vLLM calls the scheduler-side methods from its scheduler thread and the
    worker-side methods from the model runner's thread; neither side is
    called concurrently with itself, apart from `get_finished`.
    """

    @property
    def requires_kv_delivery(self) -> bool:
        # A cache: a dropped save is a later miss, never a lost hand-off.
        return False

    def __init__(
        self,
        vllm_config: "VllmConfig",
        role: KVConnectorRole,
        kv_cache_config: "KVCacheConfig",
    ):
        super().__init__(
            vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config
        )
        self._cfg = _extra(vllm_config)
        ns = _namespace(vllm_config, kv_cache_config, self._cfg)
        self._block_size: int = ns["block_tokens"]
        masters = self._cfg["master"]
        self._client = hymcache.Client(
            masters,
            transport=self._cfg["transport"],
            deadline=float(self._cfg["load_deadline"]),
        )
        # A short load must become recomputation, never a failed request.
        ktc = self._kv_transfer_config
        if getattr(ktc, "kv_load_failure_policy", "recompute") != "recompute":
            try:
                ktc.kv_load_failure_policy = "recompute"
            except Exception:  # a frozen config: set it anyway
                object.__setattr__(ktc, "kv_load_failure_policy", "recompute")
        if role == KVConnectorRole.SCHEDULER:
            self._keys = hymcache.KeyBuilder(tp_rank=0, **ns)
            # Each TP rank stores its own blocks: hints name every rank's.
            tp = int(getattr(vllm_config.parallel_config,
                             "tensor_parallel_size", 1) or 1)
            self._rank_keys = [self._keys] + [
                hymcache.KeyBuilder(tp_rank=r, **ns) for r in range(1, tp)
            ]
            self.hints_sent = 0
            self.hints_dropped = 0
            self.ended_hints_sent = 0
            self._reqs: Dict[str, _RequestState] = {}
            self._master_down_since: Optional[float] = None
            self._lookup_calls = 0
            self._lookup_failures = 0
            self.engine_blocks = _start_engine_blocks(
                vllm_config, self._cfg, self._client, self._keys)
        else:
            from vllm.distributed.parallel_state import (
                get_tensor_model_parallel_rank,
            )

            try:
                tp_rank = get_tensor_model_parallel_rank()
            except Exception:  # no distributed group: a single worker
                tp_rank = 0
            self._keys = hymcache.KeyBuilder(tp_rank=tp_rank, **ns)
            self._tp_rank = tp_rank
            self._layers: List[Tuple[torch.Tensor, int]] = []  # (tensor, block dim)
            # numpy views of host layers ([] when not all are; None: unknown)
            self._np_layers: Optional[List[np.ndarray]] = None
            self._row_elems: List[int] = []
            self._row_bytes = 0
            self._dtype: Optional[torch.dtype] = None
            self._invalid: Set[int] = set()
            self._pending: List[Tuple[Any, torch.Tensor]] = []  # (future, staging)
            self._mu = threading.Lock()
            self._failures: Dict[str, int] = {}
            self.loaded_blocks = 0
            self.failed_blocks = 0
            self.stored_blocks = 0
        logger.info(
            "HyMCacheConnector %s: master=%s namespace=%s",
            role.name,
            masters,
            {k: v for k, v in ns.items()},
        )

    # ------------------------------------------------------------------
    # Scheduler side
    # ------------------------------------------------------------------

    def _lookup(self, keys: List[bytes]) -> int:
        """The leading run of keys HyMCache holds; 0 when it cannot say."""
        if not keys:
            return 0
        now = time.monotonic()
        if self._master_down_since is not None and (
            now - self._master_down_since < float(self._cfg["retry_interval"])
        ):
            return 0
        self._lookup_calls += 1
        try:
            found = self._client.exists(
                keys, deadline=float(self._cfg["lookup_deadline"])
            )
        except hymcache.Error as e:
            self._lookup_failures += 1
            if self._master_down_since is None:
                logger.warning(
                    "HyMCache master unreachable (%s): serving by recomputation "
                    "until it is back (logged once)",
                    e,
                )
            self._master_down_since = now
            return 0
        if self._master_down_since is not None:
            logger.warning("HyMCache master reachable again")
            self._master_down_since = None
        return hymcache.hit_prefix(found)

    def get_num_new_matched_tokens(
        self, request: "Request", num_computed_tokens: int
    ) -> Tuple[Optional[int], bool]:
        bs = self._block_size
        prompt = list(request.prompt_token_ids or [])
        state = self._reqs.get(request.request_id)
        if state is None:
            n_full = len(prompt) // bs
            keys = self._keys.keys(prompt[: n_full * bs]) if n_full else []
            state = _RequestState(
                request=request, keys=keys, hit_blocks=self._lookup(keys)
            )
            state.saved_upto = state.hit_blocks
            self._reqs[request.request_id] = state
        state.local_tokens = num_computed_tokens
        # vLLM computes at least the last prompt token itself.
        loadable = min(state.hit_blocks, (len(prompt) - 1) // bs)
        return max(0, loadable * bs - num_computed_tokens), False

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ) -> None:
        state = self._reqs.get(request.request_id)
        if state is None:
            return
        state.block_ids = list(blocks.get_block_ids()[0])
        if num_external_tokens > 0:
            bs = self._block_size
            start = state.local_tokens // bs
            end = start + num_external_tokens // bs
            state.load = (start, end)

    def build_connector_meta(
        self, scheduler_output: "SchedulerOutput"
    ) -> KVConnectorMetadata:
        meta = HyMCacheConnectorMetadata()
        bs = self._block_size
        progress: Dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            state = self._reqs.get(new.req_id)
            if state is None:
                continue
            state.block_ids = list(new.block_ids[0])
            progress[new.req_id] = (
                new.num_computed_tokens
                + scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            )
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self._reqs.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                if req_id in cached.resumed_req_ids:
                    state.block_ids = list(new_ids[0])
                else:
                    state.block_ids.extend(new_ids[0])
            progress[req_id] = cached.num_computed_tokens[
                i
            ] + scheduler_output.num_scheduled_tokens.get(req_id, 0)

        for req_id, state in self._reqs.items():
            if state.load is not None:
                start, end = state.load
                state.load = None
                if end > start and end <= len(state.block_ids):
                    tokens = list(state.request.all_token_ids[: end * bs])
                    meta.loads.append(
                        _LoadSpec(req_id, tokens, start, state.block_ids[start:end])
                    )
            done_tokens = progress.get(req_id)
            if done_tokens is None:
                continue
            self._extend_keys(state, done_tokens)
            end = min(done_tokens // bs, len(state.keys), len(state.block_ids))
            if end > state.saved_upto:
                start = state.saved_upto
                tokens = list(state.request.all_token_ids[: end * bs])
                meta.saves.append(
                    _SaveSpec(req_id, tokens, start, state.block_ids[start:end])
                )
                state.saved_upto = end
        return meta

    def _extend_keys(self, state: _RequestState, done_tokens: int) -> None:
        """Names the full blocks past the prompt (generated tokens) once
        their KV is computed, chained after the prompt's keys."""
        bs = self._block_size
        tokens = state.request.all_token_ids
        end = min(done_tokens, len(tokens)) // bs
        have = len(state.keys)
        if end <= have:
            return
        new = list(tokens[have * bs : end * bs])
        if any(t < 0 for t in new):  # placeholders of async scheduling
            return
        parent = state.keys[-1] if state.keys else None
        state.keys.extend(self._keys.keys(new, parent=parent))

    def request_finished(
        self, request: "Request", block_ids: List[int]
    ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        # Saves copy the blocks out in the step that computed them, so vLLM
        # may free the blocks at once.
        state = self._reqs.pop(request.request_id, None)
        if state is not None and state.keys:
            params = getattr(request, "kv_transfer_params", None) or {}
            self._hint_turn(state, ended=bool(
                params.get("hymcache_conversation_ended", False)))
        return False, None

    def _hint_turn(self, state: _RequestState, ended: bool) -> None:
        """The conversation answered: its chain (every TP rank's) is likely
        read again at its next turn, or, `ended`, never (the master evicts
        it first). Advice: never fails the request."""
        hold = float(self._cfg["hint_hold"])
        if hold <= 0 and not ended:
            return
        tokens = list(state.request.all_token_ids[: len(state.keys) * self._block_size])
        for rank, builder in enumerate(self._rank_keys):
            try:
                keys = state.keys if rank == 0 else builder.keys(tokens)
                if ended:
                    sent = self._client.hint_conversation_ended(keys)
                else:
                    sent = self._client.hint_next_turn(keys, hold=hold)
                if sent:
                    if ended:
                        self.ended_hints_sent += 1
                    else:
                        self.hints_sent += 1
                else:
                    self.hints_dropped += 1
            except Exception as e:  # noqa: BLE001 - advice only
                self.hints_dropped += 1
                if self.hints_dropped == 1 or self.hints_dropped % 1000 == 0:
                    logger.warning("HyMCache think-time hint failed: %s (%d so far)",
                                   e, self.hints_dropped)

    # ------------------------------------------------------------------
    # Worker side
    # ------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        num_blocks = self._kv_cache_config.num_blocks
        layers: List[Tuple[torch.Tensor, int]] = []
        row_elems: List[int] = []
        for name in sorted(kv_caches, key=_layer_index):
            t = kv_caches[name]
            # CPU backend: [num_blocks, H, N, 2D]; flash attention: [2,
            # num_blocks, N, H, D]. Find the block axis.
            if t.shape[0] == num_blocks:
                bdim = 0
            elif t.dim() > 1 and t.shape[1] == num_blocks:
                bdim = 1
            else:
                raise ValueError(
                    f"HyMCacheConnector: cannot find the block axis of {name} "
                    f"{tuple(t.shape)} (num_blocks={num_blocks})"
                )
            layers.append((t, bdim))
            row_elems.append(t.numel() // num_blocks)
            self._dtype = t.dtype
        self._layers = layers
        self._np_layers = None
        self._row_elems = row_elems
        elem = torch.empty((), dtype=self._dtype).element_size()
        self._row_bytes = sum(row_elems) * elem
        logger.info(
            "HyMCacheConnector worker tp_rank=%d: %d layers, %d bytes per block",
            self._tp_rank,
            len(layers),
            self._row_bytes,
        )

    def _host_views(self) -> Optional[List[np.ndarray]]:
        """Each layer's KV cache as a [num_blocks, bytes per block] numpy
        view of the same memory, when every layer is a contiguous host
        tensor with the block axis first (vLLM's CPU backend); else None.

        Why numpy there: torch's index_select / copy_ / index_copy_ run on
        the OpenMP pool that vLLM's CPU worker binds to its cores, and
        between forward passes they were slow: gathering a 2,190-token
        prompt's 68 blocks (8.7 MiB, 4 layers) took 45 ms inside vLLM on
        the development VM, numpy's single-threaded copies 3 ms. On the
        turn with no hits that gather is on the TTFT path (wait_for_save
        runs before vLLM returns the first token)."""
        if self._np_layers is None:
            views: List[np.ndarray] = []
            for t, bdim in self._layers:
                if t.device.type != "cpu" or bdim != 0 or not t.is_contiguous():
                    self._np_layers = []
                    break
                views.append(t.view(torch.uint8).numpy().reshape(t.shape[0], -1))
            else:
                self._np_layers = views
        return self._np_layers or None

    def _gather(self, block_ids: List[int]) -> torch.Tensor:
        """Rows [n, row_bytes] (uint8) holding the blocks of every layer."""
        n = len(block_ids)
        rows = torch.empty((n, self._row_bytes), dtype=torch.uint8)
        views = self._host_views()
        if views is not None:
            out = rows.numpy()
            for i, b, k in _runs(block_ids):
                off = 0
                for v in views:
                    out[i : i + k, off : off + v.shape[1]] = v[b : b + k]
                    off += v.shape[1]
            return rows
        typed = rows.view(self._dtype)
        idx = torch.tensor(block_ids, dtype=torch.long)
        off = 0
        for (t, bdim), e in zip(self._layers, self._row_elems):
            idx_d = idx.to(t.device)
            piece = t.index_select(bdim, idx_d).movedim(bdim, 0).reshape(n, e)
            typed[:, off : off + e].copy_(piece)
            off += e
        return rows

    def _scatter(self, rows: torch.Tensor, block_ids: List[int]) -> None:
        n = len(block_ids)
        views = self._host_views()
        if views is not None:
            src = rows[:n].numpy()
            for i, b, k in _runs(block_ids):
                off = 0
                for v in views:
                    v[b : b + k] = src[i : i + k, off : off + v.shape[1]]
                    off += v.shape[1]
            return
        typed = rows[:n].view(self._dtype)
        idx = torch.tensor(block_ids, dtype=torch.long)
        off = 0
        for (t, bdim), e in zip(self._layers, self._row_elems):
            shape = list(t.shape)
            del shape[bdim]
            src = typed[:, off : off + e].reshape([n] + shape).movedim(0, bdim)
            t.index_copy_(bdim, idx.to(t.device), src.to(t.device))
            off += e

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._connector_metadata
        if not isinstance(meta, HyMCacheConnectorMetadata) or not meta.loads:
            return
        for spec in meta.loads:
            keys = self._keys.keys(spec.token_ids)[spec.start :]
            n = len(spec.block_ids)
            rows = torch.empty((n, self._row_bytes), dtype=torch.uint8)
            arr = rows.numpy()
            loaded = 0
            try:
                got = self._client.load(
                    keys[:n],
                    [arr[i] for i in range(n)],
                    deadline=float(self._cfg["load_deadline"]),
                )
                loaded = int(got.loaded)
                # A block shorter than a full row is not vLLM's block.
                for i, length in enumerate(list(got.lengths)[:loaded]):
                    if length != self._row_bytes:
                        loaded = i
                        break
            except hymcache.Error as e:
                self._warn("load", "HyMCache load failed (recomputed): %s", e)
            if loaded:
                self._scatter(rows, spec.block_ids[:loaded])
            if loaded < n:
                self._invalid.update(spec.block_ids[loaded:])
            self.loaded_blocks += loaded
            self.failed_blocks += n - loaded

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Whole-block keys: the load finished in start_load_kv.
        return

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: "AttentionMetadata",
        **kwargs: Any,
    ) -> None:
        # Blocks are gathered across layers once, in wait_for_save.
        return

    def wait_for_save(self) -> None:
        self._reap()
        meta = self._connector_metadata
        if not isinstance(meta, HyMCacheConnectorMetadata) or not meta.saves:
            return
        for spec in meta.saves:
            all_keys = self._keys.keys(spec.token_ids)
            keys = all_keys[spec.start : spec.start + len(spec.block_ids)]
            parent = all_keys[spec.start - 1] if spec.start > 0 else None
            rows = self._gather(spec.block_ids[: len(keys)])
            arr = rows.numpy()
            try:
                fut = self._client.store(
                    keys, [arr[i] for i in range(len(keys))], parent_key=parent
                )
            except hymcache.Error as e:
                self._warn("store", "HyMCache store failed (a miss later): %s", e)
                continue
            with self._mu:
                self._pending.append((fut, rows))
            self.stored_blocks += len(keys)

    def _warn(self, kind: str, fmt: str, err: Exception) -> None:
        """Logs the first failure of a kind, then every 1000th: a dead node
        or master must not log once per request."""
        n = self._failures.get(kind, 0) + 1
        self._failures[kind] = n
        if n == 1 or n % 1000 == 0:
            logger.warning(fmt + " (%d so far)", err, n)

    def set_tp_rank_for_test(self, tp_rank: int) -> None:
        """Names blocks as TP rank `tp_rank` would (a worker-side test hook)."""
        ns = _namespace(self._vllm_config, self._kv_cache_config, self._cfg)
        self._keys = hymcache.KeyBuilder(tp_rank=tp_rank, **ns)
        self._tp_rank = tp_rank

    def _reap(self) -> None:
        with self._mu:
            self._pending = [(f, r) for f, r in self._pending if not f.done()]

    def get_block_ids_with_load_errors(self) -> Set[int]:
        out, self._invalid = self._invalid, set()
        return out

    def get_finished(
        self, finished_req_ids: Set[str]
    ) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        self._reap()
        return None, None

    def shutdown(self) -> None:
        reporter = getattr(self, "engine_blocks", None)
        if reporter is not None:
            reporter.stop()
        try:
            self._client.close()
        except hymcache.Error as e:
            logger.warning("HyMCache close: %s", e)


def _start_engine_blocks(vllm_config: "VllmConfig", cfg: Dict[str, Any],
                         client: Any, keys: Any) -> Optional[Any]:
    """The reporter of this engine's own cache (engine_id set), following
    vLLM's KV events on this host; None (said once) when vLLM publishes
    none over ZMQ."""
    engine_id = str(cfg.get("engine_id") or "")
    if not engine_id:
        return None
    ev = getattr(vllm_config, "kv_events_config", None)
    if (ev is None or not getattr(ev, "enable_kv_cache_events", False) or
            getattr(ev, "publisher", "") != "zmq"):
        logger.warning(
            "HyMCacheConnector: engine_id %r is set but vLLM publishes no KV "
            "events over ZMQ (kv_events_config); this engine's cache is not "
            "reported", engine_id)
        return None
    from vllm.distributed.kv_events import ZmqEventPublisher

    from hymcache.engine_blocks import EngineBlocksReporter

    rank = getattr(vllm_config.parallel_config, "data_parallel_rank", 0) or 0
    endpoint = ZmqEventPublisher.offset_endpoint_port(ev.endpoint, rank)
    # The publisher binds (a wildcard); the reporter beside it connects.
    endpoint = endpoint.replace("//*:", "//127.0.0.1:")
    return EngineBlocksReporter(client, engine_id, keys, endpoint,
                                topic=ev.topic).start()


def _runs(block_ids: List[int]) -> List[Tuple[int, int, int]]:
    """(position, first block id, count) of each run of consecutive block ids:
    vLLM mostly hands out consecutive blocks, and one slice copy per run and
    layer beats numpy's fancy indexing (which gathers into a temporary first:
    4x slower for a 68-block prompt here)."""
    out: List[Tuple[int, int, int]] = []
    for i, b in enumerate(block_ids):
        if out and out[-1][1] + out[-1][2] == b:
            pos, first, k = out[-1]
            out[-1] = (pos, first, k + 1)
        else:
            out.append((i, b, 1))
    return out


def _layer_index(name: str) -> Tuple[int, str]:
    """Sort key: the first integer in a layer name, then the name."""
    digits = ""
    for part in name.split("."):
        if part.isdigit():
            digits = part
            break
    return (int(digits) if digits else -1, name)
