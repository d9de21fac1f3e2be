#!/bin/sh
# The ABI check: the built library against the ABI of the release it belongs to
# (abi/libflame-MAJOR.MINOR.abi, written by `make abi-dump` when that release was made),
# compared by abidiff (Debian's abigail-tools) over the public headers' types only.
# Usage: tests/check-abi.sh lib/libflame.so.X.Y.Z
lib=${1:?library}
version=$(sed -n 's/^#define FLAME_VERSION_STRING "\(.*\)"/\1/p' include/flame/flame.h)
base=abi/libflame-${version%.*}.abi
[ -f "$base" ] || { echo "abi: FAILED, no baseline $base for version $version (make abi-dump writes it)"; exit 1; }
if ! command -v abidiff >/dev/null 2>&1; then
    # a GPU machine without the package runs the rest; make test's machines always have it
    [ -n "$FLAME_REQUIRE_GPU" ] && { echo "abi: skipped, abidiff is not installed here (abigail-tools)"; exit 0; }
    echo "abi: FAILED, abidiff not found: install abigail-tools (make deps-test does)"; exit 1
fi
# New functions pass (--no-added-syms); any other difference fails, appended struct fields
# too: the struct_size rule keeps them compatible, but libabigail 2.2 cannot tell an appended
# field from a moved one, so an append is confirmed by hand and recorded with make abi-dump
# in the same change (CHANGELOG.md says what was appended).
out=$(abidiff --no-added-syms --no-show-locs "$base" "$lib" 2>&1); rc=$?
if [ $rc -ne 0 ]; then
    echo "$out"; echo "abi: FAILED (abidiff exit $rc): $lib differs from the ABI of $base"; exit 1
fi
echo "abi: OK, $lib has the ABI of $base (functions added since: $(abidiff --no-show-locs "$base" "$lib" | grep -c "^  \[A\]"))"
