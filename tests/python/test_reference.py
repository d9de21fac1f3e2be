"""Self-checks of the numpy reference: properties the format promises, each of which a
wrong mask, position rule, pooling or file reader would break; and the Beauty metrics."""
import json
import time

import numpy as np
import pytest

import flame_testlib as lib
from flame.tools import convert, evaluate, layout, reference, st_io


def model(name, seed=0, dtype="F32", tmp_path=None):
    cfg = lib.CASES[name]
    t = reference.random_model(cfg, seed)
    if tmp_path is None:
        return cfg, {k: v.astype(np.float64) for k, v in t.items()}
    reference.save(tmp_path / "m.safetensors", cfg, t, dtype)
    return reference.load(tmp_path / "m.safetensors")


@pytest.mark.parametrize("name", ["pre_tanh_final_sumi_from_recent", "relu_concat_projection_side_sumi"])
def test_sumi_candidates_are_independent(name):
    cfg, t = model(name)
    rng = np.random.default_rng(1)
    h, c, hs, cs = lib.random_request(cfg, rng, 5, 6)
    full = reference.score(cfg, t, h, c, hs, cs)
    assert full.shape == (6, 3) and np.all((full > 0) & (full < 1))
    # each candidate alone gives its row of the joint request (no candidate sees another)
    for j in range(6):
        one = None if cs is None else [(np.array([0, o[j + 1] - o[j]]), ids[o[j]:o[j + 1]]) for o, ids in cs]
        np.testing.assert_allclose(reference.score(cfg, t, h, c[j:j + 1], hs, one)[0], full[j], rtol=1e-12)
    # ...while the history does matter
    assert not np.allclose(reference.score(cfg, t, h[1:], c, None if hs is None else
                                           [(o[1:] - o[1], ids[o[1]:]) for o, ids in hs], cs), full)


def test_dot_head_is_causal():
    """With no position embedding, the user state after k items is token k-1's output in
    the longer sequence: later items must not leak into earlier tokens."""
    cfg = lib.config(position={"rule": "none", "candidate_position": -1}, blocks={"norm": "pre"})
    t = {k: v.astype(np.float64) for k, v in reference.random_model(cfg, 3).items()}
    h = np.array([4, 9, 1, 30, 17, 22])
    x = reference.embed(cfg, t, h)
    mask = np.tril(np.ones((6, 6), dtype=bool))
    states = reference.encode(x, mask, t, cfg)
    table = t["tables.item.weight"]
    for k in range(1, 7):
        np.testing.assert_allclose(reference.score(cfg, t, h[:k], np.arange(40))[:, 0], table @ states[k - 1],
                                   rtol=1e-10, atol=1e-12)


def test_history_truncation_keeps_most_recent():
    cfg, t = model("deep_pre_side_dot_projection")  # max_len 4, side features
    rng = np.random.default_rng(2)
    h, c, hs, cs = lib.random_request(cfg, rng, 9, 5)
    kept = [(o[5:] - o[5], ids[o[5]:]) for o, ids in hs]
    np.testing.assert_array_equal(reference.score(cfg, t, h, c, hs, cs), reference.score(cfg, t, h[5:], c, kept, cs))
    assert not np.allclose(reference.score(cfg, t, h[:8], c, [(o[:9], ids[:o[8]]) for o, ids in hs], cs),
                           reference.score(cfg, t, h, c, hs, cs))


def test_empty_history():
    cfg, t = model("iclrec_like")
    np.testing.assert_array_equal(reference.score(cfg, t, [], [1, 2, 3]), np.zeros((3, 1)))
    cfg, t = model("pre_tanh_final_sumi_from_recent")
    s = reference.score(cfg, t, [], [5, 6])
    assert np.all(np.isfinite(s))
    np.testing.assert_allclose(reference.score(cfg, t, [], [6])[0], s[1], rtol=1e-12)
    assert reference.score(cfg, t, [1], [5, 6]).shape == (2, 3) and reference.score(cfg, t, [1], []).shape == (0, 3)


