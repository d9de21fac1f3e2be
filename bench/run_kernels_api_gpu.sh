#!/bin/bash
# The public kernels on a CUDA machine in one command: builds the library, the kernel-API tests
# and bench/kernels-api-bench, then runs the GPU test suite (FLAME_REQUIRE_GPU=1: a missing GPU
# fails), the same suite under compute-sanitizer memcheck and synccheck, the host-id packing
# suite, and bench/run_kernels_api_bench.py (the public calls, the internal kernels, the copy
# bandwidth and the PyTorch peers in one run). Results under $1 (default $OUT). Steps (STEPS):
# build test san bench. Exit status 1 when a step failed.
out=${1:-$OUT}
steps=${STEPS:-"build test san bench"}
mkdir -p "$out"
has() { [[ " $steps " == *" $1 "* ]]; }
rc=0
if has build; then
    make -j16 CUDA=1 lib build/tests/test_kernels_api_cuda build/tests/test_tbe_pack build/tests/test_kernels_api \
        bench/kernels-api-bench >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
fi
if has test; then
    for t in test_kernels_api_cuda test_tbe_pack test_kernels_api; do
        FLAME_REQUIRE_GPU=1 timeout 240 "./build/tests/$t" >"$out/$t.log" 2>&1
        r=$?
        echo "$t rc $r" | tee -a "$out/$t.log"
        [ $r -eq 0 ] || { tail -20 "$out/$t.log"; rc=1; }
    done
fi
if has san; then
    for tool in memcheck synccheck; do
        FLAME_REQUIRE_GPU=1 timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 \
            ./build/tests/test_kernels_api_cuda >"$out/san_$tool.log" 2>&1
        r=$?
        echo "$tool rc $r" | tee -a "$out/san_$tool.log"
        grep -E "ERROR SUMMARY|SYNCCHECK SUMMARY" "$out/san_$tool.log"
        [ $r -eq 0 ] || { tail -30 "$out/san_$tool.log"; rc=1; }
    done
fi
if has bench; then
    timeout 420 python3 bench/run_kernels_api_bench.py --out-dir "$out/bench" >"$out/bench.log" 2>&1 || rc=1
    cat "$out/bench.log"
fi
exit $rc
