#!/bin/sh
# The library builds and passes its C suites without its optional modules: a copy of the
# checkout's files is built with WITH_REDIS=0 WITH_NUMA=0 (and CUDA=0, to keep it short) in a
# folder of its own, its link line must name neither hiredis nor libnuma, the export list must
# be the full one (the stand-ins keep every entry point), and every C suite it builds runs
# (test_optional_modules checks the stand-ins there).
#   tests/check-optional-modules.sh
set -e
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then # the checkout's files, untracked ones too
    git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C "$dir"
else # an unpacked source tarball: everything but build outputs
    tar -cf - --exclude=./build --exclude='./build-*' --exclude=./.venv --exclude='./lib/libflame*' . | tar -xf - -C "$dir"
fi
make -C "$dir" -j2 CUDA=0 WITH_REDIS=0 WITH_NUMA=0 lib >"$dir/build.log" 2>&1 ||
    { tail -30 "$dir/build.log"; echo "optional modules: FAILED, make lib without them"; exit 1; }
if grep -E -- '-lhiredis|-lnuma' "$dir/build.log" >/dev/null; then
    grep -E -- '-lhiredis|-lnuma' "$dir/build.log" | head -3
    echo "optional modules: FAILED, the library still links hiredis or libnuma"; exit 1
fi
if readelf -d "$dir/lib/libflame.so" | grep -E 'libhiredis|libnuma'; then
    echo "optional modules: FAILED, libflame.so still needs hiredis or libnuma"; exit 1
fi
exports() { nm -D --defined-only "$1" | awk '{print $NF}' | grep '^flame_' | sort; }
exports "$dir/lib/libflame.so" >"$dir/exports"
if [ -f lib/libflame.so ]; then # the checkout's own build: the same entry points
    exports lib/libflame.so >"$dir/exports.full"
    if ! cmp -s "$dir/exports.full" "$dir/exports"; then
        diff "$dir/exports.full" "$dir/exports" | head; echo "optional modules: FAILED, the export lists differ"; exit 1
    fi
fi
# every C suite but libnuma's own (the Makefile's TESTS for WITH_NUMA=0)
tests=$(cd "$dir" && ls tests/test_*.c | grep -v '^tests/test_numa\.c$' | sed 's|^tests/\(.*\)\.c$|build/tests/\1|')
make -C "$dir" -j2 CUDA=0 WITH_REDIS=0 WITH_NUMA=0 $tests >>"$dir/build.log" 2>&1 ||
    { tail -30 "$dir/build.log"; echo "optional modules: FAILED, make the tests without them"; exit 1; }
(cd "$dir" && FLAME_C_ONLY=1 ./tests/run-tests.sh $tests) >"$dir/run.log" 2>&1 ||
    { grep -E 'FAILED|ERROR' "$dir/run.log" | head -20; echo "optional modules: FAILED, a C suite"; exit 1; }
echo "optional modules: OK (WITH_REDIS=0 WITH_NUMA=0: $(tail -1 "$dir/run.log"))"
