"""safetensors reading and writing for F32/F16/BF16 and I8 (int8 tables), numpy only.

numpy has no bfloat16, so BF16 is handled as raw uint16 bits: reading shifts them into the
high half of a float32; writing rounds float32 to nearest-even. I8 tensors (int8 row-wise
quantized tables, flame.quant) are read and written as int8 arrays, never rounded. The
safetensors package does the container work (header, alignment) so that files are written by
an implementation independent of libflame's loader.
"""
import json
import os
import struct

import numpy as np
import safetensors

DTYPES = ("F32", "F16", "BF16")  # float storage dtypes
ALL_DTYPES = DTYPES + ("I8",)     # I8: int8 tables only (flame.quant)
_NUMPY = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "I8": np.dtype("i1")}
_SPEC_NAME = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I8": "int8"}


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bits (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def unique_keys(pairs):
    """json object_pairs_hook refusing a key that appears twice in one object, as libflame's
    loader does (readers disagree on which copy wins)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key '{k[:60]}' appears twice in a JSON object")
        out[k] = v
    return out


def read_header(path):
    """(metadata dict, {name: entry}) straight from the file's JSON header (duplicate keys
    refused)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size < 8:
            raise ValueError(f"{path}: {size} bytes, too short for a safetensors header")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:  # checked before reading: a lying length would allocate it
            raise ValueError(f"{path}: header length {n} exceeds the file size ({size} bytes)")
        try:
            header = json.loads(f.read(n), object_pairs_hook=unique_keys)
        except RecursionError:  # nested deeper than Python's stack (JSONDecodeError is a ValueError)
            raise ValueError(f"{path}: the safetensors header nests too deeply") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    return meta, header


def read(path):
    """(metadata, {name: array}, {name: dtype string}): float32 arrays (F16/BF16 widened
    exactly), int8 arrays for I8 tensors (flame.quant.unpack dequantizes a model's)."""
    meta, _ = read_header(path)
    with open(path, "rb") as f:
        raw = f.read()
    tensors, dtypes = {}, {}
    for name, entry in safetensors.deserialize(raw):
        dt = entry["dtype"]
        if dt not in _NUMPY:
            raise ValueError(f"tensor '{name}' has unsupported dtype '{dt}'")
        a = np.frombuffer(bytes(entry["data"]), dtype=_NUMPY[dt]).reshape(entry["shape"])
        if dt == "I8":
            tensors[name] = a.copy()
        else:
            tensors[name] = bf16_bits_to_f32(a) if dt == "BF16" else a.astype(np.float32)
        dtypes[name] = dt
    return meta, tensors, dtypes


def encode(a, dtype, finite=True):
    """float array (integer array for I8) -> contiguous little-endian array holding `dtype`'s bytes.
    With `finite`, float values must be finite and stay finite in `dtype` (libflame refuses a
    file holding a NaN or Inf weight: F16 ends at 65504); False writes them as they are."""
    if dtype in DTYPES:
        a = np.asarray(a, dtype=np.float32)
        bad = np.flatnonzero(~np.isfinite(a)) if finite else []
        if len(bad):
            raise ValueError(f"value {a.flat[bad[0]]} (flat index {bad[0]}) is not finite")
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is found and named below
            b = f32_to_bf16_bits(a) if dtype == "BF16" else np.ascontiguousarray(a, dtype=_NUMPY[dtype])
        wide = bf16_bits_to_f32(b) if dtype == "BF16" else b
        bad = np.flatnonzero(~np.isfinite(wide)) if finite else []
        if len(bad):
            raise ValueError(f"value {a.flat[bad[0]]} (flat index {bad[0]}) overflows {dtype}")
        return b
    if dtype == "I8":
        a = np.asarray(a)
        if a.dtype != np.int8 and (not np.all(np.isfinite(a)) or np.any(a != np.rint(a)) or np.any(a < -128)
                                   or np.any(a > 127)):
            raise ValueError("I8 needs integers in [-128, 127] (flame.quant.quantize_rows makes them)")
    return np.ascontiguousarray(a, dtype=_NUMPY[dtype])


def write(path, tensors, metadata=None, dtype="F32", finite=True):
    """Writes {name: array} as `dtype` (one of DTYPES, or a {name: dtype} dict whose values
    may also be "I8" for int8 arrays). A NaN or Inf float value, given or made by the
    narrowing, raises ValueError naming the tensor, unless `finite` is False (a file libflame
    must refuse, for tests)."""
    keep, specs = [], {}
    for name, a in tensors.items():
        dt = dtype[name] if isinstance(dtype, dict) else dtype
        if dt not in (ALL_DTYPES if isinstance(dtype, dict) else DTYPES):
            raise ValueError(f"dtype must be one of {DTYPES}, got {dt!r}")
        try:
            b = encode(a, dt, finite)
        except ValueError as e:
            raise ValueError(f"tensor '{name}': {e}") from None
        keep.append(b)
        if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8 takes pointers
            specs[name] = safetensors.TensorSpec(dtype=_SPEC_NAME[dt], shape=list(b.shape),
                                                 data_ptr=b.ctypes.data, data_len=b.nbytes)
        else:
            specs[name] = {"dtype": _SPEC_NAME[dt], "shape": list(b.shape), "data": b.tobytes()}
    safetensors.serialize_file(specs, str(path), metadata=metadata)
    # safetensors writes through a 0600 temporary file: give the file the mode any file this
    # process creates gets (0666 less the umask), so a service account can read a model
    os.chmod(path, 0o666 & ~_umask())


def _umask():
    """The process's umask without changing it (os.umask would, process-wide)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022
