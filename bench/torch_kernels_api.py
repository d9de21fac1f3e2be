"""The PyTorch peers of the attention cases of bench/kernels-api-bench: SUMI attention, fp16, 8
heads, at the attention benchmark's shapes (B sequences of L history and M candidate rows, every
row a query; B1 L256 M128, B8 L256 M128, B1 L1024 M128, B8 L1024 M512 dh64, B32 L1024 M512 and
B8 L4096 M512 dh128).

  flash2, cudnn2, efficient2: two scaled_dot_product_attention calls with that backend forced,
      the history causally (B, H, L, Dh) and the candidates against the history
      (B, H, M, Dh) x (B, H, L, Dh); they leave out each candidate's own key (the self term),
      which only flatters them;
  flex (--flex): one FlexAttention call (torch.compile) over all L + M rows with the SUMI
      block mask, self term included.

Inputs are random, laid out per head [B, H, S, Dh] before timing (a cost the peers are spared).
Each peer's output is checked against a float32 reference on up to two sequences. Time: median
over --reps groups of 10 back-to-back calls timed with CUDA events. Prints one JSON document:
{"torch", "device", "shapes": [{"shape", "peers": {name: us}, "fastest", "fastest_us",
"correct"}, ...], "correct"}.

  python3 bench/torch_kernels_api.py [--reps N] [--flex]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_attention import reference, rel, timed  # the attention benchmark's peers' helpers (same dir)

H = 8
# (B, L, M, Dh), as bench/kernels_api_bench.cu's ATTN_SHAPES
SHAPES = [(8, 1024, 512, 64), (1, 256, 128, 64), (8, 256, 128, 64), (1, 1024, 128, 64), (32, 1024, 512, 128),
          (8, 4096, 512, 128)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--flex", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    shapes = [one_shape(dev, shape, args) for shape in SHAPES]
    ok = all(r["correct"] for r in shapes)
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(dev), "shapes": shapes,
                      "correct": ok}))
    return 0 if ok else 1


def one_shape(dev, shape, args):
    B, L, M, DH = shape
    g = torch.Generator(device=dev).manual_seed(3)
    q, k, v = (torch.randn(B, H, L + M, DH, device=dev, generator=g).half() for _ in range(3))
    qh, kh, vh, qc = (x.contiguous() for x in (q[:, :, :L], k[:, :, :L], v[:, :, :L], q[:, :, L:]))
    nb = min(B, 2)
    ref_noself, ref_full = reference(q[:nb], k[:nb], v[:nb], L, False), reference(q[:nb], k[:nb], v[:nb], L, True)
    peers, ok = {}, True
    shape_name = f"b{B}_l{L}_m{M}_h{H}_dh{DH}"

    def two_calls():
        return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True), F.scaled_dot_product_attention(qc, kh, vh)

    for name, backend in (("flash2", SDPBackend.FLASH_ATTENTION), ("cudnn2", SDPBackend.CUDNN_ATTENTION),
                          ("efficient2", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                oh, oc = two_calls()
                e = rel(torch.cat([oh, oc], 2)[:nb], ref_noself)
                us, _ = timed(two_calls, args.reps)
        except RuntimeError as ex:
            print(f"# {shape_name} {name}: {str(ex).splitlines()[0]}", file=sys.stderr)
            continue
        if e > 1e-2:
            print(f"# {shape_name} {name}: relative error {e:.3g} against the reference", file=sys.stderr)
            ok = False
            continue
        peers[name] = round(us, 2)
    if args.flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention)
        bm = create_block_mask(lambda b, h, qi, kv: torch.where(qi < L, kv <= qi, (kv < L) | (kv == qi)), B=None, H=None,
                               Q_LEN=L + M, KV_LEN=L + M, device=dev)
        fn = lambda: flex(q, k, v, block_mask=bm)
        try:
            e = rel(fn()[:nb], ref_full)
            if e <= 1e-2:
                peers["flex"] = round(timed(fn, args.reps)[0], 2)
            else:
                ok = False
                print(f"# {shape_name} flex: relative error {e:.3g}", file=sys.stderr)
        except Exception as ex:  # a compile failure must not hide the other peers
            print(f"# {shape_name} flex: {str(ex).splitlines()[0]}", file=sys.stderr)
    fastest = min(peers, key=peers.get) if peers else None
    return {"shape": shape_name, "peers": peers, "fastest": fastest, "fastest_us": peers.get(fastest),
            "correct": ok and bool(peers)}


if __name__ == "__main__":
    sys.exit(main())
