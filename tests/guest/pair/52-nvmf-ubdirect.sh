#!/bin/sh
# shellcheck disable=SC2034 # variables read through eval in t()
# Two-guest NVMe/TCP test of ubdirect's own initiator, run on the INITIATOR guest:
#   scripts/vm/pair.sh --bin target/debug/ubdirect -- 'sh tests/guest/pair/52-nvmf-ubdirect.sh'
# The target guest (10.77.0.1) exports its nvme0 namespace as nqn.2026-11.io.ubdirect:test on
# TCP 4420. Here (10.77.0.2): discover, identify, perf --verify write then read across the QEMU
# socket link (the host then finds the first stamp in the TARGET's nvme0.img: UBD-TARGETCHECK),
# and the refusals. Prints TAP.

n=0
t() {
    n=$((n + 1))
    if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; fi
}
echo "1..6"
# The target guest boots at the same time as this one: wait (at most 180 s) until its port
# answers, as 51-nvmet-tcp.sh does through nvmet.sh --wait (a fresh-clone CI run asked at 6 s
# of uptime, before the target listened, and discover/identify failed while perf, later, passed).
end=$(($(cut -d. -f1 /proc/uptime) + 180))
until timeout 3 bash -c "exec 3<>/dev/tcp/10.77.0.1/4420" 2>/dev/null; do
    if [ "$(cut -d. -f1 /proc/uptime)" -ge "$end" ]; then
        echo "# the target 10.77.0.1:4420 did not answer within 180 s"
        break
    fi
    sleep 1
done
A=nvmf-tcp://10.77.0.1:4420/nqn.2026-11.io.ubdirect:test/1
t "discover 10.77.0.1:4420 lists the subsystem" \
    'ubdirect discover 10.77.0.1:4420 >/tmp/d.out 2>/dev/null && grep -q "nvme .*10.77.0.1 .*nqn.2026-11.io.ubdirect:test" /tmp/d.out || { cat /tmp/d.out; false; }'
t "identify across guests: a 64 MiB namespace of 512-byte blocks" \
    'ubdirect identify $A >/tmp/i.out 2>/dev/null && grep -q "size    : 67108864 bytes" /tmp/i.out || { cat /tmp/i.out; false; }'
# Past the image pattern the host checks elsewhere: 32..48 MiB.
t "perf -w write --verify across guests (stamps 16 MiB)" \
    'ubdirect perf $A -w write -q 16 -o 64K -t 2 --verify --offset 32M --span 16M >/tmp/w.out 2>&1 || { cat /tmp/w.out; false; }'
t "perf -w read --verify finds the stamps, no mismatch" \
    'ubdirect perf $A -w read -q 16 -o 64K -t 2 --verify --offset 32M --span 16M >/tmp/r.out 2>&1 && grep -q ", 0 mismatches" /tmp/r.out && ! grep -q "verified 0 blocks" /tmp/r.out || { cat /tmp/r.out; false; }'
# The host finds the first stamp (LBA 32 MiB / 512 = 0x10000, then "ubd-nvmf") in the TARGET's image.
echo "UBD-TARGETCHECK nvmf-ubdirect-stamp file-bytes nvme0.img:$((32 << 20)) 0000010000000000666d766e2d646275"
t "a wrong NQN is refused by name" \
    '! ubdirect identify nvmf-tcp://10.77.0.1:4420/nqn.2026-11.io.ubdirect:nope 2>/tmp/e.out && grep -q "Connect Invalid Parameters" /tmp/e.out'
t "nothing on port 4999: refused" \
    '! ubdirect discover 10.77.0.1:4999 2>/tmp/e2.out && grep -q "refused the connection" /tmp/e2.out'
