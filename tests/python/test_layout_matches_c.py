"""flame.tools.layout (Python) against src/model/config.c and fl_tensor_specs (C): for the same
flame.config both accept or both refuse it, and for an accepted one the tensors Python lays out
are exactly those the library reads (flame_model_load refuses a missing, extra or misshapen
tensor) and the sizes Python derives are the library's (flame_model_info)."""
import copy

import numpy as np
import pytest

import flame
from flame.tools import layout, reference

from flame_testlib import CASES, random_config


def c_accepts(cfg):
    """The library's verdict on cfg: True, or False for a FLAME_ERR_FORMAT (its message kept)."""
    try:
        flame.Model.random(cfg).close()
        return True, ""
    except flame.FormatError as e:
        return False, str(e)


def py_accepts(cfg):
    try:
        layout.check(cfg)
        return True, ""
    except ValueError as e:
        return False, str(e)


def minimal(cfg):
    """cfg without the keys a config may leave out when they hold the library's default."""
    c = copy.deepcopy(cfg)
    for key, default in (("combine", "sum"), ("projection", False), ("input_layernorm", False),
                         ("final_layernorm", False)):
        if c.get(key) == default:
            del c[key]
    for f in c["features"]:
        if f.get("pooling") == "sum":
            del f["pooling"]
    if c["position"]["rule"] == "none":
        del c["position"]
    elif c["position"].get("candidate_position") == -1:
        del c["position"]["candidate_position"]
    if c["layernorm"] == {"eps": 1e-5, "eps_inside_sqrt": True}:
        del c["layernorm"]
    if c["head"]["type"] == "sumi":
        for t in c["head"]["tasks"]:
            if t.get("activation") == "relu":
                del t["activation"]
            if t.get("hidden") == []:
                del t["hidden"]
    return c


VALID = {**CASES, **{f"random{seed}": random_config(np.random.default_rng(seed)) for seed in range(40)}}
VALID.update({f"minimal_{name}": minimal(cfg) for name, cfg in list(VALID.items())[:12]})


@pytest.mark.parametrize("name", sorted(VALID))
def test_accepted_configs_lay_out_as_the_library_reads(tmp_path, name):
    cfg = VALID[name]
    assert py_accepts(cfg) == (True, ""), name
    assert c_accepts(cfg) == (True, ""), name
    shapes = layout.shapes(cfg)
    path = tmp_path / "m.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 1))  # Python's tensor list and shapes
    with flame.Model(path) as m:  # the library refuses any tensor it does not expect as laid out
        info = m.info
    full = layout.with_defaults(cfg)
    assert info.d_model == cfg["d_model"] and info.max_len == cfg["max_len"]
    assert info.num_blocks == cfg["blocks"]["count"] and info.num_heads == cfg["blocks"]["num_heads"]
    assert info.num_tasks == layout.num_tasks(cfg) and info.num_side_features == layout.num_side(cfg)
    assert info.head == full["head"]["type"]
    assert info.num_items == min(layout.table(cfg, n)["rows"] for n in layout.item_tables(cfg))
    assert info.weight_bytes == 4 * sum(int(np.prod(s)) for s in shapes.values())
    with flame.Model.random(cfg) as r:  # and the library's own layout of the config, the same size
        assert r.info.weight_bytes == info.weight_bytes


def _set(path, value):
    """A mutation: sets cfg[path...] to value (None deletes the key)."""
    def apply(cfg):
        c = copy.deepcopy(cfg)
        node = c
        for k in path[:-1]:
            node = node[k]
        if value is None:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return c
    return apply


def _rename_table(i, name):
    """A mutation: table i and the features reading it renamed to `name`."""
    def apply(cfg):
        c = copy.deepcopy(cfg)
        old = c["tables"][i]["name"]
        c["tables"][i]["name"] = name
        for f in c["features"]:
            if f["table"] == old:
                f["table"] = name
        return c
    return apply


