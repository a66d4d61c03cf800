#!/bin/sh
# The guest half of scripts/bench/nvme.sh (runs in the guest's /ubd): ROUNDS interleaved rounds;
# in each, for every depth, the floor loop and ubdirect perf (shadow doorbells auto, on, off) on
# vfio-pci, then the kernel's polled io_uring paths (uring-iopoll, uring-cmd) with the controller
# on the kernel nvme driver (poll_queues=1). One line per run:
#   R <round> <engine> <qd> <iops> <mean_ns> <p50_ns> <p99_ns>
#   C <round> <engine> <qd> <submit_cycles/IO> <complete_cycles/IO> <SQ doorbells/IO> <CQ doorbells/IO>
# (engine "ubdirect" is the default --shadow-doorbells auto, "ubdirect-on" / "ubdirect-nosh"
# force them on / off; "ubdirect-old" is the older binary of OLD_BIN, when given); a failed run prints
#   FAIL <round> <engine> <qd> <exit status> <first line of stderr>
# MODE=pad (nvme.sh --pad): per depth, the floor loop bare and with each of PADS ticks of
# per-read busy-waiting (engine "floor+N"), then ubdirect perf (auto, off); no kernel engines.
# MODE=cmb (nvme.sh --cmb): per depth, ubdirect perf with the I/O SQ in host memory (engine
# "host") and in the controller's CMB ("cmb", --sq-in-cmb), the order alternating between rounds.
# MODE=capi (nvme.sh --capi): per depth, ubdirect perf and the C API's perf loop ("capi",
# ubd_capi_perf_loop beside libubdirect.so in /ubd/bin), the order alternating between rounds.
MODE=${MODE:-floor}
ADDR=${ADDR:-0000:00:10.0}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-"1 32 128 256"}
SECS=${SECS:-2}

one() {
    round=$1 name=$2 q=$3
    shift 3
    bin=ubdirect
    [ "$name" = ubdirect-old ] && bin=ubdirect-old
    if $bin perf "$ADDR" -q "$q" -o 4096 -w randread -t "$SECS" --json "$@" >/tmp/b.json 2>/tmp/b.err; then
        # The total's figures: the first iops / mean / p50 / p99 / cycles after "total" (its
        # read and write parts come later and would overwrite them); the doorbell counts are
        # the first core's.
        awk -v r="$round" -v e="$name" -v q="$q" '
            /"total":/ { t = 1 }
            { gsub(/[",]/, "") }
            t && $1 == "iops:" && iops == "" { iops = $2 }
            t && $1 == "mean:" && mean == "" { mean = $2 }
            t && $1 == "p50:" && p50 == "" { p50 = $2 }
            t && $1 == "p99:" && p99 == "" { p99 = $2 }
            t && $1 == "submit_cycles_per_io:" && sc == "" { sc = $2 }
            t && $1 == "complete_cycles_per_io:" && cc == "" { cc = $2 }
            $1 == "sq_doorbell_writes_per_io:" && sq == "" { sq = $2 }
            $1 == "cq_doorbell_writes_per_io:" && cq == "" { cq = $2 }
            END { printf "R %s %s %s %.0f %.0f %.0f %.0f\n", r, e, q, iops, mean, p50, p99
                  printf "C %s %s %s %.0f %.0f %.3f %.3f\n", r, e, q, sc, cc, sq, cq }' /tmp/b.json
    else
        echo "FAIL $round $name $q $? $(head -n1 /tmp/b.err)"
    fi
}

# capi_one ROUND QD: the C API's perf loop (examples/c/perf_loop.c); it prints IOPS only, so
# the latency fields are 0 ("n/a" in the table).
capi_one() {
    if ubd_capi_perf_loop "$ADDR" "$2" "$SECS" >/tmp/b.out 2>/tmp/b.err; then
        iops=$(sed -n 's/^perf_loop: .*: \([0-9.]*\) IOPS.*/\1/p' /tmp/b.out)
        echo "R $1 capi $2 ${iops:-0} 0 0 0"
    else
        echo "FAIL $1 capi $2 $? $(head -n1 /tmp/b.err)"
    fi
}

# Engines of the two-engine modes, each a command run with ROUND and QD appended.
host() { one "$1" host "$2"; }
cmb() { one "$1" cmb "$2" --sq-in-cmb; }
ubd() { one "$1" ubdirect "$2"; }
capi() { capi_one "$1" "$2"; }

# alternate A B: ROUNDS rounds of every depth, A then B in odd rounds and B then A in even ones.
alternate() {
    echo "# cpus=$(nproc) kernel=$(uname -r)"
    bind-vfio "$ADDR" >/dev/null 2>&1 || echo "# bind-vfio $ADDR failed"
    r=1
    while [ "$r" -le "$ROUNDS" ]; do
        for q in $DEPTHS; do
            if [ $((r % 2)) = 1 ]; then
                "$1" "$r" "$q"
                "$2" "$r" "$q"
            else
                "$2" "$r" "$q"
                "$1" "$r" "$q"
            fi
        done
        r=$((r + 1))
    done
}

if [ "$MODE" = cmb ]; then
    alternate host cmb
    exit 0
fi
if [ "$MODE" = capi ]; then
    alternate ubd capi
    exit 0
fi

if [ "$MODE" = pad ]; then
    echo "# cpus=$(nproc) kernel=$(uname -r) pads=$PADS"
    bind-vfio "$ADDR" >/dev/null 2>&1 || echo "# bind-vfio $ADDR failed"
    r=1
    while [ "$r" -le "$ROUNDS" ]; do
        for q in $DEPTHS; do
            one "$r" floor "$q" --engine floor --shadow-doorbells off
            for p in $PADS; do
                one "$r" "floor+$p" "$q" --engine floor --shadow-doorbells off --floor-pad-cycles "$p"
            done
            one "$r" ubdirect "$q"
            one "$r" ubdirect-nosh "$q" --shadow-doorbells off
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
        one "$r" floor "$q" --engine floor --shadow-doorbells off
        one "$r" floor-sh "$q" --engine floor --shadow-doorbells on
        one "$r" ubdirect "$q"
        one "$r" ubdirect-on "$q" --shadow-doorbells on
        one "$r" ubdirect-nosh "$q" --shadow-doorbells off
        [ -n "${OLD:-}" ] && one "$r" ubdirect-old "$q"
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
