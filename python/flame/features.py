"""Item features from Python: feature records, the sources they come from (a feature file,
Redis, a Python callback) and the item cache in front of a source (flame.h "item features",
docs/features.md). An Engine with an item cache (Engine.set_item_cache) takes requests that
give item ids only and fills their side features from it.

    src = flame.FeatureSource.from_file("items.features")        # or .redis(...), .from_callback(...)
    with flame.ItemCache(src, max_entries=100_000) as cache:
        rec = cache.get([17, 18])[0]    # FeatureRecord(bags=(array([4]), array([1, 3])), dense=array([0.25]))

A record has one bag of item-side ids per side-feature slot of the model, plus optional dense
float32 values (carried, not read by version-1 models). None stands for a missing record (the
source does not know the id; the engine then pools empty bags to zero vectors).
"""
from __future__ import annotations

import ctypes as C
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _arrays, _lib, errors
from ._handle import Handle
from ._structs import FETCH_FN, F32P, I64P, ItemCacheParams, ItemCacheStats, RedisOptions, as_dict, new
from .errors import FlameError, ShapeError

_log = logging.getLogger("flame")


@dataclass(frozen=True, eq=False)
class FeatureRecord:
    """One item's features: `bags` holds one id array per slot, `dense` the float values.
    Whatever is given is checked and stored as C-contiguous int64 bags and float32 dense
    values (the layout the library reads): ids of another dtype are refused."""
    bags: Tuple[np.ndarray, ...]
    dense: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        bags = self.bags
        if isinstance(bags, (str, bytes)) or not isinstance(bags, (Sequence, np.ndarray)):
            raise ShapeError(f"bags must be a sequence of per-slot id sequences, got {type(bags).__name__}")
        object.__setattr__(self, "bags", tuple(_arrays.ids(b, f"bag {s}") for s, b in enumerate(bags)))
        object.__setattr__(self, "dense", _arrays.dense(self.dense))

    @classmethod
    def of(cls, bags: Sequence[Any], dense: Any = None) -> "FeatureRecord":
        """A record from per-slot id sequences (lists or int64 arrays) and optional floats."""
        return cls(bags, dense)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, FeatureRecord) and len(self.bags) == len(other.bags)
                and all(np.array_equal(a, b) for a, b in zip(self.bags, other.bags))
                and np.array_equal(self.dense, other.dense))


RecordLike = Union[FeatureRecord, Sequence[Sequence[int]], None]


def _as_record(value: RecordLike, num_slots: int, where: str) -> Optional[FeatureRecord]:
    if value is None or isinstance(value, FeatureRecord):
        rec = value
    else:
        rec = FeatureRecord.of(value)
    if rec is not None and len(rec.bags) != num_slots:
        raise ShapeError(f"{where}: {len(rec.bags)} bag(s), the source's records have {num_slots} slot(s)")
    return rec


def _csr(rec: FeatureRecord) -> Tuple[np.ndarray, np.ndarray]:
    """(slot_offsets [num_slots + 1], ids) of a record, as flame_feature_batch_set takes them."""
    offsets = np.zeros(len(rec.bags) + 1, dtype=np.int64)
    np.cumsum([b.size for b in rec.bags], out=offsets[1:])
    flat = np.concatenate(rec.bags) if rec.bags else np.zeros(0, np.int64)
    return offsets, np.ascontiguousarray(flat, dtype=np.int64)


def _p(a: np.ndarray, typ) -> Any:
    return a.ctypes.data_as(typ) if a.size else None


