"""int8 row-wise quantized embedding tables (docs/model-format.md, "int8 tables").

A table `tables.{name}.weight` may be stored as I8 [rows, dim] beside `tables.{name}.qparams`,
F32 [rows, 2] holding each row's scale and bias:

    value[r, c] = scale[r] * q[r, c] + bias[r]      (scale = qparams[r, 0], bias = qparams[r, 1])

`quantize_rows` makes such a pair from a float table (row-wise min/max, FBGEMM style),
`dequantize_rows` gives the values back, `pack`/`unpack` turn a model's tensor dict into what
a file holds and back, with the checks libflame's loader makes (same messages).
"""
import numpy as np


def qparams_name(weight_name):
    """'tables.item.weight' -> 'tables.item.qparams'."""
    if not (weight_name.startswith("tables.") and weight_name.endswith(".weight")):
        raise ValueError(f"'{weight_name}' is not a table tensor (tables.<name>.weight)")
    return weight_name[: -len(".weight")] + ".qparams"


def quantize_rows(table):
    """Row-wise int8 quantization of a float [rows, dim] table -> (q int8 [rows, dim],
    qparams float32 [rows, 2]).

    Per row: scale = (max - min) / 255, bias = min + 128 scale, q = round((x - bias) / scale)
    (half to even) clamped to [-128, 127]; the 256 codes then span [min, max] and every value
    comes back within scale / 2 (plus float32 rounding of scale and bias). A constant row gets
    scale 0, bias = its value, q = 0, and comes back exactly. Raises ValueError on non-finite
    values."""
    x = np.asarray(table, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"quantize_rows: expected a [rows, dim] table with dim >= 1, got shape {list(x.shape)}")
    if not np.all(np.isfinite(x)):
        raise ValueError("quantize_rows: the table has non-finite values")
    lo, hi = x.min(1).astype(np.float64), x.max(1).astype(np.float64)
    scale = ((hi - lo) / 255.0).astype(np.float32)
    flat = scale == 0
    bias = np.where(flat, lo, lo + 128.0 * scale.astype(np.float64)).astype(np.float32)
    step = np.where(flat, 1.0, scale.astype(np.float64))
    q = np.rint((x.astype(np.float64) - bias[:, None].astype(np.float64)) / step[:, None])
    q = np.where(flat[:, None], 0.0, np.clip(q, -128, 127)).astype(np.int8)
    return q, np.stack([scale, bias], 1).astype(np.float32)


def dequantize_rows(q, qparams, dtype=np.float64):
    """scale * q + bias per row. float64 (the default) is the exact value of the format's
    definition; float32 rounds the product, then the sum, to float32 as libflame does, so it
    gives the bits of libflame's values (and of a table dequantized once to F32)."""
    q = np.asarray(q)
    qp = np.asarray(qparams, dtype=np.float32)
    if np.dtype(dtype) == np.float32:
        return qp[:, 0:1] * q.astype(np.float32) + qp[:, 1:2]
    return qp[:, 0:1].astype(np.float64) * q.astype(np.float64) + qp[:, 1:2].astype(np.float64)


def _table_names(cfg):
    return {f"tables.{t['name']}.weight": t for t in cfg["tables"]}


def pack(cfg, tensors, int8_tables, dtype="F32"):
    """({name: array}, {name: dtype}) to write: the tables named in `int8_tables` (table names,
    or True for every table) become I8 + qparams (quantize_rows); every other tensor keeps the
    float storage `dtype` ("F32", "F16" or "BF16")."""
    names = [t["name"] for t in cfg["tables"]] if int8_tables is True else list(int8_tables or ())
    known = [t["name"] for t in cfg["tables"]]
    for n in names:
        if n not in known:
            raise ValueError(f"int8_tables: '{n}' is not a table of the config (tables: {known})")
    out, dtypes = {}, {}
    for name, a in tensors.items():
        out[name], dtypes[name] = a, dtype
    for n in names:
        w = f"tables.{n}.weight"
        q, qp = quantize_rows(tensors[w])
        out[w], dtypes[w] = q, "I8"
        out[qparams_name(w)], dtypes[qparams_name(w)] = qp, "F32"
    return out, dtypes