def test_embedding_rules_without_blocks():
    """0 blocks and no LayerNorm: the dot score is <sum of pooled features + position, T[c]>."""
    tables, features = lib.side_features(("sum", "mean"))
    tables = [{**tb, "dim": 16} for tb in tables]
    for rule, last_row in [("left_padded_slot", 5), ("from_recent", 0), ("from_oldest", 1)]:
        cfg = lib.config(tables=tables, features=features, input_layernorm=False, blocks={"count": 0},
                         position={"rule": rule, "rows": 8, "candidate_position": -1})
        t = {k: v.astype(np.float64) for k, v in reference.random_model(cfg, 5).items()}
        # token 1 (the last): item 7, cat bag {2, 2} under sum, tag bag {1, 12} under mean
        hs = [(np.array([0, 1, 3]), np.array([6, 2, 2])), (np.array([0, 0, 2]), np.array([1, 12]))]
        base = t["tables.item.weight"][7] + 2 * t["tables.cat.weight"][2] + t["position.weight"][last_row]
        e = base + (t["tables.tag.weight"][1] + t["tables.tag.weight"][12]) / 2
        got = reference.score(cfg, t, [3, 7], [0, 39], hs)[:, 0]
        np.testing.assert_allclose(got, t["tables.item.weight"][[0, 39]] @ e, rtol=1e-12)
        # an empty bag pools to zero under mean too
        hs[1] = (np.array([0, 2, 2]), np.array([1, 12]))
        np.testing.assert_allclose(reference.score(cfg, t, [3, 7], [0, 39], hs)[:, 0],
                                   t["tables.item.weight"][[0, 39]] @ base, rtol=1e-12)


def test_layernorm_eps_placement():
    x = np.array([[1.0, 2.0, 4.0]])
    t = {"n.weight": np.ones(3), "n.bias": np.zeros(3)}
    sd = np.std(x)
    inside = reference.layer_norm(x, t, "n", {"layernorm": {"eps": 0.5, "eps_inside_sqrt": True}})
    outside = reference.layer_norm(x, t, "n", {"layernorm": {"eps": 0.5, "eps_inside_sqrt": False}})
    np.testing.assert_allclose(inside, (x - x.mean()) / np.sqrt(sd ** 2 + 0.5))
    np.testing.assert_allclose(outside, (x - x.mean()) / (sd + 0.5))


def test_activations():
    x = np.linspace(-4, 4, 81)
    erf, tanh = reference.activation("gelu_erf", x), reference.activation("gelu_tanh", x)
    assert np.max(np.abs(erf - tanh)) < 1e-3 and np.max(np.abs(erf - tanh)) > 1e-5
    np.testing.assert_allclose(reference.activation("gelu_erf", np.array([1.0])), [0.8413447460685429], rtol=1e-14)
    np.testing.assert_array_equal(reference.activation("relu", x), np.maximum(x, 0))


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_half_files_round_trip(tmp_path, dtype):
    cfg, t32 = lib.CASES["iclrec_like"], reference.random_model(lib.CASES["iclrec_like"], 7)
    reference.save(tmp_path / "m.safetensors", cfg, t32, dtype)
    assert set(st_io.read_header(tmp_path / "m.safetensors")[1][k]["dtype"] for k in t32) == {dtype}
    _, t = reference.load(tmp_path / "m.safetensors")
    for k, v in t32.items():
        want = v.astype(np.float16) if dtype == "F16" else st_io.bf16_bits_to_f32(st_io.f32_to_bf16_bits(v))
        np.testing.assert_array_equal(t[k], want.astype(np.float64))
        np.testing.assert_allclose(t[k], v, rtol=2 ** -8, atol=1e-4)


def test_bf16_rounds_to_nearest_even():
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -2.5, 3.0e38], dtype=np.float32)
    got = st_io.bf16_bits_to_f32(st_io.f32_to_bf16_bits(x))
    np.testing.assert_array_equal(got, np.array([1.0, 1.0, 1 + 2 ** -6, 1 + 2 ** -7, -2.5, 226 / 128 * 2.0 ** 127], np.float32))


