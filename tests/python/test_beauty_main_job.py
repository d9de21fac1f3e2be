"""The main job end to end: examples/flame-score evaluates the trained ICLRec Beauty model
(converted to the flame format) with the C engine and reproduces its published metrics."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

TOLERANCE = 0.0002
METRICS = ["HR@5", "NDCG@5", "HR@10", "NDCG@10", "HR@20", "NDCG@20"]


@pytest.fixture
def beauty_flame(beauty_dir, tmp_path):
    built = REPO / "build" / "beauty.flame.safetensors"  # made by `make test`
    if built.exists():
        return built
    out = tmp_path / "beauty.flame.safetensors"
    subprocess.run([sys.executable, "-m", "flame.tools.convert", "iclrec", str(beauty_dir / "iclrec-beauty.safetensors"),
                    str(out)], check=True, env={"PYTHONPATH": str(REPO / "python")})
    return out


def test_flame_score_reproduces_beauty_metrics(beauty_dir, beauty_flame):
    exe = REPO / "examples" / "flame-score"
    assert exe.exists(), "examples/flame-score is not built: run `make`"
    res = subprocess.run([str(exe), "--model", str(beauty_flame), "--sequences", str(beauty_dir / "Beauty.txt"),
                          "--eval", "loo", "--k", "5,10,20", "--exclude-history", "--json", "--batch", "64"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    want = json.loads((beauty_dir / "iclrec-beauty.metrics.json").read_text())
    assert got["users"] == want["users"] == 22363
    for k in METRICS:
        assert abs(got[k] - want[k]) <= TOLERANCE, f"{k}: libflame {got[k]:.5f} vs published {want[k]:.4f}"
    assert set(got["latency_us"]) == {"p50", "p90", "p99"}
    assert 0 < got["latency_us"]["p50"] <= got["latency_us"]["p90"] <= got["latency_us"]["p99"]
    assert got["users_per_s"] > 0


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_flame_score_reproduces_beauty_metrics_on_the_gpu(beauty_dir, beauty_flame, dtype):
    """The same evaluation through the CUDA backend: within 0.0005 of the published metrics."""
    res = subprocess.run([str(REPO / "examples" / "flame-score"), "--model", str(beauty_flame), "--sequences",
                          str(beauty_dir / "Beauty.txt"), "--eval", "loo", "--k", "5,10,20", "--exclude-history",
                          "--json", "--batch", "256", "--device", "cuda", "--dtype", dtype],
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0 and "FLAME_ERR_NO_DEVICE" in res.stderr:
        if os.environ.get("FLAME_REQUIRE_GPU"):
            pytest.fail("FLAME_REQUIRE_GPU is set but: " + res.stderr.strip())
        pytest.skip("no usable GPU: " + res.stderr.strip().splitlines()[-1])
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    want = json.loads((beauty_dir / "iclrec-beauty.metrics.json").read_text())
    for k in METRICS:
        assert abs(got[k] - want[k]) <= 0.0005, f"{k} ({dtype}): libflame {got[k]:.5f} vs published {want[k]:.4f}"


def test_flame_score_rejects_a_bad_sequences_file(beauty_flame, tmp_path):
    exe = str(REPO / "examples" / "flame-score")
    cases = {
        "1 5 6 7\n2 3 1e3 4\n": "2: item id '1e3' is not a non-negative integer",  # never read as 1
        "1 5 6 7\n3 99999999 1\n": "id 99999999 out of range [0, 12103)",          # the library names the id
        "": "holds no 'user item item ...' lines",
        "1\n2\n": "no line of",                     # users without items: nothing to evaluate is an error
        "1 2 3 4\0 5 6\n": "1: a NUL byte at column 8",  # not a line cut short
    }
    for text, message in cases.items():
        bad = tmp_path / "bad.txt"
        bad.write_bytes(text.encode())
        res = subprocess.run([exe, "--model", str(beauty_flame), "--sequences", str(bad), "--eval", "loo"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 1, (text, res.stdout)
        assert message in res.stderr, (text, res.stderr)
    res = subprocess.run([exe, "--model", str(beauty_flame), "--sequences", str(bad), "--eval", "loo", "--k", "5,5"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--k '5,5': 5 appears twice" in res.stderr