def check_finite(name, dt, a):
    """ValueError naming the tensor and its first NaN or Inf (flat index, and [row, column] of
    a matrix), as libflame's loader refuses them: one makes every score NaN."""
    a = np.asarray(a)
    bad = np.flatnonzero(~np.isfinite(a.reshape(-1)))
    if not bad.size:
        return
    i = int(bad[0])
    at = f" (row {i // a.shape[1]}, column {i % a.shape[1]})" if a.ndim == 2 and a.shape[1] > 0 else ""
    raise ValueError(f"tensor '{name}' ({dt}): value {i}{at} is {float(a.reshape(-1)[i]):g}; weights must be finite")


def unpack(cfg, tensors, dtypes, dtype=np.float64):
    """{name: float array} from what a file holds ({name: array}, {name: dtype string}): I8
    tables dequantized (dequantize_rows, in `dtype`) and their qparams consumed, everything
    else cast to `dtype`. Raises ValueError for what libflame's loader refuses (an I8 tensor
    that is not a table, missing or misshapen or non-F32 qparams, a non-finite scale or bias,
    qparams beside a float table, a NaN or Inf float weight), with its message."""
    tables = _table_names(cfg)
    out = {}
    for name, a in tensors.items():
        if name.endswith(".qparams") and name[: -len(".qparams")] + ".weight" in tables:
            w = name[: -len(".qparams")] + ".weight"
            if dtypes.get(w) != "I8":
                raise ValueError(f"unexpected tensor '{name}': '{w}' is {dtypes.get(w, 'absent')}, not I8 "
                                 f"(only int8 tables have qparams)")
            continue
        if dtypes[name] != "I8":
            check_finite(name, dtypes[name], a)
            out[name] = np.asarray(a).astype(dtype)
            continue
        if name not in tables:
            raise ValueError(f"tensor '{name}' has dtype I8; only embedding tables (tables.<name>.weight) may be int8")
        rows, qn = tables[name]["rows"], qparams_name(name)
        if qn not in tensors:
            raise ValueError(f"missing tensor '{qn}': '{name}' is I8, so it needs its per-row scale and bias "
                             f"([{rows}, 2], F32)")
        if dtypes[qn] != "F32":
            raise ValueError(f"tensor '{qn}' has dtype {dtypes[qn]}, expected F32 (the per-row scale and bias of "
                             f"'{name}')")
        qp = np.asarray(tensors[qn], dtype=np.float32)
        if qp.shape != (rows, 2):
            raise ValueError(f"tensor '{qn}' has shape {list(qp.shape)}, expected [{rows}, 2]")
        bad = np.argwhere(~np.isfinite(qp))
        if bad.size:
            r, k = (int(v) for v in bad[0])
            raise ValueError(f"tensor '{qn}': row {r} has a non-finite {'bias' if k else 'scale'} ({qp[r, k]})")
        # every value scale * q + bias (|q| <= 128) must be a finite float32, as the loader checks
        reach = 128.0 * np.abs(qp[:, 0].astype(np.float64)) + np.abs(qp[:, 1].astype(np.float64))
        over = np.flatnonzero(reach > float(np.finfo(np.float32).max))
        if over.size:
            r = int(over[0])
            raise ValueError(f"tensor '{qn}': row {r}: scale {float(qp[r, 0]):g} and bias {float(qp[r, 1]):g} give "
                             f"values beyond float32 (|scale| * 128 + |bias| = {reach[r]:g})")
        q = np.asarray(a)
        if q.ndim != 2 or q.shape[0] != rows:  # layout.check_tensors names the expected shape
            out[name] = q.astype(dtype)
            continue
        out[name] = dequantize_rows(q, qp, dtype)
    return out
