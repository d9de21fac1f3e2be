#!/bin/bash
# Builds the library, the attention kernel test and bench on a CUDA machine, then: the test
# (FLAME_REQUIRE_GPU=1), compute-sanitizer memcheck and racecheck on its quick form, the SASS
# matrix instructions and resources of each kernel, attention-bench and the PyTorch peers on
# the same inputs, the whole-model GPU suites, and the reference model end to end at B32 L1024
# M512 with the kernel chosen per launch and with FLAME_OPT_CUDA_ATTENTION = 1 (the portable
# mma.sync kernel); the torch step also writes results.json (bench/attention_results.py). Results
# under $1 (default
# $OUT). Steps: build test san bench torch gpu e2e.
out=${1:-$OUT}
steps=${STEPS:-"build test san bench torch"}
mkdir -p "$out" /tmp/attn
has() { [[ " $steps " == *" $1 "* ]]; }
if has build; then
    make -j16 CUDA=1 lib build/tests/test_cuda_attention bench/attention-bench >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
    grep -A2 "Compiling entry" "$out/build.log" | grep -E "entry|Used|spill" >"$out/ptxas.txt"
    for o in build/cuda/attention_wgmma.o build/cuda/attention_tc.o; do
        echo "== $o" >>"$out/ptxas.txt"
        cuobjdump --dump-sass "$o" | grep -E "Function :|HGMMA|HMMA|LDL|STL" | sed -E 's/^ *\/\*[0-9a-f]+\*\/ *//; s/ *\/\*.*//' |
            awk '/Function/{f=$0; next} {split($1,a,"."); k=f" "a[1]; c[k]++} END{for (k in c) print c[k], k}' | sort -k2 >>"$out/ptxas.txt"
    done
fi
if has test; then
    FLAME_REQUIRE_GPU=1 timeout 240 ./build/tests/test_cuda_attention >"$out/test.log" 2>&1; echo "test rc $?" >>"$out/test.log"
    tail -5 "$out/test.log"
fi
if has san; then
    for tool in memcheck racecheck; do
        FLAME_ATTN_QUICK=1 FLAME_REQUIRE_GPU=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
            ./build/tests/test_cuda_attention >"/tmp/san_$tool.log" 2>&1; echo "$tool rc $?" >>"/tmp/san_$tool.log"
        tail -30 "/tmp/san_$tool.log" >>"$out/sanitizer.log"
    done
    grep -E " rc |ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitizer.log"
fi
if has bench; then
    timeout 240 ./bench/attention-bench --dump /tmp/attn >"$out/bench.jsonl" 2>/tmp/bench.err; echo "bench rc $?"
    cat "$out/bench.jsonl" | python3 -c 'import sys,json
for l in sys.stdin:
    d=json.loads(l); print(d["shape"], d["variant"], d["tile_q"], d["us"], d["useful_tflops"], d["rel_err_f64"])'
    tail -3 /tmp/bench.err
fi
if has torch; then
    timeout 200 python3 bench/torch_attention.py /tmp/attn >"$out/torch.jsonl" 2>/tmp/torch.err; echo "torch rc $?"
    cut -c1-120 "$out/torch.jsonl"; tail -3 /tmp/torch.err
    # the results file: libflame's dispatch (`auto`) against the fastest peer of this run
    python3 bench/attention_results.py "$out/bench.jsonl" "$out/torch.jsonl" "$out/results.json" \
        --raw "$out/results.raw.json"; echo "results rc $?"
fi
if has e2e; then
    make -j16 CUDA=1 bench/e2e-bench >/dev/null 2>&1
    ./bench/attention-bench --shape 32,1024,512,8,64 >>"$out/bench.jsonl" 2>/dev/null
    for mode in wgmma mma; do
        timeout 120 ./bench/e2e-bench --portable-attention $([ $mode = mma ] && echo 1 || echo 0) --config bench/ref_gr_config.json \
            --device cuda --dtype fp16 --users 32 --history 1024 --candidates 512 --calls 40 --warmup 10 --json |
            sed "s/^{/{\"attention\": \"$mode\", /" >>"$out/e2e.jsonl"
    done
    cut -c1-300 "$out/e2e.jsonl"
fi
if has gpu; then # the suites that use the GPU (make test-gpu runs these and every other suite)
    make -j16 CUDA=1 build/tests/test_cuda build/tests/test_cuda_attention build/tests/test_cuda_embedding \
        build/tests/test_scheduler >/dev/null 2>&1
    for t in test_cuda test_cuda_attention test_cuda_embedding test_scheduler; do
        FLAME_REQUIRE_GPU=1 timeout 200 ./build/tests/$t >"/tmp/$t.log" 2>&1; echo "$t rc $?" | tee -a "$out/test-gpu.log"
        grep -E "^#|FAILED|PASSED|SKIPPED" "/tmp/$t.log" >>"$out/test-gpu.log"
    done
fi
