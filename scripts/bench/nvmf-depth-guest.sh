#!/bin/bash
# NVMe/TCP depth, guest half (loop mode: nvmet and initiator in one guest): NVMe/TCP commands per
# second as the target's backing disk sees them, per engine and depth, in one boot.
#   scripts/vm/run.sh --smp 1 --tick oneshot --mem 2G --devices nvme0 --bin target/release/ubdirect \
#       -- 'bash scripts/bench/nvmf-depth-guest.sh'
# Lines: "K <round> <engine> q<QD> iops <what the engine reports> cmds/s <backing disk reads/s>
# KiB/cmd <backing disk KiB per read>". Engines: ubdirect-wait (perf nvmf-tcp://, random 4 KiB,
# poll(2) when idle), ubdirect-spin (UBD_NVMF_SPIN=1), kernel-merge (io_uring O_DIRECT 4 KiB
# sequential on /dev/nvmeXnY, the bench's engine), kernel-nomerge (the same with merges off on
# the path device nvmeXcYnZ: one 4 KiB command per read).
set -u
T=127.0.0.1 NQN=nqn.2026-11.io.ubdirect:test SECS=${SECS:-3} ROUNDS=${ROUNDS:-2}
addr=$(echo "$UBD_NVME" | cut -d, -f1)
bk=$(ls "/sys/bus/pci/devices/$addr/nvme")n1
/ubd/scripts/vm/nvmet.sh $T --dev "/dev/$bk" >/dev/null || { echo "FAIL nvmet"; exit 1; }
mkdir -p /etc/nvme && echo nqn.2014-08.org.nvmexpress:uuid:7562642d-7463-7064-6570-746800000001 >/etc/nvme/hostnqn
st() { awk '{ print $1, $3 }' "/sys/block/$bk/stat"; }
line() { # ROUND ENGINE QD IOPS BEFORE(reads sectors) AFTER
    set -- "$1" "$2" "$3" "$4" $5 $6
    echo "K $1 $2 q$3 iops ${4%.*} cmds/s $((($7 - $5) / SECS)) KiB/cmd $((($8 - $6) / 2 / ($7 - $5 + 1)))"
}
U="nvmf-tcp://$T:4420/$NQN/1"
for ((r = 1; r <= ROUNDS; r++)); do
    for q in 1 32 128; do
        for e in wait spin; do
            b=$(st)
            UBD_NVMF_SPIN=$([[ $e == spin ]] && echo 1 || echo 0) ubdirect perf "$U" -q $q -o 4096 -w randread -t "$SECS" --json >/tmp/u.json 2>/dev/null
            line $r ubdirect-$e $q "$(awk -F'[:,]' '/"iops"/ { print $2 }' /tmp/u.json)" "$b" "$(st)"
        done
    done
    dev=$(/ubd/scripts/vm/nvmet.sh --connect $T --nqn $NQN --wait 60) || { echo "FAIL connect"; exit 1; }
    fd=${dev#/dev/}
    # The multipath head /dev/nvmeXnY is bio-based; requests (and merges) live on its path
    # device nvmeXcZnY.
    path=$(ls /sys/block | grep -E "^${fd%n*}c[0-9]+n${fd##*n}$" | head -1)
    for m in merge nomerge; do
        [[ -n $path ]] && echo $([[ $m == nomerge ]] && echo 2 || echo 0) >"/sys/block/$path/queue/nomerges"
        for q in 1 32 128; do
            b=$(st) f=$(awk '{ print $1, $2, $3 }' "/sys/block/$fd/stat")
            ubdirect pipeline --source "file:$dev" --io direct --sink null --block-size 4096 -q $q --seconds "$SECS" --json >/tmp/p.json 2>/dev/null
            line $r kernel-$m $q "$(awk -F'[:,]' '/"iops"/ { print $2; exit }' /tmp/p.json)" "$b" "$(st)"
            set -- $f $(awk '{ print $1, $2, $3 }' "/sys/block/$fd/stat")
            echo "# initiator $fd: reads $(($4 - $1)) merged $(($5 - $2)) KiB/read $((($6 - $3) / 2 / ($4 - $1 + 1)))"
        done
    done
    echo "# path device: ${path:-none}"
    /ubd/scripts/vm/nvmet.sh --disconnect --nqn $NQN >/dev/null
done
