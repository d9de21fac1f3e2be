"""The scheduler's CPU time a request at 100,000 requests/s, for a matrix of loads.

    make examples/flame-bench && python3 bench/run_sched_overhead.py [--rounds 3]
        [--peer DIR] [--out bench/results/NAME.json]

Each case runs `examples/flame-bench --overhead-only --json` (overhead.c): submitter threads
submit 1-token, 1-candidate requests on schedule in bursts through a scheduler with one
profile of 64 x 1; the scheduler's CPU time a request is its workers' (the process's less the
submitters' and the main thread's) less the pass's (the same batches scored alone), plus the
submitters' time inside the submit calls. --peer DIR names another build (DIR/examples/flame-bench with its
DIR/lib), e.g. the commit before a change: its rounds alternate with this build's, and the
ratio is this build's / the peer's. Medians over the rounds; the raw rounds are kept.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, flame-bench arguments)
CASES = [
    ("bursts of 50, no wait", ["--burst-us", "1000"]),
    ("bursts of 5, no wait", ["--burst-us", "100"]),
    ("bursts of 5, max_wait 200 us", ["--burst-us", "100", "--overhead-wait-us", "200"]),
    ("bursts of 5, adaptive wait bound 200 us", ["--burst-us", "100", "--overhead-wait-us", "200", "--adaptive"]),
    ("4 submitters, bursts of 5, max_wait 200 us",
     ["--burst-us", "200", "--submitters", "4", "--overhead-wait-us", "200"]),
]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def run(root, args):
    cmd = [os.path.join(root, "examples", "flame-bench"), "--overhead-only", "--json"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])["scheduler_cpu"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--qps", type=float, default=100000)
    ap.add_argument("--peer", help="another build's root (its examples/flame-bench and lib/)")
    ap.add_argument("--peer-label", default="peer")
    ap.add_argument("--out")
    a = ap.parse_args()
    builds = [("this", ROOT)] + ([(a.peer_label, os.path.abspath(a.peer))] if a.peer else [])
    raw = {name: {b: [] for b, _ in builds} for name, _ in CASES}
    for r in range(a.rounds):
        for name, args in CASES:
            for b, root in (builds if r % 2 == 0 else builds[::-1]):
                raw[name][b].append(run(root, args + ["--overhead-qps", str(a.qps)]))
    results = []
    print(f"{'case':45s} " + " ".join(f"{b + ' us/req':>14s}" for b, _ in builds) + ("   ratio" if a.peer else ""))
    for name, _ in CASES:
        med = {b: statistics.median(x["scheduler_cpu_us_per_request"] for x in raw[name][b]) for b, _ in builds}
        batch = statistics.median(x["mean_batch"] for x in raw[name]["this"])
        row = {"name": f"scheduler CPU time a request at {a.qps:.0f}/s, {name}", "value": round(med["this"], 3),
               "unit": "us", "mean_batch": batch,
               "achieved_qps": statistics.median(x["achieved_qps"] for x in raw[name]["this"])}
        if a.peer:
            row.update(peer=a.peer_label, peer_value=round(med[a.peer_label], 3),
                       ratio=round(med["this"] / med[a.peer_label], 3) if med[a.peer_label] > 0 else None)
        results.append(row)
        print(f"{name:45s} " + " ".join(f"{med[b]:14.2f}" for b, _ in builds) +
              (f"   {row['ratio']}" if a.peer else ""))
    if a.out:
        doc = {"date": datetime.date.today().isoformat(), "cpu": cpu_model(), "cpus": os.cpu_count(),
               "rounds": a.rounds, "results": results, "raw": raw}
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
        print("wrote", a.out)


if __name__ == "__main__":
    main()
