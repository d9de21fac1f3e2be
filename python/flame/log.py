"""Routes libflame's log lines to Python's `logging` (logger "flame") or a callable."""
from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from . import _lib
from ._structs import LOG_FN

LEVELS = {"error": 0, "warn": 1, "info": 2, "debug": 3}
_TO_LOGGING = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}
_lock = threading.Lock()
_installed = None  # the ctypes callback must stay alive as long as the library may call it


def set_log_handler(handler: Optional[Callable[[int, str], None]] = None, level: str = "info") -> None:
    """Installs the process-wide log hook: handler(logging level, message), or, when None,
    the "flame" logger. `level` is the most verbose delivered: error, warn, info, debug.
    The handler may run on any thread that calls into libflame and must not call it back."""
    global _installed
    if level not in LEVELS:
        raise ValueError(f"level must be one of {list(LEVELS)}, got {level!r}")
    logger = logging.getLogger("flame")
    fn = handler or (lambda lvl, msg: logger.log(lvl, "%s", msg))

    def hook(lvl, msg, user):
        try:
            fn(_TO_LOGGING.get(lvl, logging.DEBUG), msg.decode("utf-8", "replace"))
        except Exception:  # an exception cannot cross the C frame; drop it rather than abort
            pass

    with _lock:
        cb = LOG_FN(hook)
        _lib.check(_lib.lib().flame_set_log_callback(cb, None, LEVELS[level]))
        _installed = cb


def clear_log_handler() -> None:
    """Removes the hook (the library's default: no logging)."""
    global _installed
    with _lock:
        _lib.check(_lib.lib().flame_set_log_callback(LOG_FN(), None, 0))
        _installed = None
