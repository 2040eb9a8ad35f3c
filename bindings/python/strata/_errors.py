"""strata's exception family (docs/errors.md).

Every error raised by strata is a :class:`strata.Error` and also the built-in exception a
Python programmer expects, so ``except KeyError`` and ``except strata.Error`` both work:

============================  ==============================  ===========================
strata.StatusCode             exception class                 also a
============================  ==============================  ===========================
InvalidArgument               InvalidArgumentError            ValueError
NotFound                      NotFoundError                   KeyError
AlreadyExists                 AlreadyExistsError              KeyError
OutOfRange                    OutOfRangeError                 ValueError
ResourceExhausted             ResourceExhaustedError          MemoryError
FailedPrecondition            FailedPreconditionError         (strata.Error only)
DataLoss                      DataLossError                   OSError (errno when known)
Unavailable                   UnavailableError                (strata.Error only)
IoError                       IoError                         OSError (with errno)
DeadlineExceeded              DeadlineExceededError           TimeoutError
Cancelled                     CancelledError                  (strata.Error only)
Unimplemented                 UnimplementedError              NotImplementedError
Internal                      InternalError                   (strata.Error only)
PermissionDenied              PermissionDeniedError           PermissionError (errno)
============================  ==============================  ===========================

Each instance has ``code`` (the StatusCode name, e.g. ``"NotFound"``), ``message`` (what
went wrong, naming the key, path, offset or option) and ``errno`` (0 when no OS call failed;
for the OSError family it is also ``OSError.errno``).
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every strata error."""

    code: str = "Unknown"

    def __init__(self, message: str = "", errno: int = 0):
        Exception.__init__(self, message)
        self.message = message
        self._strata_errno = errno

    def __str__(self) -> str:  # KeyError would otherwise print repr(message)
        return f"{self.code}: {self.message}"


class _OSErrorMixin(Error):
    """Errors that are also OSError: OSError(errno, message) sets .errno and .strerror."""

    def __init__(self, message: str = "", errno: int = 0):
        OSError.__init__(self, errno, message)  # type: ignore[misc]
        self.message = message
        self._strata_errno = errno

    def __str__(self) -> str:
        suffix = f" [errno {self.errno}]" if self.errno else ""  # type: ignore[attr-defined]
        return f"{self.code}: {self.message}{suffix}"


class InvalidArgumentError(Error, ValueError):
    code = "InvalidArgument"


class NotFoundError(Error, KeyError):
    code = "NotFound"


class AlreadyExistsError(Error, KeyError):
    code = "AlreadyExists"


class OutOfRangeError(Error, ValueError):
    code = "OutOfRange"


class ResourceExhaustedError(Error, MemoryError):
    code = "ResourceExhausted"


class FailedPreconditionError(Error):
    code = "FailedPrecondition"


class DataLossError(_OSErrorMixin, OSError):
    code = "DataLoss"


class UnavailableError(Error):
    code = "Unavailable"


class IoError(_OSErrorMixin, OSError):
    code = "IoError"


class DeadlineExceededError(Error, TimeoutError):
    code = "DeadlineExceeded"


class CancelledError(Error):
    code = "Cancelled"


class UnimplementedError(Error, NotImplementedError):
    code = "Unimplemented"


class InternalError(Error):
    code = "Internal"


class PermissionDeniedError(_OSErrorMixin, PermissionError):
    code = "PermissionDenied"


# Index = strata::StatusCode value (base/include/strata/base/status.hpp).
_BY_CODE = [
    None,
    InvalidArgumentError,
    NotFoundError,
    AlreadyExistsError,
    OutOfRangeError,
    ResourceExhaustedError,
    FailedPreconditionError,
    DataLossError,
    UnavailableError,
    IoError,
    DeadlineExceededError,
    CancelledError,
    UnimplementedError,
    InternalError,
    PermissionDeniedError,
]


def _errno_of(self: Error) -> int:
    return self._strata_errno


# `errno` is a read-only view for the non-OSError classes (OSError has its own attribute).
Error.errno = property(_errno_of)  # type: ignore[assignment]
for _cls in (DataLossError, IoError, PermissionDeniedError):
    # OSError's C-level errno wins through the MRO only if we drop the property there.
    _cls.errno = OSError.errno  # type: ignore[attr-defined]


def _from_status(code: int, message: str, errno: int) -> Error:
    """Builds the exception for a strata::Status (called by the C++ translator)."""
    cls = _BY_CODE[code] if 0 < code < len(_BY_CODE) else InternalError
    return cls(message, errno)
