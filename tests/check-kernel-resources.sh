#!/bin/sh
# Checks ptxas's report (-Xptxas -v, kept by the build as build/cuda/<name>.ptxas) of a kernel
# file whose speed depends on it: no kernel spills registers to local memory, and ptxas did
# not serialise any warpgroup MMA (its "wgmma.mma_async instructions are serialized" remarks,
# whatever the cause: C7515, an instruction writing an accumulator while a product is in
# flight; C7518, accumulators read in a divergent path while one is; and any other code that
# says so), which makes every wgmma of the function wait for the one before. Either compiles
# and runs correctly, only slower, so nothing else would notice.
# Usage: tests/check-kernel-resources.sh REPORT...   (no report: a CPU-only build, skipped)
status=0
checked=0
for report in "$@"; do
    if [ ! -f "$report" ]; then
        echo "kernel resources: $report absent (a build without nvcc): skipped"
        continue
    fi
    demangle() { if command -v c++filt >/dev/null; then c++filt; else cat; fi; }
    serialised=$(grep -i 'instructions are serialized' "$report" |
        sed -n "s/.*(\(C[0-9]*\)).*in the function '\([^']*\)'.*/\2 \1/p" | demangle)
    if [ -n "$serialised" ]; then
        echo "FAIL $report: ptxas serialised the wgmma of (function, remark):"
        echo "$serialised" | sed 's/^/  /'
        status=1
    fi
    # each entry's "Compiling entry function 'NAME'" is followed by its spill line
    spills=$(awk "/Compiling entry function/ { match(\$0, /'[^']*'/); name = substr(\$0, RSTART + 1, RLENGTH - 2) }
                  /bytes spill stores/ { n++; if (\$5 != 0 || \$9 != 0) print name \" (\" \$5 \" bytes stored, \" \$9 \" loaded)\" }
                  END { print n > \"/dev/stderr\" }" "$report" 2>"${TMPDIR:-/tmp}/kr.$$")
    entries=$(cat "${TMPDIR:-/tmp}/kr.$$"); rm -f "${TMPDIR:-/tmp}/kr.$$"
    if [ -n "$spills" ]; then
        echo "FAIL $report: kernels spill registers:"
        echo "$spills" | demangle | sed 's/^/  /'
        status=1
    fi
    if [ "${entries:-0}" -eq 0 ]; then
        echo "FAIL $report: no kernel entries in the report (was it built with -Xptxas -v?)"
        status=1
    fi
    checked=$((checked + ${entries:-0}))
done
[ "$status" -eq 0 ] && [ "$checked" -gt 0 ] && echo "kernel resources: $checked kernels, no spills, no serialised wgmma"
exit "$status"
