#!/usr/bin/env python3
"""The PyTorch peer of bench/activation-bench: F.gelu (approximate='none', the erf form) over
[rows, 2048] in fp16 and bf16, inputs drawn as activation-bench draws them (a sum of four
uniforms, scale 2). Each call of a timed group reads its own input tensor; the output is a new
tensor (PyTorch's GELU has no in-place form), so the bytes moved are the same as the in-place
pass's. Time: median over reps groups of 20 back-to-back calls timed with CUDA events. One
JSON line per (rows, dtype).

  python3 bench/torch_activation.py [--reps N] [--rows R ...]
"""
import argparse
import json

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rows", type=int, nargs="*", default=[384, 3072, 49152])
    args = ap.parse_args()
    group = 20
    for rows in args.rows:
        for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            g = torch.Generator(device="cuda").manual_seed(rows)
            xs = [((torch.rand(rows, 2048, 4, device="cuda", generator=g) - 0.5).sum(-1) * 2.0).to(dt)
                  for _ in range(group)]
            for x in xs:  # warm-up
                F.gelu(x)
            torch.cuda.synchronize()
            ts = []
            for _ in range(args.reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for x in xs:
                    F.gelu(x)
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) * 1000.0 / group)
            ts.sort()
            us = ts[len(ts) // 2]
            gbps = 2.0 * rows * 2048 * 2 / 1e3 / us
            print(json.dumps({"rows": rows, "cols": 2048, "dtype": name, "peer": "torch F.gelu",
                              "us": round(us, 2), "gbps": round(gbps)}), flush=True)


if __name__ == "__main__":
    main()
