"""Small model configs covering the format's options, random requests for them, and how
scores are compared with the float64 reference."""
import copy

import numpy as np

from flame.tools import layout, reference

BASE = {
    "format": "flame", "version": 1, "d_model": 16, "max_len": 6,
    "tables": [{"name": "item", "rows": 40, "dim": 16}],
    "features": [{"name": "item", "table": "item", "input": "item", "pooling": "sum"}],
    "combine": "sum", "projection": False,
    "position": {"rule": "left_padded_slot", "rows": 6, "candidate_position": -1},
    "input_layernorm": True,
    "blocks": {"count": 2, "num_heads": 2, "ffn_dim": 24, "norm": "post", "activation": "gelu_erf"},
    "final_layernorm": False,
    "layernorm": {"eps": 1e-12, "eps_inside_sqrt": True},
    "head": {"type": "dot", "table": "item"},
}

SUMI_HEAD = {"type": "sumi", "tasks": [
    {"name": "click", "hidden": [12], "activation": "relu"},
    {"name": "like", "hidden": [], "activation": "relu"},
    {"name": "share", "hidden": [8, 4], "activation": "gelu_tanh"},
]}


def config(**changes):
    """BASE with top-level keys replaced; blocks and layernorm are merged one level deep."""
    cfg = copy.deepcopy(BASE)
    for k, v in changes.items():
        cfg[k] = {**cfg[k], **v} if k in ("blocks", "layernorm") else v
    return cfg


def side_features(pooling=("sum", "mean")):
    """Item features plus side-feature slots on small tables of other widths (for concat)."""
    tables = [{"name": "item", "rows": 40, "dim": 16}, {"name": "cat", "rows": 7, "dim": 8},
              {"name": "tag", "rows": 13, "dim": 4}]
    features = [{"name": "item", "table": "item", "input": "item", "pooling": "sum"},
                {"name": "cat", "table": "cat", "input": "side", "pooling": pooling[0]},
                {"name": "tag", "table": "tag", "input": "side", "pooling": pooling[1]}]
    return tables, features


# name -> config; together they cover every option of docs/model-format.md
CASES = {
    "iclrec_like": config(),
    "pre_tanh_final_sumi_from_recent": config(
        blocks={"norm": "pre", "activation": "gelu_tanh", "num_heads": 4}, final_layernorm=True,
        position={"rule": "from_recent", "rows": 9, "candidate_position": 8},
        layernorm={"eps": 1e-5, "eps_inside_sqrt": False}, head=SUMI_HEAD),
    "relu_concat_projection_side_sumi": config(
        **dict(zip(("tables", "features"), side_features())), combine="concat", projection=True,
        d_model=12, blocks={"activation": "relu", "num_heads": 3}, position={"rule": "left_padded_slot", "rows": 6, "candidate_position": 2},
        head=SUMI_HEAD),
    "sum_mean_tables_no_position_dot": config(
        tables=[{"name": "item", "rows": 40, "dim": 16}, {"name": "item2", "rows": 50, "dim": 16},
                {"name": "cat", "rows": 5, "dim": 16}],
        features=[{"name": "a", "table": "item", "input": "item", "pooling": "mean"},
                  {"name": "b", "table": "item2", "input": "item", "pooling": "sum"},
                  {"name": "c", "table": "cat", "input": "side", "pooling": "mean"}],
        position={"rule": "none", "candidate_position": -1}, input_layernorm=False,
        blocks={"count": 1, "num_heads": 1}),
    "deep_pre_side_dot_projection": config(
        **dict(zip(("tables", "features"), side_features(("mean", "sum")))), combine="concat", projection=True,
        blocks={"count": 3, "norm": "pre", "activation": "gelu_erf", "num_heads": 4}, final_layernorm=True,
        input_layernorm=False, max_len=4, position={"rule": "left_padded_slot", "rows": 5, "candidate_position": -1}),
    "no_blocks_dot": config(blocks={"count": 0}, final_layernorm=True),
    "post_sumi_from_oldest": config(position={"rule": "from_oldest", "rows": 7, "candidate_position": 6},
                                    head=SUMI_HEAD),
}


def random_bags(rng, n_tokens, rows, max_bag=3):
    """(offsets, ids) with bags of 0..max_bag ids, empty bags included."""
    sizes = rng.integers(0, max_bag + 1, size=n_tokens)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return offsets, rng.integers(0, rows, size=int(offsets[-1])).astype(np.int64)


