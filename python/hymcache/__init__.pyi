# Type stubs of the hymcache package (the extension's classes included).
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import errors as errors
from .errors import (
    Aborted as Aborted,
    AlreadyExists as AlreadyExists,
    Cancelled as Cancelled,
    DataLoss as DataLoss,
    DeadlineExceeded as DeadlineExceeded,
    Error as Error,
    FailedPrecondition as FailedPrecondition,
    Internal as Internal,
    InvalidArgument as InvalidArgument,
    NotFound as NotFound,
    OutOfRange as OutOfRange,
    PermissionDenied as PermissionDenied,
    ResourceExhausted as ResourceExhausted,
    Unauthenticated as Unauthenticated,
    Unavailable as Unavailable,
    Unimplemented as Unimplemented,
    Unknown as Unknown,
)

# A contiguous object with the buffer protocol (numpy.ndarray, bytearray,
# memoryview, mmap) or with __dlpack__ on the CPU.
Buffer = Any
Key = Union[bytes, str]
TokenIds = Union[Sequence[int], Any]  # or an int32 / int64 numpy array

class LoadResult:
    """Blocks [0, loaded) are in the caller's buffers, complete."""
    @property
    def loaded(self) -> int: ...
    @property
    def lengths(self) -> List[int]: ...
    @property
    def hit_prefix(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def stop_reason(self) -> Optional[Error]: ...
    def __int__(self) -> int: ...

class StoreResult:
    @property
    def stored(self) -> int: ...
    @property
    def skipped(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def refused(self) -> int: ...
    @property
    def node_id(self) -> int: ...
    @property
    def outcomes(self) -> List[str]: ...
    @property
    def errors(self) -> List[Optional[Error]]: ...

class StoreFuture:
    def done(self) -> bool: ...
    def result(self, timeout: Optional[float] = None) -> StoreResult: ...

class Client:
    def __init__(
        self,
        masters: Union[str, Sequence[str], None] = None,
        *,
        transport: str = "auto",
        deadline: float = 10.0,
        store_deadline: float = 2.0,
        auth_token: str = "",
        tls_ca_file: str = "",
        tls_cert_file: str = "",
        tls_key_file: str = "",
        tls_server_name: str = "",
        store_threads: int = 2,
        max_pending_stores: int = 64,
        master_connections: int = 8,
        grpc_poll_strategy: str = "auto",
        etcd: Union[str, Sequence[str], None] = None,
        cluster: str = "default",
        location_cache_entries: int = 16384,
        location_cache_ttl: float = 1.0,
    ) -> None: ...
    def __enter__(self) -> "Client": ...
    def __exit__(self, *exc: Any) -> bool: ...
    def load(
        self,
        keys: Sequence[Key],
        buffers: Sequence[Buffer],
        *,
        deadline: Optional[float] = None,
        prefetch: bool = True,
    ) -> LoadResult: ...
    def store(
        self,
        keys: Sequence[Key],
        buffers: Sequence[Buffer],
        *,
        parent_key: Optional[Key] = None,
        deadline: Optional[float] = None,
    ) -> StoreFuture: ...
    def lookup(
        self, keys: Sequence[Key], *, deadline: Optional[float] = None
    ) -> Dict[str, Any]: ...
    def exists(
        self, keys: Sequence[Key], *, deadline: Optional[float] = None
    ) -> List[bool]: ...
    def remove(
        self, keys: Sequence[Key], *, deadline: Optional[float] = None
    ) -> List[bool]: ...
    def prefix_query(
        self, keys: Sequence[Key], *, deadline: Optional[float] = None
    ) -> Dict[str, Any]: ...
    def report_engine_blocks(
        self,
        engine_id: str,
        *,
        stored: Sequence[Key] = [],
        removed: Sequence[Key] = [],
        cleared: bool = False,
        deadline: Optional[float] = None,
    ) -> Tuple[int, float]: ...
    def hint_next_turn(
        self,
        keys: Sequence[Key],
        *,
        expected_in: Optional[float] = None,
        hold: Optional[float] = None,
    ) -> bool: ...
    def hint_conversation_ended(self, keys: Sequence[Key]) -> bool: ...
    def stats(self, *, deadline: Optional[float] = None) -> Dict[str, Any]: ...
    def register_buffer(self, buffer: Buffer) -> None: ...
    def unregister_buffer(self, buffer: Buffer) -> None: ...
    def pending_stores(self) -> int: ...
    def close(self) -> None: ...

class KeyBuilder:
    def __init__(
        self,
        *,
        model: str = "",
        dtype: str = "",
        layout: str = "",
        tp_rank: int = 0,
        tp_size: int = 1,
        salt: str = "",
        block_tokens: int = 512,
    ) -> None: ...
    @property
    def block_tokens(self) -> int: ...
    def keys(
        self, token_ids: TokenIds, *, parent: Optional[Key] = None
    ) -> List[bytes]: ...

def hit_prefix(found: Sequence[bool]) -> int: ...
def key_to_hex(key: Key) -> str: ...
def keys(
    token_ids: TokenIds,
    *,
    model: str = "",
    dtype: str = "",
    layout: str = "",
    tp_rank: int = 0,
    tp_size: int = 1,
    salt: str = "",
    block_tokens: int = 512,
    parent: Optional[Key] = None,
) -> List[bytes]: ...