class _Batch:
    """A flame_feature_batch for one call (created and destroyed around it)."""

    def __init__(self, num_slots: int):
        self.num_slots, self.h = num_slots, C.c_void_p()
        _lib.check(_lib.lib().flame_feature_batch_create(num_slots, C.byref(self.h)))

    def __enter__(self) -> "_Batch":
        return self

    def __exit__(self, *exc) -> None:
        _lib.lib().flame_feature_batch_destroy(self.h)

    def records(self) -> List[Optional[FeatureRecord]]:
        if self.num_slots == 0:  # flame_feature_batch_get_slot tells found from missing, and needs a slot
            raise errors.UnsupportedError("records of 0 slots cannot be read back: a missing record and a found "
                                          "one look the same without a slot to ask about")
        L, out = _lib.lib(), []
        found, ptr, count, dptr = C.c_int32(), I64P(), C.c_size_t(), F32P()
        for i in range(L.flame_feature_batch_size(self.h)):
            bags = []
            for s in range(self.num_slots):
                _lib.check(L.flame_feature_batch_get_slot(self.h, i, s, C.byref(found), C.byref(ptr), C.byref(count)))
                if not found.value:
                    break
                bags.append(np.ctypeslib.as_array(ptr, (count.value,)).copy() if count.value else np.zeros(0, np.int64))
            if not found.value:
                out.append(None)
                continue
            _lib.check(L.flame_feature_batch_get_dense(self.h, i, C.byref(dptr), C.byref(count)))
            dense = np.ctypeslib.as_array(dptr, (count.value,)).copy() if count.value else np.zeros(0, np.float32)
            out.append(FeatureRecord(tuple(bags), dense))
        return out


def _write(batch: C.c_void_p, index: int, rec: Optional[FeatureRecord]) -> None:
    L = _lib.lib()
    if rec is None:
        _lib.check(L.flame_feature_batch_set_missing(batch, index))
        return
    offsets, flat = _csr(rec)
    _lib.check(L.flame_feature_batch_set(batch, index, _p(offsets, I64P), _p(flat, I64P), flat.size,
                                         _p(rec.dense, F32P), rec.dense.size))


class _Callback:
    """The C-callable side of FeatureSource.from_callback. What the Python function raises
    cannot cross the C frame: it becomes a status for libflame (the FlameError's own, else
    FLAME_ERR_UNAVAILABLE), a warning on the "flame" logger, and the __cause__ of the error
    the Python call that triggered the fetch raises on the same thread (the first the call's
    fetches raised)."""

    def __init__(self, num_slots: int, fn: Callable[[np.ndarray], Iterable[RecordLike]]):
        self.num_slots, self.fn = num_slots, fn
        self.local = threading.local()
        self.thunk = FETCH_FN(self._call)  # kept alive with the source object (C holds its address)

    def _call(self, user, ids, n, batch) -> int:
        try:
            arr = np.ctypeslib.as_array(ids, (n,)).copy() if n else np.zeros(0, np.int64)
            got = self.fn(arr)
            records = list(got) if got is not None else None
            if records is None or len(records) != n:
                raise ShapeError(f"the fetch callback returned {'None' if records is None else len(records)} "
                                 f"record(s) for {n} id(s)")
            for i, value in enumerate(records):
                _write(batch, i, _as_record(value, self.num_slots, f"record {i} (id {arr[i]})"))
            return errors.OK
        except BaseException as e:  # noqa: B902 - nothing may unwind into C
            # Kept only for a call on this thread that will report it (call_with_cause), and
            # the call's first exception, as libflame reports the first failure: an item cache
            # fetches a batch refused for a record again id by id and names the first id that
            # fails alone (the record that stopped the batch), not the last one retried. An
            # exit request is kept over any other exception.
            kept = getattr(self.local, "error", None)
            if getattr(self.local, "calls", 0) and (kept is None or (_exit_request(e) and not _exit_request(kept))):
                self.local.error = e
            # (a status outside C's int would reach the library as its low 32 bits: 2**32 as FLAME_OK)
            status = e.status if isinstance(e, FlameError) and 0 < e.status < 2**31 else errors.ERR_UNAVAILABLE
            # the exception's text, not the exception: a handler that keeps records (a memory
            # handler, a test's capture) would keep it, its traceback and the callback's frames
            _log.warning("feature fetch callback raised %s: %s (libflame gets %s)", type(e).__name__, _text(e),
                         _lib.status_name(status))
            return status

    def begin_call(self) -> Optional[BaseException]:
        """A call on this thread starts: what its fetches raise is kept for it from now on.
        Returns what an enclosing call on this thread kept (end_call puts it back)."""
        outer = getattr(self.local, "error", None)
        self.local.error = None
        self.local.calls = getattr(self.local, "calls", 0) + 1
        return outer

    def end_call(self, outer: Optional[BaseException]) -> None:
        self.local.calls -= 1
        self.local.error = outer

    def take_error(self) -> Optional[BaseException]:
        e = getattr(self.local, "error", None)
        self.local.error = None
        return e


