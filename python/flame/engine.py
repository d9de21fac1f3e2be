"""flame.Engine: scores requests with a model; numpy in, numpy out.

Ids go to C by pointer when they are C-contiguous int64 arrays (no copy); scores are
written straight into the float32 result (or into `out=`). Shapes and dtypes are checked
here, values (id ranges, CSR offsets) by the library, whose messages name the token and id.
"""
from __future__ import annotations

import ctypes as C
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from . import _arrays, _lib
from ._handle import Handle
from ._structs import I64P, F32P, Bags, Request as _Request, EngineStats as _EngineStats, as_dict, new
from .errors import DTypeError
from .model import Model

# Engine options (flame_option): keyword -> (enum value, Python type).
OPTIONS = {"device": (1, str), "max_batch": (2, int), "score_chunk": (3, int), "dtype": (4, str),
           "device_memory_budget": (5, int), "cuda_executors": (7, int), "cuda_graphs": (8, int)}

# Statistics groups: name -> (C function, struct). Groups whose function the loaded library
# does not export are left out, so newer handles (cache, allocator) slot in as one line each.
STATS = {"engine": ("flame_engine_get_stats", _EngineStats)}


@dataclass
class Request:
    """One user's request for Engine.score_batch.

    history:        int64 [history_len], oldest first (any length; the most recent max_len are used)
    candidates:     int64 [num_candidates]
    history_side:   per side-feature slot an (offsets int64 [history_len + 1], ids int64) pair
    candidate_side: per slot an (offsets int64 [num_candidates + 1], ids int64) pair
    """
    history: Any
    candidates: Any
    history_side: Optional[Sequence[Any]] = None
    candidate_side: Optional[Sequence[Any]] = None
    user_id: int = 0


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(I64P) if a.size else None


