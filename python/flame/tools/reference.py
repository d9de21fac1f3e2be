"""Independent float64 numpy implementation of the flame architecture family.

Written from docs/model-format.md alone, to check libflame against. Everything works on
arrays with any leading batch shape ([..., tokens, d]) and an explicit boolean visibility
mask ([..., queries, keys]), so the one-request `score` and the batched evaluation in
evaluate.py run the same code.
"""
import json
import math

import numpy as np

from . import layout, quant, st_io

_erf = np.frompyfunc(math.erf, 1, 1)  # numpy has no erf; math.erf is exact to double rounding


# ------------------------------------------------------------------ files

def load(path):
    """(config dict, {name: float64 array}); F32/F16/BF16 files and int8 tables (dequantized
    in float64: scale * q + bias, flame.quant), validated like the engine."""
    meta, tensors, dtypes = st_io.read(path)
    if "flame.config" not in meta:
        raise ValueError(f"{path}: no flame.config")
    cfg = layout.parse(meta["flame.config"])
    t = quant.unpack(cfg, tensors, dtypes, np.float64)
    layout.check_tensors(cfg, t)
    return cfg, t


def save(path, cfg, tensors, dtype="F32", int8_tables=()):
    """Writes a model file: every tensor as `dtype`, except the tables named in int8_tables
    (or all of them: True), stored int8 row-wise quantized (flame.quant.quantize_rows)."""
    layout.check(cfg)
    layout.check_tensors(cfg, tensors)
    dtypes = dtype
    if int8_tables:
        tensors, dtypes = quant.pack(cfg, tensors, int8_tables, dtype)
    st_io.write(path, tensors, {"flame.config": json.dumps(cfg)}, dtypes)


def random_model(cfg, seed):
    layout.check(cfg)
    return layout.random_model(cfg, seed)


# ------------------------------------------------------------------ layers

def layer_norm(x, t, name, cfg):
    ln = cfg["layernorm"]
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)  # biased
    den = np.sqrt(var + ln["eps"]) if ln["eps_inside_sqrt"] else np.sqrt(var) + ln["eps"]
    return (x - mu) / den * t[name + ".weight"] + t[name + ".bias"]


def activation(kind, x):
    if kind == "gelu_erf":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(x.dtype))
    if kind == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if kind == "relu":
        return np.maximum(x, 0.0)
    raise ValueError(f"unknown activation {kind!r}")


def linear(x, t, name):
    return x @ t[name + ".weight"].T + t[name + ".bias"]


