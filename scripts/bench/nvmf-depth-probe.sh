#!/bin/bash
# NVMe/TCP depth diagnosis (guest half, loop mode): what the target's backing disk sees per engine.
# Run from the host:
#   scripts/vm/run.sh --smp 1 --tick oneshot --mem 2G --devices nvme0 --bin target/release/ubdirect \
#     --bin /usr/bin/ss --bin /usr/bin/strace -- 'bash scripts/bench/nvmf-depth-probe.sh'
# For each run: IOPS from the engine, and the backing disk's (/sys/block/nvme0n1/stat) reads
# completed, reads merged, sectors read: commands the target really issued, and their size.
set -u
T=127.0.0.1 NQN=nqn.2026-11.io.ubdirect:test SECS=${SECS:-3}
addr=$(echo "$UBD_NVME" | cut -d, -f1)
bk=$(ls "/sys/bus/pci/devices/$addr/nvme")n1
/ubd/scripts/vm/nvmet.sh $T --dev "/dev/$bk" >/dev/null || { echo "FAIL nvmet"; exit 1; }
st() { awk '{ print $1, $2, $3 }' "/sys/block/$1/stat"; }
delta() { # NAME BEFORE AFTER
    set -- "$1" $2 $3
    echo "# $1: backing reads $(($5 - $2)) merged $(($6 - $3)) sectors $(($7 - $4)) (avg $((($7 - $4) / ($5 - $2 + 1) / 8)) KiB)"
}
U="nvmf-tcp://$T:4420/$NQN/1"
for spec in "randread 1" "randread 32" "read 32" "randread 128"; do
    set -- $spec
    b=$(st "$bk")
    ubdirect perf "$U" -q "$2" -o 4096 -w "$1" -t "$SECS" 2>&1 | sed 's/^/R ubdirect /'
    delta "ubdirect $1 q$2" "$b" "$(st "$bk")"
done
# ss during a QD32 run
ubdirect perf "$U" -q 32 -o 4096 -w randread -t 4 >/dev/null 2>&1 &
sleep 2; ss -tin 2>&1 | grep -A1 ':4420' | sed 's/^/# ss /'; wait
echo "# strace -c -f of a QD32 randread run"
strace -c -f -o /tmp/st.txt ubdirect perf "$U" -q 32 -o 4096 -w randread -t 3 2>&1 | sed 's/^/R ubdirect-strace /'
head -n 14 /tmp/st.txt | sed 's/^/# st /'
# the kernel initiator, QD32, sequential (the bench's engine)
dev=$(/ubd/scripts/vm/nvmet.sh --connect $T --nqn $NQN --wait 60) || { echo "FAIL connect"; exit 1; }
fd=${dev#/dev/}
for q in 1 32; do
    b=$(st "$bk"); f=$(st "$fd")
    ubdirect pipeline --source "file:$dev" --sink null --block-size 4096 -q $q --seconds "$SECS" 2>&1 | tail -n 2 | sed "s/^/R kernel-uring-q$q /"
    delta "kernel q$q" "$b" "$(st "$bk")"
    set -- $f $(st "$fd"); echo "# kernel q$q: fabrics dev reads $(($4 - $1)) merged $(($5 - $2))"
done
/ubd/scripts/vm/nvmet.sh --disconnect --nqn $NQN >/dev/null
