#!/usr/bin/env python3
"""The results file of a SUMI attention run (docs/benchmarks.md, `bench/results/<machine>-<date>.json`).

Reads attention-bench's JSON lines and bench/torch_attention.py's from one run on one machine
and writes, for each shape, libflame's time and useful TFLOP/s (the `auto` variant: what
fl_cuda_attention runs for the engine) against the fastest PyTorch peer of that run:

  python3 bench/attention_results.py BENCH.jsonl TORCH.jsonl OUT.json [--raw OUT.raw.json]

Exits 1 when a shape the peers ran on lacks libflame's `auto` line or a timed peer (a results
file needs both from the same run), or when an output failed its check against float64
(rel_err_f64 >= 1e-2, or NaN). Shapes the peers did not run on are left out.
"""
import argparse
import json
import sys

PEER_NAMES = {
    "cudnn2": "two SDPA calls, cuDNN backend (history causal; candidates vs history, self term omitted), same run",
    "flash2": "two SDPA calls, flash backend (history causal; candidates vs history, self term omitted), same run",
    "flex": "FlexAttention with the SUMI block mask (torch.compile), same run",
}


def lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def entries(lib, torch):
    out, problems = [], []
    for shape in dict.fromkeys(d["shape"] for d in lib):
        if not any(d["shape"] == shape for d in torch):  # a shape the peers were not run on
            print("attention_results: %s: no peer run, left out" % shape, file=sys.stderr)
            continue
        auto = [d for d in lib if d["shape"] == shape and d["variant"] == "auto"]
        peers = [d for d in torch if d["shape"] == shape and d.get("peer") in PEER_NAMES and "us" in d]
        if not auto or not peers:
            problems.append("%s: %s" % (shape, "no auto line" if not auto else "no timed peer"))
            continue
        a = auto[0]
        if not a["rel_err_f64"] < 1e-2:
            problems.append("%s: relative error %s against float64" % (shape, a["rel_err_f64"]))
            continue
        best = min(peers, key=lambda d: d["us"])
        for key, unit, suffix in (("us", "us", "us"), ("useful_tflops", "TFLOP/s", "useful_tflops")):
            out.append({"name": "sumi_attn_%s_%s" % (shape, suffix), "value": a[key], "unit": unit,
                        "peer": PEER_NAMES[best["peer"]], "peer_value": best[key],
                        "ratio": round(a[key] / best[key], 4)})
    return out, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench")
    ap.add_argument("torch")
    ap.add_argument("out")
    ap.add_argument("--raw", help="also write both inputs, unchanged, to this file")
    args = ap.parse_args()
    lib, torch = lines(args.bench), lines(args.torch)
    out, problems = entries(lib, torch)
    for p in problems:
        print("attention_results: " + p, file=sys.stderr)
    if problems or not out:
        return 1
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump({"libflame": lib, "torch": torch}, f, indent=1)
            f.write("\n")
    for e in out:
        print("%-50s %10.2f %-8s peer %10.2f  ratio %.3f" % (e["name"], e["value"], e["unit"], e["peer_value"], e["ratio"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
