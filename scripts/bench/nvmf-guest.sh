#!/bin/bash
# The guest half of scripts/bench/nvmf.sh (runs on the initiator guest, in /ubd). Connects the
# kernel's NVMe/TCP initiator to TARGET (nvmf-tcp://TARGET:4420/nqn.2026-11.io.ubdirect:test/1)
# and reads the namespace. Engines (ROUNDS rounds, each engine at each depth in DEPTHS):
#   kernel-tcp-uring  io_uring O_DIRECT reads on /dev/nvmeXn1 through `ubdirect pipeline --source
#                     file:/dev/nvmeXn1 --sink null` (ubdirect's file source: io_uring, QD requests
#                     in flight, sequential, wrapping; `ubdirect perf --engine uring-iopoll` takes
#                     a PCI address only, and busybox has no fio): 4 KiB at each depth, 1 MiB at QD 4
#   kernel-tcp-dd     busybox dd, O_DIRECT, QD 1: 4 KiB reads and 1 MiB streaming reads
# One line per run:
#   R <round> <engine> <qd> <block> <ios> <seconds> <iops> <MiB/s> [<mean_us> <p99_us>]
# a failed run prints "FAIL <round> <engine> <qd> <block> <why>".
set -u
TARGET=${TARGET:-127.0.0.1}
NQN=${NQN:-nqn.2026-11.io.ubdirect:test}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-"1 32 128"}
IOS=${IOS:-2048}     # dd: 4 KiB reads per run
SECS=${SECS:-3}      # seconds per kernel-tcp-uring run
STREAM_MIB=${STREAM_MIB:-64}

