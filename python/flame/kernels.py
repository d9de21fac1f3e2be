"""The engine's kernels for custom pipelines (flame/kernels.h): the table-batched embedding bag
and SUMI attention, on the CPU and on CUDA GPUs, over numpy arrays and, through DLPack, over
PyTorch tensors (or any object with __dlpack__), without a copy.

    import numpy as np, flame.kernels as fk
    bag = fk.EmbeddingBag([t0, (t1_int8, t1_scale_bias)], pooling=["sum", "mean"])   # concat
    out = bag([ids0, ids1], offsets=[off0, off1], weights=[None, w1])                # float32 [batch, width]
    o = fk.sumi_attention(q, k, v, cu_history, cu_candidates, heads=4)               # float32, packed as q

Tables are float32 or float16 arrays [rows, dim], ("bfloat16", uint16 array) pairs (the bf16
bit patterns), or (int8 array, float32 [rows, 2] (scale, bias)) pairs; torch tensors of those
dtypes (bfloat16 included) are taken as they are. Every id, offset and count is checked by the
library before anything is computed; a bad one raises InvalidArgumentError naming the table
(or sequence), the bag and the value, and the output is left as it was.

PyTorch: given torch tensors, the calls return torch tensors (on the inputs' device). On a GPU
(CUDA tensors) the work is enqueued on the tensors' current stream
(torch.cuda.current_stream(device), or the `stream` argument: a torch.cuda.Stream or a
cudaStream_t as an int) and the call returns without waiting for it, as a torch operation
does. CUDA ids, offsets and weights stay on the device: the library checks them there, and
EmbeddingBag(...)(check=True), the default, then waits for the stream to raise a bad value at
once; check=False leaves the stream alone and bag.index_status() reports later (the first bad
value since the last report; lookups write nothing while one is pending). Attention's
cumulative counts are host data (the library plans its work list from them): CUDA ones are
copied to the host, which waits for the stream, so keep them on the CPU.
"""
from __future__ import annotations

import ctypes as C
import sys
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _arrays, _dlpack, _lib, errors
from ._handle import Handle
from ._structs import (AttentionParams, EmbeddingBagBatch, EmbeddingBagInput, EmbeddingBagParams, EmbeddingTable,
                       F32P, I64P, new)

DEVICE_CPU = -1
F32, F16, BF16, INT8 = 0, 1, 2, 3  # flame_dtype
POOLING = {"sum": 0, "mean": 1}
COMBINE = {"concat": 0, "sum": 1}
MASKS = {"sumi": 0, "causal": 1, "none": 2}

TableLike = Union[np.ndarray, Tuple[Any, Any]]


def _choice(value: str, table: dict, what: str) -> int:
    if value not in table:
        raise errors.InvalidArgumentError(f"{what} {value!r} is not one of {sorted(table)}")
    return table[value]


# ---- inputs from numpy, torch and other DLPack producers

def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _torch():
    import torch  # only reached with torch tensors in hand, so torch is installed
    return torch


def _host(x: Any) -> Any:
    """A numpy view of a CPU DLPack object (zero copy; a torch tensor that requires grad is
    detached first); anything else as it is (numpy takes it)."""
    if _dlpack.has_dlpack(x) and not _dlpack.is_cuda(x):
        if getattr(x, "requires_grad", False):
            x = x.detach()
        return _dlpack.View(x).array()
    return x


def _cuda_device(d: Any) -> Optional[int]:
    """None for the CPU, else the CUDA device index, from 'cpu', 'cuda', 'cuda:N', N, a
    torch.device or None (None: the CPU)."""
    if d is None or d == "cpu" or d == DEVICE_CPU:
        return None
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        n = _arrays.c_int(d, "device", 32)
        if n < 0:
            raise errors.InvalidArgumentError(f"device {n} is no CUDA device index")
        return n
    txt = str(d)
    if txt == "cuda":
        return 0
    if txt.startswith("cuda:") and txt[5:].isdigit():
        return int(txt[5:])
    raise errors.InvalidArgumentError(f"device {d!r} is neither 'cpu' nor 'cuda[:N]'")


def _stream_handle(device: int, stream: Any) -> int:
    """The cudaStream_t (as an int, 0 for the legacy default stream) a GPU call runs on."""
    if stream is not None:
        return int(getattr(stream, "cuda_stream", stream))
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            return int(torch.cuda.current_stream(device).cuda_stream)
    return 0


def _used_on(device: int, handle: int, tensors: List[Any]) -> None:
    """Torch tensors a call made (ids converted to int64, an output it allocated) come from torch's
    caching allocator on the current stream, and the library reads or writes them on `handle`.
    When that is another stream the allocator is told (record_stream), so that their memory,
    once freed, goes to no later allocation before the library's work on `handle` is done."""
    made = [t for t in tensors if t is not None and _is_torch(t)]
    if not made:
        return
    torch = _torch()
    if handle == int(torch.cuda.current_stream(device).cuda_stream):
        return
    s = torch.cuda.ExternalStream(handle, device=device) if handle else torch.cuda.default_stream(device)
    for t in made:
        t.record_stream(s)