def test_load_rejects_wrong_tensor_sets(tmp_path):
    cfg = lib.CASES["iclrec_like"]
    t = reference.random_model(cfg, 0)
    meta = {"flame.config": json.dumps(cfg)}
    st_io.write(tmp_path / "extra.safetensors", {**t, "blocks.9.attn.q.weight": np.zeros((16, 16))}, meta)
    with pytest.raises(ValueError, match="unexpected tensor 'blocks.9.attn.q.weight'"):
        reference.load(tmp_path / "extra.safetensors")
    st_io.write(tmp_path / "miss.safetensors", {k: v for k, v in t.items() if k != "blocks.1.ln2.bias"}, meta)
    with pytest.raises(ValueError, match="missing tensor 'blocks.1.ln2.bias'"):
        reference.load(tmp_path / "miss.safetensors")


def test_bad_ids_are_named():
    cfg, t = model("relu_concat_projection_side_sumi")
    with pytest.raises(ValueError, match="id 40 "):
        reference.score(cfg, t, [1, 2], [40], *lib.random_request(cfg, np.random.default_rng(0), 2, 1)[2:])
    h, c, hs, cs = lib.random_request(cfg, np.random.default_rng(0), 2, 1)
    hs[1] = (np.array([0, 1, 3]), np.array([0, 12, 13]))  # slot 1 indexes table 'tag' (13 rows)
    with pytest.raises(ValueError, match="id 13 "):
        reference.score(cfg, t, h, c, hs, cs)


def test_config_ranges():
    with pytest.raises(ValueError, match="num_heads"):
        layout.check(lib.config(blocks={"num_heads": 3}))
    with pytest.raises(ValueError, match="candidate_position"):
        layout.check(lib.config(position={"rule": "left_padded_slot", "rows": 6, "candidate_position": 6}))
    with pytest.raises(ValueError, match="position.rows"):
        layout.check(lib.config(position={"rule": "from_recent", "rows": 5, "candidate_position": -1}))


@pytest.mark.parametrize("cfg", [lib.CASES["iclrec_like"], lib.CASES["no_blocks_dot"], lib.config(
    blocks={"norm": "pre", "count": 3, "activation": "relu"}, final_layernorm=True,
    position={"rule": "from_recent", "rows": 7, "candidate_position": -1}), lib.config(
    blocks={"norm": "pre", "count": 2}, position={"rule": "from_oldest", "rows": 7, "candidate_position": -1})])
def test_batched_user_states_equal_per_request(cfg):
    t = {k: v.astype(np.float64) for k, v in reference.random_model(cfg, 4).items()}
    rng = np.random.default_rng(4)
    hists = [rng.integers(0, 40, size=n) for n in (0, 1, 2, 5, 6, 3)]  # max_len 6
    h = evaluate.user_states(cfg, t, hists)
    table = t["tables.item.weight"]
    for b, hist in enumerate(hists):
        np.testing.assert_allclose(table @ h[b], reference.score(cfg, t, hist, np.arange(40))[:, 0],
                                   rtol=1e-10, atol=1e-12)


def test_beauty_metrics(tmp_path, beauty_dir):
    """The converted ICLRec checkpoint reproduces its published full-sort metrics."""
    dst = tmp_path / "beauty.safetensors"
    assert convert.main(["iclrec", str(beauty_dir / "iclrec-beauty.safetensors"), str(dst)]) == 0
    t0 = time.perf_counter()
    got = evaluate.evaluate(dst, beauty_dir / "Beauty.txt")
    want = json.loads((beauty_dir / "iclrec-beauty.metrics.json").read_text())
    print(f"Beauty: {got} in {time.perf_counter() - t0:.1f} s")
    for k in ("HR@5", "NDCG@5", "HR@10", "NDCG@10", "HR@20", "NDCG@20"):
        assert abs(got[k] - want[k]) <= 2e-4, (k, got[k], want[k])


def test_duplicate_config_keys_are_refused_like_libflame(tmp_path):
    """json.loads keeps the last of two equal keys, cJSON the first: both readers refuse them."""
    import flame
    from flame import errors
    text = json.dumps(lib.CASES["pre_tanh_final_sumi_from_recent"])
    text = text.replace('"max_len":', '"max_len": 3, "max_len":', 1)
    header = json.dumps({"__metadata__": {"flame.config": text}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "dup.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(flame.FlameError) as e:
        flame.Model(path)
    assert e.value.status == errors.ERR_FORMAT and "key 'max_len' appears twice" in e.value.message, e.value.message
    with pytest.raises(ValueError, match="key 'max_len' appears twice"):
        reference.load(path)
