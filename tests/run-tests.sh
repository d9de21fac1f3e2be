#!/bin/sh
# Runs every test suite: the cmocka binaries given as arguments, the export check and pytest.
# Exits non-zero if any suite failed; prints one closing line with the counts of suites.
passed=0; failed=0
run() {
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $*"; fi
}
for t in "$@"; do run "$t"; done
run ./tests/check-exports.sh lib/libflame.so
run ./tests/check-install.sh
PYTHONDONTWRITEBYTECODE=1 run ${PYTHON:-python3} -m pytest -q -rs tests/python
echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
