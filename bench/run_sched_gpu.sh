#!/bin/bash
# The scheduler against direct calls on a GPU engine, in one run: the reference model
# (bench/ref_gr_config.json, random weights) at histories of 256 with long-tailed candidate
# counts, driven open loop by examples/flame-bench --device cuda
#   direct     --threads caller threads (default: the machine's cores) calling flame_score;
#   scheduler  the same engine behind a scheduler (profiles, adaptive wait bounded at WAIT_US).
# Both sweep the same levels (doubling from QPS until the achieved rate falls under 90% of the
# offered one), refine their peak with three levels between the last sustained level and the
# next double, then each runs once more at 80% of its peak sustainable level (after a warm-up
# level in the same process, dropped). Writes one JSON
# (default $OUT/sched-gpu.json, or $1) with both sweeps and the three comparisons:
#   sustainable_ratio     the highest level each sustains with P99 <= the bound (the direct
#                         callers' P99 at their peak, or P99_BOUND_US), scheduler / direct;
#   p99_ratio_at_peak     P99 at the direct callers' peak level, direct / scheduler;
#   p99_over_p50_at_80    P99 / P50 at 80% of each one's peak.
# A few minutes: SECONDS_PER_LEVEL (5) a level, about 8 levels a mode.
#   usage: bench/run_sched_gpu.sh [OUT.json]
#   env: DEVICE QPS WAIT_US THREADS PROFILES CANDS HISTORY CONFIG (a model config file)
#        WORKERS (the scheduler's; default 0: its own choice, one on the CPU)
#        SKIP_BUILD=1 (use the built examples/flame-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp}/sched-gpu.json}
device=${DEVICE:-cuda}
qps=${QPS:-100}
wait_us=${WAIT_US:-1000}
threads=${THREADS:-$(nproc)}
profiles=${PROFILES:-16x128,8x256,4x512}
cands=${CANDS:-longtail:64:512}
history=${HISTORY:-256}
secs=${SECONDS_PER_LEVEL:-5}
work=$(mktemp -d)
if [ -z "${SKIP_BUILD:-}" ]; then
    make -j"$(nproc)" CUDA=1 lib examples/flame-bench >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
fi
cfg=$(cat "${CONFIG:-bench/ref_gr_config.json}")
common=(--config "$cfg" --device "$device" --history "$history" --candidates "$cands" --seconds "$secs"
        --no-overhead --json)
sched=(--profiles "$profiles" --max-wait-us "$wait_us" --adaptive --workers "${WORKERS:-0}")
bench() { ./examples/flame-bench "${common[@]}" "$@" 2>>"$work/stderr.log"; }
bench --direct --threads "$threads" --sweep auto --qps "$qps" >"$work/direct.json"
bench "${sched[@]}" --sweep auto --qps "$qps" >"$work/sched.json"
peak() { python3 -c 'import json,sys; L=json.load(open(sys.argv[1]))["levels"]; ok=[l for l in L if l["achieved_qps"]>=0.9*l["offered_qps"]]; print(max([l["offered_qps"] for l in ok] or [L[0]["offered_qps"]]))' "$1"; }
# Doubling resolves the peak only to a factor of 2: three levels between each mode's last
# sustained level and the next double refine it to an eighth. Each flame-bench run starts a
# fresh engine, whose first seconds are slower (lazy CUDA module loading, first captures): a
# level at a quarter of the peak runs first and is dropped.
refine() {
    python3 -c 'import sys; p=float(sys.argv[1]); print(",".join(str(round(p*f, 1)) for f in (0.25, 1.25, 1.5, 1.75)))' "$1"
}
merge() { python3 - "$1" "$2" <<'PY'
import json, sys
main, extra = (json.load(open(f)) for f in sys.argv[1:])
main["levels"] = sorted(main["levels"] + extra["levels"][1:], key=lambda l: l["offered_qps"])
json.dump(main, open(sys.argv[1], "w"))
PY
}
pd=$(peak "$work/direct.json")
bench --direct --threads "$threads" --sweep "$(refine "$pd")" >"$work/direct-refine.json"
merge "$work/direct.json" "$work/direct-refine.json"
pd=$(peak "$work/direct.json")
# the scheduler also runs at the direct callers' refined peak (the P99 comparison there)
ps=$(peak "$work/sched.json")
bench "${sched[@]}" --sweep "$(refine "$ps"),$pd" >"$work/sched-refine.json"
merge "$work/sched.json" "$work/sched-refine.json"
ps=$(peak "$work/sched.json")
# the 80% levels, each after a warm-up level at a quarter of the peak in the same process (a fresh
# engine's first seconds would otherwise be part of the level's tail); the warm-up is dropped
at80() { python3 -c 'import sys; p=float(sys.argv[1]); print("%s,%s" % (round(0.25 * p, 1), round(0.8 * p, 1)))' "$1"; }
bench --direct --threads "$threads" --sweep "$(at80 "$pd")" >"$work/direct80.json"
bench "${sched[@]}" --sweep "$(at80 "$ps")" >"$work/sched80.json"
python3 - "$work" "$out" "${P99_BOUND_US:-0}" "$device" "$threads" "$profiles" "$wait_us" "$cands" "$history" \
    "${CONFIG:-bench/ref_gr_config.json}" "${WORKERS:-0}" <<'EOF'
