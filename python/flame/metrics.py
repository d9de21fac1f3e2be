"""Metrics (flame/metrics.h, docs/metrics.md): per-stage latency of engines and schedulers,
and the Prometheus text exposition of an engine, its caches, a scheduler and a pinned pool.

    text = flame.metrics_text(engine=e, scheduler=s)    # for a /metrics endpoint
    flame.latency(e, "total")                            # {"count", "sum_us", "p50_us", ..., "max_us"}
"""
from __future__ import annotations

import contextlib
import ctypes as C
from typing import Any, Dict, Optional

from . import _lib, errors
from ._structs import Latency, MetricsSources, as_dict, new

# flame_stage values (user_cache, item_cache and source_fetch: the parts of features)
STAGES = {"queue_wait": 0, "features": 1, "tokens": 2, "h2d": 3, "compute": 4, "d2h": 5, "total": 6,
          "user_cache": 7, "item_cache": 8, "source_fetch": 9}


def latency(handle: Any, stage: str) -> Dict[str, int]:
    """One stage's latency on an Engine (features, tokens, h2d, compute, d2h, total, and the
    parts of features: user_cache, item_cache, source_fetch) or a Scheduler (queue_wait,
    total): count and sum_us since creation, p50/p90/p99/p999/max_us of the window since the
    last Scheduler.reset_latency."""
    from .engine import Engine
    from .scheduler import Scheduler
    if stage not in STAGES:
        raise errors.InvalidArgumentError(f"stage {stage!r} is none of {', '.join(STAGES)}")
    fn = {Engine: "flame_engine_get_latency", Scheduler: "flame_scheduler_get_latency"}.get(type(handle))
    if fn is None:
        raise errors.DTypeError(f"latency() takes a flame.Engine or flame.Scheduler, got {type(handle).__name__}")
    raw = new(Latency)
    with handle._use() as h:
        _lib.check(getattr(_lib.lib(), fn)(h, STAGES[stage], C.byref(raw)))
    return as_dict(raw)


def metrics_text(engine: Optional[Any] = None, scheduler: Optional[Any] = None,
                 pinned_pool: Optional[Any] = None) -> str:
    """The Prometheus text exposition (format 0.0.4) of the given handles; a scheduler's
    engine is reported with it when engine is not given."""
    from .engine import Engine
    from .memory import PinnedPool
    from .scheduler import Scheduler
    given = (("engine", engine, Engine), ("scheduler", scheduler, Scheduler), ("pinned_pool", pinned_pool, PinnedPool))
    for name, obj, kind in given:  # the C side reads each pointer as its own type: a mix-up would crash it
        if obj is not None and not isinstance(obj, kind):
            raise errors.DTypeError(f"{name} must be a flame.{kind.__name__}, got {type(obj).__name__}")
    if engine is None and scheduler is not None:
        engine = scheduler.engine
    src = new(MetricsSources)
    with contextlib.ExitStack() as stack:
        for name, obj in (("engine", engine), ("scheduler", scheduler), ("pinned_pool", pinned_pool)):
            if obj is not None:
                setattr(src, name, stack.enter_context(obj._use()).value)
        need = C.c_size_t(0)
        L = _lib.lib()
        size = 32768
        for _ in range(4):  # the text grows between calls only by digits: retry with what it said
            buf = C.create_string_buffer(size)
            st = L.flame_metrics_text(C.byref(src), buf, size, C.byref(need))
            if st != errors.ERR_BUFFER_TOO_SMALL:
                _lib.check(st)
                return buf.value.decode("utf-8")
            size = need.value + 4096
        _lib.check(st)
    raise AssertionError("unreachable")
