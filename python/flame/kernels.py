"""The engine's kernels for custom pipelines (flame/kernels.h), on the CPU with numpy arrays:
the table-batched embedding bag and SUMI attention.

    import numpy as np, flame.kernels as fk
    bag = fk.EmbeddingBag([t0, (t1_int8, t1_scale_bias)], pooling=["sum", "mean"])   # concat
    out = bag([ids0, ids1], offsets=[off0, off1], weights=[None, w1])                # float32 [batch, width]
    o = fk.sumi_attention(q, k, v, cu_history, cu_candidates, heads=4)               # float32, packed as q

Tables are float32 or float16 arrays [rows, dim], ("bfloat16", uint16 array) pairs (the bf16
bit patterns), or (int8 array, float32 [rows, 2] (scale, bias)) pairs. Every id, offset and
count is checked by the library before anything is computed; a bad one raises
InvalidArgumentError naming the table (or sequence), the bag and the value, and the output
is left as it was.
"""
from __future__ import annotations

import ctypes as C
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib, errors
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


def _i64(a: Any, what: str) -> np.ndarray:
    x = np.asarray(a)
    if x.dtype.kind not in "iu":
        raise errors.DTypeError(f"{what} must hold integers, not {x.dtype}")
    return np.ascontiguousarray(x, dtype=np.int64).reshape(-1)


def _ptr(a: Optional[np.ndarray], t) -> Any:
    return None if a is None else a.ctypes.data_as(t)