def _text(e: BaseException) -> str:
    """str(e), or a stand-in where its __str__ raises: nothing may unwind into C."""
    try:
        return str(e)
    except BaseException:  # noqa: B902
        return f"<{type(e).__name__} whose str() raised>"


def _exit_request(e: BaseException) -> bool:
    return isinstance(e, (KeyboardInterrupt, SystemExit))


def call_with_cause(callbacks: Sequence[Optional["_Callback"]], status_fn: Callable[[], int]) -> None:
    """_lib.check(status_fn()), chaining the exception a fetch callback raised on this thread
    during the call (if one did) as the error's cause."""
    live = [c for c in callbacks if c is not None]
    outer = [c.begin_call() for c in live]
    try:
        _lib.check(status_fn())
    except FlameError as err:
        for c in live:
            cause = c.take_error()
            if _exit_request(cause):
                raise cause from None  # an exit request is the caller's, whatever libflame made of it
            if cause is not None:
                raise err from cause
        raise
    finally:
        # nothing a fetch raised outlives the call but as the cause of its error: kept, it
        # would hold the callback's frames and what they reference until the thread's next call
        for c, e in zip(live, outer):
            c.end_call(e)


class FeatureSource(Handle):
    """Where item feature records come from. Make one with from_file, redis or from_callback.
    Thread-safe: fetch may be called from many threads (a Redis source serializes them on its
    connection). An ItemCache keeps its source alive, so a source may be closed once its
    caches exist."""

    _destroy, _what = "flame_feature_source_destroy", "feature source"
    _callback: Optional[_Callback] = None

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("use FeatureSource.from_file(path), FeatureSource.redis(...) or "
                        "FeatureSource.from_callback(num_slots, fetch)")

    @classmethod
    def _make(cls, create: Callable[[C.c_void_p], int], callback: Optional[_Callback] = None) -> "FeatureSource":
        self = cls.__new__(cls)
        self._handle, self._callback = C.c_void_p(), callback
        _lib.check(create(self._handle))
        self.num_slots = _lib.lib().flame_feature_source_num_slots(self._handle)
        return self

    @classmethod
    def from_file(cls, path: Union[str, os.PathLike]) -> "FeatureSource":
        """A feature file (docs/features.md, "Feature file") read into memory; ids not in it
        are missing. Raises FlameIOError, FormatError (naming file:line)."""
        p = _arrays.c_path(path, "path")
        return cls._make(lambda h: _lib.lib().flame_feature_source_create_file(p, C.byref(h)))

    @classmethod
    def redis(cls, num_slots: int, *, host: str = "127.0.0.1", port: int = 6379, key_prefix: str = "flame:item:",
              connect_timeout_ms: int = 200, read_timeout_ms: int = 200, keys_per_command: int = 256,
              backoff_min_ms: int = 10, backoff_max_ms: int = 2000) -> "FeatureSource":
        """Records from a Redis server (key = key_prefix + decimal id, value = the record
        encoding of docs/features.md), connected now. Raises UnavailableError (cannot
        connect: the message names host, port and why), InvalidArgumentError."""
        opts = _redis_options(num_slots, host, port, key_prefix, connect_timeout_ms, read_timeout_ms,
                              keys_per_command, backoff_min_ms, backoff_max_ms)
        return cls._make(lambda h: _lib.lib().flame_feature_source_create_redis(C.byref(opts), C.byref(h)))

    @classmethod
    def from_callback(cls, num_slots: int, fetch: Callable[[np.ndarray], Iterable[RecordLike]]) -> "FeatureSource":
        """Records from `fetch(ids)`: ids is an int64 array; it returns one entry per id, in
        order: a FeatureRecord, a sequence of num_slots per-slot id sequences, or None for an
        id it does not know. Raising fails the whole fetch (FLAME_ERR_UNAVAILABLE unless a
        FlameError says otherwise). libflame calls it from scoring threads and the item
        cache's refresh thread, possibly at once: it must be thread-safe, and must not call
        the cache or engine that uses it."""
        num_slots = _arrays.c_int(num_slots, "num_slots", 32)
        if not callable(fetch):
            raise TypeError(f"fetch must be callable, got {type(fetch).__name__}")
        cb = _Callback(num_slots, fetch)
        return cls._make(lambda h: _lib.lib().flame_feature_source_create_callback(num_slots, cb.thunk, None,
                                                                                    None, C.byref(h)), cb)

    def fetch(self, ids: Any) -> List[Optional[FeatureRecord]]:
        """The records of `ids` straight from the source (no cache)."""
        arr = _arrays.ids(ids, "ids")
        with _Batch(self.num_slots) as b:
            with self._use() as h:
                call_with_cause([self._callback], lambda: _lib.lib().flame_feature_source_fetch(
                    h, _p(arr, I64P), arr.size, b.h))
            return b.records()

    def __repr__(self) -> str:
        return "<flame.FeatureSource closed>" if self.closed else f"<flame.FeatureSource slots={self.num_slots}>"


