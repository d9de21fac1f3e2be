"""flame.Scheduler: dynamic batching in front of an Engine (flame.h "batch-profile
scheduler", docs/scheduler.md). Threads submit one user's request at a time; the scheduler
groups them into batches that fit its batch profiles (users x candidates per user), splits
requests longer than every profile, and scores each batch with one library call.

    with flame.Scheduler(engine, profiles=[(8, 32), (4, 64), (2, 128)], max_wait_us=500) as sched:
        scores = sched.score(history, candidates)              # blocks; other threads batch with it
        future = sched.submit(history, candidates)             # concurrent.futures.Future of the scores
"""
from __future__ import annotations

import ctypes as C
import itertools
import threading
from concurrent.futures import Future
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _arrays, _lib, errors
from ._handle import Handle
from ._structs import DONE_FN, F32P, BatchProfile, SchedulerParams, SchedulerStats, SubmitOptions, new
from .engine import Engine, Request


class Scheduler(Handle):
    """A batch-profile scheduler over `engine`, which it keeps alive (closing the engine
    closes its schedulers first).

    profiles: (max_users, max_candidates) pairs, up to 16; None = the FLAME paper's
      (1, 128), (2, 128), (4, 64), (8, 32). Under a dot head only max_users counts.
    max_wait_us: how long the oldest queued request waits for its batch to fill (0: never).
    workers: threads calling the engine (0: the GPU engine's executors, 1 on the CPU).
    max_queue: parts waiting at most before submits are refused (0: 65536).
    max_bypass: the no-starvation rule of the priority levels: batches of higher levels that
      may go ahead of a waiting lower-level request before its level's batch goes (0: 8).
    adaptive_wait: the wait for company follows the arrival rate (a forming batch goes once the
      next request is overdue, at the latest after max_wait_us); False: always max_wait_us.
    Thread-safe: score and submit from any threads.
    """

    PRIORITY_LOW, PRIORITY_NORMAL, PRIORITY_HIGH = -1, 0, 1

    _destroy, _what = "flame_scheduler_destroy", "scheduler"
    _fork_safe = False  # its workers exist only in the process that made it
    _exit_rank = 0  # closed at exit first: its workers run the done callbacks (flame._handle)

    def __init__(self, engine: Engine, profiles: Optional[Sequence[Tuple[int, int]]] = None, *,
                 max_wait_us: int = 0, workers: int = 0, max_queue: int = 0, max_bypass: int = 0,
                 adaptive_wait: bool = False):
        if not isinstance(engine, Engine):
            raise errors.DTypeError(f"engine must be a flame.Engine, got {type(engine).__name__}")
        self._handle = C.c_void_p()
        p = new(SchedulerParams)
        arr = None
        if profiles is not None:
            pairs = [tuple(x) for x in profiles]
            if not pairs or any(len(x) != 2 for x in pairs):
                raise errors.ShapeError("profiles must be a non-empty list of (max_users, max_candidates) pairs")
            arr = (BatchProfile * len(pairs))()
            for i, (u, c) in enumerate(pairs):
                arr[i] = BatchProfile(_u32(u, f"profile {i} max_users"), _u32(c, f"profile {i} max_candidates"))
            p.profiles, p.num_profiles = C.cast(arr, C.POINTER(BatchProfile)), len(pairs)
        p.max_wait_us = _arrays.c_int(max_wait_us, "max_wait_us", 64)
        p.workers, p.max_queue = _u32(workers, "workers"), _u32(max_queue, "max_queue")
        p.max_bypass = _u32(max_bypass, "max_bypass")
        if not isinstance(adaptive_wait, bool):
            raise errors.DTypeError(f"adaptive_wait must be a bool, got {type(adaptive_wait).__name__}")
        p.adaptive_wait = int(adaptive_wait)
        self.engine = engine
        eh = engine._retain()  # the C scheduler uses the engine until it is destroyed (_destroyed gives it back)
        try:
            _lib.check(_lib.lib().flame_scheduler_create(eh, C.byref(p), C.byref(self._handle)))
        except BaseException:
            engine._release()
            raise
        self.num_profiles = len(arr) if arr is not None else 4  # the library's defaults: the FLAME paper's four
        engine._schedulers.add(self)
        # submitted requests by token: their C struct and arrays must live until done runs
        self._pending: Dict[int, Tuple[Future, List[Any], np.ndarray]] = {}
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        # one C thunk for every request of this scheduler; it holds the pending table, not
        # the scheduler, so dropping the scheduler frees it at once (no reference cycle)
        self._done = DONE_FN(_completer(self._pending, self._lock))

    def _prepare(self, history, candidates, history_side, candidate_side, user_id, from_user_cache, kv_cache,
                 history_version, out, private=False):
        keep: List[Any] = []
        req = self.engine._request(Request(history, candidates, history_side, candidate_side, user_id,
                                           from_user_cache, kv_cache, history_version), keep, private=private)
        keep.append(req)
        return req, keep, _arrays.scores_out(out, req.num_candidates, self.engine.num_tasks)

    def score(self, history: Any, candidates: Any, history_side: Optional[Sequence[Any]] = None,
              candidate_side: Optional[Sequence[Any]] = None, *, user_id: Optional[int] = None,
              from_user_cache: bool = False, kv_cache: bool = False, history_version: int = 0,
              out: Optional[np.ndarray] = None) -> np.ndarray:
        """Engine.score through the scheduler: blocks until this request's batch is scored
        (the GIL is released meanwhile, so other threads' requests join the batch).
        kv_cache, history_version: as Engine.score's (the engine's KV cache keeps user_id's
        history K/V); such a request is never split into parts: it reaches the engine whole
        (docs/scheduler.md)."""
        req, keep, res = self._prepare(history, candidates, history_side, candidate_side, user_id, from_user_cache,
                                       kv_cache, history_version, out)
        with self._use() as h:
            _lib.check(_lib.lib().flame_scheduler_score(h, C.byref(req), res.ctypes.data_as(F32P), res.size))
        return res

    def submit(self, history: Any, candidates: Any, history_side: Optional[Sequence[Any]] = None,
               candidate_side: Optional[Sequence[Any]] = None, *, user_id: Optional[int] = None,
               from_user_cache: bool = False, kv_cache: bool = False, history_version: int = 0,
               out: Optional[np.ndarray] = None, priority: int = 0, timeout_us: int = 0,
               deadline_us: int = 0) -> "Future[np.ndarray]":
        """Queues the request and returns a Future of its float32 [num_candidates, num_tasks]
        scores (its exception is the FlameError of a failed request). Raises at once, with
        nothing queued, for bad shapes or dtypes, a full queue (UnavailableError) or a
        closed scheduler. The ids and bags are copied (read-only arrays excepted: a catalogue
        of candidates many requests share, made read-only, is passed as it is), so changing the
        arrays after submit returns does not change the request (`out`, when given, is written
        when the Future completes).
        kv_cache, history_version: as score's.
        The Future completes on a scheduler worker, so callbacks added with
        add_done_callback run there: they may submit, but score() from them is refused (it
        would wait for the worker it runs on).
        priority: Scheduler.PRIORITY_LOW (-1), _NORMAL (0) or _HIGH (1). timeout_us (relative)
        and deadline_us (absolute, on now_us()'s clock): a request still queued then fails with
        DeadlineExceededError (a TimeoutError). The Future's `ticket` attribute is its handle
        for cancel(); Future.cancel() itself refuses (the request is handed over at once)."""
        self._check_usable()  # closed (or inherited through fork): raise before anything is kept
        priority = _arrays.c_int(priority, "priority", 32)
        timeout_us = _arrays.c_int(timeout_us, "timeout_us", 64)
        deadline_us = _arrays.c_int(deadline_us, "deadline_us", 64, signed=False)
        # the request is scored after submit returns: over copies, so that the caller may reuse
        # its arrays at once (the library reads them until done)
        req, keep, res = self._prepare(history, candidates, history_side, candidate_side, user_id, from_user_cache,
                                       kv_cache, history_version, out, private=True)
        opts = new(SubmitOptions)
        opts.priority, opts.timeout_us, opts.deadline_us = priority, timeout_us, deadline_us
        fut: "Future[np.ndarray]" = Future()
        fut.set_running_or_notify_cancel()  # running from now on: cancel() cannot stop it, so it refuses
        token = next(self._tokens)
        ticket = C.c_uint64(0)
        with self._lock:
            self._pending[token] = (fut, keep, res)
        try:
            with self._use() as h:
                st = _lib.lib().flame_scheduler_submit_ex(h, C.byref(req), res.ctypes.data_as(F32P), res.size,
                                                          C.byref(opts), self._done, C.c_void_p(token),
                                                          C.byref(ticket))
        except BaseException:
            with self._lock:
                self._pending.pop(token, None)
            raise
        if st != errors.OK:
            with self._lock:
                self._pending.pop(token, None)
            _lib.check(st)
        fut.ticket = ticket.value  # type: ignore[attr-defined]
        return fut

    def cancel(self, future_or_ticket: Any) -> bool:
        """Withdraws a queued request (a Future from submit, or its ticket): True when it was
        cancelled (its Future then holds CancelledError), False when it is no longer queued
        (it is being scored or has completed)."""
        ticket = getattr(future_or_ticket, "ticket", future_or_ticket)
        try:
            ticket = _arrays.c_int(ticket, "ticket", 64, signed=False)
        except errors.InvalidArgumentError:
            raise errors.InvalidArgumentError(f"not a ticket of this scheduler: {future_or_ticket!r}") from None
        with self._use() as h:
            st = _lib.lib().flame_scheduler_cancel(h, C.c_uint64(ticket))
        if st == errors.ERR_UNAVAILABLE:
            return False
        _lib.check(st)
        return True

    def now_us(self) -> int:
        """The scheduler's clock (CLOCK_MONOTONIC, us): the clock of submit's deadline_us."""
        with self._use() as h:
            return int(_lib.lib().flame_scheduler_now_us(h))

    def stats(self) -> Dict[str, Any]:
        """submitted, completed, failed, rejected, split, parts, batches, isolated, queued, timeouts, cancelled,
        profile_batches (per profile, in the order given), latency_p50/p99/max_us and
        queue_wait_p50/p99_us (since creation or reset_latency)."""
        raw = new(SchedulerStats)
        with self._use() as h:
            _lib.check(_lib.lib().flame_scheduler_get_stats(h, C.byref(raw)))
        d = {name: getattr(raw, name) for name, _ in raw._fields_ if name != "struct_size"}
        d["profile_batches"] = list(raw.profile_batches)[:self.num_profiles]
        return d

    def latency(self, stage: str = "total") -> Dict[str, int]:
        """flame.latency of this scheduler: "queue_wait" or "total" (count, sum_us,
        p50/p90/p99/p999/max_us)."""
        from .metrics import latency
        return latency(self, stage)

    def metrics_text(self) -> str:
        """flame.metrics_text of this scheduler and its engine (Prometheus text format)."""
        from .metrics import metrics_text
        return metrics_text(self.engine, self)

    def reset_latency(self) -> None:
        """Empties the latency histograms: the percentiles then cover what completes from now on."""
        with self._use() as h:
            _lib.check(_lib.lib().flame_scheduler_reset_latency(h))

    def close(self) -> None:
        """Scores what is queued (every Future completes), stops the workers, and lets the
        engine close again."""
        super().close()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine._schedulers.discard(self)

    def _destroyed(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine._release()

    def __repr__(self) -> str:
        if self.closed:
            return "<flame.Scheduler closed>"
        s = self.stats()
        return f"<flame.Scheduler batches={s['batches']} parts={s['parts']} queued={s['queued']}>"


def _completer(pending: Dict[int, Tuple[Future, List[Any], np.ndarray]], lock: threading.Lock):
    def done(user, status, message) -> None:  # on a worker thread (ctypes takes the GIL)
        with lock:
            fut, _keep, res = pending.pop(user)
        if status == errors.OK:
            fut.set_result(res)
        else:
            fut.set_exception(errors.from_status(status, (message or b"").decode("utf-8", "replace")))
    return done


def _u32(v: Any, name: str) -> int:
    return _arrays.c_int(v, name, 32, signed=False)
