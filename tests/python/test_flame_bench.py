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
KEYS = {"offered_qps", "achieved_qps", "p50_us", "p90_us", "p99_us", "p999_us", "timeouts", "rejected", "mean_batch",
        "send_late_p50_us", "send_late_p99_us"}
CPU_KEYS = {"offered_qps", "achieved_qps", "submitters", "burst", "max_users", "max_wait_us", "adaptive", "requests",
            "rejected", "mean_batch", "worker_cpu_us_per_request", "pass_cpu_us_per_request",
            "submit_cpu_us_per_request", "scheduler_cpu_us_per_request"}


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
        assert 0 <= lv["send_late_p50_us"] <= lv["send_late_p99_us"]


def check_cpu(cpu, qps, seconds, submitters, adaptive):
    assert set(cpu) == CPU_KEYS
    assert cpu["submitters"] == submitters and cpu["adaptive"] is adaptive and cpu["rejected"] == 0
    assert cpu["requests"] == pytest.approx(qps * seconds, rel=0.02)
    assert cpu["offered_qps"] == pytest.approx(qps, rel=0.05) and cpu["achieved_qps"] > 0
    assert 1 <= cpu["mean_batch"] <= cpu["max_users"]
    assert cpu["worker_cpu_us_per_request"] > 0 and cpu["pass_cpu_us_per_request"] > 0
    assert cpu["submit_cpu_us_per_request"] > 0
    parts = cpu["worker_cpu_us_per_request"] - cpu["pass_cpu_us_per_request"] + cpu["submit_cpu_us_per_request"]
    assert cpu["scheduler_cpu_us_per_request"] == pytest.approx(parts, abs=2e-3)


def test_json_csv_png_through_the_scheduler(tmp_path):
    out_csv, out_png = tmp_path / "levels.csv", tmp_path / "levels.png"
    args = ["--sweep", "40,80", "--seconds", "1", "--requests", "60", "--candidates", "uniform:1:32",
            "--history", "8", "--profiles", "4x32,1x64", "--max-wait-us", "1000", "--adaptive", "--csv", str(out_csv),
            "--json"]
    if shutil.which("gnuplot"):
        args += ["--png", str(out_png)]
    p = bench(*args)
    doc = json.loads(p.stdout)
    assert set(doc) == {"levels", "scheduler_overhead_us", "scheduler_cpu", "engine"}
    check_levels(doc["levels"], 2)
    # a CPU engine: requests scored, no graphs, no padded passes
    assert doc["engine"]["requests"] > 0
    assert doc["engine"]["graph_captures"] == doc["engine"]["profile_passes"] == 0
    assert doc["scheduler_overhead_us"] >= 0
    check_cpu(doc["scheduler_cpu"], 100000, 1, 2, True)
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
    assert doc["scheduler_overhead_us"] is None and doc["scheduler_cpu"] is None


def test_overhead_only():
    p = bench("--overhead-only", "--overhead-qps", "20000", "--submitters", "3", "--burst-us", "500",
              "--overhead-users", "16", "--overhead-wait-us", "100", "--seconds", "1", "--json")
    doc = json.loads(p.stdout)
    assert doc["levels"] == []
    cpu = doc["scheduler_cpu"]
    check_cpu(cpu, 20000, 1, 3, False)
    assert cpu["max_users"] == 16 and cpu["max_wait_us"] == 100
    assert cpu["burst"] == 3  # 20,000/s over 3 threads, 500 us a burst


def test_bad_options_are_named():
    p = subprocess.run([str(EXE), "--candidates", "pareto:3"], capture_output=True, text=True)
    assert p.returncode == 2 and "--candidates 'pareto:3'" in p.stderr
    p = subprocess.run([str(EXE), "--profiles", "8by32"], capture_output=True, text=True)
    assert p.returncode == 2 and "--profiles '8by32'" in p.stderr
    # every number whole and in range (strtod took nan, inf and "5junk"; strtoul took -1 as 2^64 - 1)
    for args, what in ((["--qps", "nan"], "--qps nan is not a number in (0, 1e+07]"),
                       (["--seconds", "inf"], "--seconds inf is not a number"),
                       (["--burst-us", "nan"], "--burst-us nan is not a number in [1, 1e+06]"),
                       (["--timeout-us", "-5"], "--timeout-us -5 is not a whole number in 0..1000000000000"),
                       (["--history", "abc"], "--history abc is not a whole number"),
                       (["--workers", "99999999999"], "--workers 99999999999 is not a whole number in 0..256"),
                       (["--candidates", "fixed:5junk"], "--candidates 'fixed:5junk'"),
                       (["--profiles", "-1x5"], "--profiles '-1x5'"),
                       (["--profiles", ",".join(["1x1"] * 17)], "--profiles '1x1,"),  # more than the scheduler takes
                       (["--sweep", "1,2,"], "--sweep '1,2,'")):
        p = subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and what in p.stderr, (args, p.stderr)


def test_runs_too_short_for_a_request():
    # the overhead run replays its batches: with no request it is skipped, and --overhead-only fails
    p = subprocess.run([str(EXE), "--overhead-only", "--seconds", "0.000001"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1 and "is no request a submitter; skipped" in p.stderr
    # a rate so low that its first arrival lies past the level: nothing sent, at once
    doc = json.loads(bench("--no-overhead", "--sweep", "1e-300", "--seconds", "1", "--json").stdout)
    assert doc["levels"][0]["achieved_qps"] == 0 and doc["levels"][0]["rejected"] == 0
