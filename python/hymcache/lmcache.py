"""LMCache remote storage plugin on HyMCache.

LMCache cuts a request's tokens into chunks (256 tokens by default), keys
each with a ``CacheEngineKey`` whose chunk hash chains over the earlier
chunks, and keeps hot chunks in its local CPU pool (``MemoryObj``s). Remote
stores plug in as a ``RemoteConnector``; this module is one, for the
installed lmcache's Remote Storage Plugin Framework
(lmcache/v1/storage_backend/connector/__init__.py, checked against lmcache
0.5.6). LMCache's config (LMCACHE_CONFIG_FILE, YAML):

    chunk_size: 256
    local_cpu: true
    max_local_cpu_size: 5          # GB
    remote_storage_plugins: ["hymcache"]
    extra_config:
      remote_storage_plugin.hymcache.module_path: hymcache.lmcache
      remote_storage_plugin.hymcache.class_name: HyMCacheConnector
      remote_storage_plugin.hymcache.master: "10.0.0.1:7000"
      # optional: .transport (auto), .deadline (5 s), .store_deadline (2 s)

Chunks load straight into MemoryObjs allocated from LMCache's local CPU
backend (``client.load`` writes into ``memory_obj.byte_array``), and store
from them; a batch of chunks is one HyMCache chain (one node, read back in
order with prefetch). The chunk's stored length says how many tokens a
partial last chunk holds (``reshape_partial_chunk``), so no metadata header
is stored beside the bytes (``save_chunk_meta`` is ignored: the chunk shape
and dtype are the engine's full-chunk metadata; layer-wise mode is not
supported).

Keys: ``lmcache/<CacheEngineKey.to_string()>`` (model, world size, worker,
chunk hash, dtype, tags), or its SHA-256 when longer than HyMCache's 256
bytes.

Failure: a dead node, an unreachable master or a deadline is a miss (False,
None, a shorter prefix) and never an exception into LMCache; the first
failure of each kind logs a warning and ``errors`` counts them all.

Importing this module does not import lmcache; the class is built on first
access (``hymcache.lmcache.HyMCacheConnector``), which needs lmcache.
"""

import hashlib
import logging
import threading

import hymcache

logger = logging.getLogger(__name__)

CLASS_NAME = "HyMCacheConnector"
PLUGIN = "hymcache"
_DEFAULT_DEADLINE = 5.0
_DEFAULT_STORE_DEADLINE = 2.0
_STORED = ("stored", "already_stored")


def hymcache_key(key):
    """The HyMCache key of a CacheEngineKey."""
    k = b"lmcache/" + key.to_string().encode()
    return k if len(k) <= 256 else hashlib.sha256(k).digest()


def _option(config, name, default=None):
    extra = getattr(config, "extra_config", None) or {}
    for k in (f"remote_storage_plugin.{PLUGIN}.{name}", f"{PLUGIN}.{name}"):
        if k in extra:
            return extra[k]
    return default


