"""examples/flame-bench, the load generator: --json has the documented shape and sane values
(percentiles in order, every request accounted for), --csv one row per level, --png a PNG
(gnuplot), direct calls as well as the scheduler, and it stops by itself on its bounds."""
import csv
import json
import shutil
import subprocess

import pytest

from conftest import REPO

EXE = REPO / "examples" / "flame-bench"
KEYS = {"offered_qps", "achieved_qps", "p50_us", "p90_us", "p99_us", "p999_us", "timeouts", "rejected", "mean_batch"}


def bench(*args, timeout=120):
    if not EXE.exists():
        pytest.fail(f"{EXE} is not built: run make")
    p = subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr
    return p


def check_levels(levels, n):
    assert len(levels) == n
    for lv in levels:
        assert set(lv) == KEYS
        assert 0 < lv["p50_us"] <= lv["p90_us"] <= lv["p99_us"] <= lv["p999_us"]
        assert lv["achieved_qps"] > 0 and lv["mean_batch"] >= 1


def test_json_csv_png_through_the_scheduler(tmp_path):
    out_csv, out_png = tmp_path / "levels.csv", tmp_path / "levels.png"
    args = ["--sweep", "40,80", "--seconds", "1", "--requests", "60", "--candidates", "uniform:1:32",
            "--history", "8", "--profiles", "4x32,1x64", "--max-wait-us", "1000", "--adaptive", "--csv", str(out_csv),
            "--json"]
    if shutil.which("gnuplot"):
        args += ["--png", str(out_png)]
    p = bench(*args)
    doc = json.loads(p.stdout)
    assert set(doc) == {"levels", "scheduler_overhead_us"}
    check_levels(doc["levels"], 2)
    assert doc["scheduler_overhead_us"] >= 0
    assert "offered/s" in p.stderr  # the table goes to stderr with --json
    rows = list(csv.DictReader(out_csv.open()))
    assert [float(r["p99_us"]) for r in rows] == [lv["p99_us"] for lv in doc["levels"]]
    if shutil.which("gnuplot"):
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_direct_calls_diurnal_and_bounds():
    p = bench("--direct", "--threads", "2", "--qps", "100", "--diurnal", "--seconds", "1", "--requests", "30",
              "--candidates", "longtail:8:128", "--json", "--no-overhead")
    doc = json.loads(p.stdout)
    check_levels(doc["levels"], 1)
    assert doc["levels"][0]["mean_batch"] == 1  # no scheduler
    assert doc["scheduler_overhead_us"] is None


def test_bad_options_are_named():
    p = subprocess.run([str(EXE), "--candidates", "pareto:3"], capture_output=True, text=True)
    assert p.returncode == 2 and "--candidates 'pareto:3'" in p.stderr
    p = subprocess.run([str(EXE), "--profiles", "8by32"], capture_output=True, text=True)
    assert p.returncode == 2 and "--profiles '8by32'" in p.stderr
