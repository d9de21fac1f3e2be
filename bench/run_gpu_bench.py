"""The GPU benchmark in one command: libflame and its PyTorch peers in the same run.

    make -j16 all bench && python3 bench/run_gpu_bench.py --out-dir DIR

Steps (each a subprocess whose raw output goes to DIR; progress lines carry timestamps):
  1. models: the reference GR configuration (bench/ref_gr_config.json: 4 pre-LN blocks,
     d_model 512, 8 heads, FFN 2048 GELU, 4 single-id features pooled into 64 dims and
     projected to 512, SUMI, 3 sigmoid task heads) with random weights (flame.tools.reference),
     and the Beauty model converted from $FLAME_SHARED_DIR/data/amazon-beauty (flame.tools.convert);
  2. embedding: bench/embedding-bench (the TBE kernel, device copy bandwidth) and
     bench/torch_embedding.py (F.embedding_bag, one call over concatenated tables);
  3. end to end, fp16, B1 L256 M128, B8 L256 M128, B1 L1024 M128: bench/e2e-bench (through
     the public C API, 1000 calls) and bench/torch_e2e.py (eager and torch.compile
     reduce-overhead, the latter also with fused SDPA calls, plain and with the candidates' own
     keys merged by log-sum-exp, and the max abs score difference against libflame); also libflame on
     variable-length histories (B8, L 128..256, 256 distinct request sets) against the
     peer's fixed L256 (what padding gives PyTorch);
  4. Beauty full sort (all 12,103 items per user, batches of 256, fp16 and fp32): e2e-bench
     --sequences --all-items against torch_e2e.py --sequences;
  5. serving scale, B32 L1024 M512 (fewer calls), both systems, and the GPU's dense fp16/bf16
     matrix peak as PyTorch reaches it (bench/torch_matmul_peak.py). Every end-to-end shape
     gets a model-FLOPs utilisation entry: the forward's useful FLOPs
     (bench/model_flops.py) / the call's P50 / the bf16 peak of the same run (fp16's is the
     same on Hopper), libflame against torch.compile;
  6. concurrent callers, B1 L256 M128 requests, one a call (e2e-bench --clients): 8 threads
     calling flame_score directly (their P99 / P50), and 32 threads directly against 32
     threads through a flame_scheduler (one profile of 8 users x 128 candidates, 200 us wait
     for company): requests/s and P99, and the scheduler's candidates/s against
     torch.compile's at B8 L256 M128.
--steps picks a subset (embedding, e2e, beauty, torch, peak, serving; default all).
Then prints a table and writes bench/results/<machine>-<date>.json (also copied to DIR): a
list of {"name", "value", "unit", "peer", "peer_value", "ratio"}, ratio = libflame / peer
(below 1 is better for times, above 1 for rates). Exit status 1 only when a step failed
(a missed target is not a failure).

--cpu runs a tiny version of everything on the CPU (tests the scripts on a machine without a
GPU); --dry-run prints the commands only.
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_flops import forward_flops  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

SHAPES = [(1, 256, 128), (8, 256, 128), (1, 1024, 128)]
BIG = (32, 1024, 512)  # serving scale: timed with fewer calls, its peer in a run of its own
STEPS = ("embedding", "e2e", "beauty", "torch", "peak", "serving")
SERVING = (1, 256, 128)  # one request a call: B1 L256 M128
T0 = time.time()


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')} +{time.time() - T0:5.0f}s] {msg}", flush=True)


class Runner:
    def __init__(self, out_dir, dry_run, budget_s):
        self.out, self.dry, self.deadline = out_dir, dry_run, T0 + budget_s
        self.failures = []
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + self.env.get("PYTHONPATH", "")

    def run(self, tag, cmd, timeout, want_json=True):
        """Runs cmd, saves stdout/stderr as DIR/<tag>.{out,err}; returns parsed JSON (the last
        stdout line that parses) or None on failure (recorded)."""
        shown = " ".join(cmd)
        if self.dry:
            log(f"{tag}: would run: {shown}")
            return None
        left = self.deadline - time.time()
        if left < 10:
            self.failures.append(f"{tag}: skipped, the time budget is spent")
            log(f"{tag}: SKIPPED (time budget spent)")
            return None
        timeout = min(timeout, left)
        log(f"{tag}: {shown}")
        t = time.time()
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = (e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")) + f"\nTIMEOUT after {timeout:.0f} s"
            rc = "timeout"
        with open(os.path.join(self.out, tag + ".out"), "w") as f:
            f.write(out)
        with open(os.path.join(self.out, tag + ".err"), "w") as f:
            f.write(err)
        log(f"{tag}: rc={rc} in {time.time() - t:.1f} s")
        doc = None
        if want_json:
            for line in reversed(out.strip().splitlines()):
                try:
                    doc = json.loads(line)
                    break
                except ValueError:
                    continue
        if rc != 0 or (want_json and doc is None):
            tail = "\n".join(err.strip().splitlines()[-5:])
            self.failures.append(f"{tag}: rc={rc}: {tail}")
            log(f"{tag}: FAILED (rc={rc}); stderr tail:\n{tail}")
            return doc if rc == 1 and doc is not None else None  # a JSON with a failed check still shows
        return doc


def make_models(args, work):
    """The reference model file (random weights, F16 on disk) and the converted Beauty model."""
    from flame.tools import reference
    with open(os.path.join(ROOT, "bench", "ref_gr_config.json")) as f:
        cfg = json.load(f)
    if args.cpu:  # tiny: the same architecture, scaled down
        cfg["d_model"], cfg["max_len"] = 64, 64
        cfg["blocks"].update(num_heads=4, ffn_dim=128)
        cfg["position"].update(rows=65, candidate_position=64)
        cfg["tables"][0]["rows"] = 5000
    ref = os.path.join(work, "ref_gr.flame" if not args.cpu else "ref_gr_tiny.flame")
    if args.dry_run:
        log(f"models: would write {ref}")
    else:
        t = time.time()
        reference.save(ref, cfg, reference.random_model(cfg, 2026), dtype="F16")
        log(f"models: wrote {ref} ({os.path.getsize(ref) / 1e6:.0f} MB) in {time.time() - t:.1f} s")
        with open(os.path.join(args.out_dir, "ref_gr_config.json"), "w") as f:
            json.dump(cfg, f)
    shared = os.environ.get("FLAME_SHARED_DIR") or os.path.join(ROOT, "..", "shared")
    data = os.path.join(shared, "data", "amazon-beauty")
    beauty = os.path.join(work, "beauty.flame")
    ckpt, seqs = os.path.join(data, "iclrec-beauty.safetensors"), os.path.join(data, "Beauty.txt")
    if not (os.path.exists(ckpt) and os.path.exists(seqs)):
        log(f"models: {data} has no iclrec-beauty.safetensors/Beauty.txt: the Beauty step is skipped")
        return ref, None, None
    return ref, (beauty, ckpt), seqs


def nvidia_gpu():
    """The GPU's name from nvidia-smi, for runs whose steps did not report it (None without one)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else None


