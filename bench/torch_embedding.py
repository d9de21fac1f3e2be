"""The PyTorch peer of bench/embedding-bench: F.embedding_bag, one call over concatenated tables
(the method of ../shared/anchors), for the same cases.

    python3 bench/torch_embedding.py [--json] [--reps N] [--rows R] [--device cuda|cpu]

T tables of R rows (1M by default) are one [T*R, D] weight; bag (b, t) reads ids offset by
t*R, and the bags are ordered b-major so the output [B*T, D] is the TBE layout [B, T*D].
Sum pooling, uniform random ids, P ids per bag. Times are medians over --reps calls timed
with CUDA events; consecutive calls read different id sets (together larger than L2).
GB/s = (rows read + output written) / time; gbps_with_ids adds the 8-byte ids (the anchors'
count). One call per case is checked against float64 on sampled bags. --device cpu (tiny
--rows) only tests this script.
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

CASES = ([(f"rows_{rb}B_{dt}_T26_B4096_P20", 26, 4096, 20, rb // (2 if dt == "fp16" else 4), dt)
          for rb in (64, 128, 256, 512) for dt in ("fp16", "fp32")]
         + [("T26_B4096_P20_D128_fp16", 26, 4096, 20, 128, "fp16"),
            ("T26_B4096_P20_D128_fp32", 26, 4096, 20, 128, "fp32"),
            ("T8_B512_P1_D64_fp16", 8, 512, 1, 64, "fp16"),
            ("T26_B1_P20_D64_fp32", 26, 1, 20, 64, "fp32")])
DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def time_ms(self, fn, reps):
        out = []
        for _ in range(reps):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
        out.sort()
        n = len(out)
        return out[n // 2] if n % 2 else 0.5 * (out[n // 2 - 1] + out[n // 2])


def copy_gbps(dev, timer, reps, nbytes):
    a = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    ms = timer.time_ms(lambda: b.copy_(a), reps)
    del a, b
    return 2 * nbytes / (ms * 1e-3) / 1e9


def run_case(buf, dev, timer, name, T, B, P, D, dt, rows, reps):
    dtype = DTYPES[dt]
    esize = torch.finfo(dtype).bits // 8
    n = T * rows * D
    W = buf[: n * esize].view(dtype).view(T * rows, D)
    W.uniform_(-1.0, 1.0)
    set_bytes = (B * T * P + B * T + 1) * 8
    sets = max(2, -(-(128 << 20) // set_bytes)) if dev.type == "cuda" else 2
    sets = min(sets, 64)
    g = torch.Generator(device=dev).manual_seed(1)
    base = (torch.arange(T, device=dev) * rows).view(1, T, 1)
    inputs = [(torch.randint(0, rows, (B, T, P), device=dev, generator=g) + base).reshape(-1) for _ in range(sets)]
    offsets = torch.arange(B * T, device=dev) * P
    out = F.embedding_bag(inputs[0], W, offsets, mode="sum").view(B, T * D)
    # check sampled bags against float64
    k = min(B * T, 256)
    pick = torch.randint(0, B * T, (k,), generator=torch.Generator().manual_seed(2))
    ids = inputs[0].view(B * T, P)[pick.to(dev)]
    ref = W[ids.reshape(-1)].double().view(k, P, D).sum(1)
    got = out.view(B * T, D)[pick.to(dev)].double()
    err = (got - ref).abs().max().item()
    tol = 1e-2 if dt == "fp16" else 1e-4
    ok = bool(err <= tol)
    i = [0]

    def call():
        i[0] += 1
        F.embedding_bag(inputs[i[0] % sets], W, offsets, mode="sum")

    for _ in range(3):
        call()
    ms = timer.time_ms(call, reps)
    us = ms * 1e3
    rows_bytes, out_bytes, ids_bytes = B * T * P * D * esize, B * T * D * esize, B * T * P * 8
    return {"name": name, "dtype": dt, "T": T, "B": B, "P": P, "D": D, "row_bytes": D * esize, "us": round(us, 3),
            "gbps": round((rows_bytes + out_bytes) / (us * 1e-6) / 1e9, 1),
            "gbps_with_ids": round((rows_bytes + out_bytes + ids_bytes) / (us * 1e-6) / 1e9, 1),
            "max_abs_err": err, "correct": ok, "id_sets": sets}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rows", type=int, default=1000000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    timer = Timer(dev)
    cases = [c for c in CASES if not args.cases or c[0] in args.cases.split(",")]
    nbytes = max(T * args.rows * D * (2 if dt == "fp16" else 4) for _, T, _, _, D, dt in cases)
    buf = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    copy = copy_gbps(dev, timer, args.reps, (1 << 30) if dev.type == "cuda" else (1 << 24))
    res = []
    for name, T, B, P, D, dt in cases:
        r = run_case(buf, dev, timer, name, T, B, P, D, dt, args.rows, args.reps)
        r["copy_fraction"] = round(r["gbps"] / copy, 4)
        res.append(r)
        if not args.json:
            print(f"{name:32s} {r['us']:10.2f} us {r['gbps']:9.1f} GB/s {r['gbps_with_ids']:9.1f} GB/s+ids "
                  f"{'ok' if r['correct'] else 'WRONG'} (max err {r['max_abs_err']:.2g})", flush=True)
    doc = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "rows_per_table": args.rows, "reps": args.reps, "copy_gbps": round(copy, 1),
           "correct": all(r["correct"] for r in res), "cases": res}
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"torch copy_: {copy:.1f} GB/s (read + written)")
    return 0 if doc["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
