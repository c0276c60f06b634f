"""Reports what a vLLM engine's own cache holds to the HyMCache master.

A router asks the master's `PrefixQuery` which storage nodes hold a chain's
leading blocks; with this reporter the same answer also names the engines
whose own (GPU) prefix caches hold them, longest prefix first, so that a
router can send a request to the engine that already has its prefix and
fall back to any engine near the node that has it.

The reporter follows the engine's own KV events (vLLM's ``ZmqEventPublisher``,
turned on with ``kv_events_config``) and turns vLLM's block hashes into
HyMCache keys:

* ``BlockStored`` carries each block's tokens and its parent's hash: the
  keys are ``KeyBuilder.keys(token_ids, parent=<the parent's key>)``, the
  same keys the connector stores the blocks under (TP rank 0's). A block
  whose parent the reporter never saw (it started after the parent was
  stored) has no key it can compute and is left out, as are its
  descendants: a router then misses that engine's hit, never gets a wrong
  one.
* ``BlockRemoved`` drops the keys; ``AllBlocksCleared`` drops them all.
* Only the engine's own tiers count (``medium`` None or "GPU"), and only
  one KV-cache group (the connector's own limit).
* A gap in vLLM's sequence numbers means events were lost (the PUB socket
  drops under load): the reporter forgets everything it knew and relearns
  from new events, as a router does after ``AllBlocksCleared``.

Every ``interval`` seconds (and at least four times per master TTL) it sends
the changes since its last report (`Client.report_engine_blocks`). When the
master's count differs from its own (a new leader knows no engine; the
master forgot an engine that did not report in time, or trimmed it), or a
report failed, the next report resends the whole set. Reports never touch
the engine's requests: a failure is logged once and retried.

The connector starts one when ``kv_connector_extra_config`` has
``engine_id`` and vLLM publishes KV events over ZMQ (hymcache.vllm).
"""

import logging
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

import msgspec
import zmq

log = logging.getLogger("hymcache.engine_blocks")

_OWN_MEDIA = (None, "GPU")


class _Batch(msgspec.Struct, array_like=True):
    # vLLM's EventBatch: (ts, events, data_parallel_rank); events decoded
    # as plain maps tagged with their class name ("type").
    ts: float
    events: List[Dict[str, Any]]
    data_parallel_rank: Optional[int] = None


def _hashable(h: Any) -> Any:
    # vLLM's ExternalBlockHash: bytes or int (msgpack gives them back as
    # such); lists only from odd encoders.
    return tuple(h) if isinstance(h, list) else h


