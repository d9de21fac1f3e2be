#!/bin/sh
# The no-trailing-padding rule (top of include/flame/flame.h, docs/abi.md) over every struct
# the public headers declare, including ones added after tests/test_struct_layout.c's list:
# the compiler's -Wpadded reports each struct whose size is rounded up past its last field
# (GCC: "padding struct size to alignment boundary", clang: "padding size of ... to alignment
# boundary"). Holes inside a struct are allowed (an appended field never lands there).
# Usage: tests/check-struct-padding.sh [include-dir]
inc=${1:-include}
cc=${CC:-cc}
# every struct the headers define, used once so that every compiler lays it out (clang warns
# only about structs whose layout it computes)
names=$(sed -n 's/^typedef struct \([a-z_0-9]*\) {.*/\1/p' "$inc"/flame/*.h)
[ -n "$names" ] || { echo "struct padding: FAILED, no struct definitions found under $inc/flame"; exit 1; }
src=$(printf '#include "flame/flame.h"\n'; for t in $names; do printf 'extern char used_%s[sizeof(struct %s)];\n' "$t" "$t"; done)
out=$(printf '%s\n' "$src" | "$cc" -std=c99 -Wpadded -I"$inc" -x c -fsyntax-only - 2>&1) ||
    { echo "$out"; echo "struct padding: FAILED, the public headers do not compile with $cc"; exit 1; }
bad=$(printf '%s\n' "$out" | grep -E 'padding struct size to alignment boundary|padding size of .* to alignment boundary')
if [ -n "$bad" ]; then
    printf '%s\n' "$bad"
    echo "struct padding: FAILED, a public struct ends in padding: name it reserved0 (docs/abi.md, \"Appending a field\")"
    exit 1
fi
n=$(printf '%s\n' "$names" | wc -l)
echo "struct padding: OK, none of the $n public structs ends in padding ($cc -Wpadded)"
