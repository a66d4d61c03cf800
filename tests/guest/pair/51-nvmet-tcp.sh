#!/bin/sh
# shellcheck disable=SC2034 # variables read through eval in t()
# Two-guest NVMe-oF test, run on the INITIATOR guest by scripts/vm/pair.sh:
#   scripts/vm/pair.sh -- 'sh tests/guest/pair/51-nvmet-tcp.sh'
# The target guest (10.77.0.1) exports its nvme0 namespace (its own nvme0.img, the image pattern)
# as nqn.2026-11.io.ubdirect:test on TCP 4420. Here (10.77.0.2) the kernel's NVMe/TCP initiator
# connects over the QEMU socket link, reads the pattern, writes a marker sector that the host then
# finds in the TARGET's nvme0.img (UBD-TARGETCHECK), and disconnects. Prints TAP.
# Not in tests/guest/*.sh on purpose: the one-guest suite has no peer.

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
echo "1..8"

nvmet=/ubd/scripts/vm/nvmet.sh
le64() {
    dd if="$2" bs=8 count=1 skip=$(($1 / 8)) 2>/dev/null | od -A n -t x1 |
        awk '{ for (i = NF; i >= 1; i--) printf "%s", $i } END { print "" }'
}

t "peer NIC $UBD_NIC_PEER is $UBD_PEER_IF with 10.77.0.2" \
    '[ -n "$UBD_PEER_IF" ] && ip addr show "$UBD_PEER_IF" | grep -q "inet 10.77.0.2/24"'
remote=$($nvmet --connect 10.77.0.1 --wait 180 2>/tmp/nvmet-err)
rctrl=${remote#/dev/}
rctrl=${rctrl%n1}
t "kernel NVMe/TCP initiator connected to 10.77.0.1:4420: $remote" \
    '[ -b "$remote" ] && [ "$(cat /sys/class/nvme/$rctrl/transport)" = tcp ] && grep -q "traddr=10.77.0.1" /sys/class/nvme/$rctrl/address || { cat /tmp/nvmet-err; false; }'
t "the remote namespace is 64 MiB" '[ "$(cat /sys/block/${remote#/dev/}/size)" = 131072 ]'
t "read across guests: LBA 0 holds the target's image pattern" '[ "$(le64 0 "$remote")" = 0100000000000000 ]'
t "read across guests: byte 0x3a008 holds the pattern" '[ "$(le64 $((0x3a008)) "$remote")" = 010000000003a008 ]'
dd if=/dev/zero bs=512 count=1 2>/dev/null | tr '\000' '\245' >/tmp/sector
printf 'UBD-NVMET-PAIR-OK' | dd of=/tmp/sector conv=notrunc 2>/dev/null
t "write across guests (512 B at LBA 4096, O_DIRECT)" \
    'dd if=/tmp/sector of="$remote" bs=512 seek=4096 count=1 oflag=direct conv=notrunc 2>/tmp/nvmet-err || { cat /tmp/nvmet-err; false; }'
t "read back across guests (O_DIRECT)" \
    'dd if="$remote" bs=512 skip=4096 count=1 iflag=direct 2>/dev/null | cmp -s - /tmp/sector'
echo "UBD-TARGETCHECK nvmet_pair_write file-bytes nvme0.img:0x200000 5542442d4e564d45542d504149522d4f4ba5a5"
$nvmet --disconnect >/dev/null
i=0
while [ -e "/sys/class/nvme/$rctrl" ] && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
t "disconnected: $rctrl is gone" '[ ! -e "/sys/class/nvme/$rctrl" ]'
