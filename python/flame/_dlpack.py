"""DLPack import for flame.kernels: any object with __dlpack__ / __dlpack_device__ (a PyTorch
tensor, a CuPy or JAX array, a numpy array) becomes a zero-copy view, without the producer's
library being imported here.

The consumer side of the DLPack protocol (https://dmlc.github.io/dlpack/latest/python_spec.html):
__dlpack_device__() says where the data is; __dlpack__(stream=S, max_version=(1, 0)) returns a
PyCapsule named "dltensor_versioned" holding a DLManagedTensorVersioned (DLPack 1.x, with a
read-only flag), or, from a producer of the older protocol (which does not take max_version),
__dlpack__(stream=S) returns one named "dltensor" holding a DLManagedTensor; either after the
producer has made stream S wait for the work that writes the data (S is the stream the
consumer will use: 1 for CUDA's legacy default stream, else a cudaStream_t as an int). The
consumer renames the capsule "used_dltensor[_versioned]" (so the capsule no longer owns the
tensor) and calls the tensor's deleter once it is done with the memory; View does that on
close(), or when it is garbage collected.

CPU views are numpy arrays (View.array) that keep the View, and so the producer's memory,
alive. CUDA views carry the pointer, shape and strides for the C calls.
"""
from __future__ import annotations

import ctypes as C
from typing import Any, Optional, Tuple

import numpy as np

from . import errors

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT = 0, 1, 2, 4


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32), ("dtype", DLDataType),
                ("shape", C.POINTER(C.c_int64)), ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class DLManagedTensor(C.Structure):
    pass


_DELETER = C.CFUNCTYPE(None, C.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", C.c_void_p), ("deleter", _DELETER)]


class DLPackVersion(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32)]


class DLManagedTensorVersioned(C.Structure):
    pass


_DELETER_V = C.CFUNCTYPE(None, C.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", C.c_void_p), ("deleter", _DELETER_V),
                                     ("flags", C.c_uint64), ("dl_tensor", DLTensor)]
FLAG_READ_ONLY = 1

_api = C.pythonapi
_api.PyCapsule_IsValid.restype, _api.PyCapsule_IsValid.argtypes = C.c_int, [C.py_object, C.c_char_p]
_api.PyCapsule_GetPointer.restype, _api.PyCapsule_GetPointer.argtypes = C.c_void_p, [C.py_object, C.c_char_p]
_api.PyCapsule_SetName.restype, _api.PyCapsule_SetName.argtypes = C.c_int, [C.py_object, C.c_char_p]

# (code, bits) -> numpy dtype name, for CPU views; bfloat16 comes as its uint16 bit patterns
_NP = {(KDL_FLOAT, 32): "float32", (KDL_FLOAT, 16): "float16", (KDL_FLOAT, 64): "float64",
       (KDL_INT, 64): "int64", (KDL_INT, 32): "int32", (KDL_INT, 8): "int8", (KDL_UINT, 8): "uint8",
       (KDL_UINT, 16): "uint16", (KDL_BFLOAT, 16): "uint16"}
DTYPE_NAMES = {(KDL_FLOAT, 32): "float32", (KDL_FLOAT, 16): "float16", (KDL_BFLOAT, 16): "bfloat16",
               (KDL_FLOAT, 64): "float64", (KDL_INT, 64): "int64", (KDL_INT, 32): "int32", (KDL_INT, 8): "int8",
               (KDL_UINT, 8): "uint8", (KDL_UINT, 16): "uint16"}


def has_dlpack(x: Any) -> bool:
    return hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__") and not isinstance(x, np.ndarray)


def device_of(x: Any) -> Tuple[int, int]:
    """(DLPack device type, device id) of a DLPack object; (KDL_CPU, 0) for anything else."""
    if not has_dlpack(x):
        return KDL_CPU, 0
    t, i = x.__dlpack_device__()
    return int(t), int(i)


def is_cuda(x: Any) -> bool:
    return device_of(x)[0] in (KDL_CUDA, KDL_CUDA_MANAGED)