def _redis_options(num_slots, host, port, key_prefix, connect_timeout_ms, read_timeout_ms, keys_per_command,
                   backoff_min_ms, backoff_max_ms) -> RedisOptions:
    ints = dict(num_slots=num_slots, port=port, connect_timeout_ms=connect_timeout_ms,
                read_timeout_ms=read_timeout_ms, keys_per_command=keys_per_command, backoff_min_ms=backoff_min_ms,
                backoff_max_ms=backoff_max_ms)
    ints = {k: _arrays.c_int(v, k, 32) for k, v in ints.items()}
    opts = new(RedisOptions)
    opts.host, opts.key_prefix = _arrays.c_str(host, "host"), _arrays.c_str(key_prefix, "key_prefix")
    for k, v in ints.items():
        setattr(opts, k, int(v))
    return opts


def load_redis(path: Union[str, os.PathLike], num_slots: int, **redis: Any) -> int:
    """Writes every record of a feature file into Redis (pipelined; keys overwritten) with the
    options of FeatureSource.redis; returns the number of records written."""
    defaults = dict(host="127.0.0.1", port=6379, key_prefix="flame:item:", connect_timeout_ms=200,
                    read_timeout_ms=200, keys_per_command=256, backoff_min_ms=10, backoff_max_ms=2000)
    unknown = set(redis) - set(defaults)
    if unknown:
        raise TypeError(f"unknown Redis option(s) {sorted(unknown)}; known: {sorted(defaults)}")
    defaults.update(redis)
    opts = _redis_options(num_slots, **defaults)
    p = _arrays.c_path(path, "path")
    written = C.c_uint64()
    _lib.check(_lib.lib().flame_redis_load_features(C.byref(opts), p, C.byref(written)))
    return written.value


# Item cache options: the integer fields of flame_item_cache_params (times in microseconds),
# and refresh_thread, the negation of its manual_refresh.
ITEM_CACHE_OPTIONS = ("max_entries", "max_bytes", "shards", "hot_ttl_us", "cold_ttl_us", "hot_hits",
                      "negative_ttl_us", "refresh_percent", "refresh_min_hits", "refresh_thread", "retry_min_us",
                      "retry_max_us")


def _item_cache_params(options: dict) -> ItemCacheParams:
    """flame_item_cache_params from keyword options, checked here for name and type; the
    library checks the ranges (its message names the field and the bounds). A 0 in the C
    struct means "the default", so a 0 given here is refused rather than passed on."""
    p = new(ItemCacheParams)
    for key, value in options.items():
        if key not in ITEM_CACHE_OPTIONS:
            raise TypeError(f"unknown item cache option {key!r}; known: {sorted(ITEM_CACHE_OPTIONS)}")
        if key == "refresh_thread":
            if not isinstance(value, (bool, np.bool_)):
                raise errors.DTypeError(f"option refresh_thread must be True or False, got {type(value).__name__}")
            p.manual_refresh = 0 if value else 1
            continue
        bits = 8 * getattr(ItemCacheParams, key).size  # shards and refresh_percent are 32-bit
        value = _arrays.c_int(value, f"option {key}", bits, signed=False)
        if value < 1:
            raise errors.InvalidArgumentError(f"item cache option {key} = {value} is out of range (at least 1"
                                              f"{'; 100 turns refresh-ahead off' if key == 'refresh_percent' else ''})")
        setattr(p, key, int(value))
    return p


