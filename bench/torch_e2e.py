"""The PyTorch peer of bench/e2e-bench: the same flame model file in PyTorch (flame.tools.torch_ref),
the same request shapes, timed eager and under torch.compile(mode="reduce-overhead"), and the
scores compared with libflame's (flame.Engine on the same device and dtype) on the same inputs.

Reference-model mode (sumi head; candidates appended as tokens under the SUMI mask):
    python3 bench/torch_e2e.py --model ref.flame --shapes 1x256x128,8x256x128 [--dtype fp16]
      each shape BxLxM = B users per call, L history items, M candidates per user; every
      side slot gets --bag ids per token. Inputs live on the device (as ../shared/anchors);
      per call P50/P99/median over --calls calls after --warmup, timed with CUDA events (one
      event pair per call, synchronized), wall-clock P50 beside it.
      Compiled twice: the model as written (attention with an explicit [T, T] mask,
      "compiled") and with two fused SDPA calls per block, the history's causal one and the
      candidates' over [history, candidates] with a mask keeping each one's own key
      ("compiled_sdpa"; --no-sdpa skips it), and a third time with the candidates' call over
      the history alone, unmasked, each candidate's own key merged through the log-sum-exp
      the fused kernel returns ("compiled_sdpa_lse": cuDNN's, else flash's, whichever
      matches a masked float32 attention on this GPU; the JSON names it), so libflame is
      compared with what a capable PyTorch user would write, and with the fastest form.
Full-sort mode (dot head, e.g. the Beauty model):
    python3 bench/torch_e2e.py --model beauty.flame --sequences Beauty.txt --users 256
      every user of the file (history = all but the last item), B users per batch, scores of
      every item id: user states from the model's layers, then one GEMM against the item
      table (what flame_score_batch does for a contiguous candidate range), float32 scores
      copied to host memory as libflame returns them; host ids copied in per batch. users/s
      over --passes passes after one warm-up pass (wall clock).
--device cpu with small shapes only tests this script. --json prints one JSON object.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flame  # noqa: E402
from flame.tools import layout  # noqa: E402
from flame.tools.torch_ref import FlameModel, pad_histories  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] torch_e2e: {msg}", file=sys.stderr, flush=True)


def stats_us(samples_ms):
    s = sorted(samples_ms)
    n = len(s)

    def pct(p):
        return s[max(0, math.ceil(p * n) - 1)] * 1e3

    return {"p50_us": round(pct(0.5), 2), "p99_us": round(pct(0.99), 2),
            "median_us": round((s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])) * 1e3, 2),
            "mean_us": round(sum(s) / n * 1e3, 2), "min_us": round(s[0] * 1e3, 2)}


def time_calls(fn, sets, calls, warmup, dev):
    """Per call: CUDA events around it (synchronized each call) and wall clock."""
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    if dev.type == "cuda":
        torch.cuda.synchronize()
    ev, wall = [], []
    for i in range(calls):
        args = sets[i % len(sets)]
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            a.record()
            fn(*args)
            b.record()
            b.synchronize()
            wall.append((time.perf_counter() - t0) * 1e3)
            ev.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn(*args)
            wall.append((time.perf_counter() - t0) * 1e3)
            ev.append(wall[-1])
    out = stats_us(ev)
    out["wall_p50_us"] = stats_us(wall)["p50_us"]
    out["wall_mean_us"] = stats_us(wall)["mean_us"]
    return out


def side_tables(cfg):
    return [layout.table(cfg, f["table"])["rows"] for f in cfg["features"] if f["input"] == "side"]


def num_items(cfg):
    return min(layout.table(cfg, t)["rows"] for t in layout.item_tables(cfg))


def make_inputs(cfg, B, L, M, bag, seed, dev):
    g = torch.Generator().manual_seed(seed)
    n = num_items(cfg)
    h = torch.randint(0, n, (B, L), generator=g)
    c = torch.randint(0, n, (B, M), generator=g)
    hs = [torch.randint(0, r, (B, L, bag), generator=g) for r in side_tables(cfg)]
    cs = [torch.randint(0, r, (B, M, bag), generator=g) for r in side_tables(cfg)]
    return h.to(dev), c.to(dev), [x.to(dev) for x in hs], [x.to(dev) for x in cs]


def flame_requests(h, c, hs, cs):
    """The same inputs as flame.Request objects (CSR bags of `bag` ids per token)."""
    h, c = h.cpu().numpy(), c.cpu().numpy()
    hs, cs = [x.cpu().numpy() for x in hs], [x.cpu().numpy() for x in cs]
    reqs = []
    for b in range(h.shape[0]):
        def bags(x):
            n, k = x.shape
            return (np.arange(n + 1, dtype=np.int64) * k, np.ascontiguousarray(x.reshape(-1), dtype=np.int64))
        reqs.append(flame.Request(h[b], c[b], [bags(x[b]) for x in hs] or None, [bags(x[b]) for x in cs] or None))
    return reqs


def flame_engine(model_path, device, dtype):
    """flame.Engine on `device` computing in `dtype` (the ctypes package has no dtype keyword
    yet: FLAME_OPT_DTYPE = 4 is added to its option table here)."""
    flame.engine.OPTIONS.setdefault("dtype", (4, str))
    m = flame.Model(model_path)
    opts = {"device": device}
    if device != "cpu":
        opts["dtype"] = dtype
    return m, flame.Engine(m, **opts)


# ------------------------------------------------------------------ reference model (sumi)

def run_sumi(args, dev, dtype):
    model32 = FlameModel.from_file(args.model).to(dev).eval()
    cfg = model32.config
    if not model32.sumi:
        raise SystemExit("torch_e2e: the shapes mode wants a sumi-head model; use --sequences for dot heads")
    model = FlameModel.from_file(args.model).to(dev).eval().to(dtype)
    doc = {"mode": "shapes", "model": args.model, "device": str(dev), "dtype": args.dtype, "bag": args.bag,
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
           "results": []}
    engine = None
    if args.compare:
        _, engine = flame_engine(args.model, "cuda" if dev.type == "cuda" else "cpu", args.dtype)

    def eager(h, c, hs, cs):
        model.attention = "mask"
        return model.predict(h, c, None, hs, cs)

    sdpa_model = FlameModel.from_file(args.model).to(dev).eval().to(dtype)
    sdpa_model.attention = "sdpa"

    def eager_sdpa(h, c, hs, cs):
        return sdpa_model.predict(h, c, None, hs, cs)

    lse_model = FlameModel.from_file(args.model).to(dev).eval().to(dtype)
    doc["sdpa_lse_kernel"] = lse_model.use_sdpa_lse(dev, dtype) if args.sdpa else None
    if args.sdpa:
        log(f"sdpa_lse: log-sum-exp kernel {doc['sdpa_lse_kernel'] or 'none matched: the variant is skipped'}")

    def eager_sdpa_lse(h, c, hs, cs):
        return lse_model.predict(h, c, None, hs, cs)

    # eager (and the comparison) for every shape first, then compilation, the long pole,
    # shape by shape; --out-json is rewritten after each step so a timeout keeps what ran
    work = []
    with torch.no_grad():
        for shape in args.shapes.split(","):
            B, L, M = (int(x) for x in shape.lower().split("x"))
            name = f"b{B}_l{L}_m{M}"
            sets = [make_inputs(cfg, B, L, M, args.bag, 1000 * k + B, dev) for k in range(args.sets)]
            r = {"shape": name, "B": B, "L": L, "M": M, "dtype": args.dtype, "calls": args.calls, "warmup": args.warmup}
            log(f"{name}: eager")
            r["eager"] = time_calls(eager, sets, args.calls, args.warmup, dev)
            r["eager"]["candidates_per_s"] = round(B * M / (r["eager"]["mean_us"] * 1e-6), 1)
            log(f"{name}: eager p50 {r['eager']['p50_us']} us")
            if args.compare:
                h, c, hs, cs = sets[0]
                mine = eager(h, c, hs, cs).float().cpu().numpy()
                ref32 = model32.predict(h, c, None, hs, cs).float().cpu().numpy()
                lib = np.stack(engine.score_batch(flame_requests(h, c, hs, cs)))
                r["max_abs_diff_torch_vs_libflame"] = float(np.abs(mine - lib).max())
                r["max_abs_diff_torch_fp32_vs_libflame"] = float(np.abs(ref32 - lib).max())
                r["max_abs_diff_torch_vs_torch_fp32"] = float(np.abs(mine - ref32).max())
                log(f"{name}: max |torch {args.dtype} - libflame| = {r['max_abs_diff_torch_vs_libflame']:.3g}, "
                    f"|torch fp32 - libflame| = {r['max_abs_diff_torch_fp32_vs_libflame']:.3g}, "
                    f"|torch {args.dtype} - torch fp32| = {r['max_abs_diff_torch_vs_torch_fp32']:.3g}")
            doc["results"].append(r)
            work.append((r, sets))
            dump(args, doc)
        # "compiled": the model as written (explicit mask); "compiled_sdpa": the same weights
        # with two fused SDPA calls per block (flame.tools.torch_ref, attention = "sdpa");
        # "compiled_sdpa_lse": the candidates' own keys merged by log-sum-exp ("sdpa_lse")
        variants = [("compiled", eager)] + ([("compiled_sdpa", eager_sdpa)] if args.sdpa else []) + \
            ([("compiled_sdpa_lse", eager_sdpa_lse)] if doc["sdpa_lse_kernel"] else [])
        for (r, sets), (key, fn) in [(w, v) for w in work for v in variants] if not args.no_compile else []:
            name, B, M = r["shape"], r["B"], r["M"]
            log(f"{name}: torch.compile(mode='reduce-overhead') of {key} (compiling)")
            t0 = time.perf_counter()
            try:
                torch._dynamo.reset()
                compiled = torch.compile(fn, mode="reduce-overhead", dynamic=False)
                compiled(*sets[0])
                r[f"{key}_compile_s"] = round(time.perf_counter() - t0, 1)
                r[key] = time_calls(compiled, sets, args.calls, args.warmup, dev)
                r[key]["candidates_per_s"] = round(B * M / (r[key]["mean_us"] * 1e-6), 1)
                got = compiled(*sets[0]).float().cpu().numpy()
                r[f"max_abs_diff_{key}_vs_eager"] = float(np.abs(got - eager(*sets[0]).float().cpu().numpy()).max())
                log(f"{name}: {key} p50 {r[key]['p50_us']} us (compiled in {r[key + '_compile_s']} s), "
                    f"max |{key} - eager| {r['max_abs_diff_' + key + '_vs_eager']:.3g}")
            except Exception as e:  # reported; the driver counts it as a failure
                r[f"{key}_error"] = f"{type(e).__name__}: {e}"[:2000]
                log(f"{name}: torch.compile of {key} failed: {r[key + '_error'][:300]}")
            dump(args, doc)
    if engine is not None:
        engine.close()
    return doc


def dump(args, doc):
    if args.out_json:
        with open(args.out_json + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(args.out_json + ".tmp", args.out_json)


# ------------------------------------------------------------------ full sort (dot head)

def read_sequences(path):
    with open(path) as f:
        return [np.array(line.split()[1:], dtype=np.int64) for line in f if line.strip()]


def dot_user_state(model, history, lengths):
    """h of FlameModel.forward's dot head (the last history token after the blocks and the
    final LN; zeros without history) for left-padded history [B, L] and lengths [B]."""
    cfg, ml = model.config, model.config["max_len"]
    B, L = history.shape
    dev = history.device
    if L > ml:
        history, L = history[:, -ml:], ml
    lengths = lengths.clamp(max=L)
    slot = torch.arange(L, device=dev)
    valid = slot[None, :] >= (L - lengths)[:, None]
    x = model._embed(history.masked_fill(~valid, 0), None)
    rule = cfg["position"]["rule"]
    if rule != "none":
        x = x + model.history_positions(L, lengths)
    i, j = slot[:, None], slot[None, :]
    mask = ((j <= i)[None] & valid[:, None, :]) | (i == j)[None]
    if cfg["input_layernorm"]:
        x = model.input_ln(x)
    for blk in model.blocks:
        x = blk(x, mask)
    h = x[:, L - 1]
    if cfg["final_layernorm"]:
        h = model.final_ln(h)
    return h * (lengths > 0)[:, None].to(h.dtype)


def run_fullsort(args, dev, dtype):
    model = FlameModel.from_file(args.model).to(dev).eval().to(dtype)
    cfg = model.config
    if model.sumi or model.num_side:
        raise SystemExit("torch_e2e: --sequences wants a dot-head model without side features")
    table = model.tables[cfg["head"]["table"]].weight  # [N, d]
    N = table.shape[0]
    seqs = read_sequences(args.sequences)
    if args.max_users:
        seqs = seqs[:args.max_users]
    ml, B = cfg["max_len"], args.users
    batches = []
    for lo in range(0, len(seqs), B):
        hist = [s[:-1] for s in seqs[lo:lo + B]]
        h, n = pad_histories(hist, ml)
        batches.append((h.pin_memory() if dev.type == "cuda" else h, n, hist))

    def score(h, n):
        h, n = h.to(dev, non_blocking=True), n.to(dev, non_blocking=True)
        u = dot_user_state(model, h, n)
        return (u @ table.T).float().cpu()  # float32 scores in host memory, as libflame returns

    out = {"mode": "fullsort", "model": args.model, "sequences": args.sequences, "device": str(dev),
           "dtype": args.dtype, "users": len(seqs), "batch": B, "items": N, "passes": args.passes,
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None}
    with torch.no_grad():
        # the user states equal FlameModel.forward's dot head (checked on a few candidates)
        h, n, _ = batches[0]
        probe = torch.arange(0, N, max(1, N // 64), device=dev)[None].expand(h.shape[0], -1)
        fwd = model.forward(h.to(dev), probe, n.to(dev))[..., 0].float().cpu()
        mine = score(h, n)[:, probe[0].cpu()]
        out["max_abs_diff_state_vs_forward"] = float((fwd - mine).abs().max())
        if args.compare:
            _, engine = flame_engine(args.model, "cuda" if dev.type == "cuda" else "cpu", args.dtype)
            _, _, hist = batches[0]
            allc = np.arange(N, dtype=np.int64)
            lib = np.stack(engine.score_batch([flame.Request(x, allc) for x in hist]))[..., 0]
            out["max_abs_diff_torch_vs_libflame"] = float(np.abs(score(h, n).numpy() - lib).max())
            out["max_abs_score"] = float(np.abs(lib).max())
            engine.close()
            log(f"fullsort: max |torch - libflame| = {out['max_abs_diff_torch_vs_libflame']:.3g} "
                f"(scores up to {out['max_abs_score']:.3g})")

        def one_pass():
            for h, n, _ in batches:
                score(h, n)

        log(f"fullsort: {len(seqs)} users, {len(batches)} batches of {B}, {N} items")
        one_pass()  # warm-up
        times = []
        for _ in range(args.passes):
            t0 = time.perf_counter()
            one_pass()
            times.append(time.perf_counter() - t0)
    out["pass_s"] = [round(t, 4) for t in times]
    out["users_per_s"] = round(len(seqs) * len(times) / sum(times), 1)
    out["batch_mean_us"] = round(sum(times) / len(times) / len(batches) * 1e6, 1)
    log(f"fullsort: {out['users_per_s']} users/s")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="fp16", choices=sorted(DTYPES))
    ap.add_argument("--shapes", default="1x256x128", help="comma-separated BxLxM (users x history x candidates)")
    ap.add_argument("--bag", type=int, default=1, help="ids per side-feature bag")
    ap.add_argument("--sets", type=int, default=8, help="distinct input sets cycled over")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-sdpa", dest="sdpa", action="store_false",
                    help="skip the variants compiled with fused SDPA calls per block (sdpa, sdpa_lse)")
    ap.add_argument("--no-compare", dest="compare", action="store_false", help="skip the libflame comparison")
    ap.add_argument("--sequences", help="full-sort mode: a sequences file (user i1 i2 ... in per line)")
    ap.add_argument("--users", type=int, default=256, help="full-sort mode: users per batch")
    ap.add_argument("--max-users", type=int, default=0, help="full-sort mode: only the first N users (testing)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out-json", help="also write the result here, rewritten after every step (partial on a timeout)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    if dev.type == "cpu" and dtype != torch.float32:
        log(f"{args.dtype} on the CPU: computing in fp32 instead (testing only)")
        dtype = torch.float32
    doc = run_fullsort(args, dev, dtype) if args.sequences else run_sumi(args, dev, dtype)
    dump(args, doc)
    print(json.dumps(doc) if args.json else json.dumps(doc, indent=1))
    failed = any(k.endswith("_error") for r in doc.get("results", []) for k in r)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
