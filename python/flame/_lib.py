"""Finding, loading and version-checking libflame; the prototypes of every function used.

Search order (the first that exists wins, and a set FLAME_LIBRARY that does not exist is an
error rather than a reason to pick up some other copy):
  1. $FLAME_LIBRARY, a path to the shared library;
  2. a copy bundled next to this package (flame/libflame.so.<major>, as `make wheel` puts it);
  3. the build tree this package sits in (<repo>/lib/libflame.so, from `make`), when the package
     is the checkout's python/flame;
  4. ctypes.util.find_library("flame") (an installed libflame.so.0 where the dynamic loader
     looks: `make install`, ldconfig's cache, LD_LIBRARY_PATH).
The library is loaded on first use, so `import flame` works without it (converters, the
numpy reference and the PyTorch model need no C library).
"""
from __future__ import annotations

import ctypes as C
import ctypes.util
import os
import threading
from pathlib import Path
from typing import List, Optional

from . import errors
from ._structs import (I64P, F32P, ModelInfo, Request, EngineStats, LOG_FN, FETCH_FN, NumaInfo, PinnedPoolParams,
                       PinnedPoolStats, UserCacheParams, UserFeatures, UserCacheStats, RedisOptions, ItemCacheStats,
                       ItemCacheParams, SchedulerParams, SchedulerStats, SubmitOptions, Latency, MetricsSources,
                       DONE_FN, EmbeddingBagParams, EmbeddingBagBatch, AttentionParams)

# The C API this package was written against: flame.h 0.2.x. Same major (the ABI promise),
# and at least this minor (the functions and struct fields bound below exist from 0.2).
WRITTEN_FOR = (0, 2, 0)

