#!/bin/sh
# Guest test (TAP): ubdirect as an ordinary user after `TARGET_USER=<user> scripts/setup.sh`:
# identify, perf --verify (write, then read back), pipeline NVMe -> ivshmem BAR with
# --verify, all as that user; with a memlock limit too low the error names the limit and the fix.
# The bytes perf writes (nvme1 namespace 2, 56..64 MiB) are saved first and written back at the
# end, so the image pattern later tests check stays intact.

cd /ubd || exit 1
OUT=/tmp/nonroot.out
ERR=/tmp/nonroot.err
DUMP_OUT_LINES=20
DUMP_ERR_LINES=20
export UBD_STATE_DIR=/tmp/ubd-setup-nonroot
rm -rf "$UBD_STATE_DIR"
# shellcheck source=tests/guest/lib/tap.sh
. tests/guest/lib/tap.sh

USER_NAME=ubdnr
grep -q "^$USER_NAME:" /etc/passwd || echo "$USER_NAME:x:1235:1235:ubd non-root:/tmp:/bin/sh" >>/etc/passwd
grep -q "^$USER_NAME:" /etc/group || echo "$USER_NAME:x:1235:" >>/etc/group
UBD=$(command -v ubdirect)

# as_user MEMLOCK_KIB CMD...: run CMD as the user with that memlock limit (root sets the limit,
# su keeps it); status in rc.
as_user() {
    lim=$1
    shift
    # shellcheck disable=SC2016 # expanded by the inner shell
    sh -c 'ulimit -l "$1" && shift && exec su -s /bin/sh "$0" -c "$*"' "$USER_NAME" "$lim" "$@" >"$OUT" 2>"$ERR"
    rc=$?
}

# ns_of_nsid CTRL_DIR NSID: the block device name of namespace NSID (by its nsid attribute: the
# names follow the asynchronous scan order, so after a rebind nsid 2 can be nvmeXn1).
ns_of_nsid() {
    for nsd in "$1"/nvme*n*; do
        [ "$(cat "$nsd/nsid" 2>/dev/null)" = "$2" ] && echo "${nsd##*/}" | sed 's/c[0-9]*n/n/' && return 0
    done
}

bind-kernel $UBD_TEST_DEVICES >/dev/null 2>&1
ctrl=$(ls -d /sys/bus/pci/devices/"$NVME1"/nvme/nvme* 2>/dev/null | head -n1)
ns2=$(ns_of_nsid "$ctrl" 2)
saved=no
if [ -b "/dev/$ns2" ] && dd if="/dev/$ns2" of=/tmp/nonroot-save bs=1M skip=56 count=8 2>/dev/null; then
    saved=yes
fi
check "the bytes perf will write are saved (/dev/$ns2, 56..64 MiB)" [ "$saved" = yes ]

TARGET_USER=$USER_NAME HUGEMEM=64 PCI_ALLOWED="$NVME0 $NVME1 $IVSHMEM" sh scripts/setup.sh config >"$OUT" 2>"$ERR"
rc=$?
check "TARGET_USER=$USER_NAME setup.sh config binds the devices and hands their groups over" \
    eval '[ "$rc" = 0 ] && [ "$(stat -c %U /dev/vfio/$(grp "$NVME0"))" = $USER_NAME ] && [ "$(stat -c %U /dev/vfio/$(grp "$IVSHMEM"))" = $USER_NAME ]'

as_user unlimited id -u
check "the commands below run as uid 1235" eval '[ "$rc" = 0 ] && [ "$(cat $OUT)" = 1235 ]'

as_user unlimited "$UBD" identify "$NVME0"
check "identify as $USER_NAME" eval '[ "$rc" = 0 ] && out_has "QEMU NVMe"'

as_user unlimited "$UBD" perf -w write --verify -q 8 -t 1 --ns 2 --offset-mib 56 --span-mib 8 "$NVME1"
check "perf --verify -w write as $USER_NAME (stamps written, no I/O error)" \
    eval '[ "$rc" = 0 ] && out_has "^Total *: *[1-9]" && ! out_has "I/O errors"'
as_user unlimited "$UBD" perf -w read --verify -q 8 -t 1 --ns 2 --offset-mib 56 --span-mib 8 "$NVME1"
check "perf --verify -w read as $USER_NAME checks the stamps just written" \
    eval '[ "$rc" = 0 ] && out_has "verify: [1-9][0-9]* blocks checked, 0 errors"'

as_user unlimited "$UBD" pipeline --source "nvme:$NVME0" --sink "bar:$IVSHMEM/2" --block-size 1M --qd 4 --blocks 4 --bytes 8M --verify
check "pipeline nvme -> BAR --verify as $USER_NAME" eval '[ "$rc" = 0 ] && out_has "verify.*OK"'

# 64 KiB of memlock: far below the pool the pipeline pins.
as_user 64 "$UBD" pipeline --source "nvme:$NVME0" --sink "bar:$IVSHMEM/2" --block-size 1M --qd 4 --blocks 4 --bytes 8M --verify
check "with memlock 64 KiB the error names the limit and the fix" \
    eval '[ "$rc" = 1 ] && err_has "RLIMIT_MEMLOCK is 65536 bytes" && err_has "ulimit -l unlimited"'
as_user 64 "$UBD" perf -w read -q 8 -t 1 "$NVME0"
check "perf with memlock 64 KiB: the same message" \
    eval '[ "$rc" != 0 ] && err_has "RLIMIT_MEMLOCK is 65536 bytes" && err_has "ulimit -l unlimited"'

UBD_STATE_DIR=$UBD_STATE_DIR sh scripts/setup.sh reset >/dev/null 2>&1
ctrl=$(ls -d /sys/bus/pci/devices/"$NVME1"/nvme/nvme* 2>/dev/null | head -n1)
ns2=$(ns_of_nsid "$ctrl" 2)
if [ "$saved" = yes ] && [ -b "/dev/$ns2" ]; then
    dd if=/tmp/nonroot-save of="/dev/$ns2" bs=1M seek=56 count=8 conv=fsync 2>/dev/null
    dd if="/dev/$ns2" of=/tmp/nonroot-back bs=1M skip=56 count=8 iflag=direct 2>/dev/null ||
        dd if="/dev/$ns2" of=/tmp/nonroot-back bs=1M skip=56 count=8 2>/dev/null
    check "the namespace bytes perf wrote are restored" cmp -s /tmp/nonroot-save /tmp/nonroot-back
else
    not_ok "the namespace bytes perf wrote could not be restored (not saved)"
fi
rm -f /tmp/nonroot-save /tmp/nonroot-back
check "the devices are back on their kernel drivers" eval '[ "$(drv "$NVME0")" = nvme ] && [ "$(drv "$NVME1")" = nvme ]'

echo "1..$n"
[ "$failed" = 0 ]
