#!/bin/sh
# Guest test (TAP): the Python package against the emulated NVMe. The interpreter, its standard
# library, the ubdirect wheel's contents, pytest and python/tests come from
# scripts/vm/python-files.sh (suite.sh stages them under /ubd/py and /ubd/python when this script
# runs). nvme0 is bound to vfio-pci and python/tests runs with the guest tests enabled
# (`-m guest`, UBD_GUEST_NVME=nvme0): one TAP line per pytest result. A missing interpreter is a
# failure, never a skip. nvme0 goes back to the kernel driver afterwards, so the plan's
# namespace guard checks what the tests wrote.

cd /ubd || exit 1
OUT=/tmp/py-test.out
ERR=/tmp/py-test.err
DUMP_OUT_LINES=40
DUMP_ERR_LINES=40
# shellcheck source=tests/guest/lib/tap.sh
. tests/guest/lib/tap.sh

PY=/ubd/py/bin/python3
export LD_LIBRARY_PATH=/ubd/py/libs PYTHONPATH=/ubd/py/lib/python3.11/site-packages PYTHONDONTWRITEBYTECODE=1

: >"$ERR"
if [ ! -x "$PY" ]; then
    echo "# $PY is not in the guest image: scripts/vm/suite.sh stages it (scripts/vm/python-files.sh) when the filter selects this script" >"$OUT"
    not_ok "python3 in the guest"
    echo "1..$n"
    exit 1
fi
if "$PY" -c 'import sys, ubdirect, pytest; print(sys.version.split()[0], ubdirect.__file__)' >"$OUT" 2>"$ERR"; then
    ok "python3 $(cut -d' ' -f1 "$OUT") imports ubdirect and pytest"
else
    not_ok "python3 imports ubdirect and pytest"
    echo "1..$n"
    exit 1
fi

bind-vfio "$NVME0" >"$OUT" 2>"$ERR"
check "nvme0 ($NVME0) on vfio-pci" [ "$(drv "$NVME0")" = vfio-pci ]

# One TAP line per pytest result ("<nodeid> PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS ..." in -v);
# the failures' tracebacks follow as TAP comments.
t0=$(cut -d' ' -f1 /proc/uptime)
UBD_GUEST_NVME=$NVME0 "$PY" -m pytest -v -m guest --tb=short -p no:cacheprovider --basetemp=/tmp/pytest-guest \
    python/tests >"$OUT" 2>&1
rc=$?
t1=$(cut -d' ' -f1 /proc/uptime)
results=/tmp/py-test.tap
awk -v start="$n" '
    $1 ~ /::/ && $2 ~ /^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)$/ {
        n++
        name = $1; sub(/^python\/tests\//, "", name)
        if ($2 == "PASSED" || $2 == "XFAIL") print "ok " start + n " - pytest " name
        else if ($2 == "SKIPPED") print "ok " start + n " - pytest " name " # SKIP " substr($0, index($0, "SKIPPED") + 8)
        else print "not ok " start + n " - pytest " name " (" $2 ")"
    }' "$OUT" >"$results"
cat "$results"
ran=$(grep -c '^ok \|^not ok ' "$results")
bad=$(grep -c '^not ok ' "$results")
n=$((n + ran))
failed=$((failed + bad))
: >"$ERR"
if [ "$rc" != 0 ] && [ "$bad" = 0 ]; then
    not_ok "pytest exited with status $rc without a failed test (collection error, or no guest test ran)"
elif [ "$bad" != 0 ]; then
    awk '/^=+ (ERRORS|FAILURES) =+$/ { p = 1 } p' "$OUT" | head -n 80 | sed 's/^/#   /'
fi
echo "# pytest: $ran results in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')s, status $rc"

bind-kernel "$NVME0" >/dev/null 2>&1
echo "1..$n"
[ "$failed" = 0 ]
