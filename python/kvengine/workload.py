"""Workloads for the KV engine: a synthetic multi-turn chat generator and
Mooncake-format traces, both as lists of `Request`s with token ids.

Synthetic (as hymbench's generator, tools/hymbench/trace.h): conversation c
turn 0 sends a system prompt and `user_tokens` user tokens; turn t sends
turn t-1's prompt + turn t-1's `output_tokens` output tokens + new user
tokens, so every turn's prompt extends the previous one (a growing prefix).
Requests are ordered round-robin by turn (turn 0 of every conversation,
then turn 1, ...). Token ids are drawn from numpy's PCG64 seeded by (seed,
conversation, turn, kind): a run is reproducible.

Mooncake trace: one JSON object per line,
    {"timestamp": 27482, "input_length": 6955, "output_length": 52,
     "hash_ids": [46, 47, 2396, ...]}
with one prefix-chained id per block of `block_tokens` input tokens
(the last one may be partial): len(hash_ids) == ceil(input_length /
block_tokens), checked as tools/hymbench/trace.cc does. Optional
"conversation" and "turn" fields (hymbench gen writes them) are used when
present; otherwise a request's turn is inferred: 1 + the turn of the latest
earlier request whose full blocks are a prefix of this one's hash_ids (the
previous turn of the same conversation), else 0. Token ids are synthesised
from the ids: block id h stands for tokens (h * block_tokens + j) mod
(2^31 - 1), j < block_tokens, so two requests share a token prefix exactly
when they share the hash-id prefix, and the KeyBuilder keys over the tokens
are shared likewise.
"""

import dataclasses
import json
import math

import numpy as np

TOKEN_LIMIT = 2**31 - 1  # token ids are int32
VOCAB = 32000  # synthetic token ids are in [1, VOCAB)


@dataclasses.dataclass
class Request:
    """One turn of a conversation: the whole prompt's token ids."""

    conversation: int
    turn: int
    tokens: np.ndarray  # int32, the prompt
    output_length: int = 0
    timestamp_ms: float = 0.0

    @property
    def input_length(self):
        return len(self.tokens)


def synthetic(conversations=4, turns=4, system_prompt_tokens=256,
              user_tokens=256, output_tokens=64, shared_system_prompt=True,
              seed=0, turn_gap_ms=1000.0):
    """The synthetic multi-turn workload described in the module doc."""
    for name, v in (("conversations", conversations), ("turns", turns)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    for name, v in (("system_prompt_tokens", system_prompt_tokens),
                    ("user_tokens", user_tokens),
                    ("output_tokens", output_tokens)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    if system_prompt_tokens + user_tokens < 1:
        raise ValueError("a turn-0 prompt needs at least one token")

    def draw(n, *what):
        rng = np.random.default_rng([seed, *what])
        return rng.integers(1, VOCAB, size=n, dtype=np.int32)

    history = []
    for c in range(conversations):
        system = draw(system_prompt_tokens, 0 if shared_system_prompt
                      else c + 1, 0, 0)
        history.append(system)
    requests = []
    for t in range(turns):
        for c in range(conversations):
            prompt = np.concatenate([history[c], draw(user_tokens, c, t, 1)])
            requests.append(Request(
                conversation=c, turn=t, tokens=prompt,
                output_length=output_tokens,
                timestamp_ms=(t + c / conversations) * turn_gap_ms))
            history[c] = np.concatenate(
                [prompt, draw(output_tokens, c, t, 2)])
    return requests


def hash_id_tokens(hash_ids, input_length, block_tokens):
    """The synthetic token ids of a trace request (see the module doc)."""
    ids = np.asarray(hash_ids, dtype=np.int64).reshape(-1, 1)
    tokens = (ids * block_tokens + np.arange(block_tokens)) % TOKEN_LIMIT
    return tokens.reshape(-1)[:input_length].astype(np.int32)


def _field(obj, name, kinds, where, required=True):
    if name not in obj:
        if required:
            raise ValueError(f"{where}: missing \"{name}\"")
        return None
    v = obj[name]
    if isinstance(v, bool) or not isinstance(v, kinds):
        raise ValueError(f"{where}: \"{name}\" has the wrong type")
    return v


def parse_mooncake_line(line, block_tokens, where="trace"):
    """One trace line as a dict of its fields; ValueError naming `where`
    on malformed JSON, a missing or mistyped field, a negative value or a
    block count that does not match input_length."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: not a JSON object")
    rec = {
        "timestamp": _field(obj, "timestamp", (int, float), where),
        "input_length": _field(obj, "input_length", int, where),
        "output_length": _field(obj, "output_length", int, where),
        "hash_ids": _field(obj, "hash_ids", list, where),
        "conversation": _field(obj, "conversation", int, where, False),
        "turn": _field(obj, "turn", int, where, False),
    }
    if rec["input_length"] < 0 or rec["output_length"] < 0:
        raise ValueError(f"{where}: negative length")
    for h in rec["hash_ids"]:
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise ValueError(f"{where}: hash_ids must be non-negative "
                             "integers")
    want = math.ceil(rec["input_length"] / block_tokens)
    if len(rec["hash_ids"]) != want:
        raise ValueError(
            f"{where}: {len(rec['hash_ids'])} hash_ids for input_length "
            f"{rec['input_length']} (expected {want} blocks of "
            f"{block_tokens} tokens)")
    return rec


def read_mooncake(path, block_tokens=512, max_requests=0):
    """The requests of a Mooncake-format JSONL trace, in file order."""
    requests = []
    ends = {}  # id of a request's last full block -> its turn
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = parse_mooncake_line(line, block_tokens, f"{path}:{number}")
            ids = rec["hash_ids"]
            turn = rec["turn"]
            if turn is None:
                turn = 0
                for k in range(len(ids), 0, -1):
                    if ids[k - 1] in ends:
                        turn = ends[ids[k - 1]] + 1
                        break
            full = rec["input_length"] // block_tokens
            if full:
                ends[ids[full - 1]] = turn
            conversation = rec["conversation"]
            requests.append(Request(
                conversation=-1 if conversation is None else conversation,
                turn=turn,
                tokens=hash_id_tokens(ids, rec["input_length"], block_tokens),
                output_length=rec["output_length"],
                timestamp_ms=float(rec["timestamp"])))
            if max_requests and len(requests) == max_requests:
                break
    return requests