class ItemCache(Handle):
    """An in-process cache of item feature records in front of a FeatureSource: lock-free
    hits, S3-FIFO eviction bounded by entries and bytes, TTL from popularity, refresh-ahead,
    single-flight misses, negative caching (flame.h, flame_item_cache_create).

    Options (keyword arguments, the fields of flame_item_cache_params; the library checks the
    ranges; an option left out takes the library's default):
      max_entries, max_bytes, shards, hot_ttl_us, cold_ttl_us, hot_hits, negative_ttl_us,
      refresh_percent (1..99, 100: no refresh-ahead), refresh_min_hits, refresh_thread (True,
      the default: a background thread refreshes; False: call run_refresh), retry_min_us,
      retry_max_us.
    Thread-safe: get/put/invalidate/run_refresh/stats from any threads. Engines using the
    cache keep it alive, so it may be closed once given to one (Engine(model, item_cache=...)).
    """

    _destroy, _what = "flame_item_cache_destroy", "item cache"
    _exit_rank = 2  # closed at exit, once no engine keeps it: its refresh thread calls fetch (flame._handle)
    _fork_safe = False  # its refresh thread and in-flight fetches exist only in the process that made it

    def __init__(self, source: FeatureSource, **options: Any):
        if not isinstance(source, FeatureSource):
            raise errors.DTypeError(f"source must be a flame.FeatureSource, got {type(source).__name__}")
        self._handle = C.c_void_p()
        self.source, self.num_slots = source, source.num_slots  # the source's callback lives as long as we do
        params = _item_cache_params(options)
        with source._use() as sh:
            _lib.check(_lib.lib().flame_item_cache_create(sh, C.byref(params), C.byref(self._handle)))

    @property
    def callbacks(self) -> List[Optional[_Callback]]:
        return [self.source._callback]

    def get(self, ids: Any) -> List[Optional[FeatureRecord]]:
        """The records of `ids` (hits copied, misses fetched from the source in one batch and
        cached); None for ids the source does not know. Raises the source's failure
        (UnavailableError, FormatError) when a miss cannot be fetched."""
        arr = _arrays.ids(ids, "ids")
        with _Batch(self.num_slots) as b:
            with self._use() as h:
                call_with_cause(self.callbacks, lambda: _lib.lib().flame_item_cache_get(h, _p(arr, I64P), arr.size,
                                                                                         b.h))
            return b.records()

    def put(self, item_id: int, record: RecordLike) -> None:
        """Writes `record` (a FeatureRecord or per-slot id sequences) for `item_id`, replacing
        any value; fetches of it already in flight are not installed."""
        rec = _as_record(record, self.num_slots, f"item {item_id}")
        if rec is None:
            raise ShapeError("put needs a record; invalidate(item_id) drops one")
        offsets, flat = _csr(rec)
        iid = _arrays.int64(item_id, "item_id")
        with self._use() as h:
            _lib.check(_lib.lib().flame_item_cache_put(h, iid, _p(offsets, I64P), _p(flat, I64P), flat.size,
                                                       _p(rec.dense, F32P), rec.dense.size))

    def invalidate(self, item_id: int) -> None:
        """Drops `item_id`: the next get fetches it."""
        iid = _arrays.int64(item_id, "item_id")
        with self._use() as h:
            _lib.check(_lib.lib().flame_item_cache_invalidate(h, iid))

    def run_refresh(self) -> int:
        """Runs the refreshes due now on this thread (caches made with refresh_thread=False);
        returns how many ids were fetched."""
        n = C.c_uint64()
        with self._use() as h:
            call_with_cause(self.callbacks, lambda: _lib.lib().flame_item_cache_run_refresh(h, C.byref(n)))
        return n.value

    def stats(self) -> dict:
        """hits, misses, stale_serves, refreshes, refresh_failures, evictions, fetches, entries, bytes."""
        raw = new(ItemCacheStats)
        with self._use() as h:
            _lib.check(_lib.lib().flame_item_cache_get_stats(h, C.byref(raw)))
        return as_dict(raw)

    def __repr__(self) -> str:
        if self.closed:
            return "<flame.ItemCache closed>"
        s = self.stats()
        return f"<flame.ItemCache slots={self.num_slots} entries={s['entries']}>"