def attention(xq, xkv, mask, t, p, heads):
    """Softmax attention of queries xq over keys xkv where mask is True; a query that sees
    no key gets zeros (the format's rule), never NaN."""
    q, k, v = linear(xq, t, p + "q"), linear(xkv, t, p + "k"), linear(xkv, t, p + "v")

    def split(a):  # [..., T, d] -> [..., heads, T, d/heads], heads = contiguous slices
        return np.swapaxes(a.reshape(a.shape[:-1] + (heads, a.shape[-1] // heads)), -2, -3)

    q, k, v = split(q), split(k), split(v)
    logits = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    m = mask[..., None, :, :]
    logits = np.where(m, logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    e = np.exp(logits - np.where(np.isfinite(top), top, 0.0))
    s = e.sum(-1, keepdims=True)
    a = (e / np.where(s > 0, s, 1.0)) @ v
    a = np.swapaxes(a, -2, -3)
    return linear(a.reshape(a.shape[:-2] + (-1,)), t, p + "o")


def block(x, mask, t, i, cfg, rows=None):
    """One transformer block. rows: compute only these query rows (keys still all of x);
    the last block of a dot head needs only the last history token."""
    b, p = cfg["blocks"], f"blocks.{i}."
    pick = (lambda a: a) if rows is None else (lambda a: a[..., rows, :])
    mq = pick(mask)

    def ffn(h):
        return linear(activation(b["activation"], linear(h, t, p + "ffn.fc1")), t, p + "ffn.fc2")

    if b["norm"] == "post":
        h = layer_norm(pick(x) + attention(pick(x), x, mq, t, p + "attn.", b["num_heads"]), t, p + "ln1", cfg)
        return layer_norm(h + ffn(h), t, p + "ln2", cfg)
    a = layer_norm(x, t, p + "ln1", cfg)
    h = pick(x) + attention(pick(a), a, mq, t, p + "attn.", b["num_heads"])
    return h + ffn(layer_norm(h, t, p + "ln2", cfg))


def encode(x, mask, t, cfg, rows=None):
    """Input LN, blocks, final LN. rows as in `block`, applied to the last block only."""
    if cfg["input_layernorm"]:
        x = layer_norm(x, t, "input_ln", cfg)
    n = cfg["blocks"]["count"]
    if n == 0 and rows is not None:
        x = x[..., rows, :]
    for i in range(n):
        x = block(x, mask, t, i, cfg, rows if i == n - 1 else None)
    if cfg["final_layernorm"]:
        x = layer_norm(x, t, "final_ln", cfg)
    return x


# ------------------------------------------------------------------ embeddings

def pool(tab, ids, pooling):
    if len(ids) == 0:
        return np.zeros(tab.shape[1])
    v = tab[ids].sum(0)
    return v / len(ids) if pooling == "mean" else v


def embed(cfg, t, item_ids, side_bags=None):
    """Token vectors before position: item_ids [...] int, side_bags[slot][token] = id array
    (tokens flattened in item_ids' order). Returns [..., d_model]."""
    item_ids = np.asarray(item_ids, dtype=np.int64)
    parts, slot = [], 0
    for f in cfg["features"]:
        tab = t[f"tables.{f['table']}.weight"]
        if f["input"] == "item":
            parts.append(tab[item_ids])  # a bag of one id: sum and mean agree
        else:
            bags = side_bags[slot]
            v = np.stack([pool(tab, bags[j], f["pooling"]) for j in range(item_ids.size)]) if item_ids.size \
                else np.zeros((0, tab.shape[1]))
            parts.append(v.reshape(item_ids.shape + (tab.shape[1],)))
            slot += 1
    e = sum(parts) if cfg["combine"] == "sum" else np.concatenate(parts, -1)
    return linear(e, t, "input_proj") if cfg["projection"] else e


def history_position_rows(cfg, n):
    """Position row of each of n kept history tokens (oldest first), or None."""
    rule = cfg["position"]["rule"]
    if rule == "left_padded_slot":
        return cfg["max_len"] - n + np.arange(n)
    if rule == "from_recent":
        return n - 1 - np.arange(n)
    if rule == "from_oldest":
        return np.arange(n)
    return None


# ------------------------------------------------------------------ requests

def _check_ids(cfg, ids, tables, what):
    ids = np.asarray(ids, dtype=np.int64)
    for name in tables:
        rows = layout.table(cfg, name)["rows"]
        bad = np.flatnonzero((ids < 0) | (ids >= rows))
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"{what} {j}: id {int(ids[j])} is out of range [0, {rows}) of table '{name}'")


def _bags(cfg, side, n_tokens, first, what):
    """side: list of (offsets, ids) per slot over n_tokens; returns per slot the bags of
    tokens first..n_tokens-1 (history truncation drops the oldest)."""
    k = layout.num_side(cfg)
    if k == 0:
        return []
    if side is None or len(side) != k:
        raise ValueError(f"{what}: the model has {k} side-feature slots, got {0 if side is None else len(side)}")
    tabs = [f["table"] for f in cfg["features"] if f["input"] == "side"]
    out = []
    for s, (offsets, ids) in enumerate(side):
        offsets, ids = np.asarray(offsets, dtype=np.int64), np.asarray(ids, dtype=np.int64)
        if len(offsets) != n_tokens + 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 0) \
                or offsets[-1] != len(ids):  # as the library: every id in a bag, none past the array
            raise ValueError(f"{what} side slot {s}: bad CSR offsets")
        _check_ids(cfg, ids[:offsets[-1]], [tabs[s]], f"{what} side slot {s}: bag entry")
        out.append([ids[offsets[j]:offsets[j + 1]] for j in range(first, n_tokens)])
    return out


def score(cfg, t, history, candidates, history_side=None, candidate_side=None):
    """Scores [num_candidates, num_tasks] float64 for one user (docs/model-format.md)."""
    cfg = layout.with_defaults(cfg)  # the keys a config may leave out, as the library reads them
    history = np.asarray(history, dtype=np.int64).reshape(-1)
    candidates = np.asarray(candidates, dtype=np.int64).reshape(-1)
    d, tasks, sumi = cfg["d_model"], layout.num_tasks(cfg), cfg["head"]["type"] == "sumi"
    first = max(0, len(history) - cfg["max_len"])
    hist = history[first:]
    n, m = len(hist), len(candidates)
    item_tabs = [f["table"] for f in cfg["features"] if f["input"] == "item"]
    # the whole history is validated, also ids older than the window (the format leaves this
    # open; libflame 0.1 checks only the kept window)
    _check_ids(cfg, history, item_tabs, "history token")
    _check_ids(cfg, candidates, layout.item_tables(cfg), "candidate")
    hside = _bags(cfg, history_side, len(history), first, "history")
    cside = _bags(cfg, candidate_side, m, 0, "candidates") if sumi else []
    if m == 0:
        return np.zeros((0, tasks))
    if not sumi and n == 0:
        return np.zeros((m, 1))  # no user state

    x = embed(cfg, t, hist, hside) if n else np.zeros((0, d))
    rows = history_position_rows(cfg, n)
    if rows is not None:
        x = x + t["position.weight"][rows]
    if sumi:
        c = embed(cfg, t, candidates, cside)
        cp = cfg["position"].get("candidate_position", -1)
        if cp >= 0:
            c = c + t["position.weight"][cp]
        x = np.concatenate([x, c])

    # causal among history; each candidate sees all history and itself only (SUMI)
    T = n + m if sumi else n
    mask = np.zeros((T, T), dtype=bool)
    mask[:n, :n] = np.tril(np.ones((n, n), dtype=bool))
    if sumi:
        mask[n:, :n] = True
        mask[np.arange(n, T), np.arange(n, T)] = True

    if not sumi:
        h = encode(x, mask, t, cfg, rows=[n - 1])[0]
        return (t[f"tables.{cfg['head']['table']}.weight"][candidates] @ h)[:, None]
    h = encode(x, mask, t, cfg, rows=np.arange(n, T))
    out = np.empty((m, tasks))
    for k, task in enumerate(cfg["head"]["tasks"]):
        z = h
        L = len(task["hidden"]) + 1
        for l in range(L):
            z = linear(z, t, f"heads.{k}.layers.{l}")
            if l < L - 1:
                z = activation(task["activation"], z)
        out[:, k] = 1.0 / (1.0 + np.exp(-z[:, 0]))
    return out