class EmbeddingBag(Handle):
    """A table-batched embedding bag on the CPU (flame_embedding_bag_create).

    tables: one entry per table (see the module docstring).
    pooling: "sum" or "mean", for every table or one per table.
    combine: "concat" (table t owns its own columns, in order) or "sum" (equal dims, added).
    copy: True (default) copies the tables into the handle; False borrows float32 and int8
      tables in place (this object keeps the arrays alive); float16 and bfloat16 tables are
      always copied, as float32.
    threads: the OpenMP threads of each call (its default).
    Thread-safety: calls from several threads are safe; update_rows excludes running lookups.
    """

    _destroy, _what = "flame_embedding_bag_destroy", "embedding bag"

    def __init__(self, tables: Sequence[TableLike], pooling: Union[str, Sequence[str]] = "sum",
                 combine: str = "concat", copy: bool = True, threads: int = 1):
        self._handle = C.c_void_p()
        tables = list(tables)
        if not tables:
            raise errors.ShapeError("tables is empty")
        pools = [pooling] * len(tables) if isinstance(pooling, str) else list(pooling)
        if len(pools) != len(tables):
            raise errors.ShapeError(f"{len(pools)} poolings for {len(tables)} tables")
        descs = (EmbeddingTable * len(tables))()
        self._keep: List[np.ndarray] = []
        self.dtypes: List[int] = []
        self.dims: List[int] = []
        for i, (t, pool) in enumerate(zip(tables, pools)):
            data, qp, dt = self._table(i, t)
            d = descs[i]
            d.struct_size = C.sizeof(EmbeddingTable)
            d.dtype, d.pooling = dt, _choice(pool, POOLING, f"table {i}: pooling")
            d.rows, d.dim = data.shape
            d.data = data.ctypes.data
            d.qparams = _ptr(qp, F32P)
            self._keep += [data] + ([qp] if qp is not None else [])
            self.dtypes.append(dt)
            self.dims.append(int(data.shape[1]))
        p = new(EmbeddingBagParams)
        p.device, p.combine = DEVICE_CPU, _choice(combine, COMBINE, "combine")
        p.tables, p.num_tables, p.borrow = descs, len(tables), 0 if copy else 1
        if not copy and any(dt in (F16, BF16) for dt in self.dtypes):
            p.borrow = 0  # the CPU kernel reads float32: these are converted, so copied
        _lib.check(_lib.lib().flame_embedding_bag_create(C.byref(p), C.byref(self._handle)))
        if p.borrow == 0:
            self._keep = []  # copied: the arrays are no longer needed
        self.num_tables = len(tables)
        self.threads = int(threads)
        self.width = int(_lib.lib().flame_embedding_bag_width(self._handle))

    @staticmethod
    def _table(i: int, t: TableLike) -> Tuple[np.ndarray, Optional[np.ndarray], int]:
        if isinstance(t, tuple):
            if len(t) != 2:
                raise errors.ShapeError(f"table {i}: a pair (int8 array, qparams) or ('bfloat16', uint16 array)")
            if isinstance(t[0], str):
                if t[0] != "bfloat16":
                    raise errors.DTypeError(f"table {i}: dtype name {t[0]!r} (only 'bfloat16' is given by name)")
                a = np.ascontiguousarray(t[1])
                if a.dtype != np.uint16 or a.ndim != 2:
                    raise errors.DTypeError(f"table {i}: bfloat16 tables are 2-D uint16 arrays of bit patterns")
                return a, None, BF16
            a, qp = np.ascontiguousarray(t[0]), np.ascontiguousarray(t[1], dtype=np.float32)
            if a.dtype != np.int8 or a.ndim != 2:
                raise errors.DTypeError(f"table {i}: a quantized table is a 2-D int8 array, not {a.dtype} {a.shape}")
            if qp.shape != (a.shape[0], 2):
                raise errors.ShapeError(f"table {i}: qparams has shape {qp.shape}, the table needs ({a.shape[0]}, 2)")
            return a, qp, INT8
        a = np.ascontiguousarray(t)
        if a.ndim != 2:
            raise errors.ShapeError(f"table {i}: a table is 2-D [rows, dim], not {a.shape}")
        if a.dtype == np.float32:
            return a, None, F32
        if a.dtype == np.float16:
            return a, None, F16
        raise errors.DTypeError(f"table {i}: dtype {a.dtype} (float32, float16, or the pairs of the docstring)")

    def __call__(self, ids: Sequence[Any], offsets: Optional[Sequence[Any]] = None,
                 weights: Optional[Sequence[Any]] = None, out: Optional[np.ndarray] = None,
                 threads: Optional[int] = None) -> np.ndarray:
        """Pools one batch: ids[t] (int64 ids of table t), offsets[t] ([batch + 1] bag bounds,
        or None: one id per bag), weights[t] (float32 per id, or None). Returns out (float32
        [batch, width], made when not given; a given one may have a row stride)."""
        n = self.num_tables
        ids = list(ids)
        offs = [None] * n if offsets is None else list(offsets)
        ws = [None] * n if weights is None else list(weights)
        if len(ids) != n or len(offs) != n or len(ws) != n:
            raise errors.ShapeError(f"ids, offsets and weights need one entry per table ({n}): got "
                                    f"{len(ids)}, {len(offs)}, {len(ws)}")
        keep = []
        inputs = (EmbeddingBagInput * n)()
        batch = None
        for t in range(n):
            i = _i64(ids[t], f"ids[{t}]")
            o = None if offs[t] is None else _i64(offs[t], f"offsets[{t}]")
            w = None if ws[t] is None else np.ascontiguousarray(ws[t], dtype=np.float32).reshape(-1)
            if w is not None and w.size != i.size:
                raise errors.ShapeError(f"table {t}: {w.size} weights for {i.size} ids")
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
        if out is None:
            out = np.empty((batch, self.width), dtype=np.float32)
        elif (out.dtype != np.float32 or out.ndim != 2 or out.shape != (batch, self.width) or not out.flags.writeable
              or (out.size and ((self.width > 1 and out.strides[1] != 4)
                                or (batch > 1 and (out.strides[0] % 4 or out.strides[0] < 4 * self.width))))):
            raise errors.ShapeError(f"out must be a writeable float32 [{batch}, {self.width}] array with unit column "
                                    f"stride, got {out.dtype} {out.shape}")
        q = new(EmbeddingBagBatch)
        q.batch, q.inputs, q.num_inputs = batch, inputs, n
        q.out, q.ld_out, q.out_dtype = out.ctypes.data, out.strides[0] // 4 if batch > 1 else 0, F32
        q.threads = self.threads if threads is None else int(threads)
        with self._use() as h:
            _lib.check(_lib.lib().flame_embedding_bag_forward(h, C.byref(q)))
        return out

    def update_rows(self, table: int, first_row: int, values: Any, qparams: Any = None) -> None:
        """Replaces rows first_row.. of `table` with `values` ([n, dim], the table's dtype;
        for int8 tables also qparams [n, 2])."""
        dt = self.dtypes[table] if 0 <= table < self.num_tables else F32
        np_dt = {F32: np.float32, F16: np.float16, BF16: np.uint16, INT8: np.int8}[dt]
        v = np.ascontiguousarray(values, dtype=np_dt)
        if v.ndim != 2:
            raise errors.ShapeError(f"values must be 2-D [rows, dim], not {v.shape}")
        if 0 <= table < self.num_tables and v.shape[1] != self.dims[table]:
            raise errors.ShapeError(f"values have {v.shape[1]} columns, table {table} has dim {self.dims[table]}")
        qp = None if qparams is None else np.ascontiguousarray(qparams, dtype=np.float32)
        if qp is not None and qp.shape != (v.shape[0], 2):
            raise errors.ShapeError(f"qparams has shape {qp.shape}, the rows need ({v.shape[0]}, 2)")
        with self._use() as h:
            _lib.check(_lib.lib().flame_embedding_bag_update_rows(h, int(table), int(first_row), v.shape[0],
                                                                  v.ctypes.data, dt, _ptr(qp, F32P), None))

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


