#!/bin/sh
# The Python distribution as users install it, built offline with PYTHON's pip (no build
# isolation, no index): `pip install ./python` gives the distribution libflame with the import
# package flame, which finds the C library through FLAME_LIBRARY or an installed copy where the
# dynamic loader looks, and says what to do when there is none; `make wheel` gives a wheel
# whose flame finds the copy inside it with nothing set, and FLAME_LIBRARY still overrides it.
#   tests/check-python-package.sh [PYTHON]      (default: the checkout's .venv)
set -e
PY=${1:-.venv/bin/python}
case $PY in /*) ;; */*) PY=$PWD/$PY ;; esac
repo=$PWD
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
version=$(sed -n 's/^#define FLAME_VERSION_STRING "\(.*\)"/\1/p' include/flame/flame.h)
fail() { echo "python package: FAILED, $*"; exit 1; }
# every check runs from an empty folder with only the installed copy on the path
# (LD_LIBRARY_PATH is kept: on some machines it is how libflame's own dependencies are found)
py_in() { site=$1; shift; (cd "$t/empty" && env -u FLAME_LIBRARY PYTHONPATH="$site" "$@"); }
mkdir -p "$t/empty"

cp -r python "$t/src" && rm -rf "$t/src/build" "$t/src"/*.egg-info
"$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target "$t/site" "$t/src" >"$t/pip.log" 2>&1 ||
    { cat "$t/pip.log"; fail "pip install ./python"; }
[ "$(sed -n 's/^Name: //p' "$t/site/libflame-$version.dist-info/METADATA")" = libflame ] ||
    fail "no libflame-$version.dist-info in: $(ls "$t/site")"
[ -f "$t/site/flame/__init__.py" ] || fail "the import package flame is missing"

# no library anywhere (unless this machine has one installed system-wide)
out=$(py_in "$t/site" "$PY" -c '
import ctypes.util, flame
from flame import _lib
if ctypes.util.find_library("flame"):
    print("system", _lib.candidates())
else:
    try:
        flame.library_version()
        print("loaded")
    except flame.LibraryNotFoundError as e:
        print("none", e)')
case "$out" in
    "none "*"set FLAME_LIBRARY"*) ;;
    system*) echo "python package: note: a system libflame is installed, the no-library check is skipped ($out)" ;;
    *) fail "with no library: $out" ;;
esac

# FLAME_LIBRARY
out=$(py_in "$t/site" env FLAME_LIBRARY="$repo/lib/libflame.so" "$PY" -c 'import flame; from flame import _lib; print(flame.library_version(), _lib.lib()._name)')
[ "$out" = "$version $repo/lib/libflame.so" ] || fail "FLAME_LIBRARY: $out"

# an installed copy the dynamic loader finds (LD_LIBRARY_PATH here; ldconfig's cache after make install)
make -s install DESTDIR="$t/stage" PREFIX=/usr/local >/dev/null
out=$(py_in "$t/site" env LD_LIBRARY_PATH="$t/stage/usr/local/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$PY" -c 'import flame; from flame import _lib; print(flame.library_version(), _lib.lib()._name)')
[ "$out" = "$version libflame.so.0" ] || fail "installed copy: $out"

# the wheel with the library inside
make -s wheel WHEEL_PY="$PY" >"$t/wheel.log" 2>&1 || { cat "$t/wheel.log"; fail "make wheel"; }
whl=$(ls build/wheel/libflame-"$version"-py3-none-linux_*.whl) || fail "make wheel made: $(ls build/wheel)"
"$PY" -m pip install -q --no-deps --no-index --target "$t/wsite" "$whl" >"$t/pip.log" 2>&1 || { cat "$t/pip.log"; fail "pip install $whl"; }
out=$(py_in "$t/wsite" "$PY" -c '
import flame, numpy as np
from flame import _lib
cfg = {"format": "flame", "version": 1, "d_model": 8, "max_len": 4, "tables": [{"name": "item", "rows": 16, "dim": 8}],
       "features": [{"name": "item", "table": "item", "input": "item"}],
       "blocks": {"count": 1, "num_heads": 2, "ffn_dim": 16, "norm": "pre", "activation": "relu"},
       "final_layernorm": True, "head": {"type": "dot", "table": "item"}}
with flame.Model.random(cfg, seed=1) as m, flame.Engine(m) as e:
    s = e.score(np.array([3, 4]), np.array([5, 6]))
assert s.shape[0] == 2 and np.isfinite(s).all() and s[0, 0] != s[1, 0], s
print(flame.library_version(), _lib.lib()._name)')
[ "$out" = "$version $t/wsite/flame/libflame.so.0" ] || fail "bundled copy: $out"
out=$(py_in "$t/wsite" env FLAME_LIBRARY=/nonexistent/libflame.so "$PY" -c '
import flame
try:
    flame.library_version(); print("loaded")
except flame.LibraryNotFoundError as e:
    print(e)')
case "$out" in *"/nonexistent/libflame.so"*) ;; *) fail "FLAME_LIBRARY does not override the bundled copy: $out" ;; esac
echo "python package: OK (libflame $version: pip install ./python finds the library through FLAME_LIBRARY and an installed copy; make wheel's finds its own)"
