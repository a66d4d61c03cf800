#!/bin/sh
# The guest half of scripts/bench/nvme.sh (runs in the guest's /ubd): ROUNDS interleaved rounds;
# in each, for every depth, the floor loop and ubdirect perf (shadow doorbells auto, on, off) on
# vfio-pci, then the kernel's polled io_uring paths (uring-iopoll, uring-cmd) with the controller
# on the kernel nvme driver (poll_queues=1). One line per run:
#   R <round> <engine> <qd> <iops> <mean_ns> <p50_ns> <p99_ns>
#   C <round> <engine> <qd> <submit_cycles/IO> <complete_cycles/IO> <SQ doorbells/IO> <CQ doorbells/IO>
# (engine "ubdirect" is the default --shadow-doorbells auto, "ubdirect-on" / "ubdirect-nosh"
# force them on / off); a failed run prints
#   FAIL <round> <engine> <qd> <exit status> <first line of stderr>
# MODE=cmb (nvme.sh --cmb): per depth, ubdirect perf with the I/O SQ in host memory (engine
# "host") and in the controller's CMB ("cmb", --sq-in-cmb), the order alternating between rounds.
MODE=${MODE:-floor}
ADDR=${ADDR:-0000:00:10.0}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-"1 32 128 256"}
SECS=${SECS:-2}

# The total's figures: total comes after cores in the JSON, so the last match is the total's.
one() {
    round=$1 name=$2 q=$3
    shift 3
    if ubdirect perf "$ADDR" -q "$q" -o 4096 -w randread -t "$SECS" --json "$@" >/tmp/b.json 2>/tmp/b.err; then
        awk -v r="$round" -v e="$name" -v q="$q" '
            /"iops":/ { gsub(/[",]/, ""); iops = $2 }
            /"mean":/ { gsub(/[",]/, ""); mean = $2 }
            /"p50":/ { gsub(/[",]/, ""); p50 = $2 }
            /"p99":/ { gsub(/[",]/, ""); p99 = $2 }
            /"submit_cycles_per_io":/ { gsub(/[",]/, ""); sub_c = $2 }
            /"complete_cycles_per_io":/ { gsub(/[",]/, ""); comp_c = $2 }
            /"sq_doorbell_writes_per_io":/ && sq == "" { gsub(/[",]/, ""); sq = $2 }
            /"cq_doorbell_writes_per_io":/ && cq == "" { gsub(/[",]/, ""); cq = $2 }
            END { printf "R %s %s %s %.0f %.0f %.0f %.0f\n", r, e, q, iops, mean, p50, p99
                  printf "C %s %s %s %.0f %.0f %.3f %.3f\n", r, e, q, sub_c, comp_c, sq, cq }' /tmp/b.json
    else
        echo "FAIL $round $name $q $? $(head -n1 /tmp/b.err)"
    fi
}

if [ "$MODE" = cmb ]; then
    echo "# cpus=$(nproc) kernel=$(uname -r)"
    bind-vfio "$ADDR" >/dev/null 2>&1 || echo "# bind-vfio $ADDR failed"
    r=1
    while [ "$r" -le "$ROUNDS" ]; do
        for q in $DEPTHS; do
            if [ $((r % 2)) = 1 ]; then
                one "$r" host "$q"
                one "$r" cmb "$q" --sq-in-cmb
            else
                one "$r" cmb "$q" --sq-in-cmb
                one "$r" host "$q"
            fi
        done
        r=$((r + 1))
    done
    exit 0
fi

echo 1 >/sys/module/nvme/parameters/poll_queues 2>/dev/null ||
    echo "# cannot set nvme poll_queues: the kernel engines will fail"
bind-vfio "$ADDR" >/dev/null 2>&1 && ubdirect perf "$ADDR" -q 1 -t 0.2 2>&1 | grep -E '^shadow doorbells' | sed 's/^/# /'
echo "# poll_queues=$(cat /sys/module/nvme/parameters/poll_queues 2>/dev/null) cpus=$(nproc) kernel=$(uname -r)"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    bind-vfio "$ADDR" >/dev/null 2>&1 || echo "# bind-vfio $ADDR failed"
    for q in $DEPTHS; do
        one "$r" floor "$q" --engine floor
        one "$r" ubdirect "$q"
        one "$r" ubdirect-on "$q" --shadow-doorbells on
        one "$r" ubdirect-nosh "$q" --shadow-doorbells off
    done
    bind-kernel "$ADDR" >/dev/null 2>&1 || echo "# bind-kernel $ADDR failed"
    i=0
    while [ ! -e /sys/bus/pci/devices/$ADDR/nvme ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    sleep 1
    for q in $DEPTHS; do
        one "$r" uring-iopoll "$q" --engine uring-iopoll
        one "$r" uring-cmd "$q" --engine uring-cmd
    done
    r=$((r + 1))
done
