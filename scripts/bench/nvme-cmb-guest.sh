#!/bin/sh
# The guest half of scripts/bench/nvme-cmb.sh (runs in the guest's /ubd): ROUNDS interleaved
# rounds; in each, for every depth, ubdirect perf with the I/O SQ in host memory ("host") and in
# the controller's CMB ("cmb", --sq-in-cmb), the order alternating between rounds. One line per
# run:
#   R <round> <host|cmb> <qd> <iops> <mean_ns> <p50_ns> <p99_ns>
# a failed run prints
#   FAIL <round> <host|cmb> <qd> <exit status> <first line of stderr>
ADDR=${ADDR:-0000:00:10.0}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-"1 32 128"}
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
            END { printf "R %s %s %s %.0f %.0f %.0f %.0f\n", r, e, q, iops, mean, p50, p99 }' /tmp/b.json
    else
        echo "FAIL $round $name $q $? $(head -n1 /tmp/b.err)"
    fi
}

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
