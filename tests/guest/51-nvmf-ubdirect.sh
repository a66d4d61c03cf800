#!/bin/sh
# shellcheck disable=SC2034 # variables read through eval in t()
# Guest test: ubdirect's own NVMe/TCP initiator against the kernel's nvmet over
# loopback in one guest. nvmet.sh exports nvme0's namespace (kernel nvme driver, backed by the
# host's nvme0.img) as nqn.2026-11.io.ubdirect:test on 127.0.0.1:4420; `ubdirect discover`,
# `identify nvmf-tcp://...`, `perf -w write --verify` then `-w read --verify` (with and without
# digests), a write of a marker the host then finds in nvme0.img, and the refusals (wrong NQN,
# no listener). POSIX sh (busybox). Prints TAP.

n=0
t() {
    n=$((n + 1))
    if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; fi
}
echo "1..9"
nvmet=/ubd/scripts/vm/nvmet.sh
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
A=nvmf-tcp://127.0.0.1:4420/nqn.2026-11.io.ubdirect:test/1
modprobe crc32c_generic 2>/dev/null # nvmet's digests (a module on Debian's kernel)
$nvmet 127.0.0.1 --dev "/dev/${ctrl}n1" >/tmp/nvmet.out 2>&1 || cat /tmp/nvmet.out
t "discover lists nqn.2026-11.io.ubdirect:test" \
    'ubdirect discover 127.0.0.1:4420 >/tmp/d.out 2>/dev/null && grep -q "nvme .*127.0.0.1 .*nqn.2026-11.io.ubdirect:test" /tmp/d.out || { cat /tmp/d.out; false; }'
t "identify: nvme0's 64 MiB namespace over NVMe/TCP" \
    'ubdirect identify $A >/tmp/i.out 2>/dev/null && grep -q "size    : 67108864 bytes" /tmp/i.out || { cat /tmp/i.out; false; }'
t "perf -w write --verify (stamps 40..56 MiB)" \
    'ubdirect perf $A -w write -q 32 -o 64K -t 2 --verify --offset 40M --span 16M >/tmp/w.out 2>&1 || { cat /tmp/w.out; false; }'
t "perf -w read --verify: stamps found, none wrong" \
    'ubdirect perf $A -w read -q 32 -o 64K -t 2 --verify --offset 40M --span 16M >/tmp/r.out 2>&1 && grep -q ", 0 mismatches" /tmp/r.out && ! grep -q "verified 0 blocks" /tmp/r.out || { cat /tmp/r.out; false; }'
t "perf -w read with header and data digests (QD 1)" \
    'UBD_NVMF_DIGESTS=1 ubdirect perf $A -w read -q 1 -o 64K -t 1 --verify --offset 40M --span 16M --json >/tmp/g.out 2>&1 && grep -q "\"data_digest\": true" /tmp/g.out && grep -q "\"verify_errors\": 0" /tmp/g.out || { cat /tmp/g.out; false; }'
# The host finds the stamp of LBA 40 MiB / 512 at that offset of nvme0.img.
lba=$((40 * 2048))
stamp=$(printf '%016x' $lba | sed 's/../& /g' | awk '{ for (i = NF; i >= 1; i--) printf "%s", $i }')
echo "UBD-HOSTCHECK nvmf-perf-stamp file-bytes nvme0.img:$((40 << 20)) ${stamp}666d766e2d646275"
t "wrong NQN refused by name" \
    '! ubdirect identify nvmf-tcp://127.0.0.1:4420/nqn.2026-11.io.ubdirect:nope 2>/tmp/e.out && grep -q "Connect Invalid Parameters" /tmp/e.out'
t "no listener on 4999: refused" \
    '! ubdirect discover 127.0.0.1:4999 2>/tmp/e2.out && grep -q "refused the connection" /tmp/e2.out'
# Remote namespace -> ivshmem BAR (the pool carved from the BAR; C2HData lands in it), checked
# against a QD1 re-read and by the host against nvme0.img.
IVSHMEM=$(echo "$UBD_IVSHMEM" | cut -d, -f1)
bind-vfio "$IVSHMEM" >/dev/null 2>&1
t "pipeline nvmf-tcp -> ivshmem BAR, verified, host check printed" \
    'ubdirect pipeline --source $A --sink bar:$IVSHMEM/2 --block-size 1M --qd 4 --blocks 4 --bytes 8M --verify --hostcheck nvmf-tcp-bar,nvme0.img,gpubar >/tmp/p.out 2>&1 && grep -q "verify.*OK" /tmp/p.out && grep UBD-HOSTCHECK /tmp/p.out || { cat /tmp/p.out; false; }'
$nvmet --remove >/dev/null 2>&1
t "target torn down" '[ -z "$(ls /sys/kernel/config/nvmet/ports 2>/dev/null)" ]'
