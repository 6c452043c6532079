"""Errors of the kvarn package.

Every failure that comes from kvarnd or from the C++ client is a :class:`kvarn.Error` (or an
instance of one of its subclasses, one per gRPC status code), carrying the status code:

* ``e.code``: the code's name, e.g. ``"NOT_FOUND"``;
* ``e.code_value``: its number (``grpc.StatusCode`` / ``absl::StatusCode``), e.g. 5;
* ``e.message``: the daemon's or client's message.

``str(e)`` is ``"NOT_FOUND: <message>"``. The code says what to do next (see
proto/kvarn/v1/kvarn.proto): ``INVALID_ARGUMENT`` fix the request; ``NOT_FOUND`` the session
or sequence does not exist or is not yours (a wrong secret and a closed session read the
same); ``UNAUTHENTICATED`` a wrong tenant token; ``RESOURCE_EXHAUSTED`` release or preempt a
sequence; ``FAILED_PRECONDITION`` a stale epoch (the daemon restarted: reconnect) or a busy
sequence; ``UNAVAILABLE`` the daemon is draining or unreachable: retry elsewhere;
``PERMISSION_DENIED`` an admin operation without the admin token.

:class:`InvalidArgumentError` is also a :class:`ValueError`.

Bad input that the bindings find before anything is sent (wrong shapes, dtypes, lengths, a
non-contiguous ``out`` array) raises a plain :class:`ValueError` or :class:`TypeError`, not a
:class:`kvarn.Error`.
"""

__all__ = [
    "Error",
    "CancelledError",
    "UnknownError",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "AbortedError",
    "OutOfRangeError",
    "UnimplementedError",
    "InternalError",
    "UnavailableError",
    "DataLossError",
    "UnauthenticatedError",
    "CODE_NAMES",
]

#: gRPC status code numbers to their names.
CODE_NAMES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}


class Error(Exception):
    """A failed kvarnd call or client operation, with its gRPC status code.

    Attributes: ``code`` (name, e.g. ``"NOT_FOUND"``), ``code_value`` (number) and
    ``message``.
    """

    #: The code of this class (subclasses set it); an Error built for another code keeps that one.
    CODE = "UNKNOWN"

    def __init__(self, message="", code=None):
        if code is None:
            code = self.CODE
        if isinstance(code, int):
            code_value, code = code, CODE_NAMES.get(code, "UNKNOWN")
        else:
            code_value = next((n for n, c in CODE_NAMES.items() if c == code), 2)
        super().__init__(message)
        self.code = code
        self.code_value = code_value
        self.message = message

    def __str__(self):
        return f"{self.code}: {self.message}"

    def __repr__(self):
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"

    def __reduce__(self):
        return (_from_status, (self.code_value, self.message))


class CancelledError(Error):
    """CANCELLED: the call was cancelled."""
    CODE = "CANCELLED"


class UnknownError(Error):
    """UNKNOWN: an error without a better code."""
    CODE = "UNKNOWN"


class InvalidArgumentError(Error, ValueError):
    """INVALID_ARGUMENT: fix the request (bad shape, NaN/Inf, unknown preset, wrong layout,
    tokens past the tail). Also a ValueError."""
    CODE = "INVALID_ARGUMENT"


class DeadlineExceededError(Error):
    """DEADLINE_EXCEEDED: the call ran past its deadline (Client rpc_timeout)."""
    CODE = "DEADLINE_EXCEEDED"


class NotFoundError(Error):
    """NOT_FOUND: the session or sequence does not exist or is not yours (another session's
    ids, a wrong secret and a closed session all read so)."""
    CODE = "NOT_FOUND"


class AlreadyExistsError(Error):
    """ALREADY_EXISTS."""
    CODE = "ALREADY_EXISTS"


class PermissionDeniedError(Error):
    """PERMISSION_DENIED: an admin-only operation without the admin token."""
    CODE = "PERMISSION_DENIED"


class ResourceExhaustedError(Error):
    """RESOURCE_EXHAUSTED: no block free even after eviction, or a quota or cap reached:
    release or preempt a sequence."""
    CODE = "RESOURCE_EXHAUSTED"


class FailedPreconditionError(Error):
    """FAILED_PRECONDITION: stale epoch (the daemon restarted: reconnect and reopen), a busy
    sequence, or an operation the session cannot do (no shared memory over TCP)."""
    CODE = "FAILED_PRECONDITION"


class AbortedError(Error):
    """ABORTED."""
    CODE = "ABORTED"


class OutOfRangeError(Error):
    """OUT_OF_RANGE."""
    CODE = "OUT_OF_RANGE"


class UnimplementedError(Error):
    """UNIMPLEMENTED: e.g. a CUDA pool with a client library built without CUDA."""
    CODE = "UNIMPLEMENTED"


class InternalError(Error):
    """INTERNAL: a broken invariant in the daemon or the client."""
    CODE = "INTERNAL"


class UnavailableError(Error):
    """UNAVAILABLE: the daemon is draining or unreachable: retry elsewhere."""
    CODE = "UNAVAILABLE"


class DataLossError(Error):
    """DATA_LOSS."""
    CODE = "DATA_LOSS"


class UnauthenticatedError(Error):
    """UNAUTHENTICATED: a configured tenant with a wrong token, or an unknown tenant."""
    CODE = "UNAUTHENTICATED"


_BY_CODE = {cls.CODE: cls for cls in (
    CancelledError, UnknownError, InvalidArgumentError, DeadlineExceededError, NotFoundError,
    AlreadyExistsError, PermissionDeniedError, ResourceExhaustedError, FailedPreconditionError,
    AbortedError, OutOfRangeError, UnimplementedError, InternalError, UnavailableError,
    DataLossError, UnauthenticatedError)}


def _from_status(code_value, message):
    """The Error instance for a status code number (used by the extension module)."""
    name = CODE_NAMES.get(code_value, "UNKNOWN")
    cls = _BY_CODE.get(name, Error)
    return cls(message, code_value)
