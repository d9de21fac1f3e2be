#!/bin/sh
# The shared library exports only flame_* symbols (plus the version-script node itself).
lib=${1:-lib/libflame.so}
bad=$(nm -D --defined-only "$lib" | awk '{print $NF}' | grep -v -e '^flame_' -e '^LIBFLAME_[0-9]*$')
count=$(nm -D --defined-only "$lib" | awk '{print $NF}' | grep -c '^flame_')
if [ -n "$bad" ]; then
    echo "exports: FAILED, non-flame symbols exported from $lib:"; echo "$bad"; exit 1
fi
if [ "$count" -lt 20 ]; then echo "exports: FAILED, only $count flame_ symbols found in $lib"; exit 1; fi
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
if [ "$soname" != "libflame.so.0" ]; then echo "exports: FAILED, SONAME is '$soname'"; exit 1; fi
echo "exports: OK ($count flame_ symbols, SONAME $soname)"
