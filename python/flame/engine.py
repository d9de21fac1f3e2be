"""flame.Engine: scores requests with a model; numpy in, numpy out.

Ids go to C by pointer when they are C-contiguous int64 arrays (no copy); scores are
written straight into the float32 result (or into `out=`). Shapes and dtypes are checked
here, values (id ranges, CSR offsets) by the library, whose messages name the token and id.
"""
from __future__ import annotations

import contextlib
import ctypes as C
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _arrays, _config, _lib, errors, features
from ._handle import Handle
from ._structs import I64P, F32P, Bags, Request as _Request, EngineStats as _EngineStats, as_dict, new
from .errors import ShapeError
from .features import ItemCache
from .model import Model
from .user_cache import UserCache

# Engine options (flame_option): keyword -> (enum value, Python type).
OPTIONS = {"device": (1, str), "max_batch": (2, int), "dtype": (4, str),
           "device_memory_budget": (5, int), "cuda_executors": (7, int), "cuda_graphs": (8, int),
           "cuda_attention": (12, int), "threads": (9, int), "cpu_kernels": (13, str),
           "kv_cache_bytes": (14, int), "kv_cache_block_tokens": (15, int)}

# Statistics groups: name -> (C function, struct). Groups whose function the loaded library
# does not export are left out, so newer handles slot in as one line each; the attached
# caches' statistics are added by Engine.stats.
STATS = {"engine": ("flame_engine_get_stats", _EngineStats)}


@dataclass
class Request:
    """One user's request for Engine.score_batch.

    history:        int64 [history_len], oldest first (any length; the most recent max_len are used)
    candidates:     int64 [num_candidates]
    history_side:   per side-feature slot an (offsets int64 [history_len + 1], ids int64) pair;
                    None when the engine's item cache gives the bags (Engine(item_cache=...))
    candidate_side: per slot an (offsets int64 [num_candidates + 1], ids int64) pair; likewise
    user_id:        the user's key in the engine's user cache (None: not given; 0 goes to C)
    from_user_cache: True: the history is user_id's record in the engine's user cache
                    (Engine(user_cache=...)); history and history_side are then None and
                    user_id is required. A user without a record scores an empty history
                    (counted in stats()["engine"]["user_cache_misses"]).
    kv_cache:       True: the engine's KV cache (Engine(kv_cache_bytes=...)) keeps user_id's
                    history K/V, so scoring the same user again computes only the candidates
                    (and a grown history only its new items); scores as with False
    history_version: with kv_cache, a non-zero version the caller changes whenever the
                    history changes (trusted: the caller's contract), or 0: the engine hashes
                    the history window
    """
    history: Any
    candidates: Any
    history_side: Optional[Sequence[Any]] = None
    candidate_side: Optional[Sequence[Any]] = None
    user_id: Optional[int] = None
    from_user_cache: bool = False
    kv_cache: bool = False
    history_version: int = 0


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(I64P) if a.size else None


