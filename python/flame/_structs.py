"""ctypes mirrors of the public structs of include/flame/flame.h, field by field.

Every struct starts with struct_size, which the library reads to know which fields the
caller has; `new(cls)` sets it, so appending fields here (when flame.h appends them) keeps
older libraries working. The reserved0 fields (flame.h, "No trailing padding": the bytes alignment
would leave as trailing padding) are mirrored too, so the layouts match byte for byte; ctypes zeroes them, as
the library requires.
"""
import ctypes as C

I64P = C.POINTER(C.c_int64)
F32P = C.POINTER(C.c_float)


def new(cls):
    return cls(struct_size=C.sizeof(cls))


class ModelInfo(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("d_model", C.c_int32), ("num_blocks", C.c_int32),
                ("num_heads", C.c_int32), ("ffn_dim", C.c_int32), ("max_len", C.c_int32),
                ("num_tasks", C.c_int32), ("num_side_features", C.c_int32), ("head", C.c_int),
                ("num_items", C.c_int64), ("weight_bytes", C.c_uint64)]


class Bags(C.Structure):
    _fields_ = [("offsets", I64P), ("ids", I64P), ("num_ids", C.c_size_t)]


class Request(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("user_id", C.c_int64),
                ("history", I64P), ("history_len", C.c_size_t),
                ("candidates", I64P), ("num_candidates", C.c_size_t),
                ("history_side", C.POINTER(Bags)), ("candidate_side", C.POINTER(Bags)),
                ("num_side_features", C.c_size_t),
                ("history_from_user_cache", C.c_int32),
                ("history_version", C.c_uint64), ("kv_cache", C.c_int32), ("reserved0", C.c_uint32)]


class EngineStats(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("calls", C.c_uint64), ("requests", C.c_uint64),
                ("workspaces", C.c_uint64), ("scratch_bytes", C.c_uint64),
                ("max_workspace_bytes", C.c_uint64), ("device_bytes", C.c_uint64),
                ("device_weight_bytes", C.c_uint64), ("graph_captures", C.c_uint64),
                ("graph_replays", C.c_uint64), ("user_cache_hits", C.c_uint64),
                ("user_cache_misses", C.c_uint64),
                ("kv_cache_hits", C.c_uint64), ("kv_cache_misses", C.c_uint64),
                ("kv_cache_extensions", C.c_uint64), ("kv_cache_evictions", C.c_uint64),
                ("kv_cache_bytes", C.c_uint64), ("kv_cache_peak_bytes", C.c_uint64),
                ("kv_cache_budget_bytes", C.c_uint64), ("kv_cache_tokens_computed", C.c_uint64),
                ("kv_cache_tokens_saved", C.c_uint64),
                ("profile_passes", C.c_uint64), ("profile_padding_tokens", C.c_uint64)]


class NumaInfo(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("mode", C.c_int), ("num_nodes", C.c_int32),
                ("current_node", C.c_int32), ("reserved0", C.c_uint32)]


class PinnedPoolParams(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("numa_node", C.c_int32), ("pin", C.c_int32),
                ("max_cached_bytes", C.c_uint64)]


class PinnedPoolStats(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("bytes_reserved", C.c_uint64), ("bytes_in_use", C.c_uint64),
                ("bytes_requested", C.c_uint64), ("bytes_pinned", C.c_uint64), ("bytes_pageable", C.c_uint64),
                ("hits", C.c_uint64), ("misses", C.c_uint64), ("pin_failures", C.c_uint64),
                ("releases", C.c_uint64), ("pinning", C.c_int32), ("reserved0", C.c_uint32)]


class UserCacheParams(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("capacity", C.c_uint64), ("num_slots", C.c_uint32),
                ("max_ids", C.c_uint32), ("max_dense", C.c_uint32), ("mode", C.c_uint32), ("ttl_us", C.c_int64)]


class UserFeatures(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ids", I64P), ("num_ids", C.c_size_t),
                ("slot_lens", C.POINTER(C.c_uint32)), ("dense", F32P), ("num_dense", C.c_size_t),
                ("ids_capacity", C.c_size_t), ("dense_capacity", C.c_size_t), ("age_us", C.c_int64)]


class UserCacheStats(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("capacity", C.c_uint64), ("records", C.c_uint64),
                ("table_bytes", C.c_uint64), ("record_bytes", C.c_uint64), ("hits", C.c_uint64),
                ("misses", C.c_uint64), ("expired", C.c_uint64), ("puts", C.c_uint64),
                ("evictions", C.c_uint64), ("recoveries", C.c_uint64), ("corrupt", C.c_uint64)]


class RedisOptions(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("host", C.c_char_p), ("port", C.c_int32),
                ("key_prefix", C.c_char_p), ("num_slots", C.c_int32), ("connect_timeout_ms", C.c_int32),
                ("read_timeout_ms", C.c_int32), ("keys_per_command", C.c_int32), ("backoff_min_ms", C.c_int32),
                ("backoff_max_ms", C.c_int32)]


class ItemCacheStats(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("hits", C.c_uint64), ("misses", C.c_uint64),
                ("stale_serves", C.c_uint64), ("refreshes", C.c_uint64), ("refresh_failures", C.c_uint64),
                ("evictions", C.c_uint64), ("fetches", C.c_uint64), ("entries", C.c_uint64),
                ("bytes", C.c_uint64)]


