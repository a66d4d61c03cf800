#!/usr/bin/env bash
# vcpu-diag.sh QEMU-PID QMP-SOCKET: what the host sees of a guest that stopped making progress,
# twice 5 s apart: QEMU's threads (state, CPU time) and every vCPU's RIP, flags and HLT state and
# each local APIC's timer, ISR, IRR and PPR (a vCPU that spins moves its RIP and uses CPU time;
# one halted keeps its RIP). Used by scripts/vm/run.sh (freeze watch) and scripts/soak.sh.
set -uo pipefail
qpid=${1:?vcpu-diag.sh QEMU-PID QMP-SOCKET}
qmp=${2:?vcpu-diag.sh QEMU-PID QMP-SOCKET}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for pass in 1 2; do
    for t in /proc/"$qpid"/task/*; do
        echo "pass $pass thread $(basename "$t") $(cat "$t/comm" 2>/dev/null): $(awk '{print "state " $3 ", utime " $14 ", stime " $15}' "$t/stat" 2>/dev/null)"
    done
    "$here/qmp-hmp.py" "$qmp" "info registers -a" "info lapic 0" "info lapic 1" 2>&1 |
        grep -iE 'CPU#|RIP=|HLT=|ISR|IRR|timer|LVTT|PPR' | head -60
    ((pass == 1)) && sleep 5
done
exit 0