import datetime, json, os, subprocess, sys
work, out, bound, device, threads, profiles, wait_us, cands, history, config, workers = sys.argv[1:]
load = lambda n: json.load(open(os.path.join(work, n)))["levels"]
top = lambda L: max(L, key=lambda l: l["offered_qps"]) # the 80% level, not its warm-up
d, s, d80, s80 = load("direct.json"), load("sched.json"), top(load("direct80.json")), top(load("sched80.json"))
ok = lambda l: l["achieved_qps"] >= 0.9 * l["offered_qps"]
dpeak = max((l for l in d if ok(l)), key=lambda l: l["offered_qps"], default=d[0])
bound = float(bound) or dpeak["p99_us"]
sust = lambda L: max([l["offered_qps"] for l in L if ok(l) and l["p99_us"] <= bound] or [0])
at = next((l for l in s if abs(l["offered_qps"] - dpeak["offered_qps"]) < 1e-6), None)
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()
except OSError:
    gpu = None
doc = {"date": datetime.date.today().isoformat(), "gpu": gpu, "cpus": os.cpu_count(), "device": device,
       "model": config + " (random weights)", "history": int(history), "candidates": cands,
       "direct_threads": int(threads), "scheduler_workers": int(workers), "profiles": profiles,
       "adaptive_wait_bound_us": int(wait_us),
       "direct": d, "scheduler": s, "direct_at_80pct": d80, "scheduler_at_80pct": s80,
       "p99_bound_us": bound,
       "sustainable_qps": {"direct": sust(d), "scheduler": sust(s)},
       "sustainable_ratio": sust(s) / sust(d) if sust(d) else None,
       "direct_peak_qps": dpeak["offered_qps"],
       "p99_at_direct_peak_us": {"direct": dpeak["p99_us"], "scheduler": at["p99_us"] if at else None},
       "p99_ratio_at_peak": dpeak["p99_us"] / at["p99_us"] if at and at["p99_us"] else None,
       "p99_over_p50_at_80": {"direct": d80["p99_us"] / d80["p50_us"] if d80["p50_us"] else None,
                              "scheduler": s80["p99_us"] / s80["p50_us"] if s80["p50_us"] else None},
       "targets": {"sustainable_ratio": ">= 1.3", "p99_ratio_at_peak": ">= 2", "p99_over_p50_at_80": "<= 2"}}
json.dump(doc, open(out, "w"), indent=1)
print(json.dumps({k: doc[k] for k in ("sustainable_qps", "sustainable_ratio", "direct_peak_qps",
                                      "p99_at_direct_peak_us", "p99_ratio_at_peak", "p99_over_p50_at_80")}, indent=1))
print("wrote", out)
EOF
