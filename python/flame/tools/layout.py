"""flame.config: validation, derived sizes and the tensor list it implies (docs/model-format.md).

The Python twin of src/model/config.c and fl_tensor_specs (src/model/model.c): the same
defaults for the keys a config may leave out, the same limits, the same tensors.
tests/python/test_layout_matches_c.py holds the two to the same answers.
"""
import copy
import json
import re

import numpy as np

ACTIVATIONS = ("gelu_erf", "gelu_tanh", "relu")
# the limits of src/model/model_cfg.h
MAX_TABLES, MAX_FEATURES, MAX_TASKS, MAX_HIDDEN, MAX_BLOCKS, NAME_MAX = 64, 64, 64, 8, 256, 63
_NAME = re.compile(r"[A-Za-z0-9_-]+")


def with_defaults(cfg):
    """A copy of cfg with every optional key the library reads set to the library's default
    (src/model/config.c): features' pooling "sum", combine "sum", projection false, no position
    table, candidate position -1, no input or final LayerNorm, layernorm eps 1e-5 inside the
    square root, tasks' hidden [] and activation "relu"."""
    c = copy.deepcopy(cfg)
    for f in c.get("features", []):
        if isinstance(f, dict):
            f.setdefault("pooling", "sum")
    c.setdefault("combine", "sum")
    c.setdefault("projection", False)
    pos = c.setdefault("position", {"rule": "none"})
    if isinstance(pos, dict):
        if pos.get("rule") == "none":  # the library reads nothing else of it then
            pos["candidate_position"] = -1
        pos.setdefault("candidate_position", -1)
    c.setdefault("input_layernorm", False)
    c.setdefault("final_layernorm", False)
    ln = c.setdefault("layernorm", {})
    if isinstance(ln, dict):
        ln.setdefault("eps", 1e-5)
        ln.setdefault("eps_inside_sqrt", True)
    head = c.get("head")
    if isinstance(head, dict) and head.get("type") == "sumi":
        for t in head.get("tasks", []):
            if isinstance(t, dict):
                t.setdefault("hidden", [])
                t.setdefault("activation", "relu")
    return c


def _name(key, value):
    if not isinstance(value, str) or not 1 <= len(value) <= NAME_MAX or not _NAME.fullmatch(value):
        raise ValueError(f"config: {key} = {value!r} must be 1..{NAME_MAX} letters, digits, '_' or '-'")


def _range(key, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"config: {key} = {value!r} is out of range [{lo}, {hi}]")


def _choice(key, value, allowed):
    if value not in allowed:
        raise ValueError(f"config: {key} = {value!r} is not one of {list(allowed)}")


def parse(text_or_dict):
    """The config (JSON text or a dict), checked, with the library's defaults filled in."""
    if isinstance(text_or_dict, (str, bytes)):
        from .st_io import unique_keys  # duplicate keys are refused, as libflame does
        cfg = json.loads(text_or_dict, object_pairs_hook=unique_keys)
    else:
        cfg = text_or_dict
    check(cfg)
    return with_defaults(cfg)


def check(cfg):
    """Raises ValueError naming the key when the library would refuse the config."""
    try:
        _check(with_defaults(cfg))
    except (KeyError, TypeError, AttributeError, StopIteration) as e:  # a key missing or of another type
        raise ValueError(f"config: missing or malformed key ({type(e).__name__}: {e})") from None


def _check(cfg):
    if cfg.get("format") != "flame" or cfg.get("version") != 1:
        raise ValueError("config: format/version must be \"flame\"/1")
    d = cfg["d_model"]
    _range("d_model", d, 1, 65536)
    _range("max_len", cfg["max_len"], 1, 1 << 20)
    tables = cfg["tables"]
    _range("len(tables)", len(tables), 1, MAX_TABLES)
    for i, t in enumerate(tables):
        _name(f"tables[{i}].name", t["name"])
    names = [t["name"] for t in tables]
    if len(set(names)) != len(names):
        raise ValueError(f"config: table names are not unique: {names}")
    for i, t in enumerate(tables):
        _range(f"tables[{i}].rows", t["rows"], 1, 1 << 40)
        _range(f"tables[{i}].dim", t["dim"], 1, 65536)
    feats = cfg["features"]
    _range("len(features)", len(feats), 1, MAX_FEATURES)
    for i, f in enumerate(feats):
        _name(f"features[{i}].name", f["name"])
        _choice(f"features[{i}].table", f["table"], names)
        _choice(f"features[{i}].input", f["input"], ("item", "side"))
        _choice(f"features[{i}].pooling", f["pooling"], ("sum", "mean"))
    _choice("combine", cfg["combine"], ("sum", "concat"))
    dims = [table(cfg, f["table"])["dim"] for f in feats]
    if cfg["combine"] == "sum" and len(set(dims)) != 1:
        raise ValueError(f"config: combine \"sum\" needs equal feature dims, got {dims}")
    _range("combined embedding width", embed_dim(cfg), 1, 65536)
    if not cfg["projection"] and embed_dim(cfg) != d:
        raise ValueError(f"config: without projection the embedding width {embed_dim(cfg)} must equal d_model {d}")
    pos = cfg["position"]
    _choice("position.rule", pos["rule"], ("left_padded_slot", "from_recent", "from_oldest", "none"))
    if pos["rule"] != "none":
        _range("position.rows", pos["rows"], cfg["max_len"], 1 << 20)
        _range("position.candidate_position", pos["candidate_position"], -1, pos["rows"] - 1)
    b = cfg["blocks"]
    _range("blocks.count", b["count"], 0, MAX_BLOCKS)
    _range("blocks.num_heads", b["num_heads"], 1, 256)
    _range("blocks.ffn_dim", b["ffn_dim"], 1, 1 << 20)
    if d % b["num_heads"]:
        raise ValueError(f"config: d_model {d} is not a multiple of num_heads {b['num_heads']}")
    _choice("blocks.norm", b["norm"], ("post", "pre"))
    _choice("blocks.activation", b["activation"], ACTIVATIONS)
    eps = cfg["layernorm"]["eps"]
    if not 0 <= eps <= 1:
        raise ValueError(f"config: layernorm.eps = {eps} is out of range [0, 1]")
    head = cfg["head"]
    _choice("head.type", head["type"], ("dot", "sumi"))
    if head["type"] == "dot":
        _choice("head.table", head["table"], names)
        if table(cfg, head["table"])["dim"] != d:
            raise ValueError("config: the dot head's table dim must equal d_model")
    else:
        _range("len(head.tasks)", len(head["tasks"]), 1, MAX_TASKS)
        for i, t in enumerate(head["tasks"]):
            _name(f"head.tasks[{i}].name", t["name"])
            _range(f"len(head.tasks[{i}].hidden)", len(t["hidden"]), 0, MAX_HIDDEN)
            for k, w in enumerate(t["hidden"]):
                _range(f"head.tasks[{i}].hidden[{k}]", w, 1, 65536)
            _choice(f"head.tasks[{i}].activation", t["activation"], ACTIVATIONS)


