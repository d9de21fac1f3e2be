"""flame.UserCache: the shared-memory table of users' feature records that the serving
processes of one host share (flame.h "shared-memory user cache", docs/memory.md). An Engine
with a user cache (Engine.set_user_cache) scores requests that give a user id and candidates
only: slot 0 of the user's record is the history, item ids oldest first.

    with flame.UserCache("/recsys-users", capacity=100_000, max_ids=256) as users:   # ~213 MB of /dev/shm
        users.put_history(42, [12, 7, 301])
        users.get(42).history          # array([ 12,   7, 301])
"""
from __future__ import annotations

import ctypes as C
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from . import _arrays, _lib
from ._handle import Handle
from ._structs import F32P, I64P, UserCacheParams, UserCacheStats, UserFeatures, as_dict, new
from .errors import ShapeError

MODES = {"create": 0, "attach": 1, "create_or_attach": 2}


@dataclass(frozen=True, eq=False)
class UserRecord:
    """One user's record: `bags` one int64 array per slot, `dense` float32 values, `age_us`
    microseconds since it was written."""
    bags: Tuple[np.ndarray, ...]
    dense: np.ndarray
    age_us: int

    @property
    def history(self) -> np.ndarray:
        """Slot 0: the history flame_score reads (oldest first)."""
        return self.bags[0]


# the layout fields of flame_user_cache_params: (C field, bits, signed)
_LAYOUT = {"capacity": ("capacity", 64, False), "num_slots": ("num_slots", 32, False),
           "max_ids": ("max_ids", 32, False), "max_dense": ("max_dense", 32, False),
           "permissions": ("mode", 32, False), "ttl_us": ("ttl_us", 64, True)}


