"""libflame (through ctypes) against the float64 numpy reference on random small models
covering every option of docs/model-format.md, stored as F32, F16 and BF16 files.
These tests FAIL (not skip) when lib/libflame.so is missing: `make` builds it first."""
import json
import pathlib
import re

import numpy as np
import pytest

import flame_testlib as lib
import flame
from flame import _lib, errors
from flame.tools import convert, layout, reference, st_io

RTOL = 1e-5  # float32 engine vs float64 reference, relative to lib.score_scale


@pytest.fixture(scope="module")
def native():
    try:
        _lib.lib()
    except flame.LibraryNotFoundError as e:
        pytest.fail(f"libflame is not built: {e}")
    return flame


def load_pair(tmp_path, native, name, dtype, seed=0):
    cfg = lib.CASES[name]
    path = tmp_path / f"{name}.{dtype}.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, seed), dtype)
    model = flame.Model(path)
    return reference.load(path), model, flame.Engine(model)


def requests(cfg, seed):
    """Empty, short, exactly-full and over-long histories; one candidate and many."""
    rng = np.random.default_rng(seed)
    ml = cfg["max_len"]
    return [lib.random_request(cfg, rng, n, m) for n, m in [(0, 3), (1, 1), (2, 7), (ml, 5), (ml + 5, 33)]]


def assert_close(got, want, what, scale=None):
    assert got.dtype == np.float32 and got.shape == want.shape, (what, got.shape, want.shape)
    err = lib.rel_err(got, want, scale)
    assert err < RTOL, f"{what}: relative error {err:.3g} >= {RTOL}"


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("name", list(lib.CASES))
def test_scores_match_reference(tmp_path, native, name, dtype):
    (cfg, t), model, engine = load_pair(tmp_path, native, name, dtype)
    info = model.info
    assert (info.d_model, info.num_blocks, info.num_heads, info.ffn_dim, info.max_len) == \
        (cfg["d_model"], cfg["blocks"]["count"], cfg["blocks"]["num_heads"], cfg["blocks"]["ffn_dim"], cfg["max_len"])
    assert info.num_tasks == layout.num_tasks(cfg) and info.num_side_features == layout.num_side(cfg)
    assert info.head == cfg["head"]["type"]
    assert info.num_items == min(layout.table(cfg, n)["rows"] for n in layout.item_tables(cfg))
    reqs = requests(cfg, seed=1)
    scales = [lib.score_scale(cfg, t, r) for r in reqs]
    for i, r in enumerate(reqs):
        assert_close(engine.score(*r), reference.score(cfg, t, *r), f"{name}/{dtype} request {i}", scales[i])
    for i, got in enumerate(engine.score_batch(reqs)):
        assert_close(got, reference.score(cfg, t, *reqs[i]), f"{name}/{dtype} batch request {i}", scales[i])


def test_empty_candidates_and_dot_empty_history(tmp_path, native):
    (cfg, t), _, engine = load_pair(tmp_path, native, "iclrec_like", "F32")
    assert engine.score([1, 2], []).shape == (0, 1)
    np.testing.assert_array_equal(engine.score([], [1, 2, 3]), np.zeros((3, 1), np.float32))


def expect_error(fn, status, *fragments):
    with pytest.raises(flame.FlameError) as e:
        fn()
    assert e.value.status == status, str(e.value)
    for f in fragments:
        assert f in e.value.message, (f, e.value.message)


def test_out_of_range_ids_are_invalid_arg(tmp_path, native):
    (cfg, _), _, engine = load_pair(tmp_path, native, "iclrec_like", "F32")
    expect_error(lambda: engine.score([1, 2], [3, 40]), errors.ERR_INVALID_ARG, "40")
    expect_error(lambda: engine.score([1, 987654], [3]), errors.ERR_INVALID_ARG, "987654")
    expect_error(lambda: engine.score([-7, 1], [3]), errors.ERR_INVALID_ARG, "-7")
    (cfg, _), _, engine = load_pair(tmp_path, native, "relu_concat_projection_side_sumi", "F32")
    h, c, hs, cs = lib.random_request(cfg, np.random.default_rng(0), 2, 1)
    hs[1] = (np.array([0, 1, 2]), np.array([3, 1313]))  # table 'tag' has 13 rows
    expect_error(lambda: engine.score(h, c, hs, cs), errors.ERR_INVALID_ARG, "1313")
    # a batch is validated as a whole: the message names the bad request
    hs[1] = (np.array([0, 1, 2]), np.array([3, 4]))
    expect_error(lambda: engine.score_batch([(h, c, hs, cs), (h, [555], hs, cs)]), errors.ERR_INVALID_ARG, "555")


