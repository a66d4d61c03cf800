# shellcheck shell=sh
# Shared helpers of the guest shell tests (POSIX sh, busybox; sourced, never run: ubd-plan runs
# only tests/guest/*.sh). The caller sets OUT and ERR (the files a failing test shows) and may
# cap what is shown with DUMP_OUT_LINES / DUMP_ERR_LINES; the counters are n and failed.

# shellcheck disable=SC2034 # the device addresses are read by the scripts that source this
NVME0=${UBD_NVME%%,*}
NVME1=${UBD_NVME#*,}
NIC0=${UBD_NICS%%,*}
NIC1=${UBD_NICS#*,}
IVSHMEM=$UBD_IVSHMEM

n=0
failed=0
# ok NAME / not_ok NAME: one TAP line; a failure also shows the command's output.
ok() {
    n=$((n + 1))
    echo "ok $n - $1"
}
not_ok() {
    n=$((n + 1))
    failed=$((failed + 1))
    echo "not ok $n - $1"
    [ -s "$OUT" ] && head -n "${DUMP_OUT_LINES:-1000000}" "$OUT" | sed 's/^/#   out: /'
    [ -s "$ERR" ] && head -n "${DUMP_ERR_LINES:-1000000}" "$ERR" | sed 's/^/#   err: /'
}
# check NAME CMD...: one TAP line from a command's status.
check() {
    name=$1
    shift
    if "$@"; then ok "$name"; else not_ok "$name"; fi
}

# drv ADDR / grp ADDR: the device's driver / IOMMU group ("" when none).
drv() {
    l=$(readlink "/sys/bus/pci/devices/$1/driver" 2>/dev/null)
    echo "${l##*/}"
}
grp() {
    l=$(readlink "/sys/bus/pci/devices/$1/iommu_group" 2>/dev/null)
    echo "${l##*/}"
}
# out_has / err_has PATTERN: grep the last command's stdout / stderr.
out_has() { grep -q -- "$1" "$OUT"; }
err_has() { grep -q -- "$1" "$ERR"; }