def random_request(cfg, rng, n_hist, n_cand):
    """(history, candidates, history_side, candidate_side) valid for cfg."""
    rows = min(t["rows"] for t in cfg["tables"]
               if t["name"] in [f["table"] for f in cfg["features"] if f["input"] == "item"])
    side_rows = [next(t["rows"] for t in cfg["tables"] if t["name"] == f["table"])
                 for f in cfg["features"] if f["input"] == "side"]
    hist = rng.integers(0, rows, size=n_hist)
    cand = rng.integers(0, rows, size=n_cand)
    if not side_rows:
        return hist, cand, None, None
    return (hist, cand, [random_bags(rng, n_hist, r) for r in side_rows],
            [random_bags(rng, n_cand, r) for r in side_rows])


def random_config(rng):
    """A random valid config; over a few dozen seeds every option of the format appears
    (combine, projection, side features and pooling, position rules, candidate position,
    norms, activations, eps placement, block counts, both heads, task MLP shapes)."""
    heads = int(rng.choice([1, 2, 4]))
    d = heads * int(rng.integers(2, 7))
    combine = str(rng.choice(["sum", "concat"]))
    projection = bool(rng.integers(2)) or combine == "concat"
    n_side = int(rng.integers(0, 3))
    dim = lambda: d if not projection else int(rng.integers(2, 9))  # noqa: E731
    item_dim = dim()
    tables = [{"name": "item", "rows": int(rng.integers(20, 60)), "dim": item_dim}]
    features = [{"name": "item", "table": "item", "input": "item", "pooling": "sum"}]
    for s in range(n_side):
        tables.append({"name": f"side{s}", "rows": int(rng.integers(3, 15)),
                       "dim": item_dim if combine == "sum" else dim()})
        features.append({"name": f"side{s}", "table": f"side{s}", "input": "side",
                         "pooling": str(rng.choice(["sum", "mean"]))})
    if not projection and combine == "concat":
        projection = True
    max_len = int(rng.integers(1, 9))
    rule = str(rng.choice(["left_padded_slot", "from_recent", "none"]))
    rows = max_len + int(rng.integers(0, 3))
    sumi = bool(rng.integers(2))
    pos = {"rule": rule, "rows": rows,
           "candidate_position": int(rng.integers(-1, rows)) if (sumi and rule != "none") else -1}
    acts = ["gelu_erf", "gelu_tanh", "relu"]
    head = {"type": "dot", "table": "item"}
    if sumi:
        head = {"type": "sumi", "tasks": [
            {"name": f"t{k}", "hidden": [int(x) for x in rng.integers(1, 9, size=int(rng.integers(0, 3)))],
             "activation": str(rng.choice(acts))} for k in range(int(rng.integers(1, 4)))]}
    elif projection and item_dim != d:  # the dot head's table must be d_model wide
        tables.append({"name": "out", "rows": tables[0]["rows"] + 3, "dim": d})
        head = {"type": "dot", "table": "out"}
    return {"format": "flame", "version": 1, "d_model": d, "max_len": max_len, "tables": tables,
            "features": features, "combine": combine, "projection": projection, "position": pos,
            "input_layernorm": bool(rng.integers(2)),
            "blocks": {"count": int(rng.integers(0, 4)), "num_heads": heads, "ffn_dim": int(rng.integers(1, 33)),
                       "norm": str(rng.choice(["pre", "post"])), "activation": str(rng.choice(acts))},
            "final_layernorm": bool(rng.integers(2)),
            "layernorm": {"eps": float(rng.choice([1e-12, 1e-5, 1e-3])), "eps_inside_sqrt": bool(rng.integers(2))},
            "head": head}


def rel_err(got, want, scale=None):
    """Largest absolute difference over `scale` (default: the largest |want|)."""
    scale = np.max(np.abs(want), initial=0.0) if scale is None else scale
    return float(np.max(np.abs(np.asarray(got, np.float64) - want), initial=0.0) / max(scale, 1e-30))


def score_scale(cfg, t64, r):
    """What a request's errors are measured against: for a dot head the largest |score| this
    user gets over the whole item table (one candidate's dot product can cancel to near 0,
    where float32 rounding is relatively large); None (the request's own largest score) for
    sumi heads, whose sigmoids do not cancel."""
    if cfg["head"]["type"] != "dot":
        return None
    items = np.arange(min(layout.table(cfg, n)["rows"] for n in layout.item_tables(cfg)))
    return np.max(np.abs(reference.score(cfg, t64, r[0], items, r[2], None)))
