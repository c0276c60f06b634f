"""SGLang HiCache storage backend on HyMCache.

HiCache (SGLang's hierarchical cache) keeps a host memory pool between the
GPU KV cache and a storage backend, and asks the backend for pages by key
(each page key hashes its tokens and the previous page's key, so keys are
already prefix-chained). This module is such a backend, implementing the
installed sglang's ``HiCacheStorage``
(sglang/srt/mem_cache/hicache_storage.py, checked against sglang 0.5.23).

SGLang loads it as a dynamic backend; the class is named on the command
line:

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "hymcache",
        "module_path": "hymcache.sglang", "class_name": "HyMCacheStorage",
        "interface_v1": 1, "master": "10.0.0.1:7000"}'

``interface_v1`` makes SGLang's cache controller call ``batch_get_v1`` /
``batch_set_v1``: pages go straight between HyMCache and the host pool's
pages (``HostKVCache.get_page_buffer_meta``), without copies. Without it the
controller uses the older ``batch_get`` / ``batch_set`` with one flat tensor
per page (one copy in SGLang). The two paths use different keys.

Other extra-config fields: ``master`` (an address or a list), ``transport``
(default "auto"), ``deadline`` (seconds, loads and lookups, default 5),
``store_deadline`` (default 2), ``salt`` (added to the namespace).

Keys: ``hicache/<namespace digest>/<page key>/<piece>``, where the
namespace is the model, the pipeline stage, the tensor-parallel shard (not
for MLA, whose KV is the same on every rank), the context-parallel rank,
the host pool's layout, dtype and page size, and the salt; a page whose
host-pool pages are several buffers (K and V, or one per layer) stores one
key per piece. Different models, ranks or layouts never share a key.

Failure: nothing here raises into SGLang. A dead node, an unreachable
master or a deadline is a miss (``False`` / ``None`` / a shorter prefix);
SGLang then recomputes those tokens. Degraded calls log a warning the
first time and count in ``errors``.

Importing this module does not import sglang; the class is built on first
access (``hymcache.sglang.HyMCacheStorage``), which needs sglang installed.
"""

import ctypes
import hashlib
import logging
import threading

import hymcache

logger = logging.getLogger(__name__)

CLASS_NAME = "HyMCacheStorage"
_DEFAULT_DEADLINE = 5.0
_DEFAULT_STORE_DEADLINE = 2.0
_STORED = ("stored", "already_stored")


def _byte_view(ptr, size):
    """A writable memoryview of `size` bytes at address `ptr` (no copy)."""
    return memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")