def _dl_stream(handle: int) -> int:
    """The DLPack stream argument for a cudaStream_t: 1 means the legacy default stream."""
    return handle if handle else 1


def _c_stream(handle: int) -> Optional[int]:
    return handle or None


class _Cuda:
    """The CUDA views of one call, closed (their deleters called) when the call has been enqueued.
    The producers' tensors are the caller's: they stay alive as long as the caller holds them,
    and the work runs on their stream, in the order torch's own operations would."""

    def __init__(self, device: int, stream: int):
        self.device, self.stream, self.views = device, stream, []

    def view(self, x: Any, what: str) -> _dlpack.View:
        if getattr(x, "requires_grad", False):
            x = x.detach()
        v = _dlpack.View(x, stream=_dl_stream(self.stream))
        self.views.append(v)
        if not v.on_cuda or v.device[1] != self.device:
            raise errors.InvalidArgumentError(f"{what} is on DLPack device {v.device}, the call runs on cuda:"
                                              f"{self.device}")
        return v

    def close(self) -> None:
        for v in self.views:
            v.close()
        self.views = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _unit_columns(v: _dlpack.View, what: str, ndim: int) -> int:
    """The row stride (elements) of a [rows, cols] view whose columns are contiguous; for ndim 1
    a contiguous vector (returns 1)."""
    if v.ndim != ndim:
        raise errors.ShapeError(f"{what} must be {ndim}-D, not {v.ndim}-D {v.shape}")
    if ndim == 1:
        if v.shape[0] > 1 and v.strides[0] != 1:
            raise errors.ShapeError(f"{what} must be contiguous (stride {v.strides[0]}): pass .contiguous()")
        return 1
    rows, cols = v.shape
    if cols > 1 and v.strides[1] != 1:
        raise errors.ShapeError(f"{what} must have unit column stride, not {v.strides[1]}: pass .contiguous()")
    ld = v.strides[0] if rows > 1 else cols
    if rows > 1 and ld < cols:
        raise errors.ShapeError(f"{what}: row stride {ld} is below its {cols} columns")
    return max(ld, 1)


_DL_FLOAT = {(_dlpack.KDL_FLOAT, 32): 0, (_dlpack.KDL_FLOAT, 16): 1, (_dlpack.KDL_BFLOAT, 16): 2}
_TORCH_OUT = {0: "float32", 1: "float16", 2: "bfloat16"}
OUT_DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}
# host outputs: numpy has no bfloat16, so a bfloat16 output is its bit patterns (as bfloat16 tables are given)
_NP_OUT = {0: np.dtype(np.float32), 1: np.dtype(np.float16), 2: np.dtype(np.uint16)}
_NP_OUT_NAME = {0: "float32", 1: "float16", 2: "uint16 (bfloat16 bit patterns)"}


def _i64(a: Any, what: str) -> np.ndarray:
    x = np.asarray(_host(a))
    if x.dtype.kind not in "iu":
        raise errors.DTypeError(f"{what} must hold integers, not {x.dtype}")
    if x.ndim != 1:
        raise errors.ShapeError(f"{what} must be 1-D, got shape {x.shape}")
    if x.dtype == np.uint64 and x.size:  # converted, 2**63 would reach the library as -2**63
        big = np.flatnonzero(x > np.iinfo(np.int64).max)
        if big.size:
            raise errors.InvalidArgumentError(f"{what}[{big[0]}] = {x[big[0]]} does not fit int64")
    return np.ascontiguousarray(x, dtype=np.int64)


def _weights(a: Any, what: str) -> np.ndarray:
    """Host weights as float32 in the shape given (checked against the ids' by the caller: not
    flattened, so a [1, n] array is not taken for n weights)."""
    x = np.asarray(_host(a))
    if x.dtype.kind not in "fiu":
        raise errors.DTypeError(f"{what} must hold numbers, not {x.dtype}")
    return np.ascontiguousarray(x, dtype=np.float32).reshape(x.shape)


def _ptr(a: Optional[np.ndarray], t) -> Any:
    return None if a is None else a.ctypes.data_as(t)


