#!/bin/sh
# make install / uninstall into a staging DESTDIR; consumers build from the installed files alone,
# as users' builds would: a C program with pkg-config, a C++ program with pkg-config (the header
# as C++17 and C++20), both through CMake's find_package(flame CONFIG REQUIRED), whose version
# file accepts 0.2 (this version) and refuses 1.0.
set -e
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
make -s install DESTDIR="$stage" PREFIX=/opt/flame >/dev/null
prefix="$stage/opt/flame"
lib="$prefix/lib"
for f in include/flame/flame.h include/flame/scheduler.h include/flame/features.h include/flame/memory.h include/flame/metrics.h lib/libflame.so lib/libflame.so.0 lib/libflame.a lib/pkgconfig/flame.pc \
         lib/cmake/flame/flameConfig.cmake lib/cmake/flame/flameConfigVersion.cmake; do
    [ -e "$prefix/$f" ] || { echo "install: FAILED, $f missing"; exit 1; }
done
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
flags=$(PKG_CONFIG_SYSROOT_DIR="$stage" PKG_CONFIG_PATH="$lib/pkgconfig" pkg-config --cflags --libs flame)
${CC:-cc} -std=c11 -Wall -Wextra -Werror -pedantic -o "$stage/consumer" tests/consumer.c $flags
"$stage/consumer"
for std in c++17 c++20; do
    ${CXX:-c++} -std=$std -Wall -Wextra -Werror -pedantic -o "$stage/consumer-$std" tests/consumer.cpp $flags
    "$stage/consumer-$std"
done

command -v cmake >/dev/null || { echo "install: FAILED, cmake not found (scripts/install-deps --tests installs it)"; exit 1; }
cmake_build() { # DIR VERSION: configure and build tests/cmake-consumer asking for VERSION
    cmake -S tests/cmake-consumer -B "$1" -DCMAKE_PREFIX_PATH="$prefix" -DFLAME_REQUEST_VERSION="$2" \
        -DCMAKE_BUILD_TYPE=Release >"$1.log" 2>&1 && cmake --build "$1" >>"$1.log" 2>&1
}
cmake_build "$stage/cmake" 0.2 || { cat "$stage/cmake.log"; echo "install: FAILED, CMake consumer"; exit 1; }
grep -q "found libflame $(sed -n 's/^Version: //p' "$lib/pkgconfig/flame.pc") in $lib/cmake/flame" "$stage/cmake.log" ||
    { cat "$stage/cmake.log"; echo "install: FAILED, CMake found another libflame"; exit 1; }
"$stage/cmake/consumer"
"$stage/cmake/consumer_cxx"
if cmake_build "$stage/cmake-v1" 1.0; then echo "install: FAILED, find_package(flame 1.0) accepted 0.x"; exit 1; fi
grep -q "requested version \"1.0\"" "$stage/cmake-v1.log" ||
    { cat "$stage/cmake-v1.log"; echo "install: FAILED, find_package(flame 1.0) failed for another reason"; exit 1; }

make -s uninstall DESTDIR="$stage" PREFIX=/opt/flame
left=$(find "$stage/opt" \( -type f -o -type l \) | head -5)
[ -z "$left" ] || { echo "uninstall: FAILED, left behind: $left"; exit 1; }
echo "install: OK (C and C++17/20 consumers built with pkg-config and with CMake find_package, and ran; uninstall removed everything)"