class _HiCacheBackend:
    """The backend's logic; combined with sglang's HiCacheStorage below.

    Safe for concurrent use: SGLang calls it from its prefetch and backup
    threads at once; hymcache.Client is thread-safe and the only mutable
    state here is the error counter (guarded by _lock)."""

    def __init__(self, storage_config, kwargs=None, client=None):
        extra = dict(storage_config.extra_config or {})
        self.storage_config = storage_config
        self.mem_pool_host = None
        self._pieces = None
        self._deadline = float(extra.get("deadline", _DEFAULT_DEADLINE))
        self._store_deadline = float(
            extra.get("store_deadline", _DEFAULT_STORE_DEADLINE))
        self._salt = str(extra.get("salt", ""))
        self._writer = bool(getattr(storage_config, "is_storage_writer", True))
        self._lock = threading.Lock()
        self.errors = 0
        self._warned = set()
        if client is None:
            master = extra.get("master")
            if not master:
                raise ValueError(
                    "hymcache.sglang: set \"master\" in "
                    "--hicache-storage-backend-extra-config")
            client = hymcache.Client(
                master, transport=str(extra.get("transport", "auto")),
                deadline=self._deadline, store_deadline=self._store_deadline)
        self.client = client
        self._prefix = self._namespace_prefix(pool=None)

    # Namespace ---------------------------------------------------------

    def _namespace_prefix(self, pool):
        c = self.storage_config
        parts = [f"model={c.model_name or ''}",
                 f"pp={c.pp_rank}/{c.pp_size}"]
        if not c.is_mla_model:
            parts.append(f"tp={c.tp_rank}/{c.tp_size}")
        else:
            parts.append("mla")
        if getattr(c, "attn_cp_size", 1) > 1:
            parts.append(f"cp={c.attn_cp_rank}/{c.attn_cp_size}")
        if getattr(c, "dcp_size", 1) > 1:
            parts.append(f"dcp={c.dcp_rank}/{c.dcp_size}")
        if pool is not None:
            parts.append(f"layout={getattr(pool, 'layout', '')}")
            parts.append(f"dtype={getattr(pool, 'dtype', '')}")
            parts.append(f"page={getattr(pool, 'page_size', '')}")
        parts.append(f"salt={self._salt}")
        digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]
        return f"hicache/{digest}/"

    def _key(self, page_key, piece):
        k = f"{self._prefix}{page_key}/{piece}".encode()
        return k if len(k) <= 256 else hashlib.sha256(k).digest()

    def _degraded(self, what, err):
        with self._lock:
            self.errors += 1
            first = what not in self._warned
            self._warned.add(what)
        if first:
            logger.warning("hymcache.sglang: %s failed (%r); treated as a "
                           "miss, SGLang recomputes", what, err)

    # Host pool ---------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host
        self._pieces = None
        self._prefix = self._namespace_prefix(mem_pool_host)
        for name in ("kv_buffer", "k_buffer", "v_buffer"):
            t = getattr(mem_pool_host, name, None)
            if t is None or not hasattr(t, "__dlpack__"):
                continue
            try:
                self.client.register_buffer(t)
            except Exception as e:  # a no-op for TCP and shm; RDMA may refuse
                self._degraded("register_buffer", e)

    def _page_views(self, keys, host_indices):
        """The HyMCache keys and host-pool views of `keys`' pages:
        (hkeys, views, pieces per page)."""
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if ptrs and isinstance(ptrs[0], (list, tuple)):  # multi-buffer MLA
            ptrs = [p for group in ptrs for p in group]
            sizes = [s for group in sizes for s in group]
        if not keys or len(ptrs) % len(keys):
            raise ValueError(f"{len(ptrs)} buffers for {len(keys)} pages")
        n = len(ptrs) // len(keys)
        hkeys = [self._key(k, j) for k in keys for j in range(n)]
        views = [_byte_view(int(p), int(s)) for p, s in zip(ptrs, sizes)]
        return hkeys, views, n

    def _parent(self, extra_info, pieces):
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info else None
        return self._key(prefix[-1], pieces - 1) if prefix else None

    # Zero-copy path (interface_v1) ---------------------------------------

    def batch_exists(self, keys, extra_info=None):
        """The number of leading pages whose every piece is stored."""
        if not keys:
            return 0
        try:
            n = self._pieces_per_page()
            pieces = ["flat"] if n == 0 else range(n)
            n = max(n, 1)
            hkeys = [self._key(k, j) for k in keys for j in pieces]
            found = self.client.exists(hkeys, deadline=self._deadline)
            return hymcache.hit_prefix(found) // n
        except Exception as e:
            self._degraded("batch_exists", e)
            return 0

    def _pieces_per_page(self):
        """Keys per page: 0 for the copying path's one "flat" key."""
        if self.mem_pool_host is None or self._flat:
            return 0
        if self._pieces is None:  # the same for every page of a pool
            import torch
            page = int(self.mem_pool_host.page_size)
            ptrs, _ = self.mem_pool_host.get_page_buffer_meta(
                torch.arange(page, dtype=torch.int64))
            multi = ptrs and isinstance(ptrs[0], (list, tuple))
            self._pieces = len(ptrs[0]) if multi else len(ptrs)
        return self._pieces

    @property
    def _flat(self):
        extra = self.storage_config.extra_config or {}
        return not bool(extra.get("interface_v1", 0))

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        if not keys:
            return []
        try:
            hkeys, views, n = self._page_views(keys, host_indices)
            got = self.client.load(hkeys, views, deadline=self._deadline)
            pages = int(got.loaded) // n
        except Exception as e:
            self._degraded("batch_get_v1", e)
            pages = 0
        return [i < pages for i in range(len(keys))]

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        if not keys:
            return []
        if not self._writer:  # an MLA replica: the writer rank stores
            return [True] * len(keys)
        try:
            hkeys, views, n = self._page_views(keys, host_indices)
            r = self.client.store(
                hkeys, views, parent_key=self._parent(extra_info, n),
                deadline=self._store_deadline).result(
                    self._store_deadline + self._deadline)
            ok = [o in _STORED for o in r.outcomes]
        except Exception as e:
            self._degraded("batch_set_v1", e)
            return [False] * len(keys)
        return [all(ok[i * n:(i + 1) * n]) for i in range(len(keys))]

    # Copying path (one flat tensor per page) -----------------------------

    def exists(self, key):
        return self.batch_exists([key]) == 1

    def get(self, key, target_location=None, target_sizes=None):
        out = self.batch_get([key], [target_location])
        return out[0] if out else None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        if not keys:
            return []
        try:
            got = self.client.load([self._key(k, "flat") for k in keys],
                                   list(target_locations),
                                   deadline=self._deadline)
            loaded = int(got.loaded)
        except Exception as e:
            self._degraded("batch_get", e)
            loaded = 0
        return [t if i < loaded else None
                for i, t in enumerate(target_locations)]

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value])

    def batch_set(self, keys, values=None, target_locations=None,
                  target_sizes=None):
        if not keys:
            return False
        if not self._writer:
            return True
        try:
            bufs = [v.contiguous() for v in values]
            r = self.client.store(
                [self._key(k, "flat") for k in keys], bufs,
                deadline=self._store_deadline).result(
                    self._store_deadline + self._deadline)
            return all(o in _STORED for o in r.outcomes)
        except Exception as e:
            self._degraded("batch_set", e)
            return False

    # Housekeeping ------------------------------------------------------

    def clear(self):
        # The store does not list a client's keys; the cluster evicts by
        # recency, and a new salt starts a fresh namespace.
        return None

    def get_stats(self):
        return None

    def close(self):
        try:
            self.client.close()
        except Exception as e:
            self._degraded("close", e)


_CLASS = None
_CLASS_LOCK = threading.Lock()


def storage_class():
    """The backend class, a subclass of the installed sglang's
    HiCacheStorage (imports sglang)."""
    global _CLASS
    with _CLASS_LOCK:
        if _CLASS is None:
            from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

            _CLASS = type(CLASS_NAME, (_HiCacheBackend, HiCacheStorage), {
                "__module__": __name__,
                "__doc__": _HiCacheBackend.__doc__,
            })
        return _CLASS


def __getattr__(name):
    if name == CLASS_NAME:
        return storage_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
