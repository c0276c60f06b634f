"""Exceptions of the hymcache package: one class per absl status code.

Every error the C++ SDK returns reaches Python as the class of its code,
all under `hymcache.Error`. Argument errors (`InvalidArgument`,
`OutOfRange`) are also `ValueError`s, `DeadlineExceeded` is also a
`TimeoutError` and `Unavailable` a `ConnectionError`, so generic handlers
work too. `err.code` is the canonical code's name (e.g. "NOT_FOUND");
`err.reason` is the machine-readable reason that refines it, or "none"
(common/status_reason.h: "store_queue_full", "no_room",
"node_refused_write", "not_attempted", "not_leader", "read_only",
"write_receipt_invalid", "nodes_rejoining"). Match on code and reason,
never on the message, which is for people.

load() never raises for a miss, a dead node, a buffer too small or its
deadline: those end the loaded prefix and appear as `LoadResult.stop_reason`
(an instance of one of these classes).
"""


class Error(Exception):
    """Base class of every hymcache error."""

    code = "UNKNOWN"

    def __init__(self, message="", reason="none"):
        super().__init__(message)
        self.message = message
        self.reason = reason


class Cancelled(Error):
    code = "CANCELLED"


class Unknown(Error):
    code = "UNKNOWN"


class InvalidArgument(Error, ValueError):
    """A bad argument: sizes that differ, a read-only, strided or object
    buffer, an empty key list, bad options."""

    code = "INVALID_ARGUMENT"


class DeadlineExceeded(Error, TimeoutError):
    """The call's deadline (or a future's timeout) passed."""

    code = "DEADLINE_EXCEEDED"


class NotFound(Error, KeyError):
    """A key is not stored (or vanished), or a buffer is not registered."""

    code = "NOT_FOUND"

    def __str__(self):  # KeyError would quote the message
        return self.message


class AlreadyExists(Error):
    code = "ALREADY_EXISTS"


class PermissionDenied(Error):
    """The master refused the caller's identity (docs/security.md)."""

    code = "PERMISSION_DENIED"


class ResourceExhausted(Error):
    """No room, a full store queue, or the locked-memory limit."""

    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(Error):
    """E.g. a call on a closed client."""

    code = "FAILED_PRECONDITION"


class Aborted(Error):
    code = "ABORTED"


class OutOfRange(Error, ValueError):
    """A buffer too small for its block (load's stop_reason)."""

    code = "OUT_OF_RANGE"


class Unimplemented(Error):
    code = "UNIMPLEMENTED"


class Internal(Error):
    code = "INTERNAL"


class Unavailable(Error, ConnectionError):
    """The master or a storage node cannot be reached."""

    code = "UNAVAILABLE"


class DataLoss(Error):
    code = "DATA_LOSS"


class Unauthenticated(Error):
    code = "UNAUTHENTICATED"


# absl::StatusCode values (absl/status/status.h), as the extension passes them.
_BY_CODE = {
    1: Cancelled,
    2: Unknown,
    3: InvalidArgument,
    4: DeadlineExceeded,
    5: NotFound,
    6: AlreadyExists,
    7: PermissionDenied,
    8: ResourceExhausted,
    9: FailedPrecondition,
    10: Aborted,
    11: OutOfRange,
    12: Unimplemented,
    13: Internal,
    14: Unavailable,
    15: DataLoss,
    16: Unauthenticated,
}


def _from_status(code, message, reason="none"):
    """The exception for a non-OK absl status (called by the extension)."""
    return _BY_CODE.get(code, Unknown)(message, reason)
