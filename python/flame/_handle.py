"""The lifetime every libflame handle wrapper shares: close() (idempotent), context manager,
closing on garbage collection, and ClosedError once closed."""
import ctypes as C

from . import _lib
from .errors import ClosedError


class Handle:
    _destroy = ""  # name of the flame_*_destroy function of the handle
    _what = ""     # for messages: "model", "engine"

    @property
    def handle(self) -> C.c_void_p:
        if not getattr(self, "_handle", None):
            raise ClosedError(f"the {self._what} is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return not getattr(self, "_handle", None)

    def close(self) -> None:
        """Destroys the handle (no call on it may be running). Idempotent."""
        h = getattr(self, "_handle", None)
        if h:
            self._handle = C.c_void_p()
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
