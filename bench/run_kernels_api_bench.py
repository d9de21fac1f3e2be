"""The public kernels' GPU benchmark in one command, with their PyTorch peers in the same run.

    make -j16 lib bench/kernels-api-bench && python3 bench/run_kernels_api_bench.py --out-dir DIR

Steps (each a subprocess whose raw output goes to DIR):
  1. bench/kernels-api-bench --json: the embedding bag through flame/kernels.h at T26 B4096 P20
     D128 fp16 (ids from the host, checked and staged by the calling thread and by 8 threads,
     and device-resident ids), the internal kernel, the device's
     copy bandwidth, SUMI attention fp16 at the attention benchmark's shapes (B8 L1024 M512 dh64
     also against the internal dispatcher), the host cost of a batch-1 call of each;
  2. bench/torch_embedding.py: one F.embedding_bag call over the 26 tables concatenated, ids on
     the device, the same case;
  3. bench/torch_kernels_api.py: the SDPA peers of the attention cases (flash, cuDNN and
     memory-efficient backends; FlexAttention with --flex), each shape's fastest the peer.
Then prints a table and writes bench/results/<machine>-<date>-kernels-api.json (also copied to
DIR): a list of {"name", "value", "unit", "peer", "peer_value", "ratio"}, ratio = libflame /
peer (above 1 is better for GB/s, below 1 for us). Exit status 1 only when a step failed.
--dry-run prints the commands only.
"""
import argparse
import datetime
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_gpu_bench import ROOT, Runner, entry, log, pick  # noqa: E402

CASE = "T26_B4096_P20_D128_fp16"
# the attention cases, as bench/kernels_api_bench.cu's ATTN_SHAPES (8 heads, fp16)
ATTN_SHAPES = ["b8_l1024_m512_h8_dh64", "b1_l256_m128_h8_dh64", "b8_l256_m128_h8_dh64", "b1_l1024_m128_h8_dh64",
               "b32_l1024_m512_h8_dh128", "b8_l4096_m512_h8_dh128"]


def entries(api, temb, tatt):
    api, temb, tatt = api or {}, temb or {}, tatt or {}
    te = pick(temb, CASE) or {}
    copy = api.get("copy_gbps")
    tgbps = te.get("gbps")
    attn = []
    by_shape = {sh["shape"]: sh for sh in tatt.get("shapes") or []}
    for n in ATTN_SHAPES:
        sh = by_shape.get(n, {})
        fastest = sh.get("fastest")
        attn.append(entry(f"api_sumi_attn_{n}_us", api.get(f"api_sumi_attn_{n}_us"), "us",
                          f"fastest PyTorch SDPA peer ({fastest}; two calls without the self term)" if fastest
                          else "PyTorch SDPA", sh.get("fastest_us")))
        attn.append(entry(f"api_sumi_attn_{n}_host_us", api.get(f"api_sumi_attn_{n}_host_us"), "us", None, None))
        attn += [entry(f"torch_sdpa_{p}_{n}_us", us, "us", None, None) for p, us in sorted((sh.get("peers") or {}).items())]
    return [
        entry(f"api_tbe_{CASE}_gbps", api.get(f"api_tbe_{CASE}_gbps"), "GB/s",
              "F.embedding_bag over concatenated tables (ids on the device)", tgbps),
        entry(f"api_tbe_{CASE}_device_ids_gbps", api.get(f"api_tbe_{CASE}_device_ids_gbps"), "GB/s",
              "F.embedding_bag over concatenated tables (ids on the device)", tgbps),
        entry(f"internal_tbe_{CASE}_gbps", api.get(f"internal_tbe_{CASE}_gbps"), "GB/s",
              "F.embedding_bag over concatenated tables (ids on the device)", tgbps),
        entry("api_tbe_256B_rows_gbps", api.get("api_tbe_256B_rows_gbps"), "GB/s",
              "device-to-device copy (read + written)", copy),
        entry("api_tbe_256B_rows_device_ids_gbps", api.get(f"api_tbe_{CASE}_device_ids_gbps"), "GB/s",
              "device-to-device copy (read + written)", copy),
        entry("api_tbe_256B_rows_device_ids_back_to_back_gbps",
              api.get(f"api_tbe_{CASE}_device_ids_back_to_back_gbps"), "GB/s",
              "device-to-device copy (read + written)", copy),
        entry(f"api_tbe_{CASE}_8_threads_gbps", api.get(f"api_tbe_{CASE}_8_threads_gbps"), "GB/s",
              "F.embedding_bag over concatenated tables (ids on the device)", tgbps),
        entry(f"api_tbe_{CASE}_host_us", api.get(f"api_tbe_{CASE}_host_us"), "us", None, None),
        entry(f"api_tbe_{CASE}_8_threads_host_us", api.get(f"api_tbe_{CASE}_8_threads_host_us"), "us", None, None),
        entry(f"api_tbe_{CASE}_device_ids_host_us", api.get(f"api_tbe_{CASE}_device_ids_host_us"), "us", None, None),
        entry("api_tbe_batch1_host_us", api.get("api_tbe_batch1_host_us"), "us", None, None),
        entry("api_sumi_attn_batch1_host_us", api.get("api_sumi_attn_batch1_host_us"), "us", None, None),
    ] + attn


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True, help="raw outputs go here")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--flex", action="store_true", help="also FlexAttention (compiles for about a minute)")
    ap.add_argument("--machine", help="name in bench/results/<machine>-<date>-kernels-api.json (default: the GPU's)")
    ap.add_argument("--budget-s", type=float, default=540, help="stop starting steps after this many seconds")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    r = Runner(args.out_dir, args.dry_run, args.budget_s)
    py = sys.executable
    api = r.run("kernels_api", [os.path.join(ROOT, "bench", "kernels-api-bench"), "--json", "--reps", str(args.reps)],
                300)
    temb = r.run("torch_embedding", [py, os.path.join(ROOT, "bench", "torch_embedding.py"), "--json", "--reps",
                                     str(args.reps), "--cases", CASE], 300)
    tatt = r.run("torch_attention", [py, os.path.join(ROOT, "bench", "torch_kernels_api.py"), "--reps",
                                     str(max(5, args.reps // 2))] + (["--flex"] if args.flex else []), 300)
    if args.dry_run:
        return 0
    rows = entries(api, temb, tatt)
    for e in rows:
        ratio = "" if e["ratio"] is None else f"ratio {e['ratio']:.3f}"
        peer = "" if e["peer"] is None else f"vs {e['peer_value']} ({e['peer']})"
        print(f"{e['name']:48s} {e['value']!s:>10} {e['unit']:5s} {peer} {ratio}")
    gpu = (api or {}).get("device", "gpu")
    machine = args.machine or gpu.lower().replace("nvidia", "").strip().replace(" ", "-") or "gpu"
    doc = {"date": datetime.date.today().isoformat(), "device": gpu, "method": __doc__.split("\n\n")[1].strip(),
           "raw": {"kernels_api": api, "torch_embedding": temb, "torch_attention": tatt}, "entries": rows,
           "failures": r.failures}
    path = os.path.join(ROOT, "bench", "results", f"{machine}-{doc['date']}-kernels-api.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    shutil.copy(path, args.out_dir)
    log(f"wrote {path}")
    return 1 if r.failures else 0


if __name__ == "__main__":
    sys.exit(main())
