"""The batch-profile scheduler against calling the engine directly, in the same run.

    make all bench venv && .venv/bin/python bench/run_sched_bench.py [--rounds 5] [--out bench/results/NAME.json]

N client threads each send one user's request at a time and wait for it, as a serving
process's threads do (bench/e2e-bench --clients). Per workload, rounds alternate between:
  direct     each client calls flame_score itself (OPENBLAS_NUM_THREADS=1: with more, the
             clients' BLAS threads oversubscribe the cores; one round at 2 shows that);
  queue      a scheduler whose only profile holds 1 user: bounded concurrency, no batching
             (separates what batching gives from what fewer threads on the cores give);
  scheduler  the scheduler batching up to --sched-users users (its workers' BLAS single-
             threaded, one worker per core).
Workloads: the Beauty model with every item a candidate (dot head; from
$FLAME_SHARED_DIR/data/amazon-beauty, converted on the fly), and the embedded default (SUMI
head, 128 candidates, histories of 16..64). Prints a table; writes bench/results/
<machine>-<date>-sched.json ({"name", "value", "unit", "peer", "peer_value", "ratio"}, ratio =
libflame's scheduler / direct calls) with the raw rounds beside it (.raw.json).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "cpu"
    word = model.split()[1].lower() if len(model.split()) > 1 and model.split()[0] in ("AMD", "Intel(R)") else "cpu"
    return model, f"{word.replace('(r)', '')}-{os.cpu_count()}c"


def run(args, blas, extra):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(blas))
    cmd = [os.path.join(ROOT, "bench", "e2e-bench")] + args + extra + ["--json"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shared", default=os.environ.get("FLAME_SHARED_DIR", os.path.join(ROOT, "..", "shared")))
    ap.add_argument("--out", help="default bench/results/<machine>-<date>-sched.json")
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    model_name, machine = cpu_name()
    workloads = []
    beauty_dir = os.path.join(a.shared, "data", "amazon-beauty")
    tmp = tempfile.mkdtemp(prefix="flame-sched-bench-")
    if os.path.exists(os.path.join(beauty_dir, "Beauty.txt")):
        model = os.path.join(tmp, "beauty.flame")
        subprocess.run([sys.executable, "-m", "flame.tools.convert", "iclrec",
                        os.path.join(beauty_dir, "iclrec-beauty.safetensors"), model], check=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")), capture_output=True)
        workloads.append(("beauty_fullsort", "Beauty, dot head, 12,103 candidates a user", 32, 32,
                          ["--model", model, "--sequences", os.path.join(beauty_dir, "Beauty.txt"), "--all-items",
                           "--users", "64", "--calls", "150", "--warmup", "10"]))
    else:
        print(f"note: {beauty_dir} has no Beauty.txt: the Beauty workload is skipped")
    # heavy requests: batches of 2 (the FLAME paper's (2, 128) profile), larger ones add to the tail
    workloads.append(("default_sumi", "embedded default, SUMI head, 128 candidates, histories 16..64", 8, 2,
                      ["--users", "1", "--sets", "16", "--history", "64", "--history-min", "16", "--candidates", "128",
                       "--calls", "30", "--warmup", "2"]))
    variants = {
        "direct": (1, ["--via", "direct"]),
        "queue": (1, ["--via", "scheduler", "--sched-users", "1", "--workers", str(cores)]),
        "scheduler": (1, ["--via", "scheduler", "--workers", str(cores)]),
    }
    raw, results = {"cpu": model_name, "cores": cores, "rounds": {}}, []
    for name, what, clients, users, args in workloads:
        base = args + ["--clients", str(clients), "--sched-candidates", "128"]
        rounds = {v: [] for v in variants}
        for r in range(a.rounds):
            for v, (blas, extra) in variants.items():
                extra = extra + (["--sched-users", str(users)] if v == "scheduler" else [])
                rounds[v].append(run(base, blas, extra))
            print(f"{name} round {r + 1}: " + ", ".join(f"{v} {rounds[v][-1]['requests_per_s']:.0f}/s "
                                                        f"p99 {rounds[v][-1]['p99_us']:.0f} us" for v in variants))
        blas2 = run(base, 2, ["--via", "direct"])  # what a second BLAS thread per client does
        raw["rounds"][name] = {"what": what, "clients": clients, "sched_users": users, "rounds": rounds,
                               "direct_blas2": blas2}

        def med(v, key):
            return statistics.median(x[key] for x in rounds[v])

        peer = f"flame_score called directly by the same {clients} client threads (OPENBLAS_NUM_THREADS=1), same run"
        for key, unit in (("requests_per_s", "requests/s"), ("p50_us", "us"), ("p99_us", "us")):
            for v in ("scheduler", "queue"):
                value, pv = med(v, key), med("direct", key)
                results.append({"name": f"sched_{name}_{v}_{key}", "value": round(value, 2), "unit": unit,
                                "peer": peer, "peer_value": round(pv, 2), "ratio": round(value / pv, 4)})
        results.append({"name": f"sched_{name}_mean_batch", "value": round(med("scheduler", "mean_batch"), 3),
                        "unit": "requests", "peer": None, "peer_value": None, "ratio": None})
        results.append({"name": f"sched_{name}_direct_blas2_requests_per_s", "value": round(blas2["requests_per_s"], 2),
                        "unit": "requests/s", "peer": peer, "peer_value": round(med("direct", "requests_per_s"), 2),
                        "ratio": round(blas2["requests_per_s"] / med("direct", "requests_per_s"), 4)})
    date = datetime.date.today().isoformat()
    out = a.out or os.path.join(ROOT, "bench", "results", f"{machine}-{date}-sched.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    with open(out.replace(".json", ".raw.json"), "w") as f:
        json.dump(raw, f, indent=1)
    print(f"\n{'name':55s} {'value':>12s} {'direct':>12s} {'ratio':>7s}")
    for r in results:
        pv = "-" if r["peer_value"] is None else f"{r['peer_value']:.1f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        print(f"{r['name']:55s} {r['value']:12.1f} {pv:>12s} {ratio:>7s}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
