#!/usr/bin/env bash
# scripts/pipeline.sh: the first run. Streams an NVMe namespace through the unified buffer pool
# with ubdirect's userspace driver and, for comparison, through the kernel's nvme driver
# (io_uring, O_DIRECT), and prints both figures, their ratio and the verification.
#
#   scripts/pipeline.sh [--no-deps] [extra `ubdirect pipeline` options]
#
# - Installs what it needs first (scripts/deps.sh, as scripts/test.sh does; root) unless
#   --no-deps or UBD_NO_DEPS=1; builds `ubdirect` with `cargo build --release`.
# - On a machine where an NVMe controller is bound to vfio-pci (scripts/setup.sh), it runs the
#   direct path on it (--sink cuda when an NVIDIA GPU is there, else null; UBD_SINK overrides):
#   UBD_SECONDS (default 10) seconds for the figure, then UBD_VERIFY_BYTES (default 1G) verified.
#   The kernel path needs the controller on the kernel driver: not done here, to leave your
#   binding alone (`scripts/setup.sh reset`, then `ubdirect pipeline --source file:/dev/nvme0n1`).
# - Otherwise it boots the QEMU guest test bed (scripts/vm/run.sh) with one emulated NVMe
#   (64 MiB namespace) and the ivshmem "GPU BAR", and in that one boot measures
#     direct: ubdirect over vfio-pci (polled, zero copy)       --source nvme:<addr>
#     kernel: the kernel nvme driver, io_uring with O_DIRECT   --source file:/dev/nvme0n1
#   in 3 alternating rounds of UBD_SECONDS (default 3) seconds each (the median is shown, with the
#   range), then verifies one pass of the namespace through
#   each, and streams 32 MiB of it into the BAR (peer to peer), verified in the guest and, after
#   the guest exits, on the host against the BAR's backing file: a check of the path, not timed
#   (its line shows no rate).
# Exit status: 0 when everything ran and every check held.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "pipeline.sh: $*"; }
die() {
    echo "pipeline.sh: error: $*" >&2
    exit 1
}

deps=1
[[ ${UBD_NO_DEPS:-0} == 1 ]] && deps=0
if [[ ${1:-} == --no-deps ]]; then
    deps=0
    shift
fi
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
fi
if ((deps == 1)); then
    scripts/deps.sh || die "scripts/deps.sh failed: run it as root once (sudo scripts/deps.sh), then scripts/pipeline.sh --no-deps"
fi

say "building ubdirect (cargo build --release)"
cargo build --release -p ubdirect-cli --quiet
bin=target/release/ubdirect

vfio_nvme() {
    local d
    for d in /sys/bus/pci/devices/*; do
        [[ $(cat "$d/class" 2>/dev/null) == 0x010802 ]] || continue
        [[ $(basename "$(readlink "$d/driver" 2>/dev/null)" 2>/dev/null) == vfio-pci ]] || continue
        basename "$d"
        return 0
    done
    return 1
}

if [[ ${UBD_PIPELINE_GUEST:-0} != 1 ]] && nvme=$(vfio_nvme); then
    sink=${UBD_SINK:-}
    if [[ -z $sink ]]; then
        if nvidia-smi -L >/dev/null 2>&1; then sink=cuda; else sink=null; fi
    fi
    say "NVMe $nvme is bound to vfio-pci: running on this machine (sink $sink)"
    set -x
    "$bin" pipeline --source "nvme:$nvme" --sink "$sink" --seconds "${UBD_SECONDS:-10}" "$@"
    exec "$bin" pipeline --source "nvme:$nvme" --sink "$sink" --bytes "${UBD_VERIFY_BYTES:-1G}" --verify "$@"
fi

secs=${UBD_SECONDS:-3}
bar_mib=32 # the BAR run is a verification pass of this many MiB, not timed
say "no NVMe bound to vfio-pci here: running in the QEMU guest test bed (one boot, ${secs} s per path)"
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/ubd-pipeline.XXXXXX")
extra="$*"
# The guest (busybox sh) prints one `UBD-RESULT <path> <bytes_per_s> <verify>` line per path;
# everything else goes to the log.
guest_cmd='nv=${UBD_NVME%%,*}
opts="--block-size 1M -q 8 '"$extra"'"
# result PATH FILE: the last run'"'"'s bytes_per_s and verify outcome of a --json document.
result() {
    bps=$(grep "\"bytes_per_s\"" "$2" | tail -n 1 | sed "s/.*: *//; s/,.*//")
    v=none
    grep -q "\"ok\": true" "$2" && v=OK
    grep -q "\"ok\": false" "$2" && v=MISMATCH
    echo "UBD-RESULT $1 ${bps:-0} $v"
}
run() { # run NAME ARGS...: ubdirect pipeline --json into /tmp/NAME.json, the log gets the text
    n=$1
    shift
    echo "== ubdirect pipeline $*"
    ubdirect pipeline "$@" --json >/tmp/$n.json || { echo "UBD-FAILED $n"; cat /tmp/$n.json; return 1; }
    cat /tmp/$n.json
}
kdev() { # the kernel block device of the only NVMe of this boot, once it appears
    # (with multipath kernels sysfs names the controller path nvme0c0n1; /dev has nvme0n1).
    for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
        for b in /dev/nvme*n1; do [ -b "$b" ] && echo "$b" && return 0; done
        sleep 1
    done
    return 1
}
bind-vfio $UBD_IVSHMEM >/dev/null || exit 1
# Rounds alternate the paths, so that a change of load on the host hits both alike.
for r in 1 2 3; do
    bind-vfio $nv >/dev/null || exit 1
    run direct$r --source nvme:$nv --sink null $opts --seconds '"$secs"' && result direct /tmp/direct$r.json
    bind-kernel $nv >/dev/null
    dev=$(kdev) || { echo "UBD-FAILED kernel: no block device for $nv on the kernel nvme driver"; exit 1; }
    run kernel$r --source file:$dev --sink null $opts --seconds '"$secs"' && result kernel /tmp/kernel$r.json
