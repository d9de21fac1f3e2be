"""Checking the arrays a request is made of, before any pointer reaches C.

numpy arrays must already be int64: converting another dtype silently would copy (and float
ids are a bug upstream), so they are refused with a message saying how to convert. Python
lists and tuples of ints are converted (booleans among them refused). A C-contiguous, aligned
int64 array is passed by pointer with no copy; a strided or misaligned one is copied once (C
reads contiguous, aligned ids).
"""
from __future__ import annotations

import os
from collections import abc
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from .errors import DTypeError, InvalidArgumentError, ShapeError

_BOOLS = {bool, np.bool_}

Bag = Tuple[np.ndarray, np.ndarray]  # (offsets [num_tokens + 1], ids [offsets[-1]]), int64


def ids(value: Any, name: str) -> np.ndarray:
    """A 1-D C-contiguous int64 array (the input itself when it already is one)."""
    if isinstance(value, np.ndarray):
        if value.dtype != np.int64:
            raise DTypeError(f"{name} must be an int64 array, got {value.dtype} "
                             f"(convert with .astype(np.int64))")
        a = value
    else:
        if isinstance(value, (bool, np.bool_)):
            raise DTypeError(f"{name} must be a sequence of integer ids, got a bool")
        a = np.asarray(value)
        if a.dtype == np.bool_:
            raise DTypeError(f"{name} must hold integer ids, got booleans")
        if a.dtype.kind in "iu" and isinstance(value, abc.Sequence) and not isinstance(value, range):
            # numpy reads True as 1 beside ints; a bool among ids is a bug upstream, as a bool id is
            # (the types are collected at C speed; the position is looked for only when one is there)
            if not _BOOLS.isdisjoint(set(map(type, value))):
                at = next(i for i, x in enumerate(value) if isinstance(x, (bool, np.bool_)))
                raise DTypeError(f"{name}[{at}] is a bool ({value[at]!r}): ids must be ints")
        if a.size == 0:
            a = a.astype(np.int64)
        elif a.dtype.kind not in "iu" or a.dtype == np.uint64:
            raise DTypeError(f"{name} must hold integer ids, got {a.dtype} values")
        a = a.astype(np.int64, copy=False)
    if a.ndim != 1:
        raise ShapeError(f"{name} must be 1-D, got shape {a.shape}")
    flags = a.flags
    return a if flags.c_contiguous and flags.aligned else a.copy()  # strided or misaligned (a view into bytes)


def frozen(a: np.ndarray) -> bool:
    """Whether no array can write a's memory: a and every array it views are read-only, and
    the memory is the arrays' own or a bytes object's (an array can be made writeable again,
    but only on purpose)."""
    x: Any = a
    while isinstance(x, np.ndarray):
        if x.flags.writeable:
            return False
        x = x.base
    return x is None or isinstance(x, bytes)


def private(a: np.ndarray) -> np.ndarray:
    """a, or a copy of it when the caller could change it (see frozen)."""
    return a if frozen(a) else a.copy()


def int64(value: Any, name: str) -> int:
    """A Python int that fits int64 (an id or a key), refused otherwise with a clear message."""
    return c_int(value, name, 64)


def dense(value: Any, name: str = "dense") -> np.ndarray:
    """Dense features: a 1-D aligned float32 array (None: empty). A finite number float32
    cannot hold is refused, naming it (converted, it would be stored as infinity)."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            d = np.zeros(0, np.float32) if value is None else np.ascontiguousarray(value, dtype=np.float32)
    except (TypeError, ValueError, OverflowError) as e:
        raise DTypeError(f"{name} must hold numbers: {e}") from None
    if d.ndim != 1:
        raise ShapeError(f"{name} must be 1-D, got shape {d.shape}")
    if value is not None and not (isinstance(value, np.ndarray) and value.dtype == np.float32):
        lost = np.flatnonzero(~np.isfinite(d))
        for i in lost[:1]:  # inf or nan after the cast: was it one before?
            try:
                was = float(np.asarray(value).reshape(-1)[i])
            except OverflowError:  # an int beyond any float
                was = None
            if was is None or np.isfinite(was):
                raise InvalidArgumentError(f"{name}[{i}] = {np.asarray(value).reshape(-1)[i]} does not fit float32")
    return d if d.flags.aligned else d.copy()  # a misaligned view (into bytes)


def c_str(value: Any, name: str) -> bytes:
    """A string as the NUL-terminated bytes C reads, refused when it holds a NUL (C would read
    only what precedes it: "cpu\\x00cuda:1" would be "cpu")."""
    if not isinstance(value, str):
        raise DTypeError(f"{name} must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise InvalidArgumentError(f"{name} {value!r} holds a NUL character")
    return value.encode()


def c_path(value: Any, name: str) -> bytes:
    """A path (str, bytes or os.PathLike) as the bytes C opens, refused when it holds a NUL
    (as open() refuses it: C would open what precedes it)."""
    try:
        b = os.fsencode(value)
    except TypeError:
        raise DTypeError(f"{name} must be a path (str, bytes or os.PathLike), got {type(value).__name__}") from None
    if b"\x00" in b:
        raise InvalidArgumentError(f"{name} {os.fsdecode(b)!r} holds a NUL character")
    return b


def c_int(value: Any, name: str, bits: int, signed: bool = True) -> int:
    """An int that fits the C field or argument it is passed as (ctypes would silently keep its
    low bits: 2**32 + 2 threads became 2); the library then checks the meaningful range."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise DTypeError(f"{name} must be an int, got {type(value).__name__}")
    lo, hi = (-2**(bits - 1), 2**(bits - 1)) if signed else (0, 2**bits)
    v = int(value)
    if not lo <= v < hi:
        raise InvalidArgumentError(f"{name} = {v} is outside [{lo}, {hi})")
    return v


