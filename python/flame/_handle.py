"""The lifetime every libflame handle wrapper shares: close() (idempotent), context manager,
closing on garbage collection, and ClosedError once closed.

A handle belongs to the process that made it. A child of fork() forgets the handles it
inherited instead of destroying them: destroying, say, an item cache there would wait for a
refresh thread that exists only in the parent (the child's copy of the memory is simply left
to the child's exit). Handles that own threads (schedulers, item caches, engines using an item
cache or a GPU) refuse to be used in such a child; models, CPU engines and user caches work
there. Objects the child makes itself are destroyed as usual."""
import ctypes as C
import os

from . import _lib
from .errors import ClosedError


class Handle:
    _destroy = ""  # name of the flame_*_destroy function of the handle
    _what = ""     # for messages: "model", "engine"

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self._pid = os.getpid()
        return self

    _fork_safe = True  # False: the handle owns threads (or a GPU context) that a fork() does not copy

    @property
    def handle(self) -> C.c_void_p:
        if not getattr(self, "_handle", None):
            raise ClosedError(f"the {self._what} is closed")
        if not self._usable_after_fork() and self._pid != os.getpid():
            raise ClosedError(f"the {self._what} was made in process {self._pid} before fork(): its threads exist only "
                              f"there; make a new one in this process")
        return self._handle

    def _usable_after_fork(self) -> bool:
        return self._fork_safe

    @property
    def closed(self) -> bool:
        return not getattr(self, "_handle", None)

    def close(self) -> None:
        """Destroys the handle (no call on it may be running). Idempotent. In a forked child,
        an inherited handle is only forgotten (see the module docstring)."""
        h = getattr(self, "_handle", None)
        if h:
            self._handle = C.c_void_p()
            if getattr(self, "_pid", None) == os.getpid():
                getattr(_lib.lib(), self._destroy)(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass
