"""The ctypes package (flame.Model, flame.Engine): arrays in and out, options, statistics,
and every error path: bad dtype, wrong shape, closed handles, library missing or of the
wrong version, and each status code turned into its exception class."""
import ctypes
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import flame
import flame_testlib as lib
from conftest import REPO
from flame import _lib, errors
from flame.tools import reference


@pytest.fixture
def dot_engine(tmp_path):
    cfg = lib.CASES["iclrec_like"]
    path = tmp_path / "dot.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 0))
    with flame.Model(path) as m, flame.Engine(m) as e:
        yield cfg, reference.load(path)[1], e


@pytest.fixture
def side_engine(tmp_path):
    cfg = lib.CASES["relu_concat_projection_side_sumi"]  # 3 tasks, 2 side slots
    path = tmp_path / "side.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 1))
    with flame.Model(path) as m, flame.Engine(m) as e:
        yield cfg, reference.load(path)[1], e


def test_score_arrays_and_no_copy_out(dot_engine):
    cfg, t, e = dot_engine
    h, c = np.array([3, 1, 4, 1, 5], dtype=np.int64), np.array([9, 2, 6], dtype=np.int64)
    s = e.score(h, c)
    assert s.dtype == np.float32 and s.shape == (3, 1) and s.flags.c_contiguous
    np.testing.assert_allclose(s, reference.score(cfg, t, h, c), rtol=1e-5)
    out = np.full((3, 1), np.nan, dtype=np.float32)
    assert e.score(h, c, out=out) is out  # written in place
    np.testing.assert_array_equal(out, s)
    # lists and strided int64 views give the same scores
    np.testing.assert_array_equal(e.score([3, 1, 4, 1, 5], (9, 2, 6)), s)
    np.testing.assert_array_equal(e.score(np.repeat(h, 2)[::2], c), s)


def test_side_features_and_batch(side_engine):
    cfg, t, e = side_engine
    rng = np.random.default_rng(3)
    reqs = [lib.random_request(cfg, rng, n, m) for n, m in [(4, 3), (0, 2), (9, 5)]]
    want = [reference.score(cfg, t, *r) for r in reqs]
    for r, w in zip(reqs, want):
        np.testing.assert_allclose(e.score(*r), w, rtol=1e-5, atol=1e-6)
    as_objects = [flame.Request(*reqs[0]), dict(zip(("history", "candidates", "history_side", "candidate_side"),
                                                    reqs[1])), reqs[2]]
    got = e.score_batch(as_objects)
    assert [g.shape for g in got] == [(3, 3), (2, 3), (5, 3)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert e.score_batch([]) == []


def test_bags_helper():
    off, ids = flame.bags([[4, 5], [], [6]])
    assert off.tolist() == [0, 2, 2, 3] and ids.tolist() == [4, 5, 6]
    assert off.dtype == ids.dtype == np.int64


def test_model_info_random_and_default(tmp_path):
    cfg = lib.CASES["pre_tanh_final_sumi_from_recent"]
    with flame.Model.random(cfg, seed=5) as m:
        i = m.info
        assert (i.d_model, i.num_blocks, i.num_heads, i.num_tasks, i.head, i.num_items) == (16, 2, 4, 3, "sumi", 40)
        assert i.weight_bytes == 4 * sum(int(np.prod(s)) for s in flame.tools.layout.shapes(cfg).values())
    d = flame.Model.default_config()
    assert d["format"] == "flame" and d["head"]["type"] == "sumi" and len(d["head"]["tasks"]) == 3
    with pytest.raises(flame.InvalidArgumentError, match=r"seed = 18446744073709551621 is outside \[0, "):
        flame.Model.random(cfg, seed=2**64 + 5)  # not the model of seed 5
    with pytest.raises(flame.InvalidArgumentError, match="seed = -1 is outside"):
        flame.Model.random(cfg, seed=-1)
    with pytest.raises(flame.InvalidArgumentError, match="device = 4294967296 is outside"):
        flame.kernels.EmbeddingBag([np.zeros((2, 2), np.float32)], device=2**32)  # not device 0


def test_engine_stats_count_calls_and_requests(dot_engine):
    _, _, e = dot_engine
    before = e.stats()["engine"]
    assert set(before) == {"calls", "requests", "workspaces", "scratch_bytes", "max_workspace_bytes",
                           "device_bytes", "device_weight_bytes", "graph_captures", "graph_replays",
                           "user_cache_hits", "user_cache_misses", "kv_cache_hits", "kv_cache_misses",
                           "kv_cache_extensions", "kv_cache_evictions", "kv_cache_bytes", "kv_cache_peak_bytes",
                           "kv_cache_budget_bytes", "kv_cache_tokens_computed", "kv_cache_tokens_saved",
                           "profile_passes", "profile_padding_tokens"}
    assert before["device_bytes"] == 0  # a CPU engine holds no GPU memory
    e.score([1, 2], [3])
    e.score([1], [3, 4])
    e.score_batch([([1], [2]), ([3], [4]), ([5], [6])])
    after = e.stats()["engine"]
    assert after["calls"] - before["calls"] == 3 and after["requests"] - before["requests"] == 5
    assert after["workspaces"] >= 1 and after["scratch_bytes"] > 0


@pytest.mark.parametrize("bad, what", [
    (np.array([1, 2], dtype=np.int32), "int32"), (np.array([1.0, 2.0]), "float64"),
    ([1.5, 2.0], "float64"), (np.array([1, 2], dtype=np.uint64), "uint64")])
def test_wrong_dtype_is_rejected_before_c(dot_engine, bad, what):
    _, _, e = dot_engine
    for args in ((bad, [1]), ([1], bad)):
        with pytest.raises(flame.DTypeError, match=what) as ei:
            e.score(*args)
        assert isinstance(ei.value, TypeError) and ei.value.status == errors.ERR_INVALID_ARG
    with pytest.raises(flame.DTypeError, match="out must be a float32"):
        e.score([1], [2], out=np.zeros((1, 1), dtype=np.float64))


def test_wrong_shape_is_rejected_before_c(dot_engine, side_engine):
    _, _, e = dot_engine
    with pytest.raises(flame.ShapeError, match=r"history must be 1-D, got shape \(2, 2\)"):
        e.score(np.ones((2, 2), dtype=np.int64), [1])
    with pytest.raises(flame.ShapeError, match=r"out has shape \(3, 1\), expected .* \(2, 1\)"):
        e.score([1], [2, 3], out=np.zeros((3, 1), dtype=np.float32))
    with pytest.raises(flame.ShapeError, match="C-contiguous"):
        e.score([1], [2, 3], out=np.zeros((4, 1), dtype=np.float32)[::2])
    cfg, _, e = side_engine
    h, c, hs, cs = lib.random_request(cfg, np.random.default_rng(0), 3, 2)
    with pytest.raises(flame.ShapeError, match="history_side is missing: the model has 2 side-feature slot"):
        e.score(h, c, None, cs)
    with pytest.raises(flame.ShapeError, match="candidate_side has 1 slot"):
        e.score(h, c, hs, cs[:1])
    with pytest.raises(flame.ShapeError, match=r"history_side\[1\] offsets has 3 entries, expected .* 4"):
        e.score(h, c, [hs[0], (hs[1][0][:3], hs[1][1])], cs)
    with pytest.raises(flame.ShapeError, match=r"request 1: candidates must be 1-D"):
        e.score_batch([(h, c, hs, cs), (h, np.ones((1, 2), np.int64), hs, cs)])


def test_out_sharing_memory_with_the_ids_is_refused(side_engine):
    """Scores are written pass by pass (max_batch requests each) while later passes still read
    their ids: an out over the ids of a later request had it scored with a score's bits as an
    item id (a crash), and one over a request's own arrays is refused the same way."""
    cfg = side_engine[0]
    rng = np.random.default_rng(4)
    r0, r1 = (lib.random_request(cfg, rng, 3, 4) for _ in range(2))
    m = flame.Model.random(cfg)
    with flame.Engine(m, max_batch=1) as e:
        want = [s.copy() for s in e.score_batch([r0, r1])]
        buf = np.zeros(12, np.int64)  # request 1's candidates, then room: out covers them
        c1 = buf[:4]
        c1[:] = r1[1]
        out = buf.view(np.float32)[:24].reshape(8, 3)
        with pytest.raises(flame.InvalidArgumentError, match="request 1: scores overlaps its candidates"):
            e.score_batch([r0, (r1[0], c1, r1[2], r1[3])], out=out)
        assert np.array_equal(c1, r1[1])  # nothing written
        ids = r1[3][1][1]  # candidate_side slot 1's ids
        assert ids.size
        ids64 = np.zeros(ids.size + 6, np.int64)
        ids64[:ids.size] = ids
        with pytest.raises(flame.InvalidArgumentError, match="request 0: scores overlaps its candidate_side ids of slot 1"):
            e.score(r1[0], r1[1], r1[2], [r1[3][0], (r1[3][1][0], ids64[:ids.size])],
                    out=ids64.view(np.float32)[:12].reshape(4, 3))
        got = e.score_batch([r0, r1])
        assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_values_are_checked_by_the_library(side_engine):
    cfg, _, e = side_engine
    h, c, hs, cs = lib.random_request(cfg, np.random.default_rng(0), 3, 2)
    bad = [(np.array([0, 1, 2, 3]), np.array([0, 1, 7])), hs[1]]
    with pytest.raises(flame.InvalidArgumentError) as ei:  # a side id past its table: only C knows the rows
        e.score(h, c, bad, cs)
    assert type(ei.value) is flame.InvalidArgumentError
    assert "history token 2, feature 'cat' (table 'cat'): id 7 out of range [0, 7)" in ei.value.message


def test_closed_engine_and_model(tmp_path, dot_engine):
    _, _, e = dot_engine
    e.close()
    e.close()  # idempotent
    assert e.closed
    with pytest.raises(flame.ClosedError, match="engine is closed"):
        e.score([1], [2])
    with pytest.raises(flame.ClosedError):
        e.stats()
    m = flame.Model.random(lib.CASES["iclrec_like"])
    with flame.Engine(m) as e2:
        m.close()  # the engine keeps its own reference
        assert e2.score([1], [2]).shape == (1, 1)
        with pytest.raises(flame.ClosedError, match="model is closed"):
            flame.Engine(m)
    assert e2.closed


def test_engine_options(dot_engine):
    m = flame.Model.random(lib.CASES["iclrec_like"])
    with flame.Engine(m, max_batch=2, device="cpu") as e:
        assert [r.shape for r in e.score_batch([([1], [2])] * 5)] == [(1, 1)] * 5
    with pytest.raises(flame.InvalidArgumentError, match="1") as ei:
        flame.Engine(m, max_batch=0)
    assert "65536" in ei.value.message  # the library names the bounds
    with pytest.raises(TypeError, match="unknown engine option 'workers'"):
        flame.Engine(m, workers=4)
    reqs = [([1, 2, 3], list(range(m.info.num_items)))] * 3
    with flame.Engine(m, threads=1) as e1, flame.Engine(m, threads=3) as e3:  # the same bits for any thread count
        for a, b in zip(e1.score_batch(reqs), e3.score_batch(reqs)):
            assert a.tobytes() == b.tobytes()
    with pytest.raises(flame.InvalidArgumentError, match="257"):
        flame.Engine(m, threads=257)
    with pytest.raises(flame.DTypeError, match="max_batch must be an int"):
        flame.Engine(m, max_batch="8")
    with pytest.raises(flame.InvalidArgumentError, match=r"threads = 18446744073709551618 is outside"):
        flame.Engine(m, threads=2**64 + 2)  # not its low bits (2)
    with pytest.raises((flame.NoDeviceError, flame.UnsupportedError)) as ei:
        flame.Engine(m, device="cuda:99")
    assert ei.value.status in (errors.ERR_NO_DEVICE, errors.ERR_UNSUPPORTED) and "cuda" in ei.value.message


def test_strings_with_nul_are_refused(tmp_path):
    """C reads a string up to its first NUL: device="cpu\\x00cuda:7" made a CPU engine and a
    model path with a NUL inside loaded the file named by what precedes it."""
    cfg = lib.CASES["iclrec_like"]
    path = tmp_path / "m.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 0))
    with pytest.raises(flame.InvalidArgumentError, match=r"path '.*m.safetensors\\x00.bak' holds a NUL"):
        flame.Model(f"{path}\x00.bak")
    with pytest.raises(flame.InvalidArgumentError, match="config .* holds a NUL"):
        flame.Model.random(json.dumps(cfg) + "\x00junk")
    with flame.Model(path) as m:
        for key, value in (("device", "cpu\x00cuda:7"), ("cpu_kernels", "auto\x00avx512")):
            with pytest.raises(flame.InvalidArgumentError, match=f"option {key} .* holds a NUL"):
                flame.Engine(m, **{key: value})
        with pytest.raises(flame.DTypeError, match="option device must be a string, got int"):
            flame.Engine(m, device=0)


def test_load_errors_carry_the_library_message(tmp_path):
    with pytest.raises(flame.FlameIOError) as ei:
        flame.Model(tmp_path / "missing.safetensors")
    assert "missing.safetensors" in ei.value.message and isinstance(ei.value, OSError)
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{junk")
    with pytest.raises(flame.FormatError, match="FLAME_ERR_FORMAT: .*JSON"):
        flame.Model(tmp_path / "junk.safetensors")
    with pytest.raises(flame.FormatError, match="d_model"):
        flame.Model.random(lib.config(d_model=0))


def test_every_status_has_its_class():
    for status, name, cls in [(1, "INVALID_ARG", flame.InvalidArgumentError), (2, "NOMEM", flame.OutOfMemoryError),
                              (3, "IO", flame.FlameIOError), (4, "FORMAT", flame.FormatError),
                              (5, "UNSUPPORTED", flame.UnsupportedError), (6, "NO_DEVICE", flame.NoDeviceError),
                              (7, "BUFFER_TOO_SMALL", flame.BufferTooSmallError), (8, "INTERNAL", flame.InternalError)]:
        e = errors.from_status(status, "the message")
        assert type(e) is cls and e.status == status and e.message == "the message"
        assert str(e) == f"FLAME_ERR_{name}: the message" and _lib.status_name(status) == f"FLAME_ERR_{name}"
    e = errors.from_status(42, "newer code")
    assert type(e) is flame.FlameError and e.status == 42


def test_version_check():
    for ok in (200, 201, 299, 300):
        _lib.check_version(ok)
    for bad, shown in ((0, "0.0.0"), (100, "0.1.0"), (10000, "1.0.0"), (20200, "2.2.0")):
        with pytest.raises(flame.VersionMismatchError, match=rf"libflame {shown} .* needs 0.2.x"):
            _lib.check_version(bad)


def run_python(code, **env):
    full = {**os.environ, "PYTHONPATH": str(REPO / "python"), **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60)


def test_library_missing_is_a_clear_error(tmp_path):
    p = run_python("import flame\ntry:\n    flame.Model.random({})\nexcept flame.LibraryNotFoundError as e:\n"
                   "    print('caught', e)", FLAME_LIBRARY=str(tmp_path / "nope.so"))
    assert p.returncode == 0, p.stderr
    assert "caught" in p.stdout and "FLAME_LIBRARY" in p.stdout and "nope.so" in p.stdout
    # importing never needs the library
    assert run_python("import flame, flame.tools.reference, flame.tools.convert", FLAME_LIBRARY="/nonexistent").returncode == 0


def test_the_binding_imports_none_of_the_tooling():
    """flame is the binding; flame.tools (numpy reference, converters, exporter, ...) loads
    only when asked for, and the names it had under flame still resolve to it."""
    p = run_python("import sys, flame\n"
                   "print(sorted(m for m in sys.modules if m.startswith('flame.tools')))\n"
                   "from flame import reference\n"
                   "import flame.tools.reference as r\n"
                   "print(reference is r, flame.export is flame.tools.export)")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["[]", "True True"], p.stdout


def test_library_of_the_wrong_version_is_refused(tmp_path):
    """A stand-in library whose flame_version() says 1.0.0."""
    src, so = tmp_path / "v.c", tmp_path / "libfake.so"
    src.write_text("unsigned flame_version(void) { return 10000; }\n")
    if subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)]).returncode:
        pytest.skip("no C compiler")
    p = run_python("import flame\ntry:\n    flame.library_version()\nexcept flame.VersionMismatchError as e:\n"
                   "    print('caught', e)", FLAME_LIBRARY=str(so))
    assert "caught" in p.stdout and "libflame 1.0.0" in p.stdout and "libfake.so" in p.stdout, p.stdout + p.stderr


def test_search_order_prefers_flame_library(monkeypatch):
    monkeypatch.setenv("FLAME_LIBRARY", "/x/libflame.so")
    assert _lib.candidates() == ["/x/libflame.so"]
    monkeypatch.delenv("FLAME_LIBRARY")
    assert _lib.candidates()[0] == str(REPO / "lib" / "libflame.so")  # the build tree comes next


def test_log_handler_receives_library_lines(tmp_path):
    lines = []
    cfg = lib.CASES["iclrec_like"]
    path = tmp_path / "m.safetensors"
    reference.save(path, cfg, reference.random_model(cfg, 0))
    flame.set_log_handler(lambda level, msg: lines.append((level, msg)), level="info")
    try:
        flame.Model(path).close()
    finally:
        flame.clear_log_handler()
    assert any("loaded" in m and "m.safetensors" in m for _, m in lines), lines
    n = len(lines)
    flame.Model(path).close()
    assert len(lines) == n  # cleared
    with pytest.raises(ValueError, match="level must be one of"):
        flame.set_log_handler(level="loud")


def test_contiguous_int64_ids_are_not_copied():
    from flame import _arrays
    a = np.arange(6, dtype=np.int64)
    assert _arrays.ids(a, "history") is a
    strided = _arrays.ids(a[::2], "history")
    assert strided is not a and strided.flags.c_contiguous and strided.tolist() == [0, 2, 4]