class EmbeddingBag(Handle):
    """A table-batched embedding bag (flame_embedding_bag_create) on the CPU or a CUDA GPU.

    tables: one entry per table (see the module docstring): numpy arrays or CPU tensors, or
      CUDA tensors (DLPack) on the handle's device.
    pooling: "sum" or "mean", for every table or one per table.
    combine: "concat" (table t owns its own columns, in order) or "sum" (equal dims, added).
    copy: True (default) copies host tables into the handle, each in its own dtype (a float16
      or bfloat16 table takes half the memory of a float32 one; on a GPU: uploads them); False
      borrows host tables of every dtype in place on the CPU (this object keeps the arrays
      alive): they (and int8 tables' qparams) must be C-contiguous and of exactly that dtype,
      else ShapeError/DTypeError; a read-only array (a read-only mmap, bytes) may be borrowed,
      and update_rows then refuses its table. CUDA tables are always used in place (borrowed:
      this object keeps them alive and update_rows writes into them).
    device: None (default: cuda:N when the tables are CUDA tensors, else the CPU), "cpu",
      "cuda", "cuda:N" or N.
    threads: the threads of each CPU call, the caller and libflame's pool (its default); on a
      GPU, the threads that validate and stage host index arrays (device ids need none).
    Thread-safety: calls from several threads are safe; update_rows excludes running lookups on
      the CPU and is ordered by the stream on a GPU.
    """

    _destroy, _what = "flame_embedding_bag_destroy", "embedding bag"

    def __init__(self, tables: Sequence[TableLike], pooling: Union[str, Sequence[str]] = "sum",
                 combine: str = "concat", copy: bool = True, threads: int = 1, device: Any = None):
        self._handle = C.c_void_p()
        tables = list(tables)
        if not tables:
            raise errors.ShapeError("tables is empty")
        pools = [pooling] * len(tables) if isinstance(pooling, str) else list(pooling)
        if len(pools) != len(tables):
            raise errors.ShapeError(f"{len(pools)} poolings for {len(tables)} tables")
        on_cuda = [_dlpack.is_cuda(t[0] if isinstance(t, tuple) and not isinstance(t[0], str) else t) for t in tables]
        if device is None:
            cuda_tabs = [t for t, c in zip(tables, on_cuda) if c]
            if cuda_tabs:
                first = cuda_tabs[0][0] if isinstance(cuda_tabs[0], tuple) else cuda_tabs[0]
                device = _dlpack.device_of(first)[1]
        self.device = _cuda_device(device)
        if any(on_cuda) and (self.device is None or not all(on_cuda)):
            raise errors.InvalidArgumentError("tables must all be host arrays or all CUDA tensors of the handle's "
                                              "device (CUDA tables are borrowed in place)")
        borrow = all(on_cuda) if self.device is not None else not copy
        descs = (EmbeddingTable * len(tables))()
        self._keep: List[Any] = []
        self._cuda_tables: List[_dlpack.View] = []
        self.dtypes: List[int] = []
        self.dims: List[int] = []
        self._read_only: List[int] = []  # borrowed host tables update_rows may not write
        for i, (t, pool) in enumerate(zip(tables, pools)):
            if on_cuda[i]:
                data_ptr, qp_ptr, shape, dt = self._cuda_table(i, t)
            else:
                data, qp, dt = self._table(i, t, borrow)
                data_ptr, qp_ptr, shape = data.ctypes.data, _ptr(qp, F32P), data.shape
                self._keep += [data] + ([qp] if qp is not None else [])
                if borrow and not all(x.flags.writeable for x in (data, qp) if x is not None):
                    self._read_only.append(i)
            d = descs[i]
            d.struct_size = C.sizeof(EmbeddingTable)
            d.dtype, d.pooling = dt, _choice(pool, POOLING, f"table {i}: pooling")
            d.rows, d.dim = shape
            d.data = data_ptr
            d.qparams = qp_ptr
            self.dtypes.append(dt)
            self.dims.append(int(shape[1]))
        threads = _arrays.c_int(threads, "threads", 32)
        p = new(EmbeddingBagParams)
        p.device, p.combine = (DEVICE_CPU if self.device is None else self.device), _choice(combine, COMBINE, "combine")
        p.tables, p.num_tables, p.borrow = descs, len(tables), 1 if borrow else 0
        _lib.check(_lib.lib().flame_embedding_bag_create(C.byref(p), C.byref(self._handle)))
        if p.borrow == 0:
            self._keep, self._read_only = [], []  # copied: the arrays are no longer needed
        self.num_tables = len(tables)
        self.threads = threads
        self.width = int(_lib.lib().flame_embedding_bag_width(self._handle))

    def _cuda_table(self, i: int, t: Any) -> Tuple[int, Optional[int], Tuple[int, int], int]:
        """A borrowed CUDA table: (data pointer, qparams pointer, shape, dtype); the views stay
        open (the producer's memory alive) as long as this handle."""
        data, qp = (t[0], t[1]) if isinstance(t, tuple) else (t, None)
        keep = self._cuda_tables
        for x in ((data,) if qp is None else (data, qp)):
            keep.append(_dlpack.View(x.detach() if getattr(x, "requires_grad", False) else x))
        v = keep[-1] if qp is None else keep[-2]
        if v.ndim != 2 or (v.shape[0] > 1 and v.strides != (v.shape[1], 1)) or (v.shape[1] > 1 and v.strides[1] != 1):
            raise errors.ShapeError(f"table {i}: a CUDA table is a contiguous 2-D [rows, dim] tensor, not shape "
                                    f"{v.shape} strides {v.strides}")
        if qp is not None:
            q = keep[-1]
            if v.dtype != (_dlpack.KDL_INT, 8):
                raise errors.DTypeError(f"table {i}: a quantized table is int8, not {v.dtype_name}")
            if q.dtype != (_dlpack.KDL_FLOAT, 32) or q.shape != (v.shape[0], 2) or q.strides != (2, 1):
                raise errors.ShapeError(f"table {i}: qparams must be a contiguous float32 [{v.shape[0]}, 2] tensor")
            return v.ptr, q.ptr, v.shape, INT8
        dt = _DL_FLOAT.get(v.dtype)
        if dt is None:
            raise errors.DTypeError(f"table {i}: dtype {v.dtype_name} (float32, float16, bfloat16, or int8 with "
                                    f"qparams)")
        return v.ptr, None, v.shape, dt


    @staticmethod
    def _table(i: int, t: TableLike, borrow: bool) -> Tuple[np.ndarray, Optional[np.ndarray], int]:
        """(data, qparams, dtype) of a host table; a borrowed table is used in place, so it must
        be C-contiguous and of its own dtype (a silent copy would leave the caller's array
        behind: update_rows would miss it)."""
        def in_place(x: Any, what: str, dtype: Any = None) -> np.ndarray:
            a = np.asarray(x)
            if borrow and not a.flags.c_contiguous:
                raise errors.ShapeError(f"table {i}: copy=False borrows the {what} in place: it must be C-contiguous "
                                        f"(strides {a.strides}); pass copy=True")
            if borrow and dtype is not None and a.dtype != dtype:
                raise errors.DTypeError(f"table {i}: copy=False borrows the {what} in place: it must be {np.dtype(dtype)}, "
                                        f"not {a.dtype}; pass copy=True")
            return np.ascontiguousarray(a, dtype=dtype)
        if isinstance(t, tuple) and len(t) == 2 and not isinstance(t[0], str):
            t = (_host(t[0]), _host(t[1]))
        elif _dlpack.has_dlpack(t):
            v = _dlpack.View(t.detach() if getattr(t, "requires_grad", False) else t)
            if v.dtype == (_dlpack.KDL_BFLOAT, 16):  # its numpy view holds the bit patterns
                t = ("bfloat16", v.array())
            else:
                t = v.array()
        if isinstance(t, tuple):
            if len(t) != 2:
                raise errors.ShapeError(f"table {i}: a pair (int8 array, qparams) or ('bfloat16', uint16 array)")
            if isinstance(t[0], str):
                if t[0] != "bfloat16":
                    raise errors.DTypeError(f"table {i}: dtype name {t[0]!r} (only 'bfloat16' is given by name)")
                a = in_place(t[1], "bfloat16 table")
                if a.dtype != np.uint16 or a.ndim != 2:
                    raise errors.DTypeError(f"table {i}: bfloat16 tables are 2-D uint16 arrays of bit patterns")
                return a, None, BF16
            a, qp = in_place(t[0], "int8 table"), in_place(t[1], "qparams", np.float32)
            if a.dtype != np.int8 or a.ndim != 2:
                raise errors.DTypeError(f"table {i}: a quantized table is a 2-D int8 array, not {a.dtype} {a.shape}")
            if qp.shape != (a.shape[0], 2):
                raise errors.ShapeError(f"table {i}: qparams has shape {qp.shape}, the table needs ({a.shape[0]}, 2)")
            return a, qp, INT8
        a = np.asarray(t)
        if a.dtype in (np.float32, np.float16):
            a = in_place(a, f"{a.dtype} table")
        a = np.ascontiguousarray(a)
        if a.ndim != 2:
            raise errors.ShapeError(f"table {i}: a table is 2-D [rows, dim], not {a.shape}")
        if a.dtype == np.float32:
            return a, None, F32
        if a.dtype == np.float16:
            return a, None, F16
        raise errors.DTypeError(f"table {i}: dtype {a.dtype} (float32, float16, or the pairs of the docstring)")

    def __call__(self, ids: Sequence[Any], offsets: Optional[Sequence[Any]] = None,
                 weights: Optional[Sequence[Any]] = None, out: Any = None,
                 threads: Optional[int] = None, out_dtype: str = "float32", stream: Any = None,
                 check: bool = True) -> Any:
        """Pools one batch: ids[t] (int64 ids of table t), offsets[t] ([batch + 1] bag bounds,
        or None: one id per bag), weights[t] (a float32 per id, in ids[t]'s shape, or None;
        ShapeError otherwise). Returns out ([batch, width] of out_dtype, made when not given: a
        torch tensor when torch tensors were given, else numpy; a given one may have a row
        stride). out_dtype "float32", "float16" or "bfloat16" on every device, whatever the
        tables' dtypes: pooled in float32, then rounded once to nearest even. CPU handles take
        host arrays; a numpy bfloat16 output is a uint16 array of bit patterns (as bfloat16
        tables are given), a torch one a bfloat16 tensor. GPU handles take the index arrays all
        on the host or all as CUDA tensors of the handle's device (checked on the device; see
        the module docstring for check and stream), and need torch (or a CUDA `out`) for the
        output."""
        n = self.num_tables
        ids = list(ids)
        offs = [None] * n if offsets is None else list(offsets)
        ws = [None] * n if weights is None else list(weights)
        if len(ids) != n or len(offs) != n or len(ws) != n:
            raise errors.ShapeError(f"ids, offsets and weights need one entry per table ({n}): got "
                                    f"{len(ids)}, {len(offs)}, {len(ws)}")
        odt = _choice(out_dtype, OUT_DTYPES, "out_dtype")
        given = [x for x in ids + offs + ws if x is not None]
        use_torch = any(_is_torch(x) for x in given + [out])
        on_dev = [_dlpack.is_cuda(x) for x in given]
        if any(on_dev) and (self.device is None or not all(on_dev)):
            raise errors.InvalidArgumentError("ids, offsets and weights must all be host arrays or all CUDA tensors "
                                              "of the handle's device")
        if self.device is not None:
            return self._forward_gpu(ids, offs, ws, out, odt, stream, check, use_torch, all(on_dev) and bool(given),
                                     self.threads if threads is None else _arrays.c_int(threads, "threads", 32))
        inputs, batch, keep = self._host_inputs(ids, offs, ws)
        result = None
        if out is None and use_torch:
            result = _torch().empty((batch, self.width), dtype=getattr(_torch(), _TORCH_OUT[odt]))
            out = result
        if _dlpack.has_dlpack(out):
            result = out if result is None else result
            out = _dlpack.View(out).array()  # a bfloat16 tensor: its uint16 bit patterns
        np_out = _NP_OUT[odt]
        size = np_out.itemsize
        if out is None:
            out = np.empty((batch, self.width), dtype=np_out)
        elif (out.dtype != np_out or out.ndim != 2 or out.shape != (batch, self.width) or not out.flags.writeable
              or (out.size and ((self.width > 1 and out.strides[1] != size)
                                or (batch > 1 and (out.strides[0] % size or out.strides[0] < size * self.width))))):
            raise errors.ShapeError(f"out must be a writeable {_NP_OUT_NAME[odt]} [{batch}, {self.width}] array with "
                                    f"unit column stride, got {out.dtype} {out.shape}")
        q = new(EmbeddingBagBatch)
        q.batch, q.inputs, q.num_inputs = batch, inputs, n
        q.out, q.ld_out, q.out_dtype = out.ctypes.data, out.strides[0] // size if batch > 1 else 0, odt
        q.threads = self.threads if threads is None else _arrays.c_int(threads, "threads", 32)
        with self._use() as h:
            _lib.check(_lib.lib().flame_embedding_bag_forward(h, C.byref(q)))
        del keep
        return out if result is None else result

    def _host_inputs(self, ids, offs, ws):
        n = self.num_tables
        keep = []
        inputs = (EmbeddingBagInput * n)()
        batch = None
        for t in range(n):
            i = _i64(ids[t], f"ids[{t}]")
            o = None if offs[t] is None else _i64(offs[t], f"offsets[{t}]")
            w = None if ws[t] is None else _weights(ws[t], f"weights[{t}]")
            if w is not None and w.shape != i.shape:
                raise errors.ShapeError(f"table {t}: weights[{t}] has shape {w.shape}, ids[{t}] has shape {i.shape} "
                                        "(one weight per id)")
            if o is not None and o.size == 0:
                raise errors.ShapeError(f"table {t}: offsets needs batch + 1 entries, got none")
            b = i.size if o is None else o.size - 1
            if batch is None:
                batch = b
            elif b != batch:
                raise errors.ShapeError(f"table {t}: a batch of {b} bags, table 0 has {batch}")
            keep += [i, o, w]
            x = inputs[t]
            x.struct_size, x.ids, x.offsets, x.num_ids = C.sizeof(EmbeddingBagInput), _ptr(i, I64P), _ptr(o, I64P), i.size
            x.weights = _ptr(w, F32P)
        return inputs, batch, keep

    def _forward_gpu(self, ids, offs, ws, out, odt, stream, check, use_torch, device_indices, threads):
        n, dev = self.num_tables, self.device
        sh = _stream_handle(dev, stream)
        with _Cuda(dev, sh) as cu:
            if device_indices:
                inputs = (EmbeddingBagInput * n)()
                batch, keep, made = None, [], []
                for t in range(n):
                    i = ids[t]
                    if _is_torch(i) and i.dtype != _torch().int64:  # a device op on the current stream
                        i = i.to(_torch().int64)
                        made.append(i)
                    o = offs[t]
                    if o is not None and _is_torch(o) and o.dtype != _torch().int64:
                        o = o.to(_torch().int64)
                        made.append(o)
                    keep += [i, o]
                    vi = cu.view(i, f"ids[{t}]")
                    vo = None if o is None else cu.view(o, f"offsets[{t}]")
                    vw = None if ws[t] is None else cu.view(ws[t], f"weights[{t}]")
                    for v, what, want in ((vi, "ids", (_dlpack.KDL_INT, 64)), (vo, "offsets", (_dlpack.KDL_INT, 64)),
                                          (vw, "weights", (_dlpack.KDL_FLOAT, 32))):
                        if v is None:
                            continue
                        if v.dtype != want:
                            raise errors.DTypeError(f"{what}[{t}] is {v.dtype_name}, not {_dlpack.DTYPE_NAMES[want]}")
                        _unit_columns(v, f"{what}[{t}]", 1)
                    num = vi.shape[0]
                    if vw is not None and vw.shape[0] != num:
                        raise errors.ShapeError(f"table {t}: {vw.shape[0]} weights for {num} ids")
                    if vo is not None and vo.shape[0] == 0:
                        raise errors.ShapeError(f"table {t}: offsets needs batch + 1 entries, got none")
                    b = num if vo is None else vo.shape[0] - 1
                    if batch is None:
                        batch = b
                    elif b != batch:
                        raise errors.ShapeError(f"table {t}: a batch of {b} bags, table 0 has {batch}")
                    x = inputs[t]
                    x.struct_size, x.num_ids = C.sizeof(EmbeddingBagInput), num
                    x.ids = C.cast(C.c_void_p(vi.ptr), I64P) if num else None
                    x.offsets = None if vo is None else C.cast(C.c_void_p(vo.ptr), I64P)
                    x.weights = None if vw is None or not num else C.cast(C.c_void_p(vw.ptr), F32P)
            else:
                inputs, batch, keep = self._host_inputs(ids, offs, ws)
                made = []
            result = out
            if out is None:
                if not use_torch and "torch" not in sys.modules:
                    raise errors.InvalidArgumentError("a GPU lookup needs `out` (a CUDA tensor) when torch is not in use")
                torch = _torch()
                result = torch.empty((batch, self.width), dtype=getattr(torch, _TORCH_OUT[odt]),
                                     device=f"cuda:{dev}")
                made.append(result)
            vout = cu.view(result, "out")
            if _DL_FLOAT.get(vout.dtype) != odt or vout.shape != (batch, self.width):
                raise errors.ShapeError(f"out must be [{batch}, {self.width}] of {_TORCH_OUT[odt]}, got "
                                        f"{vout.dtype_name} {vout.shape}")
            ld = _unit_columns(vout, "out", 2)
            q = new(EmbeddingBagBatch)
            q.batch, q.inputs, q.num_inputs = batch, inputs, n
            q.out, q.ld_out, q.out_dtype = vout.ptr, ld, odt
            q.cuda_stream, q.device_indices = _c_stream(sh), 1 if device_indices else 0
            q.threads = threads
            with self._use() as h:
                _lib.check(_lib.lib().flame_embedding_bag_forward(h, C.byref(q)))
                _used_on(dev, sh, made)
                if device_indices and check:
                    _lib.check(_lib.lib().flame_embedding_bag_index_status(h, _c_stream(sh)))
            del keep
        return result

    def index_status(self, stream: Any = None) -> None:
        """Raises InvalidArgumentError for the first bad value the device-index lookups of a GPU
        handle found since the last report (and clears it); waits for the stream (default: the
        current torch stream of the handle's device). Nothing to report on a CPU handle."""
        sh = 0 if self.device is None else _stream_handle(self.device, stream)
        with self._use() as h:
            _lib.check(_lib.lib().flame_embedding_bag_index_status(h, _c_stream(sh)))

    def update_rows(self, table: int, first_row: int, values: Any, qparams: Any = None, stream: Any = None) -> None:
        """Replaces rows first_row.. of `table` with `values` ([n, dim]: for a float32 or
        float16 table any real numbers, converted, refused if one overflows the dtype; for an
        int8 or bfloat16 table exactly its dtype, never cast (bfloat16 as uint16 bit patterns
        or a bfloat16 tensor); int8 tables also take qparams [n, 2], converted to float32): host data (numpy or CPU tensors; CUDA tensors are
        copied to the host first, which waits for their stream). On a GPU the copy is enqueued
        on `stream` (default: the current torch stream), ordered with the lookups there."""
        def host(x):
            if x is not None and _dlpack.is_cuda(x) and _is_torch(x):
                x = x.cpu()
            x = _host(x)
            if _is_torch(x):
                x = _dlpack.View(x).array()
            return x
        table = _arrays.c_int(table, "table", 32)
        first_row = _arrays.c_int(first_row, "first_row", 64)
        values, qparams = host(values), host(qparams)
        sh = 0 if self.device is None else _stream_handle(self.device, stream)
        dt = self.dtypes[table] if 0 <= table < self.num_tables else F32
        np_dt = np.dtype({F32: np.float32, F16: np.float16, BF16: np.uint16, INT8: np.int8}[dt])
        v = np.asarray(values)
        if 0 <= table < self.num_tables and v.dtype != np_dt:
            if dt in (INT8, BF16) or v.dtype.kind not in "fiu":  # a cast would wrap int8, or misread bf16 bits
                raise errors.DTypeError(f"values are {v.dtype}; table {table} holds {np_dt}"
                                        f"{' (bfloat16 bit patterns)' if dt == BF16 else ''}: convert them first")
            with np.errstate(over="ignore", invalid="ignore"):
                cast = v.astype(np_dt)
            bad = np.flatnonzero(np.isfinite(v) & ~np.isfinite(cast)) if v.dtype.kind == "f" else []
            if len(bad) or (v.dtype.kind in "iu" and cast.size and not np.array_equal(cast, v)):
                raise errors.InvalidArgumentError(f"values: {v.flat[bad[0]] if len(bad) else 'an integer'} does not fit "
                                                  f"table {table}'s {np_dt}")
            v = cast
        if table in self._read_only:
            raise errors.InvalidArgumentError(f"table {table} is borrowed read-only memory (copy=False of a "
                                              f"non-writeable array): update_rows would write into it")
        v = np.ascontiguousarray(v)
        if v.ndim != 2:
            raise errors.ShapeError(f"values must be 2-D [rows, dim], not {v.shape}")
        if 0 <= table < self.num_tables and v.shape[1] != self.dims[table]:
            raise errors.ShapeError(f"values have {v.shape[1]} columns, table {table} has dim {self.dims[table]}")
        qp = None if qparams is None else np.ascontiguousarray(qparams, dtype=np.float32)
        if qp is not None and qp.shape != (v.shape[0], 2):
            raise errors.ShapeError(f"qparams has shape {qp.shape}, the rows need ({v.shape[0]}, 2)")
        with self._use() as h:
            _lib.check(_lib.lib().flame_embedding_bag_update_rows(h, table, first_row, v.shape[0],
                                                                  v.ctypes.data, dt, _ptr(qp, F32P), _c_stream(sh)))

    def __repr__(self) -> str:
        return f"<flame.kernels.EmbeddingBag {self.num_tables} tables width {getattr(self, 'width', '?')}>"