def test_bad_file_is_format_error(tmp_path, native):
    cfg = lib.CASES["iclrec_like"]
    t = reference.random_model(cfg, 0)
    del t["blocks.1.ffn.fc1.bias"]
    st_io.write(tmp_path / "bad.safetensors", t, {"flame.config": json.dumps(cfg)})
    expect_error(lambda: flame.Model(tmp_path / "bad.safetensors"), errors.ERR_FORMAT, "blocks.1.ffn.fc1.bias")


def test_version(native):
    L = _lib.lib()
    # the one place the version lives is flame.h; the library and the package say the same
    header = (pathlib.Path(__file__).resolve().parents[2] / "include" / "flame" / "flame.h").read_text()
    string = re.search(r'#define FLAME_VERSION_STRING "([0-9.]+)"', header).group(1)
    major, minor, patch = (int(x) for x in string.split("."))
    assert L.flame_version() == major * 10000 + minor * 100 + patch and flame.library_version() == string
    assert flame.__version__ == string
    assert _lib.status_name(errors.ERR_INVALID_ARG) == "FLAME_ERR_INVALID_ARG"


def test_beauty_model_matches_reference(tmp_path, native, beauty_dir):
    """The real converted checkpoint, all 12,103 items as candidates, a sample of users."""
    dst = tmp_path / "beauty.safetensors"
    assert convert.main(["iclrec", str(beauty_dir / "iclrec-beauty.safetensors"), str(dst)]) == 0
    cfg, t = reference.load(dst)
    engine = flame.Engine(flame.Model(dst))
    lines = (beauty_dir / "Beauty.txt").read_text().splitlines()
    items = np.arange(cfg["tables"][0]["rows"])
    for line in lines[::997]:
        seq = np.array(line.split()[1:], dtype=np.int64)[:-1]
        assert_close(engine.score(seq, items), reference.score(cfg, t, seq, items), f"Beauty user {line.split()[0]}")


def cpu_kernel_sets():
    """The FLAME_OPT_CPU_KERNELS choices this CPU has (from /proc/cpuinfo's flags, as the
    library reads cpuid), and those it lacks."""
    try:
        flags = set(re.search(r"^flags\s*:\s*(.+)$", pathlib.Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    except (OSError, AttributeError):
        flags = set()
    has = {"auto", "blas"}
    if "avx2" in flags and "fma" in flags:
        has.add("avx2")
    if "avx512f" in flags:
        has.add("avx512")
    return has, {"avx512", "avx2"} - has


@pytest.mark.parametrize("name", ["iclrec_like", "pre_tanh_final_sumi_from_recent", "relu_concat_projection_side_sumi"])
def test_cpu_kernels_choices_match_reference(tmp_path, native, name):
    """Every kernel set the CPU has scores within 1e-5 of the float64 reference (own kernels
    of any set give the same bits); one it lacks is refused at engine creation, by name."""
    cfg = lib.CASES[name]
    path = tmp_path / f"{name}.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 3), "F32")
    cfg, t = reference.load(path)
    model = flame.Model(path)
    reqs = requests(cfg, seed=4)
    scales = [lib.score_scale(cfg, t, r) for r in reqs]
    has, lacks = cpu_kernel_sets()
    own = {}
    for choice in sorted(has):
        engine = flame.Engine(model, cpu_kernels=choice, threads=2)
        got = engine.score_batch(reqs)
        for i, g in enumerate(got):
            assert_close(g, reference.score(cfg, t, *reqs[i]), f"{name} cpu_kernels={choice} request {i}", scales[i])
        if choice != "blas":
            own[choice] = got
    first = next(iter(own.values()))
    for choice, got in own.items():  # auto is one of avx512/avx2 (or the BLAS on a CPU without AVX2)
        if "avx2" in has:
            for a, b in zip(got, first):
                np.testing.assert_array_equal(a, b, err_msg=f"cpu_kernels={choice}")
    for choice in sorted(lacks):
        expect_error(lambda: flame.Engine(model, cpu_kernels=choice), errors.ERR_UNSUPPORTED,
                     f"FLAME_OPT_CPU_KERNELS = '{choice}'", "this CPU lacks")
    expect_error(lambda: flame.Engine(model, cpu_kernels="sse"), errors.ERR_INVALID_ARG,
                 "FLAME_OPT_CPU_KERNELS = 'sse' is not one of auto, avx512, avx2, blas")