class Engine(Handle):
    """Scores candidates for users with a model. Thread-safe: score() may be called from many
    threads at once (the library gives each call its own workspace; ctypes releases the GIL).

    Caches, given at creation: item_cache=ItemCache lets requests leave their side features
    out (the cache gives the bags); user_cache=UserCache lets them give a user id instead of a
    history (from_user_cache=True). The engine keeps its caches alive. (set_item_cache and
    set_user_cache attach them later, as flame_engine_set_item_cache/_user_cache do in C.)

    Options (keyword arguments; the library checks the values):
      device: "cpu" (default), "auto", "cuda", "cuda:N"
      max_batch: requests per pass in score_batch (1..65536, default 256)
      dtype: GPU compute dtype "fp32" (default), "fp16", "bf16"
      device_memory_budget: most bytes of GPU memory the engine may hold (0 = no limit)
      cuda_executors: GPU executors, 1..16 (default 2); cuda_graphs: 1 (default) or 0;
      cuda_attention: 0 (default, the kernel chosen per launch) or 1 (the portable kernel on
      every GPU)
      threads: CPU threads one call runs on, 1..256 (default 0: OPENBLAS_NUM_THREADS's count);
        scores are bitwise the same for any count
      cpu_kernels: the CPU engine's GEMM and dot-head kernels, "auto" (default: libflame's own
        in the widest set the CPU has), "avx512", "avx2" or "blas"; a set the CPU lacks raises
        FlameError with status FLAME_ERR_UNSUPPORTED naming it
      kv_cache_bytes: budget of the user-history KV cache (0 = none, the default; host memory
        on the CPU, device memory in the compute dtype on a GPU);
        requests with kv_cache=True then reuse their user's cached history K/V
        (docs/kv-cache.md); kv_cache_block_tokens: tokens a block of it holds (default 16)
    """

    _destroy, _what = "flame_engine_destroy", "engine"
    _exit_rank = 1  # closed at exit after its schedulers, before the item caches it keeps (flame._handle)

    def __init__(self, model: Model, *, item_cache: Optional[ItemCache] = None,
                 user_cache: Optional[UserCache] = None, **options: Union[str, int]):
        if item_cache is not None and not isinstance(item_cache, ItemCache):
            raise errors.DTypeError(f"item_cache must be a flame.ItemCache or None, got {type(item_cache).__name__}")
        if user_cache is not None and not isinstance(user_cache, UserCache):
            raise errors.DTypeError(f"user_cache must be a flame.UserCache or None, got {type(user_cache).__name__}")
        self._handle = C.c_void_p()
        L = _lib.lib()
        info = model.info
        self.num_tasks, self.num_side_features = info.num_tasks, info.num_side_features
        self.head = info.head
        cfg = _config.build(OPTIONS, options, "engine")
        try:
            with model._use() as mh, (item_cache._use() if item_cache else contextlib.nullcontext()) as ih, \
                    (user_cache._use() if user_cache else contextlib.nullcontext()) as uh:
                # FLAME_OPT_ITEM_CACHE, FLAME_OPT_USER_CACHE: the engine takes its own references
                _lib.check(L.flame_config_set_pointer(cfg, 10, ih))
                _lib.check(L.flame_config_set_pointer(cfg, 11, uh))
                _lib.check(L.flame_engine_create(mh, cfg, C.byref(self._handle)))
        finally:
            L.flame_config_destroy(cfg)
        self._item_cache: Optional[ItemCache] = item_cache
        self._user_cache: Optional[UserCache] = user_cache
        self._schedulers: "weakref.WeakSet[Any]" = weakref.WeakSet()  # flame.Scheduler objects over this engine
        self._on_gpu = False
        self._on_gpu = self.stats()["engine"]["device_bytes"] > 0

    def _usable_after_fork(self) -> bool:
        return self._item_cache is None and not self._on_gpu  # a CUDA context and a cache's threads do not fork

    def close(self) -> None:
        """Closes the schedulers over this engine (they score what they hold), then the engine."""
        for s in list(getattr(self, "_schedulers", ())):
            s.close()
        super().close()

    # ------------------------------------------------------------ caches

    def set_item_cache(self, cache: Optional[ItemCache]) -> None:
        """Attaches an item cache (None detaches) after creation; Engine(model, item_cache=...)
        gives it at creation instead. Requests that give no side features get their bags from
        it (a missing record pools to zero vectors). Not to be called while the engine scores. Raises InvalidArgumentError when the cache's records have another
        slot count than the model's side features."""
        if cache is not None and not isinstance(cache, ItemCache):
            raise errors.DTypeError(f"cache must be a flame.ItemCache or None, got {type(cache).__name__}")
        with self._use() as h, (cache._use() if cache else contextlib.nullcontext()) as ch:
            _lib.check(_lib.lib().flame_engine_set_item_cache(h, ch))
        self._item_cache = cache

    def set_user_cache(self, cache: Optional[UserCache]) -> None:
        """Attaches a user cache (None detaches) after creation; Engine(model, user_cache=...)
        gives it at creation instead. Requests with from_user_cache=True score
        user_id's record (slot 0, oldest first; its most recent max_len items) as their
        history; a miss scores an empty history. Not to be called while the engine scores."""
        if cache is not None and not isinstance(cache, UserCache):
            raise errors.DTypeError(f"cache must be a flame.UserCache or None, got {type(cache).__name__}")
        with self._use() as h, (cache._use() if cache else contextlib.nullcontext()) as ch:
            _lib.check(_lib.lib().flame_engine_set_user_cache(h, ch))
        self._user_cache = cache

    def _check(self, status_fn) -> None:
        """_lib.check, with the item cache's fetch-callback exception (if any) as the cause."""
        features.call_with_cause(self._item_cache.callbacks if self._item_cache else [], status_fn)

    # ------------------------------------------------------------ lifetime

    def _request(self, r: Request, keep: List[Any], where: str = "", private: bool = False) -> _Request:
        """A C request over the arrays of `r`; `keep` holds what must outlive the call.
        private: over copies of them, as the library reads them after the call returns (the
        caller's arrays are passed by pointer when they can be), but for read-only ones
        (_arrays.frozen: a catalogue shared by many requests is then one array, validated once
        a batch)."""
        if r.from_user_cache:
            if r.history is not None or r.history_side is not None:
                raise ShapeError(f"{where}from_user_cache is set: the history comes from the user cache, so history "
                                 "and history_side must be None")
            if r.user_id is None:
                raise ShapeError(f"{where}from_user_cache is set but no user_id is given: whose history?")
            h = np.zeros(0, np.int64)
        elif r.history is None:
            raise ShapeError(f"{where}history is None: pass [] for an empty history, or from_user_cache=True with a "
                             "user_id to read it from the engine's user cache")
        else:
            h = _arrays.ids(r.history, where + "history")
        c = _arrays.ids(r.candidates, where + "candidates")
        k = self.num_side_features
        # bags may be left out where nothing reads them: under the dot head the candidates',
        # with an item cache (which gives them) or a user-cache history (whose bags it gives) the rest
        cached = self._item_cache is not None
        hs = [] if (r.history_side is None and (cached or r.from_user_cache)) else \
            _arrays.bags(r.history_side, h.size, k, where + "history_side")
        cs = [] if (r.candidate_side is None and (self.head == "dot" or cached)) else \
            _arrays.bags(r.candidate_side, c.size, k, where + "candidate_side")
        if private:
            own = _arrays.private
            h, c = own(h), own(c)
            hs, cs = ([(own(o), own(i)) for o, i in bags] for bags in (hs, cs))
        keep += [h, c]
        sides = []
        for bags in (hs, cs):
            if not bags:
                sides.append(None)
                continue
            arr = (Bags * len(bags))(*[Bags(o.ctypes.data_as(I64P), i.ctypes.data_as(I64P), i.size) for o, i in bags])
            keep += [arr, bags]
            sides.append(C.cast(arr, C.POINTER(Bags)))
        uid = 0 if r.user_id is None else _arrays.int64(r.user_id, where + "user_id")
        if r.kv_cache and r.user_id is None:
            raise ShapeError(f"{where}kv_cache is set but no user_id is given: whose history is cached?")
        version = _arrays.c_int(r.history_version, where + "history_version", 64, signed=False)
        return _Request(C.sizeof(_Request), uid, _ptr(h), h.size, _ptr(c),
                        c.size, sides[0], sides[1], k, 1 if r.from_user_cache else 0,
                        version, 1 if r.kv_cache else 0)

    def score(self, history: Any, candidates: Any, history_side: Optional[Sequence[Any]] = None,
              candidate_side: Optional[Sequence[Any]] = None, *, user_id: Optional[int] = None,
              from_user_cache: bool = False, kv_cache: bool = False, history_version: int = 0,
              out: Optional[np.ndarray] = None) -> np.ndarray:
        """Scores one user's candidates.

        history: int64 [history_len], oldest first; candidates: int64 [num_candidates].
        history_side / candidate_side: one (offsets, ids) int64 CSR pair per side-feature slot
        (offsets has num_tokens + 1 entries; see flame.bags); None for models without any, or
        when the engine's item cache gives them.
        from_user_cache: the history is user_id's record in the engine's user cache (history
        None): engine.score(None, candidates, user_id=42, from_user_cache=True); a user
        without a record scores an empty history.
        kv_cache, history_version: the engine's KV cache keeps user_id's history K/V
        (Request says how; Engine(kv_cache_bytes=...) makes the cache).
        out: optional float32 [num_candidates, num_tasks] C-contiguous array to write into.
        Returns float32 [num_candidates, num_tasks]: sigmoid task scores (sumi head) or dot
        products (dot head, one column).
        Raises DTypeError/ShapeError (here), InvalidArgumentError (ids out of range, bad
        offsets; the message names them), ClosedError.
        """
        keep: List[Any] = []
        req = self._request(Request(history, candidates, history_side, candidate_side, user_id, from_user_cache,
                                    kv_cache, history_version), keep)
        res = _arrays.scores_out(out, req.num_candidates, self.num_tasks)
        with self._use() as h:
            self._check(lambda: _lib.lib().flame_score(h, C.byref(req), res.ctypes.data_as(F32P), res.size))
        return res

    def _requests(self, requests: Sequence[Union[Request, Sequence[Any], Dict[str, Any]]], keep: List[Any]):
        """The C request array of Request objects, tuples or dicts (messages name the index);
        keep holds the arrays the C structs point into."""
        reqs = (_Request * max(1, len(requests)))()
        for r, item in enumerate(requests):
            if isinstance(item, dict):
                item = Request(**item)
            elif not isinstance(item, Request):
                item = Request(*item)
            reqs[r] = self._request(item, keep, f"request {r}: ")
        return reqs

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
        reqs = self._requests(requests, keep)
        sizes = [reqs[r].num_candidates for r in range(len(requests))]
        res = _arrays.scores_out(out, sum(sizes), self.num_tasks)
        with self._use() as h:
            self._check(lambda: _lib.lib().flame_score_batch(h, reqs, len(requests), res.ctypes.data_as(F32P),
                                                             res.size))
        return np.split(res, np.cumsum(sizes)[:-1]) if sizes else []

    def score_topk(self, requests: Sequence[Union[Request, Sequence[Any], Dict[str, Any]]], k: int,
                   task: int = 0) -> Tuple[np.ndarray, np.ndarray]:
        """The k best candidates of each request by one task's score (full-sort retrieval:
        candidates = np.arange(num_items) ranks the whole catalogue).

        requests: as score_batch. k: 1..1024. task: the score column ranked by.
        Returns (ids int64 [len(requests), k], scores float32 [len(requests), k]), best first,
        ties by lower id; a request with fewer than k candidates ends in ids -1, scores -inf.
        """
        k, task = _arrays.c_int(k, "k", 32, signed=False), _arrays.c_int(task, "task", 32, signed=False)
        if not 1 <= k <= 1024:
            raise errors.InvalidArgumentError(f"k = {k} must be in 1..1024")
        keep: List[Any] = []
        reqs = self._requests(requests, keep)
        ids = np.empty((len(requests), k), dtype=np.int64)
        scores = np.empty((len(requests), k), dtype=np.float32)
        with self._use() as h:
            self._check(lambda: _lib.lib().flame_score_batch_topk(
                h, reqs, len(requests), k, task, ids.ctypes.data_as(I64P), scores.ctypes.data_as(F32P), ids.size))
        return ids, scores

    # ------------------------------------------------------------ statistics

    def stats(self) -> Dict[str, Dict[str, int]]:
        """{group: {counter: value}}: "engine" (calls, requests, workspaces, scratch_bytes,
        max_workspace_bytes, device and graph counters, user_cache_hits/misses, the KV cache's
        kv_cache_hits/misses/extensions/evictions/bytes/peak_bytes/budget_bytes/
        tokens_computed/tokens_saved), and the
        attached caches' own: "item_cache" (ItemCache.stats), "user_cache" (UserCache.stats)."""
        L, out = _lib.lib(), {}
        for group, (fn, cls) in STATS.items():
            f = getattr(L, fn, None)
            if f is None:
                continue
            raw = new(cls)
            with self._use() as h:
                _lib.check(f(h, C.byref(raw)))
            out[group] = as_dict(raw)
        for group, cache in (("item_cache", self._item_cache), ("user_cache", self._user_cache)):
            if cache is not None and not cache.closed:
                out[group] = cache.stats()
        return out

    def __repr__(self) -> str:
        return "<flame.Engine closed>" if self.closed else f"<flame.Engine {self.head} tasks={self.num_tasks}>"
