#!/bin/sh
# The source tarball (make dist) is the committed tree and builds like a checkout: it holds every
# tracked file under libflame-VERSION/, and in an empty folder, with no git and no network,
# `make` builds the library and the examples, and the main job runs. The build is the CPU one
# (CUDA=0) to keep it short: the CUDA sources' presence is checked by the file list, their
# build by every checkout's.
#   tests/check-dist.sh build/libflame-VERSION.tar.gz
set -e
tarball=${1:?tarball}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
top=$(tar -tzf "$tarball" | head -1 | cut -d/ -f1)
tar -tzf "$tarball" | sed -n "s|^$top/||p" | grep -v '/$' | grep -v '^$' | sort >"$dir/in-tarball"
git ls-files | sort >"$dir/tracked"
if ! cmp -s "$dir/tracked" "$dir/in-tarball"; then
    diff "$dir/tracked" "$dir/in-tarball" | head -20
    echo "dist: FAILED, the tarball's files are not the tracked ones"; exit 1
fi
tar -C "$dir" -xzf "$tarball"
make -C "$dir/$top" -j2 CUDA=0 >"$dir/build.log" 2>&1 || { tail -30 "$dir/build.log"; echo "dist: FAILED, make in $top"; exit 1; }
"$dir/$top/examples/flame-score" --requests 64 >"$dir/run.log" 2>&1 || { cat "$dir/run.log"; echo "dist: FAILED, the main job"; exit 1; }
echo "dist: OK ($top: $(wc -l <"$dir/tracked") files; make built it and the main job ran)"