done
echo "UBD-KERNEL-DEV $dev"
grep -q O_DIRECT /tmp/kernel1.json || echo "UBD-FAILED kernel: not O_DIRECT"
run kernel-verify --source file:$dev --sink null $opts --verify && result kernel-verify /tmp/kernel-verify.json
bind-vfio $nv >/dev/null || exit 1
run direct-verify --source nvme:$nv --sink null $opts --verify && result direct-verify /tmp/direct-verify.json
run bar --source nvme:$nv --sink bar:$UBD_IVSHMEM/2 --block-size 1M -q 4 --blocks 8 --bytes '"$bar_mib"'M --verify \
    --hostcheck pipeline-nvme0-bar,nvme0.img,gpubar && result bar /tmp/bar.json
true'
say "booting the guest; its log goes to $run_dir/pipeline.log"
set +e
scripts/vm/run.sh --devices "nvme0 ivshmem" --timeout 900 --run-dir "$run_dir" --bin "$bin" -- "$guest_cmd" \
    >"$run_dir/pipeline.log" 2>&1
rc=$?
set -e
hc=1
if grep -q UBD-HOSTCHECK "$run_dir/pipeline.log"; then
    scripts/vm/hostcheck.sh "$run_dir" "$run_dir/pipeline.log" >"$run_dir/hostcheck.out" 2>&1 && hc=0
fi

# field PATH N: field N of the path's (last) UBD-RESULT line ("" when missing).
field() { awk -v p="$1" -v n="$2" '$1 == "UBD-RESULT" && $2 == p { v = $n } END { print v }' "$run_dir/pipeline.log" | tr -d '\r'; }
# median PATH: the median bytes/s of the path's rounds ("" when none ran).
median() {
    awk -v p="$1" '$1 == "UBD-RESULT" && $2 == p { print $3 }' "$run_dir/pipeline.log" | tr -d '\r' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}
# spread PATH: "lowest-highest GB/s" of the path's rounds.
spread() {
    awk -v p="$1" '$1 == "UBD-RESULT" && $2 == p { b = $3 / 1e9; if (!n++ || b < lo) lo = b; if (b > hi) hi = b }
        END { if (n) printf "%d runs: %.2f-%.2f", n, lo, hi }' "$run_dir/pipeline.log"
}
gbs() { awk -v b="$1" 'BEGIN { if (b == "") print "-"; else printf "%.2f GB/s", b / 1e9 }'; }
d=$(median direct) k=$(median kernel)
dv=$(field direct-verify 4) kv=$(field kernel-verify 4) bv=$(field bar 4)
kdev=$(awk '$1 == "UBD-KERNEL-DEV" { print $2 }' "$run_dir/pipeline.log" | tr -d '\r')
echo
echo "NVMe -> memory, 1 MiB blocks, queue depth 8, one boot of the QEMU guest; median of 3 alternating ${secs} s runs"
echo "(QEMU TCG: guest code runs emulated, which slows the kernel path's per-I/O work far more than"
echo " on hardware; real-machine figures: BENCHMARKS.md)"
printf '  %-55s %12s  (%s)  verify %s\n' "direct: ubdirect, vfio-pci, polled, zero copy" "$(gbs "$d")" "$(spread direct)" "${dv:-not run}"
printf '  %-55s %12s  (%s)  verify %s\n' "kernel: nvme driver, io_uring O_DIRECT (${kdev:-?})" "$(gbs "$k")" "$(spread kernel)" "${kv:-not run}"
ratio=$(awk -v d="$d" -v k="$k" 'BEGIN { if (d > 0 && k > 0) printf "%.2fx", d / k; else print "-" }')
echo "  direct / kernel: $ratio"
printf '  %-55s %12s  (one pass, not timed)  verify %s, host check %s\n' "NVMe -> GPU-BAR stand-in (peer to peer, zero copy)" \
    "${bar_mib} MiB" "${bv:-not run}" "$([[ $hc == 0 ]] && echo OK || echo FAILED)"
if ((rc == 0 && hc == 0)) && [[ $dv == OK && $kv == OK && $bv == OK && $ratio != - ]] &&
    ! grep -q UBD-FAILED "$run_dir/pipeline.log"; then
    say "OK (log: $run_dir/pipeline.log)"
else
    grep -h "UBD-FAILED\|error" "$run_dir/pipeline.log" "$run_dir/hostcheck.out" 2>/dev/null | head -n 5 | sed 's/^/  /'
    say "FAILED (guest exit $rc); logs and backing files in $run_dir"
    exit 1
fi