_vp, _st = C.c_void_p, C.c_int
PROTOTYPES = [
    ("flame_version", C.c_uint, []),
    ("flame_version_string", C.c_char_p, []),
    ("flame_status_string", C.c_char_p, [_st]),
    ("flame_last_error", C.c_char_p, []),
    ("flame_set_log_callback", _st, [LOG_FN, _vp, C.c_int]),
    ("flame_model_load", _st, [C.c_char_p, C.POINTER(_vp)]),
    ("flame_model_create_random", _st, [C.c_char_p, C.c_uint64, C.POINTER(_vp)]),
    ("flame_default_model_config", C.c_char_p, []),
    ("flame_model_destroy", None, [_vp]),
    ("flame_model_get_info", _st, [_vp, C.POINTER(ModelInfo)]),
    ("flame_config_create", _st, [C.POINTER(_vp)]),
    ("flame_config_destroy", None, [_vp]),
    ("flame_config_set_int", _st, [_vp, C.c_int, C.c_int64]),
    ("flame_config_set_string", _st, [_vp, C.c_int, C.c_char_p]),
    ("flame_config_set_pointer", _st, [_vp, C.c_int, _vp]),
    ("flame_engine_create", _st, [_vp, _vp, C.POINTER(_vp)]),
    ("flame_engine_destroy", None, [_vp]),
    ("flame_score", _st, [_vp, C.POINTER(Request), F32P, C.c_size_t]),
    ("flame_score_batch", _st, [_vp, C.POINTER(Request), C.c_size_t, F32P, C.c_size_t]),
    ("flame_score_batch_topk", _st, [_vp, C.POINTER(Request), C.c_size_t, C.c_uint32, C.c_uint32, I64P, F32P,
                                     C.c_size_t]),
    ("flame_engine_get_stats", _st, [_vp, C.POINTER(EngineStats)]),
    ("flame_engine_set_item_cache", _st, [_vp, _vp]),
    ("flame_engine_set_user_cache", _st, [_vp, _vp]),
    # memory: NUMA, pinned pool, shared-memory user cache
    ("flame_numa_get_info", _st, [C.POINTER(NumaInfo)]),
    ("flame_pinned_pool_create", _st, [C.POINTER(PinnedPoolParams), C.POINTER(_vp)]),
    ("flame_pinned_pool_destroy", None, [_vp]),
    ("flame_pinned_alloc", _st, [_vp, C.c_size_t, C.POINTER(_vp), C.POINTER(C.c_int32)]),
    ("flame_pinned_free", _st, [_vp, _vp]),
    ("flame_pinned_pool_get_stats", _st, [_vp, C.POINTER(PinnedPoolStats)]),
    ("flame_user_cache_open", _st, [C.c_char_p, C.c_int, C.POINTER(UserCacheParams), C.POINTER(_vp)]),
    ("flame_user_cache_destroy", None, [_vp]),
    ("flame_user_cache_unlink", _st, [C.c_char_p]),
    ("flame_user_cache_put", _st, [_vp, C.c_int64, C.POINTER(UserFeatures)]),
    ("flame_user_cache_get", _st, [_vp, C.c_int64, C.POINTER(UserFeatures), C.POINTER(C.c_int32)]),
    ("flame_user_cache_remove", _st, [_vp, C.c_int64, C.POINTER(C.c_int32)]),
    ("flame_user_cache_get_stats", _st, [_vp, C.POINTER(UserCacheStats)]),
    ("flame_user_cache_get_params", _st, [_vp, C.POINTER(UserCacheParams)]),
    # item features: batches, sources, item cache
    ("flame_feature_batch_create", _st, [C.c_int32, C.POINTER(_vp)]),
    ("flame_feature_batch_destroy", None, [_vp]),
    ("flame_feature_batch_size", C.c_size_t, [_vp]),
    ("flame_feature_batch_set", _st, [_vp, C.c_size_t, I64P, I64P, C.c_size_t, F32P, C.c_size_t]),
    ("flame_feature_batch_set_missing", _st, [_vp, C.c_size_t]),
    ("flame_feature_batch_get_slot", _st, [_vp, C.c_size_t, C.c_int32, C.POINTER(C.c_int32), C.POINTER(I64P),
                                            C.POINTER(C.c_size_t)]),
    ("flame_feature_batch_get_dense", _st, [_vp, C.c_size_t, C.POINTER(F32P), C.POINTER(C.c_size_t)]),
    ("flame_feature_source_create_callback", _st, [C.c_int32, FETCH_FN, _vp, _vp, C.POINTER(_vp)]),
    ("flame_feature_source_create_file", _st, [C.c_char_p, C.POINTER(_vp)]),
    ("flame_feature_source_create_redis", _st, [C.POINTER(RedisOptions), C.POINTER(_vp)]),
    ("flame_redis_load_features", _st, [C.POINTER(RedisOptions), C.c_char_p, C.POINTER(C.c_uint64)]),
    ("flame_feature_source_num_slots", C.c_int32, [_vp]),
    ("flame_feature_source_fetch", _st, [_vp, I64P, C.c_size_t, _vp]),
    ("flame_feature_source_destroy", None, [_vp]),
    ("flame_item_cache_create", _st, [_vp, C.POINTER(ItemCacheParams), C.POINTER(_vp)]),
    ("flame_item_cache_destroy", None, [_vp]),
    ("flame_item_cache_get", _st, [_vp, I64P, C.c_size_t, _vp]),
    ("flame_item_cache_put", _st, [_vp, C.c_int64, I64P, I64P, C.c_size_t, F32P, C.c_size_t]),
    ("flame_item_cache_invalidate", _st, [_vp, C.c_int64]),
    ("flame_item_cache_run_refresh", _st, [_vp, C.POINTER(C.c_uint64)]),
    ("flame_item_cache_get_stats", _st, [_vp, C.POINTER(ItemCacheStats)]),
    # the batch-profile scheduler
    ("flame_scheduler_create", _st, [_vp, C.POINTER(SchedulerParams), C.POINTER(_vp)]),
    ("flame_scheduler_destroy", None, [_vp]),
    ("flame_scheduler_submit", _st, [_vp, C.POINTER(Request), F32P, C.c_size_t, DONE_FN, _vp]),
    ("flame_scheduler_score", _st, [_vp, C.POINTER(Request), F32P, C.c_size_t]),
    ("flame_scheduler_get_stats", _st, [_vp, C.POINTER(SchedulerStats)]),
    ("flame_scheduler_reset_latency", _st, [_vp]),
    # the kernels: embedding bag and SUMI attention
    ("flame_embedding_bag_create", _st, [C.POINTER(EmbeddingBagParams), C.POINTER(_vp)]),
    ("flame_embedding_bag_destroy", None, [_vp]),
    ("flame_embedding_bag_width", C.c_int64, [_vp]),
    ("flame_embedding_bag_forward", _st, [_vp, C.POINTER(EmbeddingBagBatch)]),
    ("flame_embedding_bag_update_rows", _st, [_vp, C.c_int32, C.c_int64, C.c_int64, _vp, C.c_int, F32P, _vp]),
    ("flame_embedding_bag_index_status", _st, [_vp, _vp]),
    ("flame_sumi_attention", _st, [C.POINTER(AttentionParams)]),
    ("flame_scheduler_submit_ex", _st, [_vp, C.POINTER(Request), F32P, C.c_size_t, C.POINTER(SubmitOptions), DONE_FN,
                                        _vp, C.POINTER(C.c_uint64)]),
    ("flame_scheduler_cancel", _st, [_vp, C.c_uint64]),
    ("flame_scheduler_now_us", C.c_uint64, [_vp]),
    # metrics
    ("flame_engine_get_latency", _st, [_vp, C.c_int, C.POINTER(Latency)]),
    ("flame_scheduler_get_latency", _st, [_vp, C.c_int, C.POINTER(Latency)]),
    ("flame_metrics_text", _st, [C.POINTER(MetricsSources), C.c_char_p, C.c_size_t, C.POINTER(C.c_size_t)]),
]

