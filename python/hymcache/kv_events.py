"""Publishes a HyMCache cluster's KV events in vLLM's KV-event format.

Routers built for vLLM's KV events (vLLM's own subscribers, llm-d's KV-cache
indexer, Dynamo's router) learn from them which blocks an engine holds. This
adapter tells them which blocks the shared HyMCache tier holds, in the same
wire format, so they can route a request to where its prefix is cached:

* it follows the master's event stream (``hymctl events --json``: the
  master's `WatchEvents`, resuming after the last event it saw when hymctl or
  the master restarts; admin credentials as hymctl takes them);
* BLOCK_STORED becomes ``BlockStored`` (``block_hashes``: the block's key,
  ``parent_block_hash``: its parent's key or None, ``medium``: "CPU" for a
  DRAM or CXL node, "STORAGE" for a hybrid one; no token ids: the master does
  not keep them), BLOCK_REMOVED becomes ``BlockRemoved``; node up/down events
  carry nothing a router needs (a dead node's blocks come as removals);
* events the master no longer holds (the adapter fell behind its buffer, or
  the master restarted) become ``AllBlocksCleared``: a router then forgets
  what it knew and relearns from new stores, which costs it cache hits, never
  a wrong answer;
* each batch goes out on a ZMQ PUB socket as vLLM's ``ZmqEventPublisher``
  sends it: frames (topic, sequence as 8 bytes big-endian, msgpack of
  ``KVEventBatch``), and the last ``buffer_steps`` batches are kept for
  vLLM's replay protocol on an optional ROUTER socket (a subscriber sends the
  first sequence it missed; it gets every kept batch from there, then a
  batch with sequence -1).

Keys are published as the block hashes, so a router matches them against
the keys its engines' HyMCache connector computes (hymcache.vllm names blocks
by a hash of their tokens chained on the parent's key).

Needs pyzmq and msgspec (vLLM depends on both). Run it beside the master:

    python3 -m hymcache.kv_events --master=HOST:PORT --endpoint=tcp://*:5557 \\
        --replay_endpoint=tcp://*:5558
"""

import argparse
import collections
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any, List, Optional, Sequence

import msgspec
import zmq

log = logging.getLogger("hymcache.kv_events")

END_SEQ = (-1).to_bytes(8, "big", signed=True)


# vLLM's wire types (vllm/distributed/kv_events.py), field for field as far
# as this adapter fills them: a batch is a msgpack array, each event a map
# tagged with its class name ("type"), optional fields left out.
class _Event(msgspec.Struct, omit_defaults=True, tag=True):
    pass


class BlockStored(_Event):
    block_hashes: List[Any]
    parent_block_hash: Optional[Any]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]


class BlockRemoved(_Event):
    block_hashes: List[Any]
    medium: Optional[str]


class AllBlocksCleared(_Event):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: List[Any]
    data_parallel_rank: Optional[int] = None


def _key(event: dict, field: str) -> Optional[bytes]:
    text = event.get(field, "")
    if not text:
        return None
    if event.get(field + "_encoding") == "hex":
        return bytes.fromhex(text)
    return text.encode()


def _medium(tier: str) -> str:
    return "CPU" if tier in ("dram", "cxl") else "STORAGE"


def convert(event: dict, block_size: int = 0) -> Optional[_Event]:
    """One line of ``hymctl events --json`` as a vLLM event, or None for
    events a router does not need."""
    if "missed_to" in event:
        return AllBlocksCleared()
    kind = event.get("kind")
    if kind == "BLOCK_STORED":
        return BlockStored(block_hashes=[_key(event, "key")],
                           parent_block_hash=_key(event, "parent_key"),
                           token_ids=[], block_size=block_size, lora_id=None,
                           medium=_medium(event.get("tier", "")),
                           lora_name=None)
    if kind == "BLOCK_REMOVED":
        return BlockRemoved(block_hashes=[_key(event, "key")],
                            medium=_medium(event.get("tier", "")))
    return None


