"""hymcache: the Python client of HyMCache, a disaggregated KV-cache store.

    import numpy as np
    import hymcache

    kb = hymcache.KeyBuilder(model="llama-3.1-8b", dtype="bf16",
                             layout="NHD/32x8x128", block_tokens=256)
    keys = kb.keys(token_ids)                      # one 32-byte key per full block
    with hymcache.Client(["127.0.0.1:50051"]) as c:
        pool = np.empty((len(keys), block_bytes), np.uint8)
        got = c.load(keys, list(pool))             # in place, GIL released
        # blocks [got.loaded, len(keys)) are recomputed, then stored:
        c.store(keys[got.loaded:], list(pool[got.loaded:]),
                parent_key=keys[got.loaded - 1] if got.loaded else None)

A thin layer over the C++ SDK (client/client.h): the same read path, write
path, deadlines and key scheme. Buffers are any contiguous objects with the
buffer protocol (numpy arrays, bytearray, memoryview) or DLPack (CPU); the
SDK reads and writes their memory directly. Errors are `hymcache.Error`
subclasses (hymcache.errors).

Torch: a CPU (or pinned) tensor is passed directly, through DLPack
(`__dlpack__`, any dtype, bf16 included), or as `t.numpy()`; both share its
memory. A contiguous tensor only (`t.is_contiguous()`). GPU tensors are
refused: the SDK has no GPU-memory registration, so engines stage through a
pinned host pool.
"""

from . import errors
from ._hymcache import (
    Client,
    KeyBuilder,
    LoadResult,
    StoreFuture,
    StoreResult,
    key_to_hex,
)
from .errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DataLoss,
    DeadlineExceeded,
    Error,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
)


def keys(token_ids, *, model="", dtype="", layout="", tp_rank=0, tp_size=1,
         salt="", block_tokens=512, parent=None):
    """Keys of every full block of `token_ids` in the namespace given.

    A one-off KeyBuilder(...).keys(token_ids, parent=parent); build a
    KeyBuilder once when computing keys per request.
    """
    return KeyBuilder(model=model, dtype=dtype, layout=layout,
                      tp_rank=tp_rank, tp_size=tp_size, salt=salt,
                      block_tokens=block_tokens).keys(token_ids, parent=parent)


def hit_prefix(found):
    """The number of leading True in `found` (what Client.exists returns):
    how many leading blocks of a chain are stored."""
    n = 0
    for f in found:
        if not f:
            break
        n += 1
    return n


__all__ = [
    "Client", "KeyBuilder", "LoadResult", "StoreFuture", "StoreResult",
    "hit_prefix", "key_to_hex", "keys", "errors", "Error", "Aborted", "AlreadyExists",
    "Cancelled", "DataLoss", "DeadlineExceeded", "FailedPrecondition",
    "Internal", "InvalidArgument", "NotFound", "OutOfRange",
    "PermissionDenied", "ResourceExhausted", "Unauthenticated", "Unavailable",
    "Unimplemented", "Unknown",
]
