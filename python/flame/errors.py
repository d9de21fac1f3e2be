"""Exceptions: one class per flame_status, each carrying the library's message.

Every class derives from FlameError, so `except flame.FlameError` catches everything the
package raises about the library. Argument problems found in Python (dtype, shape, a closed
handle) are InvalidArgumentError subclasses that are also TypeError/ValueError, so they read
like numpy's own errors and are caught by the usual Python idioms too.
"""
from __future__ import annotations

from typing import Dict, Type

# flame_status values (include/flame/flame.h; append-only there, so fixed here).
OK = 0
ERR_INVALID_ARG = 1
ERR_NOMEM = 2
ERR_IO = 3
ERR_FORMAT = 4
ERR_UNSUPPORTED = 5
ERR_NO_DEVICE = 6
ERR_BUFFER_TOO_SMALL = 7
ERR_INTERNAL = 8
ERR_UNAVAILABLE = 9
ERR_TIMEOUT = 10
ERR_CANCELLED = 11


class FlameError(Exception):
    """A libflame call failed. `status` is the flame_status code, `message` the library's
    flame_last_error() text (or the Python-side explanation)."""

    status: int = -1
    status_name: str = "FLAME_ERR_UNKNOWN"

    def __init__(self, message: str, status: int | None = None):
        if status is not None:
            self.status = status
        self.message = message
        super().__init__(f"{self.status_name}: {message}" if message else self.status_name)


class InvalidArgumentError(FlameError, ValueError):
    status, status_name = ERR_INVALID_ARG, "FLAME_ERR_INVALID_ARG"


class OutOfMemoryError(FlameError, MemoryError):
    status, status_name = ERR_NOMEM, "FLAME_ERR_NOMEM"


class FlameIOError(FlameError, OSError):
    status, status_name = ERR_IO, "FLAME_ERR_IO"


class FormatError(FlameError):
    status, status_name = ERR_FORMAT, "FLAME_ERR_FORMAT"


class UnsupportedError(FlameError):
    status, status_name = ERR_UNSUPPORTED, "FLAME_ERR_UNSUPPORTED"


class NoDeviceError(FlameError):
    status, status_name = ERR_NO_DEVICE, "FLAME_ERR_NO_DEVICE"


class BufferTooSmallError(FlameError):
    status, status_name = ERR_BUFFER_TOO_SMALL, "FLAME_ERR_BUFFER_TOO_SMALL"


class InternalError(FlameError):
    status, status_name = ERR_INTERNAL, "FLAME_ERR_INTERNAL"


# ---- raised before reaching C


class UnavailableError(FlameError):
    """A feature source or store did not answer (FLAME_ERR_UNAVAILABLE)."""

    status, status_name = ERR_UNAVAILABLE, "FLAME_ERR_UNAVAILABLE"


class DeadlineExceededError(FlameError, TimeoutError):
    """A scheduled request's deadline passed before its batch started (FLAME_ERR_TIMEOUT)."""

    status, status_name = ERR_TIMEOUT, "FLAME_ERR_TIMEOUT"


class CancelledError(FlameError):
    """A queued request was cancelled (FLAME_ERR_CANCELLED, Scheduler.cancel)."""

    status, status_name = ERR_CANCELLED, "FLAME_ERR_CANCELLED"


class DTypeError(InvalidArgumentError, TypeError):
    """An array has the wrong dtype (ids must be int64, scores float32)."""


class ShapeError(InvalidArgumentError):
    """An array has the wrong number of dimensions or the wrong length."""


class ClosedError(InvalidArgumentError):
    """The Model or Engine was closed."""


class LibraryNotFoundError(FlameError, OSError):
    """libflame.so could not be found or loaded."""

    status_name = "libflame not found"


class VersionMismatchError(FlameError):
    """The loaded libflame is not a version this package was written for."""

    status_name = "libflame version mismatch"


BY_STATUS: Dict[int, Type[FlameError]] = {
    c.status: c for c in (InvalidArgumentError, OutOfMemoryError, FlameIOError, FormatError,
                          UnsupportedError, NoDeviceError, BufferTooSmallError, InternalError,
                          UnavailableError, DeadlineExceededError, CancelledError)
}


def from_status(status: int, message: str) -> FlameError:
    """The exception for a non-OK status; an unknown (newer) code gives a plain FlameError."""
    cls = BY_STATUS.get(status)
    if cls is None:
        err = FlameError(message, status)
        return err
    return cls(message)
