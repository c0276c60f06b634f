"""Requests, the Mooncake JSONL trace reader, the built-in multi-turn
generator, and the rule that recovers conversations and turns from prefix
chains.

Turns are 1-based everywhere in hymsim (the paper's Table 1 counts from 1).
hymbench's traces carry 0-based `turn` fields; load_mooncake adds one.
"""

import dataclasses
import json
import random


@dataclasses.dataclass
class Request:
    # Arrival time in seconds (Mooncake traces: milliseconds / 1000).
    timestamp: float
    input_length: int
    output_length: int
    # One id per block of `block_tokens` tokens; equal ids mean equal prefixes.
    hash_ids: list
    # Conversation id and 1-based turn, or -1 when unknown.
    conversation: int = -1
    turn: int = -1
    # Closed-loop workloads: the previous turn's request index and the think
    # time after its first token (the generator sets them; -1 for open loop).
    parent: int = -1
    think_s: float = 0.0


class TraceError(ValueError):
    pass


def load_mooncake(path):
    """Reads a Mooncake-format JSONL trace (timestamp in ms, input_length,
    output_length, hash_ids; optional 0-based conversation/turn as hymbench
    writes). Raises TraceError naming the line on malformed input."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                j = json.loads(line)
                r = Request(timestamp=float(j["timestamp"]) / 1000.0,
                            input_length=int(j["input_length"]),
                            output_length=int(j.get("output_length", 0)),
                            hash_ids=[int(h) for h in j["hash_ids"]])
            except (ValueError, KeyError, TypeError) as e:
                raise TraceError("%s:%d: %s" % (path, n, e)) from None
            if r.input_length < 0 or r.timestamp < 0:
                raise TraceError("%s:%d: negative field" % (path, n))
            if "turn" in j and "conversation" in j:
                r.conversation = int(j["conversation"])
                r.turn = int(j["turn"]) + 1
            out.append(r)
    out.sort(key=lambda r: r.timestamp)
    return out


def infer_turns(requests, block_tokens, parents=None):
    """Assigns conversation and turn to requests in timestamp order, from
    their prefix chains.

    Rule. Let full(A) = min(len(A.hash_ids), A.input_length // block_tokens)
    be A's complete blocks (a trailing partial block's id changes when the
    next turn fills it). Request B's parent is the earlier request A with
    the largest full(A) >= 1 such that full(A) < len(B.hash_ids) and
    B.hash_ids[:full(A)] == A.hash_ids[:full(A)] (the latest such A on
    ties), among the requests whose last full block first came in their
    own chain (the request, its parent, its parent's parent, ... and the
    branches of that tree): a request whose full blocks are only a prefix
    an unrelated conversation brought (a system prompt every conversation
    shares, with the request's own text in its partial last block) is
    nobody's parent, since its next turn cannot be told from any other
    conversation on that prompt. B's turn is A's turn + 1; B joins A's
    conversation if it is A's first child, else it starts a new
    conversation (a branch: two requests extending the same chain are two
    conversations sharing a prefix). A request without a parent is turn 1
    of a new conversation.

    Returns the number of conversations. Overwrites conversation and turn;
    appends each request's parent index (-1: none) to `parents` if given.
    """
    by_last = {}  # last full block id -> [(full, index)]
    first_seen = {}  # block id -> the tree of its first request
    tree = []  # request index -> its root request's index
    has_child = set()
    conversations = 0
    for i, b in enumerate(requests):
        ids = b.hash_ids
        parent = -1
        for k in range(len(ids) - 1, 0, -1):
            for full, a in reversed(by_last.get(ids[k - 1], ())):
                if full == k and requests[a].hash_ids[:k] == ids[:k]:
                    parent = a
                    break
            if parent >= 0:
                break
        if parents is not None:
            parents.append(parent)
        if parent >= 0:
            a = requests[parent]
            b.turn = a.turn + 1
            if parent in has_child:
                b.conversation = conversations
                conversations += 1
            else:
                b.conversation = a.conversation
                has_child.add(parent)
        else:
            b.turn = 1
            b.conversation = conversations
            conversations += 1
        tree.append(tree[parent] if parent >= 0 else i)
        for h in ids:
            first_seen.setdefault(h, tree[i])
        full = min(len(ids), b.input_length // block_tokens)
        if full >= 1 and first_seen[ids[full - 1]] == tree[i]:
            by_last.setdefault(ids[full - 1], []).append((full, i))
    return conversations


@dataclasses.dataclass
class MultiTurnOptions:
    """The built-in workload: AIPerf-style multi-turn sessions. Turn t of a
    conversation sends everything of turn t-1 (input and output) plus
    `user_tokens` new tokens; turn 1 sends one of `shared_prefixes` shared
    documents of `shared_tokens` tokens plus `user_tokens`. Sessions run
    closed-loop: turn t+1 arrives `think_s` after turn t's first token, and
    at most `concurrency` sessions are open at once."""
    conversations: int = 64
    turns: int = 7
    # 0: every conversation has `turns` turns. > 0: each conversation's
    # turn count T is drawn from P(T = t) ~ t^-turns_zipf on 1..turns
    # (heavy-tailed like LMSYS-Chat's: most chats are short, and one that
    # has lasted is likelier to go on).
    turns_zipf: float = 0.0
    user_tokens: int = 2048
    output_tokens: int = 1
    shared_prefixes: int = 8
    shared_tokens: int = 2048
    think_s: float = 1.0
    # Each think time is think_s * uniform(1 - jitter, 1 + jitter).
    think_jitter: float = 0.0
    concurrency: int = 16
    # Start times of sessions that find a free slot are spread over this
    # many seconds (0: all at once).
    start_spread_s: float = 0.0
    seed: int = 1

    def validate(self):
        for f in ("conversations", "turns", "concurrency"):
            if getattr(self, f) < 1:
                raise ValueError("%s must be >= 1" % f)
        for f in ("user_tokens", "output_tokens", "shared_prefixes",
                  "shared_tokens"):
            if getattr(self, f) < 0:
                raise ValueError("%s must be >= 0" % f)
        if self.turns_zipf < 0:
            raise ValueError("turns_zipf must be >= 0")
        if self.user_tokens + self.shared_tokens < 1:
            raise ValueError("turn 1 needs at least one token")


def generate_multiturn(o, block_tokens):
    """Returns the requests of `o`, conversation-major (turn 1 of session 0,
    turn 2 of session 0, ...). Timestamps are start times for turn 1 only;
    the simulator places later turns (closed loop) and admits sessions
    `o.concurrency` at a time. hash_ids are prefix ids: block k of a
    conversation's context has the same id in every turn that contains it in
    full, and shared documents' blocks are shared across conversations."""
    o.validate()
    rng = random.Random(o.seed)
    next_id = [0]
    doc_ids = []
    for _ in range(max(o.shared_prefixes, 1)):
        doc_ids.append([next_id[0] + k for k in range(o.shared_tokens // block_tokens)])
        next_id[0] += len(doc_ids[-1])
    zipf = [t ** -o.turns_zipf for t in range(1, o.turns + 1)]
    out = []
    for c in range(o.conversations):
        doc = rng.randrange(max(o.shared_prefixes, 1)) if o.shared_prefixes else -1
        # Block ids of this conversation's context: the document's full
        # blocks, then private ids; a partial last block gets a fresh id in
        # each turn (its content differs).
        shared_full = o.shared_tokens // block_tokens if doc >= 0 else 0
        full_ids = list(doc_ids[doc][:shared_full]) if doc >= 0 else []
        tokens = (o.shared_tokens if doc >= 0 else 0)
        start = rng.uniform(0, o.start_spread_s) if o.start_spread_s else 0.0
        turns = o.turns
        if o.turns_zipf > 0:
            turns = rng.choices(range(1, o.turns + 1), weights=zipf)[0]
        for t in range(1, turns + 1):
            tokens += o.user_tokens
            while len(full_ids) < tokens // block_tokens:
                full_ids.append(next_id[0])
                next_id[0] += 1
            ids = list(full_ids)
            if tokens % block_tokens:
                ids.append(next_id[0])
                next_id[0] += 1
            out.append(Request(timestamp=start, input_length=tokens,
                               output_length=o.output_tokens, hash_ids=ids,
                               conversation=c, turn=t,
                               parent=len(out) - 1 if t > 1 else -1,
                               think_s=o.think_s * rng.uniform(
                                   1 - o.think_jitter, 1 + o.think_jitter)))
            tokens += o.output_tokens
    return out


def write_jsonl(requests, f):
    """Mooncake format (timestamp in ms) plus 0-based conversation/turn, as
    hymbench gen writes."""
    for r in requests:
        f.write(json.dumps({"timestamp": int(round(r.timestamp * 1000)),
                            "input_length": r.input_length,
                            "output_length": r.output_length,
                            "hash_ids": r.hash_ids,
                            "conversation": r.conversation,
                            "turn": r.turn - 1}) + "\n")