class View:
    """One imported DLPack tensor: ptr (data + byte_offset), shape, strides (in elements, the
    compact row-major ones when the producer gave none), dtype ((code, bits)), device
    ((type, id)). The producer's memory stays valid until close()."""

    def __init__(self, obj: Any, stream: Optional[int] = None):
        self._managed = None
        dev = device_of(obj)
        kw = {} if stream is None else {"stream": stream}
        try:
            capsule = obj.__dlpack__(max_version=(1, 0), **kw)
        except TypeError:  # a producer of the older protocol
            capsule = obj.__dlpack__(**kw)
        if _api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
            name, used, kind = b"dltensor_versioned", b"used_dltensor_versioned", DLManagedTensorVersioned
        elif _api.PyCapsule_IsValid(capsule, b"dltensor"):
            name, used, kind = b"dltensor", b"used_dltensor", DLManagedTensor
        else:
            raise errors.InvalidArgumentError(f"{type(obj).__name__}.__dlpack__() did not return a 'dltensor' capsule")
        addr = _api.PyCapsule_GetPointer(capsule, name)
        # from here on this View owns the tensor: the capsule's destructor must not free it
        if _api.PyCapsule_SetName(capsule, used) != 0:
            raise errors.InternalError("PyCapsule_SetName failed")
        self._managed = C.cast(addr, C.POINTER(kind))
        m = self._managed.contents
        if kind is DLManagedTensorVersioned and m.version.major != 1:
            major = int(m.version.major)
            self.close()
            raise errors.UnsupportedError(f"DLPack major version {major} (this reader knows 1)")
        self.read_only = kind is DLManagedTensorVersioned and bool(m.flags & FLAG_READ_ONLY)
        t = m.dl_tensor
        self.device = (int(t.device.device_type), int(t.device.device_id))
        if self.device[0] != dev[0]:
            self.close()
            raise errors.InvalidArgumentError(f"__dlpack_device__ said device type {dev[0]}, the tensor is on "
                                              f"{self.device[0]}")
        self.dtype = (int(t.dtype.code), int(t.dtype.bits))
        lanes = int(t.dtype.lanes)
        self.ndim = int(t.ndim)
        self.shape = tuple(int(t.shape[i]) for i in range(self.ndim))
        if t.strides:
            self.strides = tuple(int(t.strides[i]) for i in range(self.ndim))
        else:  # compact row-major
            st, acc = [], 1
            for n in reversed(self.shape):
                st.append(acc)
                acc *= max(n, 1)
            self.strides = tuple(reversed(st))
        self.itemsize = self.dtype[1] // 8
        self.ptr = (int(t.data or 0) + int(t.byte_offset))
        if lanes != 1 or self.dtype[1] % 8:
            self.close()
            raise errors.DTypeError(f"DLPack dtype (code {self.dtype[0]}, bits {self.dtype[1]}, lanes {lanes}) is "
                                    f"not a plain scalar type")

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES.get(self.dtype, f"(DLPack code {self.dtype[0]}, {self.dtype[1]} bits)")

    @property
    def on_cuda(self) -> bool:
        return self.device[0] in (KDL_CUDA, KDL_CUDA_MANAGED)

    def close(self) -> None:
        m, self._managed = self._managed, None
        if m is not None and m.contents.deleter:
            m.contents.deleter(m)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: ctypes or the producer may already be gone
            pass

    def array(self) -> np.ndarray:
        """A numpy view of a CPU tensor; it keeps this View alive (and closes it when freed)."""
        if self.device[0] not in (KDL_CPU, KDL_CUDA_HOST):
            raise errors.InvalidArgumentError(f"a tensor on DLPack device type {self.device[0]} has no host view")
        name = _NP.get(self.dtype)
        if name is None:
            raise errors.DTypeError(f"DLPack dtype {self.dtype_name} has no numpy equivalent here")
        holder = _Holder(self, np.dtype(name))
        return np.asarray(holder)


class _Holder:
    """__array_interface__ over a View, so that numpy's array keeps the View as its base."""

    def __init__(self, view: View, dtype: np.dtype):
        self.view = view
        size = dtype.itemsize
        self.__array_interface__ = {
            "version": 3, "typestr": dtype.str, "shape": view.shape,
            "strides": tuple(s * size for s in view.strides),
            # a zero-size tensor may have a NULL data pointer, which numpy does not take
            "data": (view.ptr or 16, view.read_only),
        }