def table(cfg, name):
    return next(t for t in cfg["tables"] if t["name"] == name)


def embed_dim(cfg):
    dims = [table(cfg, f["table"])["dim"] for f in cfg["features"]]
    return sum(dims) if cfg.get("combine", "sum") == "concat" else dims[0]


def position_rows(cfg):
    # With rule "none" (or no "position") there is no position table.
    pos = cfg.get("position", {"rule": "none"})
    return 0 if pos["rule"] == "none" else pos["rows"]


def num_side(cfg):
    return sum(f["input"] == "side" for f in cfg["features"])


def num_tasks(cfg):
    return 1 if cfg["head"]["type"] == "dot" else len(cfg["head"]["tasks"])


def item_tables(cfg):
    """Tables an item id indexes (its features, and the dot head's table for candidates)."""
    names = [f["table"] for f in cfg["features"] if f["input"] == "item"]
    if cfg["head"]["type"] == "dot":
        names.append(cfg["head"]["table"])
    return list(dict.fromkeys(names))


def shapes(cfg):
    """{tensor name: shape} of every tensor the config implies, nothing else."""
    cfg = with_defaults(cfg)
    d, out = cfg["d_model"], {}
    for t in cfg["tables"]:
        out[f"tables.{t['name']}.weight"] = (t["rows"], t["dim"])
    if cfg["projection"]:
        out["input_proj.weight"], out["input_proj.bias"] = (d, embed_dim(cfg)), (d,)
    if cfg["position"]["rule"] != "none":
        out["position.weight"] = (position_rows(cfg), d)
    lns = (["input_ln"] if cfg["input_layernorm"] else []) + (["final_ln"] if cfg["final_layernorm"] else [])
    b = cfg["blocks"]
    for i in range(b["count"]):
        p = f"blocks.{i}."
        for m in "qkvo":
            out[p + f"attn.{m}.weight"], out[p + f"attn.{m}.bias"] = (d, d), (d,)
        lns += [p + "ln1", p + "ln2"]
        out[p + "ffn.fc1.weight"], out[p + "ffn.fc1.bias"] = (b["ffn_dim"], d), (b["ffn_dim"],)
        out[p + "ffn.fc2.weight"], out[p + "ffn.fc2.bias"] = (d, b["ffn_dim"]), (d,)
    for ln in lns:
        out[ln + ".weight"], out[ln + ".bias"] = (d,), (d,)
    if cfg["head"]["type"] == "sumi":
        for t, task in enumerate(cfg["head"]["tasks"]):
            widths = [d] + list(task["hidden"]) + [1]
            for l in range(len(widths) - 1):
                out[f"heads.{t}.layers.{l}.weight"] = (widths[l + 1], widths[l])
                out[f"heads.{t}.layers.{l}.bias"] = (widths[l + 1],)
    return out


def check_tensors(cfg, tensors):
    """Raises ValueError naming the first missing, misshapen or unexpected tensor."""
    want = shapes(cfg)
    for name, shape in want.items():
        if name not in tensors:
            raise ValueError(f"missing tensor '{name}'")
        if tuple(tensors[name].shape) != shape:
            raise ValueError(f"tensor '{name}' has shape {list(tensors[name].shape)}, expected {list(shape)}")
    for name in tensors:
        if name not in want:
            raise ValueError(f"unexpected tensor '{name}'")


def random_model(cfg, seed):
    """Random float32 weights of the right shapes; LayerNorm near identity, small biases,
    linear layers scaled 1/sqrt(fan_in) so activations stay O(1) through deep stacks."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes(cfg).items():
        u = rng.uniform(-1.0, 1.0, size=shape)
        if name.endswith(".bias"):
            a = 0.1 * u
        elif name.startswith(("input_ln", "final_ln")) or ".ln" in name:
            a = 1.0 + 0.1 * u
        elif len(shape) == 2 and not name.startswith(("tables.", "position.")):
            a = u / np.sqrt(shape[1])
        else:
            a = 0.5 * u
        out[name] = a.astype(np.float32)
    return out
