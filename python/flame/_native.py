"""Minimal ctypes binding of include/flame/flame.h (structs mirror the header field by field).

The library is $FLAME_LIBRARY, else <repo>/lib/libflame.so. Loading happens on first use,
so `import flame._native` works without it.
"""
import ctypes as C
import os
from pathlib import Path

import numpy as np

OK, ERR_INVALID_ARG, ERR_NOMEM, ERR_IO, ERR_FORMAT = 0, 1, 2, 3, 4
ERR_UNSUPPORTED, ERR_NO_DEVICE, ERR_BUFFER_TOO_SMALL, ERR_INTERNAL = 5, 6, 7, 8
HEAD_DOT, HEAD_SUMI = 0, 1

_i64p = C.POINTER(C.c_int64)


class ModelInfo(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("d_model", C.c_int32), ("num_blocks", C.c_int32),
                ("num_heads", C.c_int32), ("ffn_dim", C.c_int32), ("max_len", C.c_int32),
                ("num_tasks", C.c_int32), ("num_side_features", C.c_int32), ("head", C.c_int),
                ("num_items", C.c_int64), ("weight_bytes", C.c_uint64)]


class Bags(C.Structure):
    _fields_ = [("offsets", _i64p), ("ids", _i64p)]


class Request(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("user_id", C.c_int64),
                ("history", _i64p), ("history_len", C.c_size_t),
                ("candidates", _i64p), ("num_candidates", C.c_size_t),
                ("history_side", C.POINTER(Bags)), ("candidate_side", C.POINTER(Bags)),
                ("num_side_features", C.c_size_t)]


def library_path():
    env = os.environ.get("FLAME_LIBRARY")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "lib" / "libflame.so"


_lib = None


def lib():
    """The loaded library with prototypes set; FileNotFoundError if it was not built."""
    global _lib
    if _lib is None:
        path = library_path()
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist: run `make` in the repository root "
                                    "(or set FLAME_LIBRARY)")
        L = C.CDLL(str(path))
        vp, st = C.c_void_p, C.c_int
        for name, res, args in [
            ("flame_version", C.c_uint, []), ("flame_version_string", C.c_char_p, []),
            ("flame_status_string", C.c_char_p, [st]), ("flame_last_error", C.c_char_p, []),
            ("flame_model_load", st, [C.c_char_p, C.POINTER(vp)]), ("flame_model_destroy", None, [vp]),
            ("flame_model_get_info", st, [vp, C.POINTER(ModelInfo)]),
            ("flame_engine_create", st, [vp, vp, C.POINTER(vp)]), ("flame_engine_destroy", None, [vp]),
            ("flame_score", st, [vp, C.POINTER(Request), C.POINTER(C.c_float), C.c_size_t]),
            ("flame_score_batch", st, [vp, C.POINTER(Request), C.c_size_t, C.POINTER(C.c_float), C.c_size_t]),
        ]:
            f = getattr(L, name)
            f.restype, f.argtypes = res, args
        _lib = L
    return _lib


class FlameError(Exception):
    def __init__(self, status, message):
        self.status, self.message = status, message
        super().__init__(f"{lib().flame_status_string(status).decode()}: {message}")


def _check(status):
    if status != OK:
        raise FlameError(status, lib().flame_last_error().decode())


def _ids(a):
    return np.ascontiguousarray(a, dtype=np.int64)


def _ptr(a):
    return a.ctypes.data_as(_i64p) if a.size else None


class Model:
    def __init__(self, path):
        self.handle = C.c_void_p()
        _check(lib().flame_model_load(str(path).encode(), C.byref(self.handle)))

    def info(self):
        info = ModelInfo(struct_size=C.sizeof(ModelInfo))
        _check(lib().flame_model_get_info(self.handle, C.byref(info)))
        return info

    def close(self):
        if self.handle:
            lib().flame_model_destroy(self.handle)
            self.handle = C.c_void_p()

    __del__ = close


class Engine:
    """Scores with a model; keeps the model's info for output sizes."""

    def __init__(self, model):
        self.handle = C.c_void_p()
        self.info = model.info()
        _check(lib().flame_engine_create(model.handle, None, C.byref(self.handle)))

    def close(self):
        if self.handle:
            lib().flame_engine_destroy(self.handle)
            self.handle = C.c_void_p()

    __del__ = close

    def _request(self, history, candidates, history_side, candidate_side, keep):
        """A Request over numpy copies; `keep` collects what must outlive the call."""
        h, c = _ids(history).reshape(-1), _ids(candidates).reshape(-1)
        keep += [h, c]
        sides = []
        for side in (history_side, candidate_side):
            if side is None:
                sides.append(None)
                continue
            arr = (Bags * max(1, len(side)))()
            for s, (off, ids) in enumerate(side):
                off, ids = _ids(off), _ids(ids)
                keep += [off, ids]
                arr[s] = Bags(off.ctypes.data_as(_i64p), ids.ctypes.data_as(_i64p))
            keep.append(arr)
            sides.append(C.cast(arr, C.POINTER(Bags)))
        n_side = max(len(s) for s in (history_side or [], candidate_side or []))
        return Request(C.sizeof(Request), 0, _ptr(h), h.size, _ptr(c), c.size, sides[0], sides[1], n_side), c.size

    def score(self, history, candidates, history_side=None, candidate_side=None):
        """float32 [num_candidates, num_tasks]; raises FlameError."""
        keep = []
        req, m = self._request(history, candidates, history_side, candidate_side, keep)
        out = np.zeros((m, self.info.num_tasks), dtype=np.float32)
        _check(lib().flame_score(self.handle, C.byref(req), out.ctypes.data_as(C.POINTER(C.c_float)), out.size))
        return out

    def score_batch(self, requests):
        """requests: list of (history, candidates, history_side, candidate_side) tuples;
        returns one float32 [num_candidates, num_tasks] array per request."""
        keep, reqs, sizes = [], (Request * max(1, len(requests)))(), []
        for r, args in enumerate(requests):
            reqs[r], m = self._request(*args, keep)
            sizes.append(m)
        out = np.zeros((sum(sizes), self.info.num_tasks), dtype=np.float32)
        _check(lib().flame_score_batch(self.handle, reqs, len(requests),
                                       out.ctypes.data_as(C.POINTER(C.c_float)), out.size))
        return np.split(out, np.cumsum(sizes)[:-1])
