"""int8 row-wise quantized tables (docs/model-format.md, "int8 tables"): flame.tools.quant's
quantizer, files written by flame.tools.reference.save / flame.export and read back, libflame
(ctypes) against the float64 numpy reference on int8 models of every option of the format,
and the loader's rejections (libflame and the reference refuse the same files, with the same
message). These tests FAIL (not skip) when lib/libflame.so is missing: `make` builds it."""
import numpy as np
import pytest

import flame_testlib as lib
import flame
from flame import _lib, errors
from flame.tools import layout, quant, reference, st_io

RTOL = 1e-5  # float32 engine vs float64 reference, relative to lib.score_scale


@pytest.fixture(scope="module")
def native():
    try:
        _lib.lib()
    except flame.LibraryNotFoundError as e:
        pytest.fail(f"libflame is not built: {e}")
    return flame


def fresh_rng():
    seed = int(np.random.SeedSequence().entropy % (1 << 63))
    print(f"seed {seed}")
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- the quantizer


def test_quantize_rows_error_range_and_constant_rows():
    rng = fresh_rng()
    for _ in range(20):
        rows, dim = int(rng.integers(1, 50)), int(rng.integers(1, 70))
        x = (rng.standard_normal((rows, dim)) * rng.uniform(1e-3, 1e3)).astype(np.float32)
        x[rng.integers(0, rows)] = np.float32(rng.standard_normal())  # a constant row
        q, qp = quant.quantize_rows(x)
        assert q.dtype == np.int8 and q.shape == x.shape and qp.dtype == np.float32 and qp.shape == (rows, 2)
        deq = quant.dequantize_rows(q, qp)
        scale, bias = qp[:, 0].astype(np.float64), qp[:, 1].astype(np.float64)
        err = np.abs(deq - x).max(1)
        # within half a step, plus float32 rounding of scale and bias
        bound = scale / 2 + 1e-6 * np.abs(x).max(1) + 256 * np.abs(scale) * 1e-7
        assert np.all(err <= bound), (err, bound)
        # the codes span the row: min and max come back within half a step, both ends used
        flat = scale == 0
        assert np.all(q[flat] == 0) and np.all(deq[flat] == x[flat])
        live = ~flat
        assert np.all(q[live].min(1) == -128) and np.all(q[live].max(1) == 127)
        np.testing.assert_allclose(bias[live], x[live].min(1) + 128 * scale[live], rtol=1e-6)


def test_quantize_refuses_non_finite_and_bad_shapes():
    with pytest.raises(ValueError, match="non-finite"):
        quant.quantize_rows(np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="rows, dim"):
        quant.quantize_rows(np.zeros(4))


