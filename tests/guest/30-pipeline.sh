#!/bin/sh
# Guest test (TAP): `ubdirect pipeline` end to end on the guest's real devices. The kernel path
# (io_uring, O_DIRECT on /dev/nvme0n1; buffered on a tmpfs file; the classic copy mode), then
# NVMe bound to vfio-pci streaming into the ivshmem BAR (peer to peer; the host compares the
# BAR's backing file with nvme0.img) and into null, and the errors for bad input: usage errors
# exit 2, run-time errors exit 1, each with a message naming the cause.

cd /ubd || exit 1
OUT=/tmp/pl-test.out
ERR=/tmp/pl-test.err
DUMP_OUT_LINES=30
DUMP_ERR_LINES=30
# shellcheck source=tests/guest/lib/tap.sh
. tests/guest/lib/tap.sh

# pl WANT_RC ARGS...: run the pipeline, keep stdout/stderr, compare the exit status.
pl() {
    want=$1
    shift
    ubdirect pipeline "$@" >"$OUT" 2>"$ERR"
    rc=$?
    [ "$rc" = "$want" ] || { echo "# exit $rc, wanted $want: ubdirect pipeline $*"; return 1; }
}

# ---- kernel path (devices still on their kernel drivers) ----
if [ -b /dev/nvme0n1 ]; then
    if pl 0 --source file:/dev/nvme0n1 --sink null --block-size 256K --qd 8 --bytes 8M --verify &&
        out_has "O_DIRECT" && out_has "verify.*OK"; then
        ok "kernel nvme via io_uring O_DIRECT -> null, verified"
    else not_ok "kernel nvme via io_uring O_DIRECT -> null, verified"; fi
else
    ok "kernel nvme via io_uring O_DIRECT # SKIP no /dev/nvme0n1"
fi
dd if=/dev/urandom of=/tmp/pl-src.bin bs=1M count=3 2>/dev/null
dd if=/dev/urandom bs=1000 count=1 2>/dev/null >>/tmp/pl-src.bin
if pl 0 --source file:/tmp/pl-src.bin --sink null --block-size 1M --qd 4 --verify &&
    out_has "buffered" && out_has "verify.*OK" && out_has "0.003 GB"; then
    ok "tmpfs file (3 MiB + 1000 B) via buffered io_uring -> null, verified"
else not_ok "tmpfs file (3 MiB + 1000 B) via buffered io_uring -> null, verified"; fi
if pl 0 --source file:/tmp/pl-src.bin --sink null --block-size 1M --mode copy --verify && out_has "classic copy" && out_has "verify.*OK"; then
    ok "classic copy mode, verified"
else not_ok "classic copy mode, verified"; fi

# ---- usage errors: exit 2 ----
if pl 2 --source disk:/x && err_has "nvme:<pci-addr>"; then ok "unknown source kind: usage error"; else not_ok "unknown source kind: usage error"; fi
if pl 2 --source file:/tmp/pl-src.bin --block-size 4X && err_has "bad size"; then ok "bad size: usage error"; else not_ok "bad size: usage error"; fi
if pl 2 --source file:/tmp/pl-src.bin --sink bar:$IVSHMEM/9 && err_has "0..5"; then ok "bad BAR number: usage error"; else not_ok "bad BAR number: usage error"; fi
if pl 2 --source file:/tmp/pl-src.bin --bytes 1M --seconds 1; then ok "--bytes with --seconds: usage error"; else not_ok "--bytes with --seconds: usage error"; fi

# ---- run-time errors: exit 1 with the cause ----
if pl 1 --source file:/nonexistent && err_has "cannot open /nonexistent"; then ok "missing file"; else not_ok "missing file"; fi
if pl 1 --source file:/tmp/pl-src.bin --sink cuda && err_has "libcuda.so not found"; then ok "no CUDA driver: clear error"; else not_ok "no CUDA driver: clear error"; fi
if pl 1 --source file:/tmp/pl-src.bin --verify --seconds 1 && err_has "needs --bytes"; then ok "verify with --seconds refused"; else not_ok "verify with --seconds refused"; fi
if pl 1 --source file:/tmp/pl-src.bin --block-size 1000 --io direct && err_has "O_DIRECT\|block"; then
    ok "direct I/O on tmpfs or unaligned block refused"
else not_ok "direct I/O on tmpfs or unaligned block refused"; fi
if pl 1 --source nvme:$NVME0 --sink null && err_has "not vfio-pci" && err_has "PCI_ALLOWED=$NVME0 scripts/setup.sh" &&
    ! err_has "setup bind"; then
    ok "nvme not bound to vfio-pci: the error names scripts/setup.sh with PCI_ALLOWED"
else not_ok "nvme not bound to vfio-pci: the error names scripts/setup.sh with PCI_ALLOWED"; fi

# ---- vfio: NVMe -> BAR (zero copy) and -> null ----
bind-vfio "$NVME0" "$IVSHMEM" >/dev/null 2>&1
if pl 0 --source "nvme:$NVME0" --sink "bar:$IVSHMEM/2" --block-size 1M --qd 4 --blocks 4 --bytes 8M --verify \
    --hostcheck pipeline-sh-nvme0-bar,nvme0.img,gpubar && out_has "verify.*OK" && out_has "UBD-HOSTCHECK"; then
    ok "nvme (vfio) -> ivshmem BAR, verified"
    grep UBD-HOSTCHECK "$OUT"
else not_ok "nvme (vfio) -> ivshmem BAR, verified"; fi
if pl 0 --source "nvme:$NVME0" --sink null --block-size 512K --qd 8 --bytes 16M --segments --json && out_has '"bytes_per_s"' &&
    out_has '"schema": "ubdirect/1"' && out_has '"queue_depth": 8' && out_has "segment: source"; then
    ok "nvme (vfio) -> null, segments, JSON"
else not_ok "nvme (vfio) -> null, segments, JSON"; fi
if pl 1 --source "nvme:$NVME0" --mode copy && err_has "needs a file"; then ok "copy mode needs a file source"; else not_ok "copy mode needs a file source"; fi
if pl 1 --source "nvme:$NVME0" --ns 9 --sink null && err_has "namespace 9 is not active" && err_has "ids are 1:" ; then
    ok "missing namespace: the error lists the active namespace ids"
else not_ok "missing namespace: the error lists the active namespace ids"; fi
if pl 1 --source "nvme:$NVME0/9" --sink null && err_has "namespace 9 is not active"; then ok "old nvme:addr/N spelling still works"; else not_ok "old nvme:addr/N spelling still works"; fi
if pl 1 --source "nvme:$NVME0/1" --ns 2 --sink null && err_has "differ"; then ok "--ns and addr/N must agree"; else not_ok "--ns and addr/N must agree"; fi

rm -f /tmp/pl-src.bin "$OUT" "$ERR"
echo "1..$n"
[ "$failed" = 0 ]