def pick(cases, name):
    return next((c for c in (cases or {}).get("cases", []) if c["name"] == name), None)


def entry(name, value, unit, peer, peer_value):
    ratio = None
    if value is not None and peer_value:
        ratio = round(value / peer_value, 4)
    return {"name": name, "value": value, "unit": unit, "peer": peer, "peer_value": peer_value, "ratio": ratio}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True, help="raw outputs go here")
    ap.add_argument("--work-dir", default=os.path.join(ROOT, "build", "gpu-bench"), help="model files (large)")
    ap.add_argument("--machine", help="name in bench/results/<machine>-<date>.json (default: from the GPU name)")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--budget-s", type=float, default=420, help="stop starting steps after this many seconds")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (its peer entries stay empty)")
    ap.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU: tests the scripts without a GPU")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated subset of " + ",".join(STEPS))
    args = ap.parse_args(argv)
    steps = set(args.steps.split(","))
    if not steps <= set(STEPS):
        ap.error(f"--steps: unknown {sorted(steps - set(STEPS))}; choose from {','.join(STEPS)}")
    os.makedirs(args.out_dir, exist_ok=True)
    os.makedirs(args.work_dir, exist_ok=True)
    py = sys.executable
    R = Runner(args.out_dir, args.dry_run, args.budget_s)
    dev = "cpu" if args.cpu else "cuda"
    calls = min(args.calls, 30) if args.cpu else args.calls
    shapes = [(1, 20, 8), (2, 20, 8), (1, 60, 8)] if args.cpu else SHAPES
    names = ["b1_l256_m128", "b8_l256_m128", "b1_l1024_m128"]  # the entries' names (tiny shapes in --cpu)
    big, big_name = ((4, 60, 16) if args.cpu else BIG), "b32_l1024_m512"
    big_calls = 5 if args.cpu else min(args.calls, 200)

    for binary in ["bench/e2e-bench"] + ([] if args.cpu or "embedding" not in steps else ["bench/embedding-bench"]):
        if not os.access(os.path.join(ROOT, binary), os.X_OK) and not args.dry_run:
            log(f"{binary} is missing: run `make all bench` first (CUDA=1 for the embedding bench)")
            return 1
    log(f"libflame GPU benchmark: out-dir {args.out_dir}, work-dir {args.work_dir}, device {dev}")

    # 1. models
    ref, beauty_src, seqs = make_models(args, args.work_dir)
    beauty = None
    if beauty_src:
        beauty = beauty_src[0]
        R.run("convert_beauty", [py, "-m", "flame.tools.convert", "iclrec", beauty_src[1], beauty], 120, want_json=False)
        if not args.dry_run and not os.path.exists(beauty):
            beauty = None

    # 2. embedding
    emb = temb = None
    if "embedding" not in steps:
        pass
    elif args.cpu:
        emb = None
        temb = R.run("embedding_torch", [py, "bench/torch_embedding.py", "--json", "--device", "cpu", "--rows", "2000",
                                         "--reps", "3", "--cases", "rows_256B_fp16_T26_B4096_P20,T8_B512_P1_D64_fp16"],
                     120)
    else:
        emb = R.run("embedding_libflame", ["bench/embedding-bench", "--json"], 150)
        temb = R.run("embedding_torch", [py, "bench/torch_embedding.py", "--json"], 180)

    # 3. end to end: libflame
    e2e = {}
    for (B, L, M), name in zip(shapes, names) if "e2e" in steps else ():
        e2e[name] = R.run(f"e2e_libflame_{name}", ["bench/e2e-bench", "--model", ref, "--device", dev, "--dtype", "fp16",
                                                   "--users", str(B), "--history", str(L), "--candidates", str(M),
                                                   "--calls", str(calls), "--warmup", "100" if not args.cpu else "3",
                                                   "--json"], 120)

    # variable-length traffic: B8, histories of 128..256 (token counts differ from call to
    # call, as in serving), against the peer padded to L256 (the peer entries reuse b8_l256_m128)
    vB, vL, vM = shapes[1]
    e2e["var"] = None if "e2e" not in steps else R.run("e2e_libflame_b8_l128to256_m128", ["bench/e2e-bench", "--model", ref, "--device", dev,
                                                         "--dtype", "fp16", "--users", str(vB), "--history", str(vL),
                                                         "--history-min", str(vL // 2), "--candidates", str(vM),
                                                         "--sets", "256", "--calls", str(calls),
                                                         "--warmup", "100" if not args.cpu else "3", "--json"], 120)

    # 4. Beauty full sort, fp16 and fp32
    bl, bt = {}, {}
    if beauty and seqs and "beauty" in steps:
        n_users = sum(1 for line in open(seqs) if line.strip())
        batches = -(-n_users // 256)
        passes = 1 if args.cpu else 3
        for dt in ("fp16", "fp32"):
            bl[dt] = R.run(f"beauty_libflame_{dt}", ["bench/e2e-bench", "--model", beauty, "--device", dev, "--dtype", dt,
                                                     "--sequences", seqs, "--all-items", "--users", "256",
                                                     "--calls", str(passes * batches), "--warmup", str(batches),
                                                     "--json"], 120)
            if dt == "fp16": # the k best on the device (flame_score_batch_topk): only 100 scores a user come back
                bl["top100"] = R.run("beauty_libflame_fp16_top100", ["bench/e2e-bench", "--model", beauty, "--device", dev,
                                                                     "--dtype", dt, "--sequences", seqs, "--all-items",
                                                                     "--users", "256", "--topk", "100",
                                                                     "--calls", str(passes * batches), "--warmup",
                                                                     str(batches), "--json"], 120)
            bt[dt] = R.run(f"beauty_torch_{dt}", [py, "bench/torch_e2e.py", "--model", beauty, "--device", dev,
                                                  "--dtype", dt, "--sequences", seqs, "--users", "256",
                                                  "--passes", str(passes), "--json"], 150)

    # 5. serving scale and the matrix peak
    B, L, M = big
    if "e2e" in steps:
        e2e[big_name] = R.run(f"e2e_libflame_{big_name}", ["bench/e2e-bench", "--model", ref, "--device", dev,
                                                           "--dtype", "fp16", "--users", str(B), "--history", str(L),
                                                           "--candidates", str(M), "--calls", str(big_calls),
                                                           "--warmup", "20" if not args.cpu else "2", "--json"], 120)
    # concurrent callers: one-user requests from client threads, direct and through a scheduler
    serving = {}
    sB, sL, sM = (1, 20, 8) if args.cpu else SERVING
    if "serving" in steps:
        s_calls = 20 if args.cpu else 300
        base = ["bench/e2e-bench", "--model", ref, "--device", dev, "--dtype", "fp16", "--users", str(sB), "--history",
                str(sL), "--candidates", str(sM), "--calls", str(s_calls), "--warmup", "2" if args.cpu else "20",
                "--json"]
        for tag, extra in (("direct8", ["--clients", "8", "--via", "direct"]),
                           ("direct32", ["--clients", "32", "--via", "direct"]),
                           ("sched32", ["--clients", "32", "--via", "scheduler", "--sched-users", "8",
                                        "--sched-candidates", str(sM), "--max-wait-us", "200"])):
            serving[tag] = R.run(f"serving_{tag}", base + extra, 180)

    peak = None
    if "peak" in steps and not args.cpu:
        peak = R.run("matmul_peak", [py, "bench/torch_matmul_peak.py"], 120)

    # 6. end to end: PyTorch eager and compiled (compilation is the long pole: last)
    tcmd = [py, "bench/torch_e2e.py", "--model", ref, "--device", dev, "--dtype", "fp16",
            "--shapes", ",".join(f"{B}x{L}x{M}" for B, L, M in shapes), "--calls", str(calls),
            "--warmup", "50" if not args.cpu else "3", "--json"]
    if args.no_compile:
        tcmd.append("--no-compile")
    partial = os.path.join(args.out_dir, "e2e_torch.json")
    te2e = None
    if "torch" in steps:
        te2e = R.run("e2e_torch", tcmd + ["--out-json", partial], 420)
        if te2e is None and os.path.exists(partial):  # a timeout or crash: keep what finished
            with open(partial) as f:
                te2e = json.load(f)
            log("e2e_torch: using the partial results it wrote before stopping")
        bcmd = [py, "bench/torch_e2e.py", "--model", ref, "--device", dev, "--dtype", "fp16", "--shapes", f"{B}x{L}x{M}",
                "--calls", str(big_calls), "--warmup", "10" if not args.cpu else "2", "--json"]
        if args.no_compile:
            bcmd.append("--no-compile")
        tbig = R.run(f"e2e_torch_{big_name}", bcmd, 300)
        if tbig:
            te2e = te2e or {}
            te2e.setdefault("results", []).extend(tbig.get("results", []))

    if args.dry_run:
        return 0

    # ---- results
    res = []
    copy = (emb or {}).get("copy_gbps")
    for rb in (64, 128, 256, 512):
        for dt, suffix in (("fp16", ""), ("fp32", "_fp32")):
            c = pick(emb, f"rows_{rb}B_{dt}_T26_B4096_P20")
            res.append(entry(f"embedding_tbe_{rb}B_rows{suffix}_gbps", c and c["gbps"], "GB/s",
                             "device-to-device cudaMemcpy bandwidth, same run (read + written)", copy))
    for dt in ("fp16", "fp32"):
        n = f"T26_B4096_P20_D128_{dt}"
        c, t = pick(emb, n), pick(temb, n)
        res.append(entry(f"embedding_tbe_{n}_gbps", c and c["gbps"], "GB/s",
                         "F.embedding_bag, one call over concatenated tables, same run", t and t["gbps"]))
    for n in ("T8_B512_P1_D64_fp16", "T26_B1_P20_D64_fp32"):
        c, t = pick(emb, n), pick(temb, n)
        res.append(entry(f"embedding_tbe_{n}_us", c and c["us"], "us",
                         "F.embedding_bag, one call over concatenated tables, same run", t and t["us"]))
    tres = {r["shape"]: r for r in (te2e or {}).get("results", [])}
    with open(os.path.join(ROOT, "bench", "ref_gr_config.json")) as f:
        ref_cfg = json.load(f)
    peak_tflops = (peak or {}).get("bf16_tflops")  # the MFU denominator: the bf16 matrix peak
    res.append(entry("gpu_matmul_peak_fp16_tflops", (peak or {}).get("fp16_tflops"), "TFLOP/s", None, None))
    res.append(entry("gpu_matmul_peak_bf16_tflops", (peak or {}).get("bf16_tflops"), "TFLOP/s", None, None))

    def mfu(shape, us):
        if not (us and peak_tflops) or args.cpu:
            return None
        return round(forward_flops(ref_cfg, *shape) / (us * 1e-6) / (peak_tflops * 1e12), 4)

    for (B, L, M), name in list(zip(shapes, names)) + [(big, big_name)]:
        mine = e2e.get(name) or {}
        peer = tres.get(f"b{B}_l{L}_m{M}", {})
        comp, eag = peer.get("compiled", {}), peer.get("eager", {})
        peer_name = "torch.compile(mode='reduce-overhead'), same model file, CUDA events, same run"
        res.append(entry(f"e2e_ref_{name}_p50_us", mine.get("p50_us"), "us", peer_name, comp.get("p50_us")))
        res.append(entry(f"e2e_ref_{name}_p99_us", mine.get("p99_us"), "us", peer_name, comp.get("p99_us")))
        res.append(entry(f"e2e_ref_{name}_candidates_per_s", mine.get("candidates_per_s"), "candidates/s", peer_name,
                         comp.get("candidates_per_s")))
        sd = peer.get("compiled_sdpa", {})
        sd_name = "torch.compile(mode='reduce-overhead') with two fused SDPA calls a block, same run"
        res.append(entry(f"e2e_ref_{name}_p50_us_vs_sdpa", mine.get("p50_us"), "us", sd_name, sd.get("p50_us")))
        res.append(entry(f"e2e_ref_{name}_candidates_per_s_vs_sdpa", mine.get("candidates_per_s"), "candidates/s",
                         sd_name, sd.get("candidates_per_s")))
        sl = peer.get("compiled_sdpa_lse", {})
        sl_name = ("torch.compile(mode='reduce-overhead') with fused SDPA calls a block, the candidates' own keys "
                   f"merged by log-sum-exp ({(te2e or {}).get('sdpa_lse_kernel')} kernel), same run")
        res.append(entry(f"e2e_ref_{name}_p50_us_vs_sdpa_lse", mine.get("p50_us"), "us", sl_name, sl.get("p50_us")))
        res.append(entry(f"e2e_ref_{name}_candidates_per_s_vs_sdpa_lse", mine.get("candidates_per_s"),
                         "candidates/s", sl_name, sl.get("candidates_per_s")))
        res.append(entry(f"e2e_ref_{name}_p50_us_vs_eager", mine.get("p50_us"), "us",
                         "PyTorch eager, same model file, CUDA events, same run", eag.get("p50_us")))
        res.append(entry(f"e2e_ref_{name}_mfu", mfu((B, L, M), mine.get("p50_us")), "fraction of the bf16 matrix peak",
                         "torch.compile(mode='reduce-overhead'), same FLOP count, same run",
                         mfu((B, L, M), comp.get("p50_us"))))
        res.append(entry(f"e2e_ref_{name}_device_bytes", mine.get("device_bytes"), "bytes", None, None))
        res.append(entry(f"e2e_ref_{name}_max_abs_score_diff", peer.get("max_abs_diff_torch_vs_libflame"), "abs",
                         "0 (libflame fp16 vs PyTorch fp16 on the same inputs)", None))
    mine, peer = e2e.get("var") or {}, tres.get("b{}_l{}_m{}".format(*shapes[1]), {}).get("compiled", {})
    peer_name = "torch.compile(mode='reduce-overhead') at B8 L256 M128 (variable histories padded to 256), same run"
    res.append(entry("e2e_ref_b8_l128to256_m128_p50_us", mine.get("p50_us"), "us", peer_name, peer.get("p50_us")))
    res.append(entry("e2e_ref_b8_l128to256_m128_candidates_per_s", mine.get("candidates_per_s"), "candidates/s",
                     peer_name, peer.get("candidates_per_s")))
    for dt, suffix in (("fp16", ""), ("fp32", "_fp32")):
        mine, peer = bl.get(dt) or {}, bt.get(dt) or {}
        res.append(entry(f"beauty_fullsort_gpu{suffix}_users_per_s", mine.get("requests_per_s"), "users/s",
                         f"PyTorch {dt} (flame.tools.torch_ref layers + one GEMM against the item table, scores to host), "
                         "batch 256, same run", peer.get("users_per_s")))
    mine, peer = bl.get("top100") or {}, bt.get("fp16") or {}
    res.append(entry("beauty_fullsort_gpu_top100_users_per_s", mine.get("requests_per_s"), "users/s",
                     "PyTorch fp16 returning every score (as beauty_fullsort_gpu_users_per_s), same run",
                     peer.get("users_per_s")))

    d8, d32, s32 = (serving.get(k) or {} for k in ("direct8", "direct32", "sched32"))
    ratio_8 = round(d8["p99_us"] / d8["p50_us"], 4) if d8.get("p50_us") else None
    res.append(entry("direct_gpu_8clients_p99_over_p50", ratio_8, "P99 / P50",
                     "8 threads calling flame_score directly, one B1 L256 M128 request each, same run", None))
    direct_name = "32 threads calling flame_score directly, one B1 L256 M128 request each, same run"
    res.append(entry("sched_gpu_32clients_requests_per_s", s32.get("requests_per_s"), "requests/s", direct_name,
                     d32.get("requests_per_s")))
    res.append(entry("sched_gpu_32clients_p99_us", s32.get("p99_us"), "us", direct_name, d32.get("p99_us")))
    b8 = tres.get("b{}_l{}_m{}".format(*shapes[1]), {}).get("compiled", {})
    res.append(entry("sched_gpu_32clients_candidates_per_s",
                     s32.get("requests_per_s") and s32["requests_per_s"] * sM,
                     "candidates/s", "torch.compile(mode='reduce-overhead') at B8 L256 M128, same run",
                     b8.get("candidates_per_s")))

    machine = args.machine
    gpu = (emb or {}).get("device") or (te2e or {}).get("gpu") or (None if args.cpu else nvidia_gpu()) or "cpu"
    if not machine:
        machine = "cpu-test" if args.cpu else gpu.lower().replace("nvidia", "").strip().replace(" ", "-") or "gpu"
    date = datetime.date.today().isoformat()
    results_dir = args.out_dir if args.cpu else os.path.join(ROOT, "bench", "results")  # --cpu: not a result
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, f"{machine}-{date}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    if not args.cpu:
        shutil.copy(path, os.path.join(args.out_dir, os.path.basename(path)))
    with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
        json.dump({"machine": machine, "gpu": gpu, "date": date, "failures": R.failures, "results": res,
                   "elapsed_s": round(time.time() - T0, 1)}, f, indent=1)

    print()
    print(f"{'name':50s} {'libflame':>14s} {'peer':>14s} {'ratio':>8s}  unit")
    for r in res:
        def fmt(v):
            return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) and abs(v) < 1e4 else f"{v:,.0f}")
        print(f"{r['name']:50s} {fmt(r['value']):>14s} {fmt(r['peer_value']):>14s} "
              f"{'-' if r['ratio'] is None else format(r['ratio'], '.3f'):>8s}  {r['unit']}")
    print()
    # (name, which number: the ratio to its peer or the value itself, comparison, goal, what)
    targets = [("embedding_tbe_256B_rows_gbps", "ratio", ">=", 0.8, "TBE >= 80% of copy bandwidth, 256-byte rows"),
               ("embedding_tbe_512B_rows_gbps", "ratio", ">=", 0.8, "TBE >= 80% of copy bandwidth, 512-byte rows"),
               ("e2e_ref_b1_l256_m128_p50_us", "ratio", "<=", 0.4, "B1 L256 M128 P50 <= 0.4x torch.compile"),
               ("e2e_ref_b8_l256_m128_candidates_per_s", "ratio", ">=", 2.0,
                "B8 L256 M128 candidates/s >= 2x torch.compile"),
               ("e2e_ref_b32_l1024_m512_mfu", "value", ">=", 0.5,
                "B32 L1024 M512 model-FLOPs utilisation >= 50% of the bf16 matrix peak"),
               ("e2e_ref_b32_l1024_m512_candidates_per_s", "ratio", ">=", 3.0,
                "B32 L1024 M512 candidates/s >= 3x torch.compile"),
               ("beauty_fullsort_gpu_users_per_s", "ratio", ">=", 1.5,
                "Beauty full sort users/s >= 1.5x PyTorch, every score returned"),
               ("direct_gpu_8clients_p99_over_p50", "value", "<=", 3.0, "8 direct callers: P99 <= 3x their P50")]
    for name, which, op, goal, what in targets:
        r = next(x for x in res if x["name"] == name)
        got = r[which]
        if r["value"] is None:
            continue
        status = "n/a" if got is None else ("met" if (got >= goal if op == ">=" else got <= goal) else "MISSED")
        print(f"target: {what}: {which} {got} -> {status}")
    log(f"wrote {path} (and a copy in {args.out_dir})")
    if R.failures:
        log(f"{len(R.failures)} step(s) failed:")
        for fl in R.failures:
            print("  " + fl.replace("\n", "\n    "))
        return 1
    log("all steps succeeded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