class UserCache(Handle):
    """Opens (mode "create", "attach" or "create_or_attach") the table `name` (a POSIX shm
    name: "/" then 1..250 characters without "/").

    Layout, fixed by the creator; 0 takes the library's default: capacity (records, default
    500000), num_slots (id slots per record, default 1), max_ids (ids per record over all
    slots, default 32; at least the model's max_len for histories), max_dense (float32 values,
    default 0), permissions (of the shm object, default 0o600), ttl_us (older records read as
    misses; 0 = never). Attaching with any of them given checks the whole layout against the
    table (0 meaning the default; FormatError naming the field and both values); "attach"
    with none given takes the table as it is. `params` holds the table's layout either way.
    "create_or_attach" also takes over a table whose creator died before finishing it (after
    1 s), initialising it with this layout; "attach" reports such a table (FlameIOError).
    Thread- and process-safe: put/get/remove/stats from any threads and processes. Closing
    drops this handle; the table lives on until unlink(name) and the last process unmaps it.
    Engines using the cache keep it mapped.
    """

    _destroy, _what = "flame_user_cache_destroy", "user cache"

    def __init__(self, name: str, mode: str = "create_or_attach", *, capacity: int = 0, num_slots: int = 0,
                 max_ids: int = 0, max_dense: int = 0, permissions: int = 0, ttl_us: int = 0):
        self._handle = C.c_void_p()
        c_name = _arrays.c_str(name, "name")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
        layout = dict(capacity=capacity, num_slots=num_slots, max_ids=max_ids, max_dense=max_dense,
                      permissions=permissions, ttl_us=ttl_us)
        p = new(UserCacheParams)
        for k, v in layout.items():
            field, bits, signed = _LAYOUT[k]
            setattr(p, field, _arrays.c_int(v, k, bits, signed))
        given = mode != "attach" or any(layout.values())
        _lib.check(_lib.lib().flame_user_cache_open(c_name, MODES[mode], C.byref(p) if given else None,
                                                    C.byref(self._handle)))
        self.name = name
        got = new(UserCacheParams)
        _lib.check(_lib.lib().flame_user_cache_get_params(self._handle, C.byref(got)))
        self.params: Dict[str, int] = {k: getattr(got, k) for k in ("capacity", "num_slots", "max_ids", "max_dense",
                                                                     "ttl_us")}

    @staticmethod
    def unlink(name: str) -> None:
        """Removes the table's name; processes that have it mapped keep it until they close."""
        _lib.check(_lib.lib().flame_user_cache_unlink(_arrays.c_str(name, "name")))

    def put(self, user_id: int, bags: Sequence[Any], dense: Any = None) -> None:
        """Writes (inserts or replaces) the record of `user_id`: `bags` one id sequence per
        slot (num_slots of them), `dense` optional float32 values. Raises ShapeError (slot
        count), InvalidArgumentError (more ids or dense values than the table's bounds)."""
        uid = _arrays.int64(user_id, "user_id")
        n = self.params["num_slots"]
        if isinstance(bags, np.ndarray) or not isinstance(bags, Sequence) or len(bags) != n:
            raise ShapeError(f"bags must be a sequence of {n} per-slot id sequence(s) (the table's num_slots); "
                             "put_history(user_id, history) writes slot 0 alone")
        arrs = [_arrays.ids(b, f"bag {s}") for s, b in enumerate(bags)]
        ids = np.ascontiguousarray(np.concatenate(arrs) if arrs else np.zeros(0, np.int64))
        lens = np.array([a.size for a in arrs], dtype=np.uint32)
        d = _arrays.dense(dense)
        f = new(UserFeatures)
        f.ids, f.num_ids = ids.ctypes.data_as(I64P), ids.size
        f.slot_lens = lens.ctypes.data_as(C.POINTER(C.c_uint32))
        f.dense, f.num_dense = d.ctypes.data_as(F32P), d.size
        with self._use() as h:
            _lib.check(_lib.lib().flame_user_cache_put(h, uid, C.byref(f)))

    def put_history(self, user_id: int, history: Any) -> None:
        """Writes `history` (item ids, oldest first) as slot 0 of the user's record, the other
        slots empty: the record Engine.score reads with from_user_cache=True."""
        self.put(user_id, [history] + [[]] * (self.params["num_slots"] - 1))

    def get(self, user_id: int) -> Optional[UserRecord]:
        """The record of `user_id`, or None (absent, expired, or dropped by crash recovery)."""
        uid = _arrays.int64(user_id, "user_id")
        p = self.params
        ids = np.empty(max(1, p["max_ids"]), np.int64)
        lens = np.empty(max(1, p["num_slots"]), np.uint32)
        dense = np.empty(max(1, p["max_dense"]), np.float32)
        f = new(UserFeatures)
        f.ids, f.ids_capacity = ids.ctypes.data_as(I64P), p["max_ids"]
        f.slot_lens = lens.ctypes.data_as(C.POINTER(C.c_uint32))
        f.dense, f.dense_capacity = dense.ctypes.data_as(F32P), p["max_dense"]
        found = C.c_int32()
        with self._use() as h:
            _lib.check(_lib.lib().flame_user_cache_get(h, uid, C.byref(f), C.byref(found)))
        if not found.value:
            return None
        ends = np.cumsum(lens[:p["num_slots"]], dtype=np.int64)
        bags = tuple(ids[e - int(n):e].copy() for e, n in zip(ends, lens[:p["num_slots"]]))
        return UserRecord(bags, dense[:f.num_dense].copy(), f.age_us)

    def remove(self, user_id: int) -> bool:
        """Removes the record of `user_id`; True if there was one."""
        removed = C.c_int32()
        uid = _arrays.int64(user_id, "user_id")
        with self._use() as h:
            _lib.check(_lib.lib().flame_user_cache_remove(h, uid, C.byref(removed)))
        return bool(removed.value)

    def stats(self) -> dict:
        """capacity, records, table_bytes, record_bytes; this handle's hits, misses, expired,
        corrupt (malformed records read as misses); puts, evictions, recoveries of all processes."""
        raw = new(UserCacheStats)
        with self._use() as h:
            _lib.check(_lib.lib().flame_user_cache_get_stats(h, C.byref(raw)))
        return as_dict(raw)

    def __repr__(self) -> str:
        if self.closed:
            return "<flame.UserCache closed>"
        return f"<flame.UserCache {self.name} {self.params}>"