class ItemCacheParams(C.Structure):
    # ttl_fn / clock_fn are C function pointers, left NULL from Python (the defaults)
    _fields_ = [("struct_size", C.c_size_t), ("max_entries", C.c_uint64), ("max_bytes", C.c_uint64),
                ("hot_ttl_us", C.c_uint64), ("cold_ttl_us", C.c_uint64), ("hot_hits", C.c_uint64),
                ("negative_ttl_us", C.c_uint64), ("refresh_min_hits", C.c_uint64), ("retry_min_us", C.c_uint64),
                ("retry_max_us", C.c_uint64), ("shards", C.c_uint32), ("refresh_percent", C.c_uint32),
                ("manual_refresh", C.c_int32), ("ttl_fn", C.c_void_p), ("ttl_user", C.c_void_p),
                ("clock_fn", C.c_void_p), ("clock_user", C.c_void_p)]


class BatchProfile(C.Structure):
    _fields_ = [("max_users", C.c_uint32), ("max_candidates", C.c_uint32)]


class SchedulerParams(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("profiles", C.POINTER(BatchProfile)), ("num_profiles", C.c_size_t),
                ("max_wait_us", C.c_int64), ("workers", C.c_uint32), ("max_queue", C.c_uint32),
                ("max_bypass", C.c_uint32), ("adaptive_wait", C.c_uint32)]


class Latency(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("count", C.c_uint64), ("sum_us", C.c_uint64), ("p50_us", C.c_uint64),
                ("p90_us", C.c_uint64), ("p99_us", C.c_uint64), ("p999_us", C.c_uint64), ("max_us", C.c_uint64)]


class MetricsSources(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("engine", C.c_void_p), ("scheduler", C.c_void_p),
                ("pinned_pool", C.c_void_p)]


class SubmitOptions(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("priority", C.c_int32), ("timeout_us", C.c_int64),
                ("deadline_us", C.c_uint64)]


MAX_PROFILES = 16  # FLAME_SCHED_MAX_PROFILES


class SchedulerStats(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("submitted", C.c_uint64), ("completed", C.c_uint64),
                ("failed", C.c_uint64), ("rejected", C.c_uint64), ("split", C.c_uint64), ("parts", C.c_uint64),
                ("batches", C.c_uint64), ("isolated", C.c_uint64), ("queued", C.c_uint64),
                ("profile_batches", C.c_uint64 * MAX_PROFILES), ("latency_p50_us", C.c_uint64),
                ("latency_p99_us", C.c_uint64), ("latency_max_us", C.c_uint64), ("queue_wait_p50_us", C.c_uint64),
                ("queue_wait_p99_us", C.c_uint64), ("timeouts", C.c_uint64), ("cancelled", C.c_uint64),
                ("in_flight", C.c_uint64), ("candidates", C.c_uint64), ("batch_slots_used", C.c_uint64),
                ("batch_slots", C.c_uint64)]


def as_dict(s: C.Structure) -> dict:
    """The fields after struct_size, as plain Python values (not the reserved ones: they fill
    what would be trailing padding and are always 0)."""
    return {name: getattr(s, name) for name, _ in s._fields_
            if name != "struct_size" and not name.startswith("reserved")}


LOG_FN = C.CFUNCTYPE(None, C.c_int, C.c_char_p, C.c_void_p)
# flame_feature_fetch_fn(user, ids, n, batch) -> flame_status
FETCH_FN = C.CFUNCTYPE(C.c_int, C.c_void_p, I64P, C.c_size_t, C.c_void_p)
# flame_score_done_fn(user, status, message)
DONE_FN = C.CFUNCTYPE(None, C.c_void_p, C.c_int, C.c_char_p)


# ---- flame/kernels.h: the embedding bag and SUMI attention


class EmbeddingTable(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("dtype", C.c_int), ("pooling", C.c_int), ("rows", C.c_int64),
                ("dim", C.c_int32), ("data", C.c_void_p), ("qparams", F32P)]


class EmbeddingBagParams(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("device", C.c_int32), ("combine", C.c_int),
                ("tables", C.POINTER(EmbeddingTable)), ("num_tables", C.c_size_t), ("borrow", C.c_int32),
                ("reserved0", C.c_uint32)]


class EmbeddingBagInput(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ids", I64P), ("offsets", I64P), ("num_ids", C.c_int64),
                ("weights", F32P)]


class EmbeddingBagBatch(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("batch", C.c_int64), ("inputs", C.POINTER(EmbeddingBagInput)),
                ("num_inputs", C.c_size_t), ("out", C.c_void_p), ("ld_out", C.c_int64), ("out_dtype", C.c_int),
                ("cuda_stream", C.c_void_p), ("threads", C.c_int32), ("device_indices", C.c_int64)]


class AttentionParams(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("device", C.c_int32), ("dtype", C.c_int), ("mask", C.c_int),
                ("heads", C.c_int32), ("head_dim", C.c_int32), ("num_seqs", C.c_int64), ("cu_history", I64P),
                ("cu_candidates", I64P), ("rows", C.c_int64), ("qkv", C.c_void_p), ("ld_qkv", C.c_int64),
                ("q", C.c_void_p), ("k", C.c_void_p), ("v", C.c_void_p), ("ld_q", C.c_int64), ("ld_k", C.c_int64),
                ("ld_v", C.c_int64), ("out", C.c_void_p), ("ld_out", C.c_int64), ("cuda_stream", C.c_void_p),
                ("threads", C.c_int32), ("reserved0", C.c_uint32)]
