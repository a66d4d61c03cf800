#!/bin/sh
# NIC loop-back in the test-bed guest, paired in time: for each frame size and repetition,
# ubdirect's virtio-net driver (the two hub NICs) and its igb driver (the two 82576 NICs) run
# back to back, buffers in the GPU-BAR stand-in, so that load changes on a shared host hit both
# alike. Run from the host (release build first):
#   cargo build --release -p ubdirect-cli --bin ubdirect
#   scripts/vm/run.sh --devices "ivshmem nic0 nic1 igb" --bin target/release/ubdirect \
#       --files drivers/igb/bench -- 'sh loopback-igb.sh'
# Prints one "AB-RESULT <mode> <size> <rep> <json>" line per run.
# Env: AB_SECONDS (per run, default 3), AB_SIZES (default "60 512 1514"), AB_BATCH (default 32),
# AB_REPS (default 3).
secs=${AB_SECONDS:-3}
sizes=${AB_SIZES:-60 512 1514}
batch=${AB_BATCH:-32}
reps=${AB_REPS:-3}
VA=${UBD_NICS%,*}
VB=${UBD_NICS#*,}
IA=${UBD_IGB%,*}
IB=${UBD_IGB#*,}
G=$UBD_IVSHMEM
rc=0
echo "AB: kernel $(uname -r), virtio-net $VA -> $VB, igb $IA -> $IB, ivshmem $G, ${secs}s per run, batch $batch, $reps reps"
bind-vfio "$VA" "$VB" "$IA" "$IB" "$G" || exit 1
run() { # mode size rep tx rx
    ubdirect loopback --gpu-bar "$G" --tx "$4" --rx "$5" --frame-size "$2" --batch "$batch" \
        --seconds "$secs" --json >/tmp/ab.json || rc=1
    echo "AB-RESULT $1 $2 $3 $(tr -d ' \n' </tmp/ab.json)"
}
for s in $sizes; do
    r=1
    while [ "$r" -le "$reps" ]; do
        run virtio-net "$s" "$r" "$VA" "$VB"
        run igb "$s" "$r" "$IA" "$IB"
        r=$((r + 1))
    done
done
exit $rc