class _Connector:
    """The connector's logic; combined with lmcache's RemoteConnector below.

    Safe for concurrent use: LMCache calls it from its event loop and its
    worker threads; blocking HyMCache calls run in the loop's executor."""

    def __init__(self, loop, local_cpu_backend, config, client=None):
        metadata = getattr(local_cpu_backend, "metadata", None)
        if metadata is not None:
            self._base_init(getattr(local_cpu_backend, "config", config),
                            metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self._deadline = float(_option(config, "deadline", _DEFAULT_DEADLINE))
        self._store_deadline = float(
            _option(config, "store_deadline", _DEFAULT_STORE_DEADLINE))
        self._lock = threading.Lock()
        self.errors = 0
        self._warned = set()
        if client is None:
            master = _option(config, "master")
            if not master:
                raise ValueError(
                    f"hymcache.lmcache: set extra_config "
                    f"remote_storage_plugin.{PLUGIN}.master")
            client = hymcache.Client(
                master, transport=str(_option(config, "transport", "auto")),
                deadline=self._deadline, store_deadline=self._store_deadline)
        self.client = client

    def _degraded(self, what, err):
        with self._lock:
            self.errors += 1
            first = what not in self._warned
            self._warned.add(what)
        if first:
            logger.warning("hymcache.lmcache: %s failed (%r); treated as a "
                           "miss, LMCache recomputes", what, err)

    async def _run(self, fn, *args):
        return await self.loop.run_in_executor(None, fn, *args)

    # Contains ----------------------------------------------------------

    def batched_contains(self, keys):
        """The number of leading keys stored."""
        if not keys:
            return 0
        try:
            found = self.client.exists([hymcache_key(k) for k in keys],
                                       deadline=self._deadline)
            return hymcache.hit_prefix(found)
        except Exception as e:
            self._degraded("lookup", e)
            return 0

    def support_batched_contains(self):
        return True

    def exists_sync(self, key):
        return self.batched_contains([key]) == 1

    async def exists(self, key):
        return await self._run(self.exists_sync, key)

    def support_batched_async_contains(self):
        return True

    async def batched_async_contains(self, lookup_id, keys, pin=False):
        return await self._run(self.batched_contains, keys)

    # Get ---------------------------------------------------------------

    def batched_get_sync(self, keys):
        """MemoryObjs of the leading stored keys, None for the rest."""
        objs = []
        try:
            for _ in keys:
                obj = self.local_cpu_backend.allocate(
                    self.meta_shapes, self.meta_dtypes, self.meta_fmt)
                if obj is None:  # the local pool is full: load fewer
                    break
                objs.append(obj)
            loaded, lengths = 0, []
            if objs:
                got = self.client.load(
                    [hymcache_key(k) for k in keys[:len(objs)]],
                    [o.byte_array for o in objs], deadline=self._deadline)
                loaded, lengths = int(got.loaded), list(got.lengths)
        except Exception as e:
            self._degraded("load", e)
            loaded = 0
        out = []
        for i in range(len(keys)):
            if i < loaded:
                try:
                    out.append(self.reshape_partial_chunk(objs[i], lengths[i]))
                    continue
                except Exception as e:  # a value of another shape
                    self._degraded("reshape", e)
                    loaded = i
            if i < len(objs):
                objs[i].ref_count_down()
            out.append(None)
        return out

    async def get(self, key):
        return (await self._run(self.batched_get_sync, [key]))[0]

    def support_batched_get(self):
        return True

    async def batched_get(self, keys):
        return await self._run(self.batched_get_sync, list(keys))

    def support_batched_get_non_blocking(self):
        return True

    async def batched_get_non_blocking(self, lookup_id, keys):
        objs = await self._run(self.batched_get_sync, list(keys))
        return [o for o in objs if o is not None]

    # Put ---------------------------------------------------------------

    def batched_put_sync(self, keys, memory_objs):
        """Stores the chunks as one chain; True where stored. Holds a
        reference to each object until HyMCache has read it."""
        if not keys:
            return []
        for o in memory_objs:
            o.ref_count_up()
        try:
            r = self.client.store(
                [hymcache_key(k) for k in keys],
                [o.byte_array for o in memory_objs],
                deadline=self._store_deadline).result(
                    self._store_deadline + self._deadline)
            return [o in _STORED for o in r.outcomes]
        except Exception as e:
            self._degraded("store", e)
            return [False] * len(keys)
        finally:
            for o in memory_objs:
                o.ref_count_down()

    async def put(self, key, memory_obj):
        await self._run(self.batched_put_sync, [key], [memory_obj])

    def support_batched_put(self):
        return True

    async def batched_put(self, keys, memory_objs):
        await self._run(self.batched_put_sync, list(keys), list(memory_objs))

    # Housekeeping ------------------------------------------------------

    def remove_sync(self, key):
        try:
            return bool(self.client.remove([hymcache_key(key)])[0])
        except Exception as e:
            self._degraded("remove", e)
            return False

    async def list(self):
        raise NotImplementedError("HyMCache does not list keys to clients")

    async def close(self):
        try:
            self.client.close()
        except Exception as e:
            self._degraded("close", e)


_CLASS = None
_CLASS_LOCK = threading.Lock()


def connector_class():
    """The connector class, a subclass of the installed lmcache's
    RemoteConnector (imports lmcache)."""
    global _CLASS
    with _CLASS_LOCK:
        if _CLASS is None:
            from lmcache.v1.storage_backend.connector.base_connector import (
                RemoteConnector)

            ns = {"__module__": __name__, "__doc__": _Connector.__doc__,
                  "_base_init": RemoteConnector.__init__}
            _CLASS = type(CLASS_NAME, (_Connector, RemoteConnector), ns)
        return _CLASS


def __getattr__(name):
    if name == CLASS_NAME:
        return connector_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