def test_float32_dequantization_matches_the_engines_arithmetic():
    """dequantize_rows(..., float32): float32 product, then float32 sum (what libflame does)."""
    rng = fresh_rng()
    q = rng.integers(-128, 128, size=(30, 9)).astype(np.int8)
    qp = rng.uniform(-1, 1, size=(30, 2)).astype(np.float32)
    got = quant.dequantize_rows(q, qp, np.float32)
    want = np.array([[np.float32(np.float32(qp[r, 0]) * np.float32(q[r, c])) + qp[r, 1] for c in range(9)]
                     for r in range(30)], dtype=np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- files


def test_save_writes_i8_and_qparams_and_load_dequantizes(tmp_path):
    cfg = lib.CASES["relu_concat_projection_side_sumi"]
    t = reference.random_model(cfg, int(fresh_rng().integers(1 << 30)))
    path = tmp_path / "m.safetensors"
    reference.save(path, cfg, t, "BF16", int8_tables=["item", "tag"])
    _, header = st_io.read_header(path)
    for name in ("item", "tag"):
        w, qp = header[f"tables.{name}.weight"], header[f"tables.{name}.qparams"]
        rows, dim = layout.table(cfg, name)["rows"], layout.table(cfg, name)["dim"]
        assert w["dtype"] == "I8" and w["shape"] == [rows, dim]
        assert qp["dtype"] == "F32" and qp["shape"] == [rows, 2]
    assert header["tables.cat.weight"]["dtype"] == "BF16" and "tables.cat.qparams" not in header
    assert all(e["dtype"] == "BF16" for k, e in header.items() if not k.startswith("tables."))
    _, raw, dtypes = st_io.read(path)
    _, t64 = reference.load(path)
    for name in ("item", "tag"):
        w = f"tables.{name}.weight"
        q, qp = raw[w], raw[quant.qparams_name(w)]
        assert q.dtype == np.int8 and dtypes[w] == "I8"
        np.testing.assert_array_equal(q, quant.quantize_rows(t[w])[0])
        np.testing.assert_array_equal(t64[w], quant.dequantize_rows(q, qp))
        assert quant.qparams_name(w) not in t64
    assert set(t64) == set(t)


def test_pack_refuses_unknown_tables():
    cfg = lib.CASES["iclrec_like"]
    with pytest.raises(ValueError, match="'nope' is not a table"):
        quant.pack(cfg, reference.random_model(cfg, 0), ["nope"])


# ---------------------------------------------------------------- libflame vs the reference


def expected_weight_bytes(cfg, int8):
    n = 0
    for name, shape in layout.shapes(cfg).items():
        count = int(np.prod(shape))
        is_q8 = name.startswith("tables.") and name[len("tables."):-len(".weight")] in int8
        n += shape[0] * (shape[1] + 8) if is_q8 else 4 * count
    return n


@pytest.mark.parametrize("which", ["all", "first"])
@pytest.mark.parametrize("name", list(lib.CASES))
def test_int8_models_match_reference(tmp_path, native, name, which):
    cfg = lib.CASES[name]
    rng = fresh_rng()
    tables = [t["name"] for t in cfg["tables"]]
    int8 = tables if which == "all" else tables[:1]
    path = tmp_path / f"{name}.int8.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, int(rng.integers(1 << 30))), "F32", int8_tables=int8)
    cfg2, t = reference.load(path)
    with flame.Model(path) as model, flame.Engine(model) as engine:
        assert model.info.weight_bytes == expected_weight_bytes(cfg, int8)
        ml = cfg["max_len"]
        reqs = [lib.random_request(cfg, rng, n, m) for n, m in [(0, 3), (1, 1), (2, 7), (ml, 5), (ml + 5, 33)]]
        for i, r in enumerate(reqs):
            got, want = engine.score(*r), reference.score(cfg2, t, *r)
            err = lib.rel_err(got, want, lib.score_scale(cfg2, t, r))
            assert err < RTOL, f"{name}/{which} request {i}: relative error {err:.3g}"


def test_export_int8_tables(tmp_path, native):
    cfg = lib.CASES["sum_mean_tables_no_position_dot"]
    t = reference.random_model(cfg, 5)
    path = tmp_path / "e.safetensors"
    flame.tools.export(t, path, cfg, int8_tables=True)
    assert {e["dtype"] for k, e in st_io.read_header(path)[1].items() if k.endswith(".weight")
            and k.startswith("tables.")} == {"I8"}
    _, t64 = reference.load(path)
    rng = fresh_rng()
    with flame.Model(path) as model, flame.Engine(model) as engine:
        for n, m in [(3, 10), (6, 40)]:
            r = lib.random_request(cfg, rng, n, m)
            want = reference.score(cfg, t64, *r)
            assert np.max(np.abs(engine.score(*r) - want)) <= RTOL * max(np.max(np.abs(want)), 1e-30)
    with pytest.raises(ValueError, match="not a table"):
        flame.tools.export(t, tmp_path / "f.safetensors", cfg, int8_tables=["missing"])


# ---------------------------------------------------------------- rejections


def _tiny(tmp_path, tensors, dtypes):
    cfg = lib.config(blocks={"count": 0}, tables=[{"name": "item", "rows": 10, "dim": 16}],
                     position={"rule": "from_recent", "rows": 6, "candidate_position": -1})
    full = reference.random_model(cfg, 1)
    full.update(tensors)
    full = {k: v for k, v in full.items() if v is not None}
    dt = {k: dtypes.get(k, "F32") for k in full}
    path = tmp_path / "bad.safetensors"
    st_io.write(path, full, {"flame.config": __import__("json").dumps(cfg)}, dt, finite=False)
    return path


def _with(a, at, value):
    a[at] = value
    return a


REJECTIONS = [
    ("missing qparams", {"tables.item.weight": np.zeros((10, 16), np.int8)}, {"tables.item.weight": "I8"},
     "missing tensor 'tables.item.qparams': 'tables.item.weight' is I8, so it needs its per-row scale and bias "
     "([10, 2], F32)"),
    ("qparams shape", {"tables.item.weight": np.zeros((10, 16), np.int8),
                       "tables.item.qparams": np.ones((10, 3), np.float32)}, {"tables.item.weight": "I8"},
     "tensor 'tables.item.qparams' has shape [10, 3], expected [10, 2]"),
    ("qparams dtype", {"tables.item.weight": np.zeros((10, 16), np.int8),
                       "tables.item.qparams": np.ones((10, 2), np.float32)},
     {"tables.item.weight": "I8", "tables.item.qparams": "F16"},
     "tensor 'tables.item.qparams' has dtype F16, expected F32 (the per-row scale and bias of 'tables.item.weight')"),
    ("non-finite scale", {"tables.item.weight": np.zeros((10, 16), np.int8),
                          "tables.item.qparams": np.array([[1, 0]] * 4 + [[np.inf, 0]] + [[1, 0]] * 5, np.float32)},
     {"tables.item.weight": "I8"}, "tensor 'tables.item.qparams': row 4 has a non-finite scale (inf)"),
    ("non-finite bias", {"tables.item.weight": np.zeros((10, 16), np.int8),
                         "tables.item.qparams": np.array([[1, 0]] * 9 + [[1, np.nan]], np.float32)},
     {"tables.item.weight": "I8"}, "tensor 'tables.item.qparams': row 9 has a non-finite bias (nan)"),
    ("overflowing scale and bias", {"tables.item.weight": np.zeros((10, 16), np.int8),
                                    "tables.item.qparams": np.array([[1, 0]] * 5 + [[3e38, -3e38]] + [[1, 0]] * 4,
                                                                    np.float32)},
     {"tables.item.weight": "I8"},
     "tensor 'tables.item.qparams': row 5: scale 3e+38 and bias -3e+38 give values beyond float32"),
    ("qparams for a float table", {"tables.item.qparams": np.ones((10, 2), np.float32)}, {},
     "unexpected tensor 'tables.item.qparams': 'tables.item.weight' is F32, not I8 (only int8 tables have qparams)"),
    ("I8 position table", {"position.weight": np.zeros((6, 16), np.int8)}, {"position.weight": "I8"},
     "tensor 'position.weight' has dtype I8; only embedding tables (tables.<name>.weight) may be int8"),
    ("NaN weight", {"tables.item.weight": _with(np.ones((10, 16), np.float32), (3, 5), np.nan)}, {},
     "tensor 'tables.item.weight' (F32): value 53 (row 3, column 5) is nan; weights must be finite"),
    ("Inf BF16 weight", {"position.weight": _with(np.ones((6, 16), np.float32), (2, 0), np.inf)},
     {"position.weight": "BF16"}, "tensor 'position.weight' (BF16): value 32 (row 2, column 0) is inf"),
    ("-Inf F16 weight", {"position.weight": _with(np.ones((6, 16), np.float32), (5, 15), -np.inf)},
     {"position.weight": "F16"}, "tensor 'position.weight' (F16): value 95 (row 5, column 15) is -inf"),
]


@pytest.mark.parametrize("what,tensors,dtypes,message", REJECTIONS, ids=[r[0] for r in REJECTIONS])
def test_libflame_and_reference_refuse_the_same_files(tmp_path, native, what, tensors, dtypes, message):
    path = _tiny(tmp_path, tensors, dtypes)
    with pytest.raises(flame.FlameError) as e:
        flame.Model(path)
    assert e.value.status == errors.ERR_FORMAT and message in e.value.message, e.value.message
    with pytest.raises(ValueError) as e2:
        reference.load(path)
    assert message in str(e2.value), str(e2.value)


def test_torch_from_file_dequantizes_int8_tables(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from flame.tools import torch_ref
    cfg = lib.CASES["iclrec_like"]
    t = reference.random_model(cfg, 3)
    path = tmp_path / "t.safetensors"
    reference.save(path, cfg, t, int8_tables=True)
    m = torch_ref.FlameModel.from_file(path)
    q, qp = quant.quantize_rows(t["tables.item.weight"])
    np.testing.assert_array_equal(m.state_dict()["tables.item.weight"].numpy(), quant.dequantize_rows(q, qp, np.float32))
    with torch.no_grad():
        r = lib.random_request(cfg, np.random.default_rng(0), 4, 6)
        _, t64 = reference.load(path)
        want = reference.score(cfg, t64, *r)
        got = m.score(*r)
    assert np.max(np.abs(got - want)) <= RTOL * np.max(np.abs(want))


# ---------------------------------------------------------------- the trained Beauty model, int8


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_beauty_with_an_int8_item_table_keeps_its_metrics(beauty_dir, tmp_path, device):
    """The ICLRec Beauty checkpoint with its item table (embedding and dot head) quantized to
    int8: within 0.0005 of the published metrics (float32: within 0.0002)."""
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO
    f32 = REPO / "build" / "beauty.flame.safetensors"  # made by `make test`
    if not f32.exists():
        f32 = tmp_path / "beauty.flame.safetensors"
        subprocess.run([sys.executable, "-m", "flame.tools.convert", "iclrec", str(beauty_dir / "iclrec-beauty.safetensors"),
                        str(f32)], check=True, env={"PYTHONPATH": str(REPO / "python")})
    meta, t, _ = st_io.read(f32)
    cfg = layout.parse(meta["flame.config"])
    out, dtypes = quant.pack(cfg, t, True)
    path = tmp_path / "beauty-int8.safetensors"
    st_io.write(path, out, meta, dtypes)
    assert os.path.getsize(path) < 0.4 * os.path.getsize(f32)
    res = subprocess.run([str(REPO / "examples" / "flame-score"), "--model", str(path), "--sequences",
                          str(beauty_dir / "Beauty.txt"), "--eval", "loo", "--k", "5,10,20", "--exclude-history",
                          "--json", "--batch", "64", "--device", device],
                         capture_output=True, text=True, timeout=600)
    if device == "cuda" and res.returncode != 0 and "FLAME_ERR_NO_DEVICE" in res.stderr:
        if os.environ.get("FLAME_REQUIRE_GPU"):
            pytest.fail("FLAME_REQUIRE_GPU is set but: " + res.stderr.strip())
        pytest.skip("no usable GPU: " + res.stderr.strip().splitlines()[-1])
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    want = json.loads((beauty_dir / "iclrec-beauty.metrics.json").read_text())
    assert got["users"] == want["users"] == 22363
    for k in ["HR@5", "NDCG@5", "HR@10", "NDCG@10", "HR@20", "NDCG@20"]:
        assert abs(got[k] - want[k]) <= 0.0005, f"{k} ({device}, int8): libflame {got[k]:.5f} vs published {want[k]:.4f}"
