#!/bin/sh
# Runs every test suite: the cmocka binaries given as arguments, the export check and pytest.
# Exits non-zero if any suite failed; prints one closing line with the counts of suites.
passed=0; failed=0
run() {
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $*"; fi
}
# pytest runs in $PYTHON, by default the checkout's virtual environment (make venv) where there
# is one, else python3.
if [ -z "$PYTHON" ]; then PYTHON=python3; [ -x .venv/bin/python ] && PYTHON=$PWD/.venv/bin/python; fi
# The Redis tests read FLAME_TEST_REDIS_PORT; without one (CI starts its own), a private server
# is started for this run. The tests fail loudly when neither exists.
if [ -z "$FLAME_TEST_REDIS_PORT" ] && command -v redis-server >/dev/null; then
    redis_dir=$(mktemp -d /tmp/flame-redis-XXXXXX)
    FLAME_TEST_REDIS_PORT=$(./tests/redis-server.sh start "$redis_dir") && export FLAME_TEST_REDIS_PORT
    trap './tests/redis-server.sh stop "$redis_dir"' EXIT
fi
for t in "$@"; do run "$t"; done
# the engine and kernels again as on a CPU its OpenBLAS does not recognise (own kernels, src/cpu/blas_check.c)
for t in "$@"; do case "$t" in */test_engine | */test_kernels) OPENBLAS_CORETYPE=Prescott run "$t" ;; esac; done
if [ -z "$FLAME_C_ONLY" ]; then # FLAME_C_ONLY=1: the cmocka suites only (make test-sanitize)
    run ./tests/check-exports.sh lib/libflame.so
    run "$PYTHON" tests/check_header_docs.py include/flame/*.h
    run ./tests/check-abi.sh "$(readlink -f lib/libflame.so)"
    run ./tests/check-struct-padding.sh include
    run ./tests/check-kernel-resources.sh build/cuda/attention_wgmma.ptxas
    run ./tests/check-install.sh
    run ./tests/check-optional-modules.sh
    run ./tests/check-python-package.sh "$PYTHON"
    PYTHONDONTWRITEBYTECODE=1 run "$PYTHON" -m pytest -q -rs tests/python
fi
echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
