#!/usr/bin/env python3
"""The PyTorch peers of bench/attention-bench on the same inputs (bf16, every token a query):

  cudnn2: two scaled_dot_product_attention calls with the cuDNN backend forced, the history
          causally (B, H, L, Dh), the candidates against the history (B, H, M, Dh) x (B, H, L, Dh);
  flash2: the same two calls with the flash backend;
  flex:   one FlexAttention call (torch.compile) over all L + M tokens with the SUMI block mask
          (history causal, candidate -> history and itself).

The two-call peers leave out each candidate's own key (the self term; merging it through the
log-sum-exp would add work to them), so they are checked against a float32 reference without
it; FlexAttention and libflame's output (out_<shape>.bin from attention-bench --dump) against
the full SUMI reference. Inputs are read from qkv_<shape>.bin and laid out contiguously per
head before timing (a cost the peers are spared). Time: median over reps groups of 10
back-to-back calls timed with CUDA events. One JSON line per (shape, peer).

  python3 bench/torch_attention.py DIR [--reps N] [--no-flex]
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(1, 256, 128, 8, 64), (8, 256, 128, 8, 64), (1, 1024, 128, 8, 64),
          (8, 1024, 512, 8, 64), (32, 1024, 512, 8, 128), (8, 4096, 512, 8, 128)]


def name_of(s):
    return "b%d_l%d_m%d_h%d_dh%d" % s


def timed(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(10):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 100.0)  # us per call
    ts.sort()
    return ts[len(ts) // 2], ts[0]


def rel(a, b):
    a, b = a.float(), b.float()
    if torch.isnan(a).any():
        return math.inf
    return ((a - b).abs().max() / b.abs().max()).item()


def reference(q, k, v, L, self_term):
    """float32 SUMI attention with an explicit mask (chunks of queries to bound memory)."""
    S = q.shape[2]
    out = torch.empty_like(q, dtype=torch.float32)
    kf, vf = k.float(), v.float()
    j = torch.arange(S, device=q.device)
    for q0 in range(0, S, 512):
        i = torch.arange(q0, min(S, q0 + 512), device=q.device)[:, None]
        allowed = torch.where(i < L, j[None, :] <= i, (j[None, :] < L) | ((j[None, :] == i) & self_term))
        s = q[:, :, q0:q0 + 512].float() @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~allowed, -math.inf)
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out[:, :, q0:q0 + 512] = p @ vf
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-flex", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    print("# torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)), file=sys.stderr)
    flex = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention)
    ok = True
    for s in SHAPES:
        B, L, M, H, Dh = s
        n = name_of(s)
        path = os.path.join(args.dir, "qkv_%s.bin" % n)
        if not os.path.exists(path):
            print("# %s: no inputs, skipped" % n, file=sys.stderr)
            continue
        S = L + M
        raw = torch.from_file(path, size=B * S * 3 * H * Dh, dtype=torch.bfloat16).to(dev)
        qkv = raw.view(B, S, 3, H, Dh)
        q, k, v = (qkv[:, :, i].transpose(1, 2).contiguous() for i in range(3))  # [B, H, S, Dh]
        qh, kh, vh, qc = q[:, :, :L].contiguous(), k[:, :, :L].contiguous(), v[:, :, :L].contiguous(), q[:, :, L:].contiguous()
        flops = 4.0 * B * H * Dh * (L * (L + 1) / 2 + M * L + M)
        # references on a subset of users for the large shapes (memory), all heads
        nb = min(B, 2)
        ref_full = reference(q[:nb], k[:nb], v[:nb], L, True)
        ref_noself = reference(q[:nb], k[:nb], v[:nb], L, False)
        ours_path = os.path.join(args.dir, "out_%s.bin" % n)
        if os.path.exists(ours_path):
            ours = torch.from_file(ours_path, size=B * S * H * Dh, dtype=torch.bfloat16).to(dev).view(B, S, H, Dh).transpose(1, 2)
            e = rel(ours[:nb], ref_full)
            print(json.dumps({"shape": n, "peer": "libflame(check)", "rel_err_f32": e}))
            ok &= e < 1e-2

        def two_calls():
            oh = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
            oc = F.scaled_dot_product_attention(qc, kh, vh)
            return oh, oc

        for peer, backend in (("cudnn2", SDPBackend.CUDNN_ATTENTION), ("flash2", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    oh, oc = two_calls()
                    got = torch.cat([oh, oc], dim=2)
                    e = rel(got[:nb], ref_noself)
                    us, mn = timed(two_calls, args.reps)
            except RuntimeError as ex:
                print("# %s %s: %s" % (n, peer, str(ex).splitlines()[0]), file=sys.stderr)
                continue
            ok &= e < 1e-2
            print(json.dumps({"shape": n, "peer": peer, "us": round(us, 2), "min_us": round(mn, 2),
                              "useful_tflops": round(flops / us * 1e-6, 1), "rel_err_f32_noself": e,
                              "self_term": "omitted"}))
            sys.stdout.flush()
        if flex is not None:
            def sumi(b, h, qi, kv):
                return torch.where(qi < L, kv <= qi, (kv < L) | (kv == qi))
            bm = create_block_mask(sumi, B=None, H=None, Q_LEN=S, KV_LEN=S, device=dev)
            fn = lambda: flex(q, k, v, block_mask=bm)
            try:
                got = fn()
                e = rel(got[:nb], ref_full)
                us, mn = timed(fn, args.reps)
            except Exception as ex:  # a compile failure must not hide the other peers
                print("# %s flex: %s" % (n, str(ex).splitlines()[0]), file=sys.stderr)
                continue
            ok &= e < 1e-2
            print(json.dumps({"shape": n, "peer": "flex", "us": round(us, 2), "min_us": round(mn, 2),
                              "useful_tflops": round(flops / us * 1e-6, 1), "rel_err_f32": e, "self_term": "included"}))
            sys.stdout.flush()
        del raw, qkv, q, k, v
        torch.cuda.empty_cache()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
