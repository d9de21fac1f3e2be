"""Host memory from Python: where NUMA puts libflame's allocations (numa_info) and the pinned
host buffer pool GPU transfers use (PinnedPool; flame.h "pinned host buffer pool").

    with flame.PinnedPool() as pool:
        buf = pool.alloc(1 << 20)
        x = buf.array(np.float32)          # a numpy view; the buffer goes back when x and buf are gone
        pool.stats()["bytes_in_use"]
"""
from __future__ import annotations

import ctypes as C
import math
import os
import weakref
from typing import Any, Optional, Tuple, Union

import numpy as np

from . import _arrays, _lib
from ._handle import Handle
from ._structs import NumaInfo, PinnedPoolParams, PinnedPoolStats, as_dict, new
from .errors import DTypeError, InvalidArgumentError

NUMA_MODES = {0: "libnuma", 1: "no_numa", 2: "one_node"}  # flame_numa_mode
NODE_LOCAL = -1  # FLAME_NUMA_NODE_LOCAL


def numa_info() -> dict:
    """{"mode": "libnuma" | "no_numa" | "one_node", "num_nodes", "current_node"} of this
    process (flame_numa_get_info): how flame_numa_* and the pinned pool place memory."""
    raw = new(NumaInfo)
    _lib.check(_lib.lib().flame_numa_get_info(C.byref(raw)))
    d = as_dict(raw)
    d["mode"] = NUMA_MODES.get(d["mode"], str(d["mode"]))
    return d


class PinnedBuffer:
    """`nbytes` (or more) of page-aligned host memory from a PinnedPool; `pinned` says whether
    it is registered with CUDA. It goes back to the pool when it and every array() view of it
    are gone; the pool cannot be closed while it lives."""

    def __init__(self, pool: "PinnedPool", address: int, nbytes: int, pinned: bool):
        # made inside the pool's alloc call, which holds a use: this one keeps the pool's C
        # handle until the buffer goes, even past a concurrent close()
        self._pool_handle = pool._retain_held()
        self._pool, self.address, self.nbytes, self.pinned = pool, address, nbytes, pinned

    def array(self, dtype: Any = np.uint8, shape: Optional[Union[int, Tuple[int, ...]]] = None) -> np.ndarray:
        """A writeable numpy view of the buffer (contents unspecified until written): `shape`
        elements of `dtype`, by default as many as fit."""
        dt = np.dtype(dtype)
        if dt.hasobject or dt.itemsize == 0:
            raise DTypeError(f"dtype {dt} cannot view raw memory (Python objects or 0-byte elements)")
        if shape is None:
            count = self.nbytes // dt.itemsize
        else:  # counted in Python ints: np.prod wraps (2**32 x 2**32 elements counted 0)
            dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
            dims = tuple(_arrays.c_int(d, "shape", 64) for d in dims)
            if any(d < 0 for d in dims):
                raise InvalidArgumentError(f"shape {dims} has a negative dimension")
            count = math.prod(dims)
        if count * dt.itemsize > self.nbytes:
            raise InvalidArgumentError(f"shape {shape} of {dt} needs {count * dt.itemsize} bytes, the buffer has "
                                       f"{self.nbytes}")
        raw = (C.c_uint8 * (count * dt.itemsize)).from_address(self.address)
        raw.buffer = self  # the view's base keeps the buffer, the buffer keeps the pool
        a = np.frombuffer(raw, dtype=dt, count=count)
        return a if shape is None else a.reshape(dims)

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is None:
            return
        try:
            if pool._pid == os.getpid():
                _lib.lib().flame_pinned_free(self._pool_handle, C.c_void_p(self.address))
        except Exception:  # interpreter shutdown
            pass
        finally:
            pool._release()

    def __repr__(self) -> str:
        return f"<flame.PinnedBuffer {self.nbytes} bytes {'pinned' if self.pinned else 'pageable'}>"


class PinnedPool(Handle):
    """A pool of NUMA-local host buffers, registered with CUDA where a GPU is usable
    (pageable otherwise), recycled by size class (flame_pinned_pool_create).

    numa_node: node of the pages (NODE_LOCAL = the allocating thread's); pin: register with
    CUDA when usable; max_cached_bytes: freed buffers kept for reuse. Thread-safe.
    """

    _destroy, _what = "flame_pinned_pool_destroy", "pinned pool"

    def __init__(self, numa_node: int = NODE_LOCAL, pin: bool = True, max_cached_bytes: int = 1 << 30):
        self._handle = C.c_void_p()
        numa_node = _arrays.c_int(numa_node, "numa_node", 32)
        max_cached_bytes = _arrays.c_int(max_cached_bytes, "max_cached_bytes", 64, signed=False)
        p = new(PinnedPoolParams)
        p.numa_node, p.pin, p.max_cached_bytes = numa_node, 1 if pin else 0, max_cached_bytes
        _lib.check(_lib.lib().flame_pinned_pool_create(C.byref(p), C.byref(self._handle)))
        self._live: "weakref.WeakSet[PinnedBuffer]" = weakref.WeakSet()

    def alloc(self, nbytes: int) -> PinnedBuffer:
        """A buffer of at least `nbytes` bytes (1 .. 2^47)."""
        nbytes = _arrays.c_int(nbytes, "nbytes", 64, signed=False)
        ptr, pinned = C.c_void_p(), C.c_int32()
        with self._use() as h:
            _lib.check(_lib.lib().flame_pinned_alloc(h, int(nbytes), C.byref(ptr), C.byref(pinned)))
            buf = PinnedBuffer(self, ptr.value, int(nbytes), bool(pinned.value))
            self._live.add(buf)
        return buf

    def stats(self) -> dict:
        """bytes_reserved, bytes_in_use, bytes_requested, bytes_pinned, bytes_pageable, hits,
        misses, pin_failures, releases, pinning."""
        raw = new(PinnedPoolStats)
        with self._use() as h:
            _lib.check(_lib.lib().flame_pinned_pool_get_stats(h, C.byref(raw)))
        return as_dict(raw)

    def close(self) -> None:
        """Destroys the pool; refused while buffers (or views of them) are alive, since the
        library unmaps every buffer with the pool."""
        live = len(getattr(self, "_live", ()))
        if live and not self.closed:
            raise InvalidArgumentError(f"{live} buffer(s) of this pool are still alive (drop them and their arrays "
                                       "first)")
        super().close()  # a buffer an alloc in flight makes keeps the C pool until it goes
    def __del__(self) -> None:  # buffers hold the pool, so none is alive here
        try:
            super().close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return "<flame.PinnedPool closed>" if self.closed else f"<flame.PinnedPool {self.stats()['bytes_in_use']} bytes in use>"