class Engine(Handle):
    """Scores candidates for users with a model. Thread-safe: score() may be called from many
    threads at once (the library gives each call its own workspace; ctypes releases the GIL).

    Options (keyword arguments; the library checks the values):
      device: "cpu" (default), "auto", "cuda", "cuda:N"
      max_batch: requests per pass in score_batch (1..65536, default 256)
      score_chunk: accepted (16..1048576) but without effect, see FLAME_OPT_SCORE_CHUNK in flame.h
      dtype: GPU compute dtype "fp32" (default), "fp16", "bf16"
      device_memory_budget: most bytes of GPU memory the engine may hold (0 = no limit)
      cuda_executors: GPU executors, 1..16 (default 2); cuda_graphs: 1 (default) or 0
    """

    _destroy, _what = "flame_engine_destroy", "engine"

    def __init__(self, model: Model, **options: Union[str, int]):
        self._handle = C.c_void_p()
        L = _lib.lib()
        info = model.info
        self.num_tasks, self.num_side_features = info.num_tasks, info.num_side_features
        self.head = info.head
        cfg = C.c_void_p()
        if options:
            _lib.check(L.flame_config_create(C.byref(cfg)))
        try:
            for key, value in options.items():
                if key not in OPTIONS:
                    raise TypeError(f"unknown engine option {key!r}; known: {sorted(OPTIONS)}")
                opt, typ = OPTIONS[key]
                if typ is str:
                    if not isinstance(value, str):
                        raise DTypeError(f"option {key} must be a string, got {type(value).__name__}")
                    _lib.check(L.flame_config_set_string(cfg, opt, value.encode()))
                else:
                    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                        raise DTypeError(f"option {key} must be an int, got {type(value).__name__}")
                    _lib.check(L.flame_config_set_int(cfg, opt, int(value)))
            _lib.check(L.flame_engine_create(model.handle, cfg, C.byref(self._handle)))
        finally:
            L.flame_config_destroy(cfg)

    # ------------------------------------------------------------ lifetime

    def _request(self, r: Request, keep: List[Any], where: str = "") -> _Request:
        """A C request over the arrays of `r`; `keep` holds what must outlive the call."""
        h = _arrays.ids(r.history, where + "history")
        c = _arrays.ids(r.candidates, where + "candidates")
        k = self.num_side_features
        hs = _arrays.bags(r.history_side, h.size, k, where + "history_side")
        # the dot head never reads candidate side features, so they may be left out there
        cs = [] if (self.head == "dot" and r.candidate_side is None) else \
            _arrays.bags(r.candidate_side, c.size, k, where + "candidate_side")
        keep += [h, c]
        sides = []
        for bags in (hs, cs):
            if not bags:
                sides.append(None)
                continue
            arr = (Bags * len(bags))(*[Bags(o.ctypes.data_as(I64P), i.ctypes.data_as(I64P)) for o, i in bags])
            keep += [arr, bags]
            sides.append(C.cast(arr, C.POINTER(Bags)))
        return _Request(C.sizeof(_Request), int(r.user_id), _ptr(h), h.size, _ptr(c), c.size,
                        sides[0], sides[1], k)

    def score(self, history: Any, candidates: Any, history_side: Optional[Sequence[Any]] = None,
              candidate_side: Optional[Sequence[Any]] = None, *, user_id: int = 0,
              out: Optional[np.ndarray] = None) -> np.ndarray:
        """Scores one user's candidates.

        history: int64 [history_len], oldest first; candidates: int64 [num_candidates].
        history_side / candidate_side: one (offsets, ids) int64 CSR pair per side-feature slot
        (offsets has num_tokens + 1 entries; see flame.bags); None for models without any.
        out: optional float32 [num_candidates, num_tasks] C-contiguous array to write into.
        Returns float32 [num_candidates, num_tasks]: sigmoid task scores (sumi head) or dot
        products (dot head, one column).
        Raises DTypeError/ShapeError (here), InvalidArgumentError (ids out of range, bad
        offsets; the message names them), ClosedError.
        """
        keep: List[Any] = []
        req = self._request(Request(history, candidates, history_side, candidate_side, user_id), keep)
        res = _arrays.scores_out(out, req.num_candidates, self.num_tasks)
        _lib.check(_lib.lib().flame_score(self.handle, C.byref(req), res.ctypes.data_as(F32P), res.size))
        return res

    def score_batch(self, requests: Sequence[Union[Request, Sequence[Any], Dict[str, Any]]],
                    out: Optional[np.ndarray] = None) -> List[np.ndarray]:
        """Scores several users in one library call (one GEMM per layer over all tokens).

        requests: Request objects, (history, candidates[, history_side, candidate_side])
        tuples or dicts of Request's fields.
        out: optional float32 [total candidates, num_tasks] array to write into.
        Returns one float32 [num_candidates_r, num_tasks] view per request, all views into one
        array. Every request is validated before any is scored; messages name the index.
        """
        keep: List[Any] = []
        reqs = (_Request * max(1, len(requests)))()
        sizes = []
        for r, item in enumerate(requests):
            if isinstance(item, dict):
                item = Request(**item)
            elif not isinstance(item, Request):
                item = Request(*item)
            reqs[r] = self._request(item, keep, f"request {r}: ")
            sizes.append(reqs[r].num_candidates)
        res = _arrays.scores_out(out, sum(sizes), self.num_tasks)
        _lib.check(_lib.lib().flame_score_batch(self.handle, reqs, len(requests), res.ctypes.data_as(F32P), res.size))
        return np.split(res, np.cumsum(sizes)[:-1]) if sizes else []

    # ------------------------------------------------------------ statistics

    def stats(self) -> Dict[str, Dict[str, int]]:
        """{group: {counter: value}} for every statistics group the loaded library has;
        today "engine": calls, requests, workspaces, scratch_bytes, max_workspace_bytes."""
        L, out = _lib.lib(), {}
        for group, (fn, cls) in STATS.items():
            f = getattr(L, fn, None)
            if f is None:
                continue
            raw = new(cls)
            _lib.check(f(self.handle, C.byref(raw)))
            out[group] = as_dict(raw)
        return out

    def __repr__(self) -> str:
        return "<flame.Engine closed>" if self.closed else f"<flame.Engine {self.head} tasks={self.num_tasks}>"
