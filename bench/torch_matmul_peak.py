"""The GPU's dense matrix peak as PyTorch reaches it, for the MFU denominator of
bench/run_gpu_bench.py: square GEMMs (n x n times n x n, 2 n^3 FLOPs) in fp16 and bf16 with
float32 accumulation (cuBLAS through torch.matmul), the best of a few sizes, CUDA events over
--reps calls after a warm-up. Prints one JSON object: {"fp16_tflops", "bf16_tflops", ...}."""
import argparse
import json

import torch


def tflops(n, dt, reps):
    a = torch.randn(n, n, device="cuda", dtype=dt)
    b = torch.randn(n, n, device="cuda", dtype=dt)
    c = torch.empty(n, n, device="cuda", dtype=dt)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        torch.matmul(a, b, out=c)
    e.record()
    e.synchronize()
    ms = s.elapsed_time(e) / reps
    assert torch.isfinite(c).all()
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sizes", default="4096,8192,12288")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        per = {n: round(tflops(n, dt, a.reps), 1) for n in (int(x) for x in a.sizes.split(","))}
        out[f"{name}_tflops"] = max(per.values())
        out[f"{name}_tflops_by_n"] = per
    print(json.dumps(out))


if __name__ == "__main__":
    main()
