"""ctypes mirrors of the public structs of include/flame/flame.h, field by field.

Every struct starts with struct_size, which the library reads to know which fields the
caller has; `new(cls)` sets it, so appending fields here (when flame.h appends them) keeps
older libraries working.
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
    _fields_ = [("offsets", I64P), ("ids", I64P)]


class Request(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("user_id", C.c_int64),
                ("history", I64P), ("history_len", C.c_size_t),
                ("candidates", I64P), ("num_candidates", C.c_size_t),
                ("history_side", C.POINTER(Bags)), ("candidate_side", C.POINTER(Bags)),
                ("num_side_features", C.c_size_t),
                ("history_from_user_cache", C.c_int32)]


class EngineStats(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("calls", C.c_uint64), ("requests", C.c_uint64),
                ("workspaces", C.c_uint64), ("scratch_bytes", C.c_uint64),
                ("max_workspace_bytes", C.c_uint64), ("device_bytes", C.c_uint64),
                ("device_weight_bytes", C.c_uint64), ("graph_captures", C.c_uint64),
                ("graph_replays", C.c_uint64), ("user_cache_hits", C.c_uint64),
                ("user_cache_misses", C.c_uint64)]


def as_dict(s: C.Structure) -> dict:
    """The fields after struct_size, as plain Python values."""
    return {name: getattr(s, name) for name, _ in s._fields_ if name != "struct_size"}


LOG_FN = C.CFUNCTYPE(None, C.c_int, C.c_char_p, C.c_void_p)