class EngineBlocksReporter:
    """Follows one engine's KV events and reports its blocks (see the module
    docstring). start() connects; stop() ends the thread.

    client: a hymcache.Client; engine_id: 1..128 bytes, unique within the
    tenant; key_builder: the connector's TP-rank-0 KeyBuilder; endpoint:
    the engine's KV-event PUB endpoint (tcp://HOST:PORT). max_blocks: most
    keys kept (the oldest go first, reported as removed). Thread safety:
    start() and stop() from one thread; the counters are for reading."""

    def __init__(self, client: Any, engine_id: str, key_builder: Any,
                 endpoint: str, topic: str = "", interval: float = 0.5,
                 max_blocks: int = 1 << 20):
        # The master's limit (kMaxEngineIdBytes, common/limits.h).
        if not engine_id or len(engine_id.encode()) > 128:
            raise ValueError("engine_id must be 1..128 bytes")
        if interval <= 0 or max_blocks < 1:
            raise ValueError("interval must be > 0 and max_blocks >= 1")
        self._client = client
        self.engine_id = engine_id
        self._keys = key_builder
        self._block = key_builder.block_tokens
        self._endpoint = endpoint
        self._topic = topic.encode()
        self._interval = interval
        self._max_blocks = max_blocks
        self._decoder = msgspec.msgpack.Decoder(type=_Batch)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        # vLLM block hash -> key, in the order stored (dicts keep it).
        self._held: Dict[Any, bytes] = {}
        # Since the last report: each changed key, True if now held.
        self._changed: Dict[bytes, bool] = {}
        self._resync = True  # the first report sends the whole set
        self._last_seq: Optional[int] = None
        self._ttl = 60.0
        self._failing = False
        # apply() and report() may run on different threads (a test feeding
        # batches by hand): the state above is theirs under this lock.
        self._lock = threading.Lock()
        # Counters.
        self.batches = 0
        self.unmapped_blocks = 0  # parent never seen, or tokens that did not fit
        self.gaps = 0
        self.reports = 0
        self.resyncs = 0
        self.report_failures = 0

    # ----------------------------------------------------------- control

    def start(self) -> "EngineBlocksReporter":
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="hymcache-engine-blocks")
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def held_keys(self) -> List[bytes]:
        """The keys the reporter believes the engine holds (for tests)."""
        with self._lock:
            return list(self._held.values())

    # ------------------------------------------------------------ events

    def apply(self, seq: int, payload: bytes) -> None:
        """One published batch (sequence number, msgpack payload)."""
        with self._lock:
            self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        if self._last_seq is not None and seq != self._last_seq + 1:
            self.gaps += 1
            log.warning("engine %s: KV events %d..%d were lost; forgetting "
                        "its blocks until new events relearn them",
                        self.engine_id, self._last_seq + 1, seq - 1)
            self._clear()
        self._last_seq = seq
        try:
            batch = self._decoder.decode(payload)
        except msgspec.DecodeError as e:
            log.warning("engine %s: a KV-event batch did not decode: %s",
                        self.engine_id, e)
            return
        self.batches += 1
        for event in batch.events:
            if not isinstance(event, dict):
                continue
            kind = event.get("type")
            if kind == "AllBlocksCleared":
                self._clear()
            elif event.get("medium") not in _OWN_MEDIA:
                continue
            elif kind == "BlockStored":
                self._on_stored(event)
            elif kind == "BlockRemoved":
                for h in event.get("block_hashes") or []:
                    key = self._held.pop(_hashable(h), None)
                    if key is not None:
                        self._drop(key)

    def _clear(self) -> None:
        self._held.clear()
        self._changed.clear()
        self._resync = True

    def _drop(self, key: bytes) -> None:
        self._changed[key] = False

    def _on_stored(self, event: Dict[str, Any]) -> None:
        hashes = [_hashable(h) for h in event.get("block_hashes") or []]
        tokens = event.get("token_ids") or []
        parent_hash = event.get("parent_block_hash")
        parent = None
        if parent_hash is not None:
            parent = self._held.get(_hashable(parent_hash))
            if parent is None:
                self.unmapped_blocks += len(hashes)
                return
        if (event.get("block_size", self._block) != self._block or
                len(tokens) != len(hashes) * self._block):
            self.unmapped_blocks += len(hashes)
            return
        keys = self._keys.keys(tokens, parent=parent) if hashes else []
        for h, key in zip(hashes, keys):
            if h in self._held:
                continue
            self._held[h] = key
            self._changed[key] = True
            if len(self._held) > self._max_blocks:
                oldest = next(iter(self._held))
                self._drop(self._held.pop(oldest))

    # ----------------------------------------------------------- reports

    def report(self) -> None:
        """Sends the changes since the last report (or the whole set)."""
        with self._lock:
            resync, self._resync = self._resync, False
            changed, self._changed = self._changed, {}
            count = len(set(self._held.values()))
            held = list(self._held.values()) if resync else []
        try:
            if resync:
                blocks, ttl = self._client.report_engine_blocks(
                    self.engine_id, stored=held, cleared=True)
            else:
                blocks, ttl = self._client.report_engine_blocks(
                    self.engine_id,
                    stored=[k for k, h in changed.items() if h],
                    removed=[k for k, h in changed.items() if not h])
        except Exception as e:  # the master down, or refusing: later
            with self._lock:
                self.report_failures += 1
                if not self._failing:
                    log.warning("engine %s: reporting its blocks to the "
                                "master failed (%s); retrying",
                                self.engine_id, e)
                self._failing = True
                self._resync = True  # the whole set, changes included
            return
        with self._lock:
            self.reports += 1
            self.resyncs += resync
            self._failing = False
            self._ttl = ttl
            if resync:
                # Only a clear since the snapshot asks for another whole
                # set; a master that disagrees right after one (it keeps
                # fewer keys per engine than this reporter) is taken at its
                # word.
                return
            self._resync = self._resync or blocks != count

    def _run(self) -> None:
        ctx = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        sub.connect(self._endpoint)
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        next_report = 0.0
        try:
            while not self._stop.is_set():
                wait = max(0.0, next_report - time.monotonic())
                if poller.poll(int(wait * 1000) + 1):
                    while True:
                        try:
                            frames = sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if len(frames) == 3:
                            self.apply(int.from_bytes(frames[1], "big",
                                                      signed=True), frames[2])
                now = time.monotonic()
                if now >= next_report:
                    self.report()
                    next_report = now + min(self._interval, self._ttl / 4)
        finally:
            sub.close(linger=0)