SUMI = CASES["relu_concat_projection_side_sumi"]      # concat + projection, side features, sumi head
DOT = CASES["iclrec_like"]                            # sum combine, no projection, dot head
# (name, base config, mutation, whether the library accepts the result)
MUTATIONS = [
    ("d_model_0", DOT, _set(["d_model"], 0), False),
    ("d_model_not_multiple_of_heads", SUMI, _set(["d_model"], 13), False),
    ("max_len_0", DOT, _set(["max_len"], 0), False),
    ("max_len_above_2^20", DOT, _set(["max_len"], (1 << 20) + 1), False),
    ("version_2", DOT, _set(["version"], 2), False),
    ("format_other", DOT, _set(["format"], "onnx"), False),
    ("no_tables", DOT, _set(["tables"], []), False),
    ("table_rows_0", DOT, _set(["tables", 0, "rows"], 0), False),
    ("table_dim_above_65536", SUMI, _set(["tables", 1, "dim"], 65537), False),
    ("table_name_with_space", SUMI, _rename_table(1, "c t"), False),
    ("table_name_64_chars", SUMI, _rename_table(1, "t" * 64), False),
    ("table_name_63_chars", SUMI, _rename_table(1, "t" * 63), True),
    ("table_name_dash_underscore", SUMI, _rename_table(1, "c-a_t"), True),
    ("feature_name_with_dot", SUMI, _set(["features", 1, "name"], "c.t"), False),
    ("duplicate_table_name", SUMI, _set(["tables", 2, "name"], "cat"), False),
    ("feature_table_unknown", DOT, _set(["features", 0, "table"], "nope"), False),
    ("feature_input_other", DOT, _set(["features", 0, "input"], "user"), False),
    ("feature_pooling_max", SUMI, _set(["features", 1, "pooling"], "max"), False),
    ("feature_pooling_left_out", SUMI, _set(["features", 1, "pooling"], None), True),
    ("combine_avg", DOT, _set(["combine"], "avg"), False),
    ("combine_sum_unequal_dims", SUMI, _set(["combine"], "sum"), False),
    ("no_projection_width_mismatch", SUMI, _set(["projection"], False), False),
    ("projection_left_out_concat", SUMI, _set(["projection"], None), False),
    ("position_rule_other", DOT, _set(["position", "rule"], "absolute"), False),
    ("position_rows_below_max_len", DOT, _set(["position", "rows"], 5), False),
    ("position_rows_above_2^20", DOT, _set(["position", "rows"], (1 << 20) + 1), False),
    ("position_rows_left_out", DOT, _set(["position", "rows"], None), False),
    ("candidate_position_past_rows", SUMI, _set(["position", "candidate_position"], 6), False),
    ("candidate_position_below_-1", SUMI, _set(["position", "candidate_position"], -2), False),
    ("position_left_out", DOT, _set(["position"], None), True),
    ("rule_none_ignores_rows_and_candidate", DOT, _set(["position"], {"rule": "none", "rows": 1,
                                                                       "candidate_position": 9}), True),
    ("blocks_count_257", DOT, _set(["blocks", "count"], 257), False),
    ("num_heads_0", DOT, _set(["blocks", "num_heads"], 0), False),
    ("ffn_dim_0", DOT, _set(["blocks", "ffn_dim"], 0), False),
    ("norm_other", DOT, _set(["blocks", "norm"], "sandwich"), False),
    ("activation_other", DOT, _set(["blocks", "activation"], "swish"), False),
    ("blocks_left_out", DOT, _set(["blocks"], None), False),
    ("eps_above_1", DOT, _set(["layernorm", "eps"], 2.0), False),
    ("layernorm_left_out", DOT, _set(["layernorm"], None), True),
    ("input_layernorm_left_out", DOT, _set(["input_layernorm"], None), True),
    ("head_type_other", DOT, _set(["head", "type"], "mlp"), False),
    ("dot_table_unknown", DOT, _set(["head", "table"], "nope"), False),
    ("no_tasks", SUMI, _set(["head", "tasks"], []), False),
    ("task_hidden_9_layers", SUMI, _set(["head", "tasks", 0, "hidden"], [4] * 9), False),
    ("task_hidden_8_layers", SUMI, _set(["head", "tasks", 0, "hidden"], [4] * 8), True),
    ("task_hidden_width_0", SUMI, _set(["head", "tasks", 0, "hidden"], [0]), False),
    ("task_hidden_left_out", SUMI, _set(["head", "tasks", 0, "hidden"], None), True),
    ("task_activation_other", SUMI, _set(["head", "tasks", 0, "activation"], "tanh"), False),
    ("task_activation_left_out", SUMI, _set(["head", "tasks", 0, "activation"], None), True),
    ("task_name_empty", SUMI, _set(["head", "tasks", 0, "name"], ""), False),
]


@pytest.mark.parametrize("name,base,mutate,accepted", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_python_and_the_library_agree(tmp_path, name, base, mutate, accepted):
    cfg = mutate(base)
    py, why_py = py_accepts(cfg)
    c, why_c = c_accepts(cfg)
    assert (py, c) == (accepted, accepted), f"{name}: Python {py} ({why_py}), library {c} ({why_c})"
    if accepted:  # and the same tensors
        path = tmp_path / "m.safetensors"
        reference.save(path, cfg, reference.random_model(cfg, 2))
        flame.Model(path).close()
