#!/bin/sh
# shellcheck disable=SC2034 # variables read through eval in t()
# Guest test: the NVMe-oF test bed in one guest. scripts/vm/nvmet.sh exports nvme0's
# namespace (on the kernel nvme driver, backed by the host's nvme0.img) as
# nqn.2026-11.io.ubdirect:test on TCP 127.0.0.1:4420; the kernel's NVMe/TCP initiator connects
# over loopback, reads the image pattern, writes a marker the host then finds in nvme0.img; the
# port is removed under a connected controller (the target gone mid-flight: I/O fails within
# the controller-loss timeout instead of hanging); everything is torn down.
# POSIX sh (busybox). Prints TAP. Runs on the Debian kernel (modules) and on the ubd kernel.

n=0
ok() {
    n=$((n + 1))
    echo "ok $n - $*"
}
not_ok() {
    n=$((n + 1))
    echo "not ok $n - $*"
}
t() {
    if eval "$2"; then ok "$1"; else not_ok "$1"; fi
}
echo "1..14"

nvmet=/ubd/scripts/vm/nvmet.sh
nqn=nqn.2026-11.io.ubdirect:test
cfg=/sys/kernel/config/nvmet
# nvme0 (the first test-bed controller) and its namespace's block device.
addr=$(echo "$UBD_NVME" | cut -d, -f1)
# Earlier tests of the suite (40-cli.sh) leave nvme0 on vfio-pci: the target needs it on the
# kernel nvme driver. Wait (bounded) for its namespace to appear.
bind-kernel "$addr" >/dev/null 2>&1
i=0
while [ $i -lt 100 ] && ! ls "/sys/bus/pci/devices/$addr/nvme"/nvme*/nvme*n1 >/dev/null 2>&1; do
    sleep 0.1
    i=$((i + 1))
done
ctrl=$(ls "/sys/bus/pci/devices/$addr/nvme" 2>/dev/null | head -n1)
local_ns=/dev/${ctrl}n1
# le64 OFFSET DEV: the little-endian u64 at byte OFFSET of DEV, as 16 hex digits.
le64() {
    dd if="$2" bs=8 count=1 skip=$(($1 / 8)) 2>/dev/null | od -A n -t x1 |
        awk '{ for (i = NF; i >= 1; i--) printf "%s", $i } END { print "" }'
}

t "nvme0 ($addr) is $local_ns on the kernel nvme driver" '[ -b "$local_ns" ]'
t "target up: $nqn on tcp 127.0.0.1:4420 backed by $local_ns" \
    '$nvmet 127.0.0.1 --dev "$local_ns" && [ -d "$cfg/subsystems/$nqn/namespaces/1" ] && [ -L "$cfg/ports/4420/subsystems/$nqn" ]'
t "a second target on the same NQN is refused by name" \
    '! $nvmet 127.0.0.1 --dev "$local_ns" 2>/tmp/nvmet-err && grep -q "exists already" /tmp/nvmet-err'

remote=$($nvmet --connect 127.0.0.1 --wait 20 --ctrl-loss-tmo 3 2>/tmp/nvmet-err)
rctrl=${remote#/dev/}
rctrl=${rctrl%n1}
t "kernel NVMe/TCP initiator connected: $remote" \
    '[ -b "$remote" ] && [ "$(cat /sys/class/nvme/$rctrl/transport)" = tcp ] && [ "$(cat /sys/class/nvme/$rctrl/subsysnqn)" = "$nqn" ] || { cat /tmp/nvmet-err; false; }'
t "the remote namespace has nvme0's size (64 MiB)" \
    '[ "$(cat /sys/block/${remote#/dev/}/size)" = 131072 ]'
# Pattern: the u64 at byte offset off of nvme0.img is (1 << 56) | off.
t "read over TCP: LBA 0 holds the image pattern" '[ "$(le64 0 "$remote")" = 0100000000000000 ]'
t "read over TCP: byte 0x3a008 (LBA 464 + 8) holds the image pattern" \
    '[ "$(le64 $((0x3a008)) "$remote")" = 010000000003a008 ]'

# Write over TCP, leaving nvme0.img as it was (later tests read its pattern): sector 2048 (1 MiB)
# is first overwritten with 0xa5 through the local namespace, then its pattern is written back
# through the fabric; the host checks the pattern is in nvme0.img (0xa5 there = the write was lost).
# pattern_sector LBA: the 512 bytes of nvme0.img's pattern at LBA (u64 at off = 1 << 56 | off).
pattern_sector() {
    off=$(($1 * 512))
    end=$((off + 512))
    while [ $off -lt $end ]; do
        printf "$(printf '\\%03o\\%03o\\%03o\\%03o\\%03o\\%03o\\%03o\\001' $((off & 255)) $((off >> 8 & 255)) \
            $((off >> 16 & 255)) $((off >> 24 & 255)) $((off >> 32 & 255)) $((off >> 40 & 255)) $((off >> 48 & 255)))"
        off=$((off + 8))
    done
}
pattern_sector 2048 >/tmp/sector
dd if=/dev/zero bs=512 count=1 2>/dev/null | tr '\000' '\245' >/tmp/a5
t "pattern of LBA 2048 generated (512 B, first word 0x0100000000100000)" \
    '[ "$(wc -c </tmp/sector)" = 512 ] && [ "$(le64 0 /tmp/sector)" = 0100000000100000 ] && [ "$(le64 504 /tmp/sector)" = 01000000001001f8 ]'
dd if=/tmp/a5 of="$local_ns" bs=512 seek=2048 count=1 oflag=direct conv=notrunc 2>/dev/null
t "write over TCP (512 B at LBA 2048, O_DIRECT)" \
    'dd if=/tmp/sector of="$remote" bs=512 seek=2048 count=1 oflag=direct conv=notrunc 2>/tmp/nvmet-err || { cat /tmp/nvmet-err; false; }'
t "the write is on the target's local namespace" \
    'dd if="$local_ns" bs=512 skip=2048 count=1 iflag=direct 2>/dev/null | cmp -s - /tmp/sector'
echo "UBD-HOSTCHECK nvmet_tcp_write file-bytes nvme0.img:0x100000 00001000000000010800100000000001"

# Target gone mid-flight: remove the port under the connected controller. With ctrl_loss_tmo=3
# the controller gives up and I/O fails (EIO) instead of waiting for a target that never returns.
$nvmet --remove-port >/dev/null
t0=$(cut -d. -f1 /proc/uptime)
timeout 60 dd if="$remote" of=/dev/null bs=4096 count=1 skip=4096 iflag=direct 2>/dev/null
rc=$?
t1=$(cut -d. -f1 /proc/uptime)
t "port removed mid-flight: a read fails (status $rc, not 124 = hung) after $((t1 - t0)) s" \
    '[ "$rc" != 0 ] && [ "$rc" != 124 ]'

$nvmet --disconnect >/dev/null
i=0
while [ -e "/sys/class/nvme/$rctrl" ] && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
t "the lost controller $rctrl is gone after --disconnect" '[ ! -e "/sys/class/nvme/$rctrl" ]'
t "target removed: no subsystem, no port" \
    '$nvmet --remove >/dev/null && [ -z "$(ls $cfg/subsystems)" ] && [ -z "$(ls $cfg/ports)" ]'
t "nvme0's local namespace still reads after the teardown" '[ "$(le64 0 "$local_ns")" = 0100000000000000 ]'