now() { echo "${EPOCHREALTIME/./}"; } # microseconds
dev=$(/ubd/scripts/vm/nvmet.sh --connect "$TARGET" --nqn "$NQN" --wait 180) || { echo "FAIL 0 kernel-tcp 0 0 connect failed"; exit 1; }
# nomerge: merges off on the namespace's path device (nvmeXcZnY: the head /dev/nvmeXnY is
# bio-based, its requests are queued and merged there). With merges on, io_uring's 32 adjacent
# 4 KiB reads go out as one 128 KiB NVMe/TCP command (the kernel's "QD32 4 KiB IOPS" would
# count 4 KiB pieces of 128 KiB commands); ubdirect's perf sends one command per read. Off,
# every kernel read is one command too.
nomerge() {
    local fd=${dev#/dev/} p
    p=$(ls /sys/block | grep -E "^${fd%n*}c[0-9]+n${fd##*n}$" | head -1)
    [[ -n $p ]] && echo 2 >"/sys/block/$p/queue/nomerges" && return
    echo 2 >"/sys/block/$fd/queue/nomerges"
}
nomerge
# reads_kib: "<reads> <KiB read>" completed by the initiator's namespace so far.
reads_kib() { awk '{ print $1, int($3 / 2) }' "/sys/block/${dev#/dev/}/stat"; }
blocks4k=$(($(cat "/sys/block/${dev#/dev/}/size") / 8))
echo "# kernel NVMe/TCP initiator: $dev ($((blocks4k / 256)) MiB) from $TARGET, kernel $(uname -r), $(nproc) vCPU"

# run_dd ROUND: IOS sequential 4 KiB O_DIRECT reads by one dd (QD 1).
run_dd() {
    local r=$1 t0 t1
    t0=$(now)
    dd if="$dev" of=/dev/null bs=4096 count="$IOS" iflag=direct 2>/dev/null ||
        { echo "FAIL $r kernel-tcp-dd 1 4096 dd failed"; return; }
    t1=$(now)
    awk -v r="$r" -v n="$IOS" -v us=$((t1 - t0)) \
        'BEGIN { s = us / 1e6; printf "R %s kernel-tcp-dd 1 4096 %d %.3f %.0f %.1f %.1f\n", r, n, s, n / s, n * 4096 / s / 1048576, s * 1e6 / n }'
}

# run_uring ROUND QD BLOCK: ubdirect pipeline's io_uring file source on the fabrics namespace.
run_uring() {
    local r=$1 q=$2 b=$3
    command -v ubdirect >/dev/null || { echo "FAIL $r kernel-tcp-uring $q $b no ubdirect binary in the guest (BIN=...)"; return; }
    local j0 j1 s0
    j0=$(busy) s0=$(reads_kib)
    if ubdirect pipeline --source "file:$dev" --sink null --block-size "$b" -q "$q" --seconds "$SECS" --json >/tmp/p.json 2>/tmp/p.err; then
        j1=$(busy)
        cpu_line "$r" kernel-tcp-uring "$q" "$b" "$(awk '/"bytes_per_s":/ { gsub(/[",]/, ""); bps = $2 } /"seconds":/ { gsub(/[",]/, ""); s = $2 } END { printf "%.0f", bps * s }' /tmp/p.json)" $((j1 - j0))
        awk -v r="$r" -v q="$q" -v b="$b" '
            /"blocks":/ { gsub(/[",]/, ""); n = $2 }
            /"seconds":/ { gsub(/[",]/, ""); s = $2 }
            /"iops":/ { gsub(/[",]/, ""); iops = $2 }
            /"bytes_per_s":/ { gsub(/[",]/, ""); bps = $2 }
            /"mean":/ { gsub(/[",]/, ""); mean = $2 }
            /"p99":/ { gsub(/[",]/, ""); p99 = $2 }
            END { printf "R %s kernel-tcp-uring %s %s %d %.3f %.0f %.1f %.1f %.1f\n", r, q, b, n, s, iops, bps / 1048576, mean / 1e3, p99 / 1e3 }' /tmp/p.json
        # Commands the initiator sent: each read must be one command of the block size.
        set -- $s0 $(reads_kib)
        echo "# D $r kernel-tcp-uring $q $b commands $(($3 - $1)) KiB_per_command $((($4 - $2) / ($3 - $1 + (($3 == $1)))))"
        (($3 > $1 && ($4 - $2) / ($3 - $1) > b / 1024)) && echo "FAIL $r kernel-tcp-uring $q $b commands of $((($4 - $2) / ($3 - $1))) KiB: reads were merged"
    else
        echo "FAIL $r kernel-tcp-uring $q $b $(head -n1 /tmp/p.err)"
    fi
}

# run_stream ROUND: one O_DIRECT reader, 1 MiB reads, STREAM_MIB MiB.
run_stream() {
    local r=$1 t0 t1
    t0=$(now)
    dd if="$dev" of=/dev/null bs=1M count="$STREAM_MIB" iflag=direct 2>/dev/null ||
        { echo "FAIL $r kernel-tcp-dd 1 1048576 dd failed"; return; }
    t1=$(now)
    awk -v r="$r" -v n="$STREAM_MIB" -v us=$((t1 - t0)) \
        'BEGIN { s = us / 1e6; printf "R %s kernel-tcp-dd 1 1048576 %d %.3f %.0f %.1f\n", r, n, s, n / s, n / s }'
}

# busy: the guest's busy CPU time in jiffies (user+nice+system+irq+softirq of all CPUs), so
# CPU-s/GB counts the initiator, its kernel TCP work and (loop mode) the target alike per engine.
busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat; }
# cpu_line ROUND ENGINE QD BLOCK BYTES JIFFIES: "# C ..." with CPU-s/GB (USER_HZ 100).
cpu_line() {
    awk -v r="$1" -v e="$2" -v q="$3" -v b="$4" -v by="$5" -v j="$6" \
        'BEGIN { if (by > 0) printf "# C %s %s %s %s cpu_s_per_gb %.2f\n", r, e, q, b, j / 100 / (by / 1e9) }'
}

# run_ubd ROUND QD BLOCK [BINARY ENGINE]: ubdirect's own NVMe/TCP initiator (`ubdirect perf
# nvmf-tcp://...`); BINARY ubdirect-before, ENGINE ubdirect-tcp-before for the BIN_BEFORE build.
run_ubd() {
    local r=$1 q=$2 b=$3 bin=${4:-ubdirect} eng=${5:-ubdirect-tcp} j0 j1 w=randread
    [[ $b == 1048576 ]] && w=read
    j0=$(busy)
    if "$bin" perf "nvmf-tcp://$TARGET:4420/$NQN/1" -q "$q" -o "$b" -w "$w" -t "$SECS" --json >/tmp/u.json 2>/tmp/u.err; then
        j1=$(busy)
        awk -v r="$r" -v e="$eng" -v q="$q" -v b="$b" '
            /"ios":/ { gsub(/[",]/, ""); n = $2 }
            /"seconds":/ { gsub(/[",]/, ""); s = $2 }
            /"iops":/ { gsub(/[",]/, ""); iops = $2 }
            /"bytes_per_s":/ { gsub(/[",]/, ""); bps = $2 }
            /"mean_latency_ns":/ { gsub(/[",]/, ""); mean = $2 }
            END { printf "R %s %s %s %s %d %.3f %.0f %.1f %.1f\n", r, e, q, b, n, s, iops, bps / 1048576, mean / 1e3 }' /tmp/u.json
        cpu_line "$r" "$eng" "$q" "$b" "$(awk '/"bytes_per_s":/ { gsub(/[",]/, ""); bps = $2 } /"seconds":/ { gsub(/[",]/, ""); s = $2 } END { printf "%.0f", bps * s }' /tmp/u.json)" $((j1 - j0))
    else
        echo "FAIL $r $eng $q $b $(head -n1 /tmp/u.err)"
    fi
}

for ((round = 1; round <= ROUNDS; round++)); do
    for q in $DEPTHS; do run_uring "$round" "$q" 4096; done
    run_uring "$round" 4 1048576
    run_dd "$round"
    run_stream "$round"
    # ---- SLOT for the nvmf helper: ubdirect's own NVMe/TCP initiator, same depths -------------
    # Enabled with UBD_NVMF_UBDIRECT=1 once `ubdirect perf` takes nvmf-tcp:// addresses:
    #   ubdirect perf "nvmf-tcp://$TARGET:4420/$NQN/1" -q <qd> -o 4096 -w randread -t 2 --json
    # Print "R <round> ubdirect-tcp <qd> <block> <ios> <seconds> <iops> <MiB/s>" lines like above.
    if [[ ${UBD_NVMF_UBDIRECT:-0} == 1 ]]; then
        /ubd/scripts/vm/nvmet.sh --disconnect --nqn "$NQN" >/dev/null # the target's queues to ubdirect alone
        for spec in $(for q in $DEPTHS; do echo "$q:4096"; done) 4:1048576; do
            run_ubd "$round" "${spec%%:*}" "${spec##*:}"
            if [[ ${UBD_NVMF_BEFORE:-0} == 1 ]]; then
                run_ubd "$round" "${spec%%:*}" "${spec##*:}" ubdirect-before ubdirect-tcp-before
            fi
            if [[ ${UBD_NVMF_SPIN_TOO:-0} == 1 ]]; then # the same, never sleeping in poll(2)
                UBD_NVMF_SPIN=1 run_ubd "$round" "${spec%%:*}" "${spec##*:}" ubdirect ubdirect-tcp-spin
            fi
            if [[ ${UBD_NVMF_NOSPIN_TOO:-0} == 1 ]]; then # the same, no bounded spin before the wait
                UBD_NVMF_IDLE_SPIN_US=0 run_ubd "$round" "${spec%%:*}" "${spec##*:}" ubdirect ubdirect-tcp-nospin
            fi
        done
        dev=$(/ubd/scripts/vm/nvmet.sh --connect "$TARGET" --nqn "$NQN" --wait 30) || exit 1
        nomerge
    fi
    # -------------------------------------------------------------------------------------------
done
/ubd/scripts/vm/nvmet.sh --disconnect --nqn "$NQN" >/dev/null
