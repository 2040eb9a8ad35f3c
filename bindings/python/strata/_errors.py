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
  ... with errno ENOSPC/EDQUOT  DiskFullError (a subclass)      OSError (errno ENOSPC/EDQUOT)
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

A full disk or quota (ResourceExhausted whose errno is ENOSPC or EDQUOT) raises
:class:`DiskFullError`: a ResourceExhaustedError (so a MemoryError) that is also an OSError
whose ``errno`` is the OS's, so ``except OSError`` catches it as it catches any disk-full
error. A budget that is full (host_budget, nvme_budget) stays a plain ResourceExhaustedError.
The optimizer's up-front disk-space check (``strata.OffloadedOptimizer.create`` /
``add_param`` / ``check_disk_space``, and so ``OffloadAdam(W)`` and their
``add_param_group``: C++ ``check_disk_space`` in optimizer/src/offload_space.cpp) is the
same condition found before writing: its status carries ENOSPC, so it raises DiskFullError
too.

Each instance has ``code`` (the StatusCode name, e.g. ``"NotFound"``), ``message`` (what
went wrong, naming the key, path, offset or option) and ``errno`` (0 when no OS call failed;
for the OSError family it is also ``OSError.errno``).
"""

from __future__ import annotations

import errno as _errno
from typing import TYPE_CHECKING


class Error(Exception):
    """Base class of every strata error."""

    code: str = "Unknown"
    errno: int  #: a read-only property (below); OSError's own errno in the OSError family

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


def _errno_of(self: Error) -> int:
    return self._strata_errno


# `errno` is a read-only view for the non-OSError classes (OSError has its own attribute).
Error.errno = property(_errno_of)  # type: ignore[assignment]


def _define(code: str, *also: type) -> type:
    """The strata.Error subclass of StatusCode ``code`` that is also each of ``also``:
    ``<code>Error`` (``IoError`` for IoError), an OSError one through _OSErrorMixin."""
    os_error = any(issubclass(b, OSError) for b in also)
    name = code if code.endswith("Error") else code + "Error"
    cls = type(name, (_OSErrorMixin if os_error else Error, *also),
               {"code": code, "__module__": __name__, "__qualname__": name,
                "__doc__": f"strata StatusCode {code}."})
    if os_error:
        # OSError's C-level errno wins through the MRO only if we drop the property there.
        cls.errno = OSError.errno  # type: ignore[attr-defined]
    return cls


# (StatusCode name, built-in exceptions it also is), in StatusCode order
# (base/include/strata/base/status.hpp): entry i has code value i + 1. The table above.
_TABLE = (
    ("InvalidArgument", ValueError), ("NotFound", KeyError), ("AlreadyExists", KeyError),
    ("OutOfRange", ValueError), ("ResourceExhausted", MemoryError), ("FailedPrecondition",),
    ("DataLoss", OSError), ("Unavailable",), ("IoError", OSError),
    ("DeadlineExceeded", TimeoutError), ("Cancelled",), ("Unimplemented", NotImplementedError),
    ("Internal",), ("PermissionDenied", PermissionError),
)
# Index = strata::StatusCode value.
_BY_CODE = [None] + [_define(code, *also) for code, *also in _TABLE]
globals().update((cls.__name__, cls) for cls in _BY_CODE[1:])

if TYPE_CHECKING:  # the classes the line above defines, spelled out for type checkers
    class InvalidArgumentError(Error, ValueError): ...
    class NotFoundError(Error, KeyError): ...
    class AlreadyExistsError(Error, KeyError): ...
    class OutOfRangeError(Error, ValueError): ...
    class ResourceExhaustedError(Error, MemoryError): ...
    class FailedPreconditionError(Error): ...
    class DataLossError(Error, OSError): ...
    class UnavailableError(Error): ...
    class IoError(Error, OSError): ...
    class DeadlineExceededError(Error, TimeoutError): ...
    class CancelledError(Error): ...
    class UnimplementedError(Error, NotImplementedError): ...
    class InternalError(Error): ...
    class PermissionDeniedError(Error, PermissionError): ...


class DiskFullError(_BY_CODE[5], OSError):  # type: ignore[misc,valid-type]
    """strata StatusCode ResourceExhausted from a full file system or quota: also an
    OSError with ``errno`` ENOSPC or EDQUOT (and a ResourceExhaustedError, a MemoryError)."""

    code = "ResourceExhausted"
    __init__ = _OSErrorMixin.__init__
    __str__ = _OSErrorMixin.__str__
    errno = OSError.errno  # type: ignore[assignment]


#: errnos for which ResourceExhausted means "the disk (or quota) is full"
_DISK_FULL_ERRNOS = frozenset({_errno.ENOSPC, _errno.EDQUOT})
__all__ = ["Error", "DiskFullError"] + [cls.__name__ for cls in _BY_CODE[1:]]


def _from_status(code: int, message: str, errno: int) -> Error:
    """Builds the exception for a strata::Status (called by the C++ translator)."""
    cls = _BY_CODE[code] if 0 < code < len(_BY_CODE) else globals()["InternalError"]
    if cls is _BY_CODE[5] and errno in _DISK_FULL_ERRNOS:
        cls = DiskFullError
    return cls(message, errno)