_lock = threading.Lock()
_lib: Optional[C.CDLL] = None


def candidates() -> List[str]:
    """Where the library is looked for, in order (see the module docstring)."""
    env = os.environ.get("FLAME_LIBRARY")
    if env:
        return [env]
    out = []
    here = Path(__file__).resolve().parent
    bundled = here / f"libflame.so.{WRITTEN_FOR[0]}"
    if bundled.exists():
        out.append(str(bundled))
    # Only the checkout's own python/flame looks for <repo>/lib: an installed copy's parents
    # (site-packages, a prefix) are not a build tree even if they hold some lib/libflame.so.
    repo = here.parents[1]
    tree = repo / "lib" / "libflame.so"
    if (repo / "include" / "flame" / "flame.h").exists() and tree.exists():
        out.append(str(tree))
    found = ctypes.util.find_library("flame")
    if found:
        out.append(found)
    return out


def _open() -> C.CDLL:
    paths = candidates()
    if not paths:
        raise errors.LibraryNotFoundError(
            "set FLAME_LIBRARY to the path of libflame.so, run `make` in the "
            "repository this package belongs to, install it (`make install`) where the dynamic "
            "loader finds it, or install a wheel with the library inside (`make wheel`)")
    path = paths[0]
    try:
        return C.CDLL(path)
    except OSError as e:
        src = "FLAME_LIBRARY" if os.environ.get("FLAME_LIBRARY") else "found"
        raise errors.LibraryNotFoundError(f"cannot load libflame ({src}: {path}): {e}") from None


def check_version(number: int, where: str = "") -> None:
    """Raises VersionMismatchError unless `number` (MAJOR*10000+MINOR*100+PATCH) is a version
    this package can drive: the same major, a minor at least WRITTEN_FOR's."""
    major, minor, patch = number // 10000, number // 100 % 100, number % 100
    want = WRITTEN_FOR
    if major != want[0] or minor < want[1]:
        raise errors.VersionMismatchError(
            f"libflame {major}.{minor}.{patch}{where} is loaded, but this Python package (flame "
            f"{'.'.join(map(str, want))}) needs {want[0]}.{want[1]}.x or a later {want[0]}.x; "
            "point FLAME_LIBRARY at a matching build")


def lib() -> C.CDLL:
    """The loaded, version-checked library with every prototype set."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            L = _open()
            L.flame_version.restype, L.flame_version.argtypes = C.c_uint, []
            check_version(L.flame_version(), f" ({L._name})")
            for name, res, args in PROTOTYPES:
                f = getattr(L, name)
                f.restype, f.argtypes = res, args
            _lib = L
    return _lib


def last_error() -> str:
    return lib().flame_last_error().decode("utf-8", "replace")


def check(status: int) -> None:
    """Raises the FlameError subclass of a non-OK status with the library's message."""
    if status != errors.OK:
        raise errors.from_status(status, last_error())


def status_name(status: int) -> str:
    return lib().flame_status_string(status).decode()


def version() -> str:
    """The loaded library's version string, e.g. "0.2.0"."""
    return lib().flame_version_string().decode()


__all__ = ["lib", "check", "check_version", "candidates", "version", "WRITTEN_FOR", "I64P", "F32P"]