class KvEventPublisher:
    """Follows the master's events and publishes them (see the module
    docstring). start() returns once the sockets are bound; stop() ends it.

    hymctl: the hymctl binary; hymctl_args: more of its flags (credentials,
    --timeout). max_batch: most events per batch (a batch is what one read
    of the stream delivered, up to this many). Thread safety: start() and
    stop() from one thread."""

    def __init__(self, master: str, endpoint: str = "tcp://*:5557",
                 replay_endpoint: Optional[str] = None, topic: str = "",
                 hymctl: str = "hymctl", hymctl_args: Sequence[str] = (),
                 buffer_steps: int = 10_000, hwm: int = 100_000,
                 block_size: int = 0, data_parallel_rank: int = 0,
                 max_batch: int = 512):
        if buffer_steps < 1 or max_batch < 1 or block_size < 0:
            raise ValueError("buffer_steps and max_batch must be >= 1, "
                             "block_size >= 0")
        self._master = master
        self._hymctl = hymctl
        self._hymctl_args = list(hymctl_args)
        self._topic = topic.encode()
        self._block_size = block_size
        self._rank = data_parallel_rank
        self._max_batch = max_batch
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._pub.bind(endpoint)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay = None
        self.replay_endpoint = None
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(
                zmq.LAST_ENDPOINT)
        self._buffer = collections.deque(maxlen=buffer_steps)
        self._lines: "queue.Queue[Optional[dict]]" = queue.Queue(maxsize=65536)
        self._stop = threading.Event()
        self._proc: Optional[subprocess.Popen] = None
        self._proc_lock = threading.Lock()
        self._stream_id = 0
        self._after = 0
        self._seq = 0
        self._encoder = msgspec.msgpack.Encoder()
        self.published_batches = 0
        self.published_events = 0
        self.hymctl_restarts = 0
        self._threads: List[threading.Thread] = []

    # ------------------------------------------------------------ follow

    def _follow(self) -> None:
        """Runs hymctl events, restarting it (resuming after the last event
        read) until stop()."""
        first = True
        while not self._stop.is_set():
            if not first:
                self.hymctl_restarts += 1
                if self._stop.wait(0.2):
                    break
            first = False
            cmd = [self._hymctl, "--master=" + self._master, "--json",
                   *self._hymctl_args, "events"]
            if self._stream_id:
                cmd[-1:-1] = ["--stream=%d" % self._stream_id,
                              "--after=%d" % self._after]
            try:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
            except OSError as e:
                log.error("cannot run %s: %s", self._hymctl, e)
                continue
            with self._proc_lock:
                self._proc = proc
            if self._stop.is_set():
                proc.kill()
            for line in proc.stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    log.warning("hymctl printed a line that is not JSON: %r",
                                line[:200])
                    continue
                self._stream_id = event.get("stream_id", self._stream_id)
                if "sequence" in event:
                    self._after = event["sequence"]
                elif "missed_to" in event:
                    self._after = event["missed_to"]
                self._lines.put(event)
            err = proc.stderr.read()
            proc.wait()
            if not self._stop.is_set():
                log.warning("hymctl events ended (exit %s): %s; resuming "
                            "after event %d", proc.returncode,
                            err.strip()[-300:], self._after)
        self._lines.put(None)

    def kill_follower_for_test(self) -> None:
        """Kills the hymctl process as a crash would (it is restarted)."""
        with self._proc_lock:
            if self._proc is not None:
                self._proc.kill()

    # ------------------------------------------------------------ publish

    def _publish_loop(self) -> None:
        while True:
            if self._replay is not None:
                while self._replay.poll(0):
                    self._serve_replay()
            try:
                first = self._lines.get(timeout=0.05)
            except queue.Empty:
                continue
            if first is None:
                return
            events = []
            done = False
            item: Optional[dict] = first
            while True:
                e = convert(item, self._block_size)
                if e is not None:
                    events.append(e)
                if len(events) >= self._max_batch:
                    break
                try:
                    item = self._lines.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    done = True
                    break
            if events:
                self._send(events)
            if done:
                return

    def _send(self, events: List[_Event]) -> None:
        payload = self._encoder.encode(
            KVEventBatch(ts=time.time(), events=events,
                         data_parallel_rank=self._rank))
        seq = self._seq
        self._seq += 1
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        self.published_batches += 1
        self.published_events += len(events)

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            log.warning("invalid replay request: %d frames", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart(
                    (client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    # ------------------------------------------------------------ control

    def start(self) -> "KvEventPublisher":
        for name, target in (("kv-events-follow", self._follow),
                             ("kv-events-publish", self._publish_loop)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._proc_lock:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.terminate()
        for t in self._threads:
            t.join(timeout=10)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def __enter__(self) -> "KvEventPublisher":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m hymcache.kv_events",
        description="Publish a HyMCache cluster's KV events in vLLM's "
        "KV-event format (ZMQ PUB, msgpack KVEventBatch).")
    p.add_argument("--master", required=True, help="HOST:PORT[,HOST:PORT...]")
    p.add_argument("--endpoint", default="tcp://*:5557", help="PUB socket")
    p.add_argument("--replay_endpoint", default=None,
                   help="ROUTER socket for vLLM's replay requests")
    p.add_argument("--topic", default="")
    p.add_argument("--hymctl", default=os.environ.get("HYMCTL", "hymctl"))
    p.add_argument("--hymctl_arg", action="append", default=[],
                   help="a flag passed to hymctl (credentials, --timeout); "
                   "repeatable")
    p.add_argument("--buffer_steps", type=int, default=10_000)
    p.add_argument("--block_size", type=int, default=0,
                   help="tokens per block, as the engines' (0: not said)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(name)s: %(message)s")
    try:
        pub = KvEventPublisher(args.master, args.endpoint, args.replay_endpoint,
                               args.topic, args.hymctl, args.hymctl_arg,
                               args.buffer_steps, block_size=args.block_size)
    except (ValueError, zmq.ZMQError) as e:
        print("hymcache.kv_events: %s" % e, file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    pub.start()
    print("hymcache.kv_events publishing on %s%s" % (
        pub.endpoint, ", replay on " + pub.replay_endpoint
        if pub.replay_endpoint else ""), flush=True)
    done.wait()
    pub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
