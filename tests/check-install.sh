#!/bin/sh
# make install / uninstall into a staging DESTDIR; a consumer builds with pkg-config alone.
set -e
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
make -s install DESTDIR="$stage" PREFIX=/opt/flame >/dev/null
lib="$stage/opt/flame/lib"
for f in include/flame/flame.h lib/libflame.so lib/libflame.so.0 lib/libflame.a lib/pkgconfig/flame.pc; do
    [ -e "$stage/opt/flame/$f" ] || { echo "install: FAILED, $f missing"; exit 1; }
done
flags=$(PKG_CONFIG_SYSROOT_DIR="$stage" PKG_CONFIG_PATH="$lib/pkgconfig" pkg-config --cflags --libs flame)
${CC:-cc} -std=c11 -o "$stage/consumer" tests/consumer.c $flags
LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$stage/consumer"
make -s uninstall DESTDIR="$stage" PREFIX=/opt/flame
left=$(find "$stage/opt" \( -type f -o -type l \) | head -5)
[ -z "$left" ] || { echo "uninstall: FAILED, left behind: $left"; exit 1; }
echo "install: OK (pkg-config consumer built and ran; uninstall removed everything)"
