"""The lifetime every libflame handle wrapper shares: close() (idempotent), context manager,
closing on garbage collection, ClosedError once closed, and safety against closing a handle
that other threads are using.

Every library call on a handle runs inside `with self._use() as h:`, which counts the call as
in flight. close() marks the handle closed at once (later calls raise ClosedError) and the
C handle is destroyed when the last call in flight returns, on that call's thread: closing
never frees memory under a running call, never waits (so a callback from inside a call may
close the handle it runs under), and never fails. Objects that need a handle for as long as
they live (a scheduler its engine, a pinned buffer its pool) hold a use for their lifetime
through _retain/_release, which keeps the C handle alive past close() until they go.

A handle belongs to the process that made it. A child of fork() forgets the handles it
inherited instead of destroying them: destroying, say, an item cache there would wait for a
refresh thread that exists only in the parent (the child's copy of the memory is simply left
to the child's exit). Handles that own threads (schedulers, item caches, engines using an item
cache or a GPU) refuse to be used in such a child; models, CPU engines and user caches work
there. Objects the child makes itself are destroyed as usual.

At interpreter exit (atexit, before finalization) the handles whose library threads call into
Python are closed: schedulers (their workers run the done callbacks, so what is queued is
scored and every Future completes), then engines (which keep their item caches), then item
caches (whose refresh threads call fetch callbacks). Left to finalization, those threads could
no longer enter Python: queued requests were dropped with their callbacks, and a thread
stopped inside the library could hold what destroy waits for."""
import atexit
import contextlib
import ctypes as C
import os
import threading
import weakref
from typing import Iterator, Optional

from . import _lib
from .errors import ClosedError


class Handle:
    _destroy = ""  # name of the flame_*_destroy function of the handle
    _what = ""     # for messages: "model", "engine"
    _exit_rank: Optional[int] = None  # closed at exit in this order (see the module docstring); None: not

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self._pid = os.getpid()
        self._life = threading.Lock()  # guards _uses, _closing and _doomed
        self._uses = 0                 # calls in flight plus lifetime holders (_retain)
        self._closing = False
        self._doomed = None            # the C handle close() left to the last use to destroy
        if cls._exit_rank is not None:
            _open_at_exit.add(self)
        return self

    _fork_safe = True  # False: the handle owns threads (or a GPU context) that a fork() does not copy

    def _check_usable(self) -> C.c_void_p:
        if self._closing or not getattr(self, "_handle", None):
            raise ClosedError(f"the {self._what} is closed")
        if not self._usable_after_fork() and self._pid != os.getpid():
            raise ClosedError(f"the {self._what} was made in process {self._pid} before fork(): its threads exist only "
                              f"there; make a new one in this process")
        return self._handle

    @property
    def handle(self) -> C.c_void_p:
        """The C handle, for passing to the library inside a `with obj._use()` block (outside
        one, another thread's close() may destroy it while it is used)."""
        return self._check_usable()

    def _retain(self) -> C.c_void_p:
        """Takes a use of the handle (ClosedError once closed); _release gives it back."""
        with self._life:
            h = self._check_usable()
            self._uses += 1
            return h

    def _retain_held(self) -> C.c_void_p:
        """One more use, taken inside a `_use()` block of this handle (so even if a close()
        ran meanwhile); returns the C handle, valid until the matching _release."""
        with self._life:
            assert self._uses > 0, "_retain_held outside a use"
            self._uses += 1
            return self._handle or self._doomed

    def _release(self) -> None:
        with self._life:
            self._uses -= 1
            doomed = self._doomed if self._uses == 0 else None
            if doomed is not None:
                self._doomed = None
        if doomed is not None:
            self._destroy_now(doomed)

    @contextlib.contextmanager
    def _use(self) -> Iterator[C.c_void_p]:
        """The C handle, kept alive (not destroyed by a concurrent close) until the block ends."""
        h = self._retain()
        try:
            yield h
        finally:
            self._release()

    def _usable_after_fork(self) -> bool:
        return self._fork_safe

    @property
    def closed(self) -> bool:
        return getattr(self, "_closing", True) or not getattr(self, "_handle", None)

    def close(self) -> None:
        """Closes the handle: later calls raise ClosedError; calls in flight on other threads
        (or the call a callback closing it runs under) finish first, and the last of them
        destroys it. Idempotent. In a forked child, an inherited handle is only forgotten
        (see the module docstring)."""
        life = getattr(self, "_life", None)
        if life is None:  # __init__ failed before Handle.__new__ ran: nothing to destroy
            return
        with life:
            h = getattr(self, "_handle", None)
            if self._closing or not h:
                self._closing = True
                return
            self._closing = True
            self._handle = C.c_void_p()
            if self._uses:
                self._doomed = h
                return
        self._destroy_now(h)

    def _destroy_now(self, h: C.c_void_p) -> None:
        if getattr(self, "_pid", None) == os.getpid():
            getattr(_lib.lib(), self._destroy)(h)
        self._destroyed()

    def _destroyed(self) -> None:
        """Runs once the C handle is gone (subclasses drop what it needed)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass


_open_at_exit: "weakref.WeakSet[Handle]" = weakref.WeakSet()


def _close_at_exit() -> None:
    """Closes the handles whose library threads call into Python while the interpreter can still
    run those calls (registered when flame is imported, so it runs after the atexit functions
    registered later, which may still use them)."""
    for h in sorted(list(_open_at_exit), key=lambda h: h._exit_rank):
        try:
            h.close()
        except Exception:  # noqa: BLE001 - one handle's failure must not keep the others open
            pass


atexit.register(_close_at_exit)