def _rows(a: Any, what: str) -> np.ndarray:
    x = np.asarray(a)
    if x.dtype != np.float32:
        raise errors.DTypeError(f"{what} must be float32 on the CPU, not {x.dtype}")
    if x.ndim != 2:
        raise errors.ShapeError(f"{what} must be 2-D [rows, columns], not {x.shape}")
    if x.size and ((x.shape[1] > 1 and x.strides[1] != 4) or (x.shape[0] > 1 and (x.strides[0] % 4 or x.strides[0] < 0))):
        raise errors.ShapeError(f"{what} must be 2-D [rows, columns] with unit column stride")
    return x


def _counts(a: Any, what: str) -> np.ndarray:
    if a is not None and _dlpack.is_cuda(a) and _is_torch(a):
        a = a.cpu()  # host data for the call's planning: this waits for the tensor's stream
    return _i64(a, what)


def sumi_attention(q: Any = None, k: Any = None, v: Any = None, cu_history: Any = None, cu_candidates: Any = None,
                   *, heads: int, qkv: Any = None, mask: str = "sumi", out: Any = None,
                   threads: int = 1, stream: Any = None) -> Any:
    """Masked multi-head attention over a ragged batch (flame_sumi_attention), on the CPU
    (numpy arrays or CPU tensors, float32) or a GPU (CUDA tensors: float16, bfloat16 or float32,
    enqueued on `stream`, by default the current torch stream of their device).

    q, k, v: [rows, heads * head_dim] (views with a row stride allowed; k and v share one), or
      qkv: [rows, 3 * heads * head_dim] (Q, K, V side by side) instead.
    cu_history, cu_candidates: int64 [num_seqs + 1] cumulative counts, host data (see the
      module docstring); sequence s is rows cu_history[s] + cu_candidates[s] .., history first
      (cu_candidates None: no candidates).
    mask: "sumi" (history causal; a candidate sees the history and itself), "causal", "none".
    Returns out, [rows, heads * head_dim] of the inputs' dtype (made when not given: a torch
    tensor when torch tensors were given, else numpy).
    """
    if cu_history is None:
        raise errors.InvalidArgumentError("cu_history is required")
    ch = _counts(cu_history, "cu_history")
    cc = None if cu_candidates is None else _counts(cu_candidates, "cu_candidates")
    if ch.size == 0 or (cc is not None and cc.size != ch.size):
        raise errors.ShapeError(f"cu_history ({ch.size}) and cu_candidates ({None if cc is None else cc.size}) need "
                                f"num_seqs + 1 entries each")
    p = new(AttentionParams)
    p.mask = _choice(mask, MASKS, "mask")
    p.heads = heads = _arrays.c_int(heads, "heads", 32)
    if heads < 1:
        raise errors.InvalidArgumentError(f"heads must be a positive int, got {heads}")
    threads = _arrays.c_int(threads, "threads", 32)
    p.num_seqs, p.cu_history, p.cu_candidates = ch.size - 1, _ptr(ch, I64P), _ptr(cc, I64P)
    if qkv is not None:
        if q is not None or k is not None or v is not None:
            raise errors.InvalidArgumentError("give either qkv or q, k and v")
        names, tensors = ["qkv"], [qkv]
    else:
        if q is None or k is None or v is None:
            raise errors.InvalidArgumentError("give q, k and v (or qkv)")
        names, tensors = ["q", "k", "v"], [q, k, v]
    use_torch = any(_is_torch(x) for x in tensors + [out])
    cuda = [_dlpack.is_cuda(x) for x in tensors]
    if any(cuda):
        if not all(cuda) or (out is not None and not _dlpack.is_cuda(out)):
            raise errors.InvalidArgumentError("q, k, v (or qkv) and out must all be on the host or all CUDA tensors")
        dev = _dlpack.device_of(tensors[0])[1]
        sh = _stream_handle(dev, stream)
        with _Cuda(dev, sh) as cu:
            views = [cu.view(x, nm) for x, nm in zip(tensors, names)]
            dt = _DL_FLOAT.get(views[0].dtype)
            if dt is None or any(vw.dtype != views[0].dtype for vw in views):
                raise errors.DTypeError(f"{', '.join(names)} must share one dtype of float16, bfloat16 or float32, "
                                        f"got {[vw.dtype_name for vw in views]}")
            arrs = [(vw.ptr, vw.shape, _unit_columns(vw, nm, 2)) for vw, nm in zip(views, names)]
            rows, width = _layout(p, arrs, qkv is not None, heads)
            result = out
            if out is None:
                if "torch" not in sys.modules:
                    raise errors.InvalidArgumentError("GPU attention needs `out` (a CUDA tensor) when torch is not in use")
                torch = _torch()
                result = torch.empty((rows, width), dtype=getattr(torch, _TORCH_OUT[dt]), device=f"cuda:{dev}")
                made = [result]
            else:
                made = []
            vo = cu.view(result, "out")
            if vo.dtype != views[0].dtype or vo.shape != (rows, width):
                raise errors.ShapeError(f"out must be [{rows}, {width}] of {views[0].dtype_name}, got {vo.dtype_name} "
                                        f"{vo.shape}")
            p.device, p.dtype = dev, dt
            p.out, p.ld_out = vo.ptr, _unit_columns(vo, "out", 2)
            p.cuda_stream = _c_stream(sh)
            _finish_layout(p, rows, width, qkv is not None)
            _lib.check(_lib.lib().flame_sumi_attention(C.byref(p)))
            _used_on(dev, sh, made)
        return result
    xs = [_rows(_host(x), nm) for x, nm in zip(tensors, names)]
    arrs = [(x.ctypes.data, x.shape, x.strides[0] // 4) for x in xs]
    rows, width = _layout(p, arrs, qkv is not None, heads)
    result = None
    if out is None and use_torch:
        result = out = _torch().empty((rows, width), dtype=_torch().float32)
    if _dlpack.has_dlpack(out):
        result = out if result is None else result
        out = _dlpack.View(out).array()
    if out is None:
        out = np.empty((rows, width), dtype=np.float32)
    else:
        out = _rows(out, "out")
        if out.shape != (rows, width) or not out.flags.writeable:
            raise errors.ShapeError(f"out must be a writeable float32 [{rows}, {width}] array, got {out.shape}")
    p.device, p.dtype = DEVICE_CPU, F32
    p.out, p.ld_out, p.threads = out.ctypes.data, out.strides[0] // 4, threads
    _finish_layout(p, rows, width, qkv is not None)
    _lib.check(_lib.lib().flame_sumi_attention(C.byref(p)))
    del xs
    return out if result is None else result


def _layout(p: AttentionParams, arrs, fused: bool, heads: int) -> Tuple[int, int]:
    """Sets the Q/K/V pointers and strides from (pointer, shape, row stride) triples; returns
    (rows, heads * head_dim)."""
    if fused:
        ptr, shape, ld = arrs[0]
        if shape[1] % (3 * heads):
            raise errors.ShapeError(f"qkv has {shape[1]} columns, not a multiple of 3 x {heads} heads")
        dh, rows = shape[1] // (3 * heads), shape[0]
        p.qkv, p.ld_qkv = ptr, ld
    else:
        (pq, sq, lq), (pk, sk, lk), (pv, sv, lv) = arrs
        if sk != sq or sv != sq:
            raise errors.ShapeError(f"q {sq}, k {sk} and v {sv} must share one shape "
                                    f"[rows, heads x head_dim] ({heads} heads)")
        if sq[1] % heads:
            raise errors.ShapeError(f"q, k and v have {sq[1]} columns, not a multiple of {heads} heads")
        dh, rows = sq[1] // heads, sq[0]
        p.q, p.k, p.v = pq, pk, pv
        p.ld_q, p.ld_k, p.ld_v = lq, lk, lv
    p.head_dim, p.rows = dh, rows
    return rows, heads * dh


def _finish_layout(p: AttentionParams, rows: int, width: int, fused: bool) -> None:
    if rows <= 1:  # the row stride of an array of 0 or 1 rows may be anything: the packed one is as good
        p.ld_q = p.ld_k = p.ld_v = width
        p.ld_qkv, p.ld_out = (3 * width if fused else 0), width


__all__ = ["EmbeddingBag", "sumi_attention", "DEVICE_CPU", "OUT_DTYPES"]
