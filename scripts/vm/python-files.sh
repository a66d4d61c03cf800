#!/usr/bin/env bash
# Stage the Python package's guest tests for run.sh --files: the host's python3.11 (Debian's
# /usr/bin/python3.11 and /usr/lib/python3.11, trimmed), the libraries it and its extension
# modules need, the built ubdirect wheel's contents, pytest with its pure-Python dependencies
# (pluggy, iniconfig, packaging, pygments without most lexers), and python/tests. The guest sees it all under /ubd/py
# (interpreter /ubd/py/bin/python3, libraries in /ubd/py/libs) and the tests in
# /ubd/python/tests; tests/guest/60-python.sh runs them.
#
#   scripts/vm/python-files.sh OUT_DIR
#
# The wheel is built as scripts/python-check.sh builds it (pip wheel ./python, dev profile) in the
# virtual environment target/pyenv (made here, with pytest, when missing). numpy is left out (73 MB
# with its OpenBLAS): the guest tests use bytes, bytearray and memoryview. Prints the staged size.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

out=${1:?usage: python-files.sh OUT_DIR}
py=/usr/bin/python3.11
stdlib=/usr/lib/python3.11
[[ -x $py && -d $stdlib ]] || vm_die "python-files: $py and $stdlib are needed (apt-get install python3.11)"
cd "$UBD_REPO"
target=${CARGO_TARGET_DIR:-$UBD_REPO/target}
venv=$target/pyenv wheels=$target/wheels

# ---- the wheel, and pytest, in target/pyenv ----
if [[ ! -x $venv/bin/python ]]; then
    python3 -m venv "$venv" || vm_die "python-files: python3 -m venv failed: install python3-venv"
fi
if ! "$venv/bin/python" -c 'import pytest' 2>/dev/null; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check pytest || vm_die "python-files: pip install pytest failed"
fi
rm -f "$wheels"/ubdirect-*.whl
MATURIN_PEP517_ARGS="--profile ${UBD_PY_PROFILE:-dev}" "$venv/bin/python" -m pip wheel -q --disable-pip-version-check \
    --no-deps ./python -w "$wheels" || vm_die "python-files: pip wheel ./python failed"
whl=$(ls "$wheels"/ubdirect-*.whl 2>/dev/null | head -1)
[[ -n $whl ]] || vm_die "python-files: pip wheel ./python left no wheel in $wheels"

# ---- the interpreter and the standard library ----
rm -rf "$out"
mkdir -p "$out/py/bin" "$out/py/libs" "$out/py/lib" "$out/python"
cp -L "$py" "$out/py/bin/python3"
# Left out: what the tests never import (GUI, test suites, build and packaging tools, docs).
cp -a "$stdlib/." "$out/py/lib/python3.11/"
(
    cd "$out/py/lib/python3.11"
    rm -rf test idlelib tkinter turtledemo ensurepip lib2to3 distutils pydoc_data config-3.11-* \
        site-packages dist-packages venv sqlite3 curses dbm turtle.py lib-dynload
    find . -depth -type d -name tests -exec rm -rf {} +
    find . -name '*.opt-[12].pyc' -delete
)
# Extension modules without test, terminal, database, TLS or CJK-codec ones (and their libraries).
mkdir -p "$out/py/lib/python3.11/lib-dynload"
for so in "$stdlib"/lib-dynload/*.so; do
    case ${so##*/} in
    _test* | _ctypes_test* | xx* | _xx* | _curses* | readline* | _dbm* | _sqlite3* | nis* | ossaudiodev* | \
        audioop* | _tkinter* | _crypt* | _codecs_* | _ssl* | _hashlib*) continue ;;
    esac
    cp "$so" "$out/py/lib/python3.11/lib-dynload/"
done
# Libraries: everything the interpreter and the staged .so files link, beside them in py/libs
# (the guest script sets LD_LIBRARY_PATH); the dynamic loader stays the guest's own.
for f in "$py" "$out"/py/lib/python3.11/lib-dynload/*.so; do
    ldd "$f" 2>/dev/null | grep -o '/[^ ]*' | grep -v '/ld-linux' || true
done | sort -u | while read -r lib; do cp -L "$lib" "$out/py/libs/"; done

# ---- site-packages: the wheel's package, pytest and its dependencies ----
site=$out/py/lib/python3.11/site-packages
mkdir -p "$site"
"$venv/bin/python" -m zipfile -e "$whl" "$site/"
rm -rf "$site"/ubdirect-*.dist-info
venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for p in pytest _pytest pluggy iniconfig packaging pygments py.py; do
    [[ -e $venv_site/$p ]] || vm_die "python-files: $p is not in $venv_site (pip install pytest)"
    cp -a "$venv_site/$p" "$site/"
done
# Their metadata: pytest and pluggy look their versions up.
for d in pytest pluggy iniconfig packaging pygments; do cp -a "$venv_site/$d"-*.dist-info "$site/"; done
find "$site" -name __pycache__ -prune -exec rm -rf {} +
# pytest's terminal writer imports pygments' Python and diff lexers: the other 8 MB of lexers stay out.
find "$site/pygments/lexers" -name '*.py' ! -name __init__.py ! -name _mapping.py ! -name python.py ! -name diff.py -delete
# Byte-compiled once here, so the guest (TCG) imports without compiling.
"$py" -m compileall -q -j 0 "$site" >/dev/null

cp -a python/tests "$out/python/"
find "$out/python" -name __pycache__ -prune -exec rm -rf {} +
vm_log "python files for the guest: $out ($(du -sh "$out" | cut -f1), wheel $(basename "$whl"))"