def csr(off: np.ndarray, ii: np.ndarray, name: str) -> None:
    """The two CSR rules said in Python's terms: offsets start at 0 and end at len(ids), so
    every id belongs to a bag and none lies past the array. That they never decrease is
    checked by the library, which reads every offset anyway (its message names the token)."""
    first, last = int(off[0]), int(off[-1])  # off has num_tokens + 1 >= 1 entries
    if first != 0:
        raise InvalidArgumentError(f"{name} offsets[0] = {first}, expected 0")
    if last != ii.size:
        raise ShapeError(f"{name} offsets[{off.size - 1}] (the end of the last token's bag) = {last}, but ids "
                         f"has {ii.size} entries: every id must belong to a bag")


def bags(side: Optional[Sequence[Any]], num_tokens: int, num_slots: int, name: str) -> List[Bag]:
    """Validates one token list's side features: `num_slots` (offsets, ids) pairs in CSR form
    over `num_tokens` tokens (offsets[0] == 0 and offsets[-1] == len(ids) checked here); the
    library gets len(ids) as the bag's num_ids and checks that the offsets never decrease and
    the id ranges, its message naming the token and the id."""
    if side is None:
        if num_slots:
            raise ShapeError(f"{name} is missing: the model has {num_slots} side-feature slot(s), "
                             f"pass one (offsets, ids) pair per slot, or give the engine an item cache that gives them "
                             f"(flame.Engine(model, item_cache=...))")
        return []
    if len(side) != num_slots:
        raise ShapeError(f"{name} has {len(side)} slot(s), the model has {num_slots} side-feature slot(s)")
    out = []
    for s, pair in enumerate(side):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ShapeError(f"{name}[{s}] must be an (offsets, ids) pair")
        off, ii = ids(pair[0], f"{name}[{s}] offsets"), ids(pair[1], f"{name}[{s}] ids")
        if off.size != num_tokens + 1:
            raise ShapeError(f"{name}[{s}] offsets has {off.size} entries, expected num_tokens + 1 = "
                             f"{num_tokens + 1}")
        csr(off, ii, f"{name}[{s}]")
        out.append((off, ii))
    return out


def scores_out(out: Optional[np.ndarray], rows: int, cols: int) -> np.ndarray:
    """The float32 [rows, cols] C-contiguous array scores are written into."""
    if out is None:
        return np.empty((rows, cols), dtype=np.float32)
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        raise DTypeError(f"out must be a float32 array, got {getattr(out, 'dtype', type(out).__name__)}")
    if out.shape != (rows, cols):
        raise ShapeError(f"out has shape {out.shape}, expected (num_candidates, num_tasks) = {(rows, cols)}")
    if not out.flags.c_contiguous or not out.flags.writeable or not out.flags.aligned:
        raise ShapeError("out must be C-contiguous, aligned and writeable")
    return out


def to_bags(lists: Sequence[Sequence[int]]) -> Bag:
    """Per-token id lists -> the (offsets, ids) CSR pair a side-feature slot takes."""
    sizes = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    flat = np.fromiter((int(i) for x in lists for i in x), dtype=np.int64, count=int(offsets[-1]))
    return offsets, flat
