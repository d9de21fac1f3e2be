#!/usr/bin/env python3
"""libflame vs ONNX Runtime on the CPU, the Beauty model, one command.

    make all bench venv-bench
    .venv/bin/python bench/run_cpu_bench.py [--shared DIR] [--out bench/results/NAME.json] [--rounds 5]
    bench/run-cpu-bench-offline ...     # a machine without a package index (see that script)

1. converts $SHARED/data/amazon-beauty/iclrec-beauty.safetensors to the flame format (temp dir);
2. builds the ONNX graph of the same model from the flame file and checks that ONNX Runtime,
   libflame and the float64 numpy reference give the same scores (max abs diff < 1e-4);
3. runs bench/beauty-bench (libflame, C API) and bench/onnx_beauty.py time (ONNX Runtime,
   CPU provider) alternately, --rounds times each, both with --threads threads
   (OPENBLAS_NUM_THREADS, which FLAME_OPT_THREADS follows, for libflame; intra_op_num_threads for ORT), and
   examples/flame-score --json (the embedded default model) as many times. The machine may be
   shared: before each round the driver waits (up to --quiet-wait s) for an idle second, and a
   round during which other processes took > 5% of the CPUs' time is discarded and repeated
   (up to --retries times); what was discarded is kept in the .raw.json;
4. prints a table (median over rounds) with ratios libflame / ONNX Runtime and the targets,
   writes bench/results/<machine>-<date>.json (a list of {"name", "value", "unit", "peer",
   "peer_value", "ratio"}) and, next to it, <same>.raw.json with every round's raw output and
   the machine description.

Exit status: 0 when everything ran and the scores agree, whether or not the targets are met
(they are reported); 1 when a step failed.
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
def targets_for(threads):
    """The product's targets, ratio libflame / ONNX Runtime: batch-1 P50 <= 0.3x at any thread
    count; batch-256 >= 3x with 2 threads (or fewer), >= 2x with more (16 on a server CPU)."""
    return {
        "beauty_cpu_b1_p50_us": ("<=", 0.3),
        "beauty_cpu_b256_users_per_s": (">=", 3.0 if threads <= 2 else 2.0),
    }


class StepError(Exception):
    pass


def run(cmd, env, what, parse_json=True):
    p = subprocess.run([str(c) for c in cmd], env=env, cwd=REPO, capture_output=True, text=True)
    if p.returncode != 0:
        raise StepError(f"{what} failed (exit {p.returncode}): {' '.join(map(str, cmd))}\n{p.stderr.strip()[-3000:]}")
    if not parse_json:
        return p.stdout
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError as e:
        raise StepError(f"{what}: output is not one JSON object ({e}):\n{p.stdout[-2000:]}") from None


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        if m:
            return m.group(1).strip()
    except OSError:
        pass
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        if m:
            return m.group(1).strip()
    except OSError:
        pass
    return platform.processor() or "unknown-cpu"


def cpu_vendor():
    try:
        m = re.search(r"^vendor_id\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        return m.group(1).strip() if m else None
    except OSError:
        return None


def cpu_flags():
    try:
        m = re.search(r"^flags\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        return set(m.group(1).split()) if m else set()
    except OSError:
        return set()


def cpu_busy(seconds=1.0):
    """Share of all cores' time spent busy over the next `seconds` (/proc/stat), or None."""
    def read():
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return sum(v), v[3] + (v[4] if len(v) > 4 else 0)
    try:
        t0, i0 = read()
        time.sleep(seconds)
        t1, i1 = read()
        return round(1.0 - (i1 - i0) / max(1, t1 - t0), 3)
    except (OSError, ValueError, IndexError):
        return None


def cpu_ticks():
    """(busy, total) jiffies of all cores since boot, or None."""
    try:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return sum(v) - v[3] - (v[4] if len(v) > 4 else 0), sum(v)
    except (OSError, ValueError, IndexError):
        return None


def usage_mark():
    return cpu_ticks(), os.times(), time.monotonic()


def others_share(mark, ncores):
    """Share of the CPUs' time that processes other than this one and its children used since `mark`."""
    t1, k1, w1 = usage_mark()
    t0, k0, w0 = mark
    if not t0 or not t1 or w1 <= w0:
        return None
    ours = (k1.children_user + k1.children_system + k1.user + k1.system) - \
           (k0.children_user + k0.children_system + k0.user + k0.system)
    busy = (t1[0] - t0[0]) / os.sysconf("SC_CLK_TCK")
    return max(0.0, round((busy - ours) / ((w1 - w0) * (os.cpu_count() or ncores)), 3))