def sumi_attention(q: Any = None, k: Any = None, v: Any = None, cu_history: Any = None, cu_candidates: Any = None,
                   *, heads: int, qkv: Any = None, mask: str = "sumi", out: Optional[np.ndarray] = None,
                   threads: int = 1) -> np.ndarray:
    """Masked multi-head attention over a ragged batch (flame_sumi_attention) on the CPU.

    q, k, v: float32 [rows, heads * head_dim] (views with a row stride allowed; k and v share
      one), or qkv: [rows, 3 * heads * head_dim] (Q, K, V side by side) instead.
    cu_history, cu_candidates: int64 [num_seqs + 1] cumulative counts; sequence s is rows
      cu_history[s] + cu_candidates[s] .., history first (cu_candidates None: no candidates).
    mask: "sumi" (history causal; a candidate sees the history and itself), "causal", "none".
    Returns out, float32 [rows, heads * head_dim] (made when not given).
    """
    if cu_history is None:
        raise errors.InvalidArgumentError("cu_history is required")
    ch = _i64(cu_history, "cu_history")
    cc = None if cu_candidates is None else _i64(cu_candidates, "cu_candidates")
    if ch.size == 0 or (cc is not None and cc.size != ch.size):
        raise errors.ShapeError(f"cu_history ({ch.size}) and cu_candidates ({None if cc is None else cc.size}) need "
                                f"num_seqs + 1 entries each")
    p = new(AttentionParams)
    p.device, p.dtype, p.mask = DEVICE_CPU, F32, _choice(mask, MASKS, "mask")
    if isinstance(heads, bool) or not isinstance(heads, (int, np.integer)) or heads < 1:
        raise errors.InvalidArgumentError(f"heads must be a positive int, got {heads!r}")
    p.heads = int(heads)
    p.num_seqs, p.cu_history, p.cu_candidates = ch.size - 1, _ptr(ch, I64P), _ptr(cc, I64P)
    if qkv is not None:
        if q is not None or k is not None or v is not None:
            raise errors.InvalidArgumentError("give either qkv or q, k and v")
        x = _rows(qkv, "qkv")
        if x.shape[1] % (3 * heads):
            raise errors.ShapeError(f"qkv has {x.shape[1]} columns, not a multiple of 3 x {heads} heads")
        dh, rows = x.shape[1] // (3 * heads), x.shape[0]
        p.qkv, p.ld_qkv = x.ctypes.data, x.strides[0] // 4
        keep = [x]
    else:
        if q is None or k is None or v is None:
            raise errors.InvalidArgumentError("give q, k and v (or qkv)")
        xq, xk, xv = _rows(q, "q"), _rows(k, "k"), _rows(v, "v")
        if xq.shape[1] % heads or xk.shape != xq.shape or xv.shape != xq.shape:
            raise errors.ShapeError(f"q {xq.shape}, k {xk.shape} and v {xv.shape} must share one shape "
                                    f"[rows, heads x head_dim] ({heads} heads)")
        dh, rows = xq.shape[1] // heads, xq.shape[0]
        p.q, p.k, p.v = xq.ctypes.data, xk.ctypes.data, xv.ctypes.data
        p.ld_q, p.ld_k, p.ld_v = xq.strides[0] // 4, xk.strides[0] // 4, xv.strides[0] // 4
        keep = [xq, xk, xv]
    width = heads * dh
    if out is None:
        out = np.empty((rows, width), dtype=np.float32)
    else:
        out = _rows(out, "out")
        if out.shape != (rows, width) or not out.flags.writeable:
            raise errors.ShapeError(f"out must be a writeable float32 [{rows}, {width}] array, got {out.shape}")
    p.head_dim, p.rows = dh, rows
    p.out, p.ld_out, p.threads = out.ctypes.data, out.strides[0] // 4, int(threads)
    if rows <= 1:  # the row stride of an array of 0 or 1 rows may be anything: the packed one is as good
        p.ld_q = p.ld_k = p.ld_v = width
        p.ld_qkv, p.ld_out = (3 * width if qkv is not None else 0), width
    _lib.check(_lib.lib().flame_sumi_attention(C.byref(p)))
    del keep
    return out


__all__ = ["EmbeddingBag", "sumi_attention", "DEVICE_CPU"]