def wait_quiet(limit_s):
    """Waits up to limit_s for a second in which the machine is under 5% busy."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        b = cpu_busy()
        if b is None or b < 0.05:
            return


def cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_slug(model, ncores):
    """'Intel(R) Xeon(R) Platinum 8480+' + 16 -> 'xeon-platinum-8480-16c'."""
    s = re.sub(r"\((r|tm|R|TM)\)", " ", model)
    s = re.sub(r"@.*$", " ", s)
    s = re.sub(r"\b(intel|amd|cpu|processor|\d+-core|with.*$)\b", " ", s, flags=re.I)
    words = [w for w in re.split(r"[^a-z0-9]+", s.lower()) if w][:3]
    return "-".join(words + [f"{ncores}c"]) if words else f"cpu-{ncores}c"


def med(rounds, *path):
    vals = []
    for r in rounds:
        v = r
        for k in path:
            v = v[k]
        vals.append(float(v))
    return statistics.median(vals)


def metric(name, value, unit, peer=None, peer_value=None):
    ratio = value / peer_value if peer_value else None
    return {"name": name, "value": round(value, 3), "unit": unit, "peer": peer,
            "peer_value": None if peer_value is None else round(peer_value, 3),
            "ratio": None if ratio is None else round(ratio, 4)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=os.environ.get("FLAME_SHARED_DIR") or str(REPO.parent / "shared"),
                    help="the shared directory holding data/amazon-beauty (default $FLAME_SHARED_DIR or ../shared)")
    ap.add_argument("--out", help="result file (default bench/results/<machine>-<date>.json)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of each system (default 5)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both systems (default 2)")
    ap.add_argument("--users", type=int, default=2000, help="batch-1 users timed per round (default 2000)")
    ap.add_argument("--warmup", type=int, default=200, help="batch-1 warm-up calls (default 200)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--batch-users", type=int, default=256 * 40, help="users per round at --batch (default 10240)")
    ap.add_argument("--retries", type=int, default=5,
                    help="rounds repeated when other processes took > 5%% of the CPUs during them (default 5)")
    ap.add_argument("--quiet-wait", type=float, default=60,
                    help="seconds to wait before each round for the machine to be idle (default 60; 0 = no wait)")
    ap.add_argument("--machine", help="machine slug for the file name (default from lscpu + core count)")
    ap.add_argument("--openblas-coretype", help="set OPENBLAS_CORETYPE (e.g. SkylakeX, Haswell) for libflame's OpenBLAS; "
                    "default: OpenBLAS's own CPU detection (or the caller's OPENBLAS_CORETYPE)")
    ap.add_argument("--onnx", help="use this ONNX graph (bench/onnx_beauty.py build of the same model) instead of "
                    "building one: the run then needs onnxruntime but not the onnx package")
    ap.add_argument("--flame", help="use this flame model file (flame.tools.convert iclrec of the Beauty checkpoint) "
                    "instead of converting the checkpoint: the run then needs numpy but not safetensors")
    ap.add_argument("--cpu-kernels", choices=["auto", "avx512", "avx2", "blas"],
                    help="libflame's FLAME_OPT_CPU_KERNELS (default auto: the CPU's widest set)")
    a = ap.parse_args(argv)

    data = Path(a.shared).resolve() / "data" / "amazon-beauty"
    ckpt, seqs = data / "iclrec-beauty.safetensors", data / "Beauty.txt"
    for f in (seqs,) + ((ckpt,) if not a.flame else (Path(a.flame), )) + ((Path(a.onnx),) if a.onnx else ()):
        if not f.is_file():
            print(f"run_cpu_bench: {f} not found (--shared DIR)", file=sys.stderr)
            return 1
    bench_bin, score_bin = REPO / "bench" / "beauty-bench", REPO / "examples" / "flame-score"
    for f in (bench_bin, score_bin, REPO / "lib" / "libflame.so"):
        if not f.exists():
            print(f"run_cpu_bench: {f.relative_to(REPO)} not built: run `make all bench` first", file=sys.stderr)
            return 1

    env = dict(os.environ)
    env["OPENBLAS_NUM_THREADS"] = str(a.threads)
    env["OMP_NUM_THREADS"] = str(a.threads)
    if a.openblas_coretype:
        env["OPENBLAS_CORETYPE"] = a.openblas_coretype
    env["PYTHONPATH"] = str(REPO / "python") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    py = sys.executable
    model_name, ncores = cpu_model(), cores()
    slug = a.machine or machine_slug(model_name, ncores)
    today = datetime.date.today().isoformat()
    out = Path(a.out).resolve() if a.out else REPO / "bench" / "results" / f"{slug}-{today}.json"

    busy_before = cpu_busy()
    if busy_before is not None and busy_before > 0.05:
        print(f"warning: the machine was {100 * busy_before:.0f}% busy just before the run: other processes compete "
              f"for the {ncores} cores and both systems' timings suffer", file=sys.stderr)
    run_mark = usage_mark()
    try:
        with tempfile.TemporaryDirectory(prefix="flame-bench-") as tmp:
            flame_file, onnx_file = Path(tmp) / "beauty.flame.safetensors", Path(tmp) / "beauty.onnx"
            if a.flame:  # converted elsewhere (a machine without the safetensors package)
                flame_file = Path(a.flame).resolve()
            else:
                print(f"converting {ckpt} ...", file=sys.stderr)
                run([py, "-m", "flame.tools.convert", "iclrec", ckpt, flame_file], env, "conversion", parse_json=False)
            if a.onnx:  # built elsewhere from the same conversion (a machine without the onnx package)
                onnx_file = Path(a.onnx).resolve()
                built = {"prebuilt": str(onnx_file)}
            else:
                built = run([py, "bench/onnx_beauty.py", "build", flame_file, onnx_file], env, "ONNX build")
            verify = run([py, "bench/onnx_beauty.py", "verify", flame_file, onnx_file, seqs], env, "score check")
            d = verify["max_abs_diff"]
            print(f"scores agree: max |ORT - libflame| {d['ort_vs_libflame']:.2e}, |ORT - reference| "
                  f"{d['ort_vs_reference']:.2e}, |libflame - reference| {d['libflame_vs_reference']:.2e} "
                  f"(users {verify['users']})", file=sys.stderr)

            common = ["--users", a.users, "--warmup", a.warmup, "--batch", a.batch, "--batch-users", a.batch_users]
            fl_cmd = [bench_bin, "--model", flame_file, "--sequences", seqs] + common + \
                (["--cpu-kernels", a.cpu_kernels] if a.cpu_kernels else [])
            ort_cmd = [py, "bench/onnx_beauty.py", "time", onnx_file, seqs, "--threads", a.threads] + common
            fl_rounds, ort_rounds, def_rounds, discarded, round_shares = [], [], [], [], []
            r = tries = 0
            while r < a.rounds:
                if a.quiet_wait > 0:
                    wait_quiet(a.quiet_wait)
                mark = usage_mark()
                order = [("libflame", fl_cmd), ("onnxruntime", ort_cmd), ("default", [score_bin, "--json"])]
                if r % 2:
                    order[0], order[1] = order[1], order[0]
                got = {name: run(cmd, env, name) for name, cmd in order}
                share = others_share(mark, ncores)
                for name in ("libflame", "onnxruntime"):
                    res = got[name]
                    print(f"round {r + 1}/{a.rounds} {name:12s} b1 P50 {res['b1']['p50_us']:8.1f} us  P99 "
                          f"{res['b1']['p99_us']:8.1f} us  b{a.batch} {res['batch']['users_per_s']:9.0f} users/s",
                          file=sys.stderr)
                if share is not None and share > 0.05 and tries < a.retries:
                    tries += 1
                    discarded.append({"others_cpu_share": share, **got})
                    print(f"round {r + 1}: other processes used {100 * share:.0f}% of the CPUs' time: discarded, "
                          f"repeating ({tries}/{a.retries} repeats used)", file=sys.stderr)
                    continue
                fl_rounds.append(got["libflame"])
                ort_rounds.append(got["onnxruntime"])
                def_rounds.append(got["default"])
                round_shares.append(share)
                r += 1
    except StepError as e:
        print(f"run_cpu_bench: {e}", file=sys.stderr)
        return 1

    others = others_share(run_mark, ncores)
    fl0, ort0 = fl_rounds[0], ort_rounds[0]
    if abs(fl0["checksum"] - ort0["checksum"]) > 1e-2 * max(1.0, abs(fl0["checksum"])):
        print(f"run_cpu_bench: checksums of the timed scores differ: libflame {fl0['checksum']}, "
              f"ORT {ort0['checksum']}", file=sys.stderr)
        return 1
    peer = f"onnxruntime {ort0['version']} CPU, {a.threads} threads"
    B = a.batch
    metrics = [
        metric("beauty_cpu_b1_p50_us", med(fl_rounds, "b1", "p50_us"), "us", peer, med(ort_rounds, "b1", "p50_us")),
        metric("beauty_cpu_b1_p99_us", med(fl_rounds, "b1", "p99_us"), "us", peer, med(ort_rounds, "b1", "p99_us")),
        metric("beauty_cpu_b1_mean_us", med(fl_rounds, "b1", "mean_us"), "us", peer, med(ort_rounds, "b1", "mean_us")),
        metric(f"beauty_cpu_b{B}_users_per_s", med(fl_rounds, "batch", "users_per_s"), "users/s", peer,
               med(ort_rounds, "batch", "users_per_s")),
        metric(f"beauty_cpu_b{B}_call_p50_us", med(fl_rounds, "batch", "call_p50_us"), "us", peer,
               med(ort_rounds, "batch", "call_p50_us")),
        metric("beauty_cpu_peak_rss_bytes", med(fl_rounds, "peak_rss_bytes"), "bytes"),
        metric("beauty_cpu_scratch_bytes", med(fl_rounds, "scratch_bytes"), "bytes"),
        metric("default_cpu_b1_p50_us", med(def_rounds, "latency_us", "p50"), "us"),
        metric("default_cpu_b1_p99_us", med(def_rounds, "latency_us", "p99"), "us"),
        metric("default_cpu_requests_per_s", med(def_rounds, "requests_per_s"), "requests/s"),
        metric("default_cpu_candidates_per_s", med(def_rounds, "candidates_per_s"), "candidates/s"),
    ]
    targets = {}
    for m in metrics:
        name = m["name"].replace(f"_b{B}_", "_b256_")
        if name in targets_for(a.threads) and m["ratio"] is not None:
            op, t = targets_for(a.threads)[name]
            targets[m["name"]] = {"target": f"{op} {t}", "met": m["ratio"] <= t if op == "<=" else m["ratio"] >= t}

    print(f"\n{model_name}, {ncores} cores, {fl0['openblas']}, {peer}; median of {a.rounds} alternating rounds")
    print(f"{'metric':34s} {'libflame':>12s} {'ONNX Runtime':>13s} {'ratio':>7s}  {'target':>7s}  met?")
    for m in metrics:
        tg = targets.get(m["name"])
        pv = "" if m["peer_value"] is None else f"{m['peer_value']:13.1f}"
        ra = "" if m["ratio"] is None else f"{m['ratio']:7.3f}"
        print(f"{m['name']:34s} {m['value']:12.1f} {pv:>13s} {ra:>7s}  {tg['target'] if tg else '':>7s}  "
              f"{('yes' if tg['met'] else 'NO') if tg else ''}")
    missed = [k for k, v in targets.items() if not v["met"]]
    disturbed = [i + 1 for i, sh in enumerate(round_shares) if sh is not None and sh > 0.05]
    if disturbed:
        print(f"warning: other processes used > 5% of the CPUs' time during kept round(s) {disturbed} (repeats "
              "exhausted): the timings are disturbed, ONNX Runtime's more than libflame's; rerun on a quiet machine")
    if discarded:
        print(f"note: {len(discarded)} round(s) discarded and repeated because other processes used the CPUs")
    print("targets: " + ("all met" if not missed else "MISSED " + ", ".join(missed)))

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(metrics, indent=1) + "\n")
    raw = out.with_name(out.name[:-5] + ".raw.json" if out.name.endswith(".json") else out.name + ".raw.json")
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    raw.write_text(json.dumps({
        "date": today, "machine": slug, "cpu_vendor": cpu_vendor(), "cpu_model": model_name, "cores": ncores,
        "threads": a.threads,
        "cpu_isa_flags": sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma"))),
        "cpu_kernels": fl0.get("cpu_kernels"),
        "git_head": git or None, "python": platform.python_version(), "openblas": fl0["openblas"],
        "openblas_core": fl0["openblas_core"],
        "OPENBLAS_CORETYPE": env.get("OPENBLAS_CORETYPE"), "onnxruntime": ort0["version"], "onnx_graph": built,
        "flame_file": str(flame_file) if a.flame else "converted from the checkpoint",
        "cpu_busy_before": busy_before, "others_cpu_share_during_run": others,
        "others_cpu_share_per_round": round_shares, "discarded_rounds": discarded,
        "targets": targets, "verify": verify, "args": vars(a),
        "rounds": {"libflame": fl_rounds, "onnxruntime": ort_rounds, "default": def_rounds},
    }, indent=1) + "\n")
    print(f"wrote {out} and {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
