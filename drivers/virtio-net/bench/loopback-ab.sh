#!/bin/sh
# NIC loop-back A/B in the test-bed guest, paired in time: for each frame size and repetition,
# the kernel virtio-net driver (AF_PACKET), the kernel copy path (AF_PACKET + CPU copies to and
# from the GPU-BAR stand-in), the kernel's ring paths (PACKET_MMAP TPACKET_V3, AF_XDP in copy
# mode) and the ubdirect userspace driver (buffers in the GPU-BAR stand-in) run back to back on
# the same two NICs, rebinding them between runs, so that load changes on a shared host hit
# all of them alike. Run from the host (release build first):
#   cargo build --release -p ubdirect-cli --bin ubdirect
#   scripts/vm/run.sh --devices "ivshmem nic0 nic1" --bin target/release/ubdirect \
#       --files drivers/virtio-net/bench -- 'sh loopback-ab.sh'
# Prints one "AB-RESULT <mode> <size> <rep> <json>" line per run.
# Env: AB_SECONDS (per run, default 3), AB_SIZES (default "60 512 1514"), AB_BATCH (default 32),
# AB_REPS (default 3), AB_RING_PATHS (the kernel ring paths, default "tpacket-v3 af-xdp";
# empty for none).
secs=${AB_SECONDS:-3}
sizes=${AB_SIZES:-60 512 1514}
batch=${AB_BATCH:-32}
reps=${AB_REPS:-3}
ring_paths=${AB_RING_PATHS-tpacket-v3 af-xdp}
A=${UBD_NICS%,*}
B=${UBD_NICS#*,}
G=$UBD_IVSHMEM
rc=0
echo "AB: kernel $(uname -r) ($(tr ' ' '\n' </proc/cmdline | grep -x 'iommu=[a-z]*' || echo 'default IOMMU mode')), NICs $A -> $B, ivshmem $G, ${secs}s per run, batch $batch, $reps reps"
run() { # mode size rep args...
    mode=$1 size=$2 rep=$3
    shift 3
    ubdirect loopback "$@" --tx "$A" --rx "$B" --frame-size "$size" --batch "$batch" --seconds "$secs" --json >/tmp/ab.json || rc=1
    echo "AB-RESULT $mode $size $rep $(tr -d ' \n' </tmp/ab.json)"
}
for s in $sizes; do
    r=1
    while [ "$r" -le "$reps" ]; do
        bind-kernel "$A" "$B" "$G" 2>/dev/null
        run kernel "$s" "$r" --kernel
        run kernel-copy-gpubar "$s" "$r" --kernel --gpu-bar "$G"
        for p in $ring_paths; do
            run "kernel-$p" "$s" "$r" --kernel "$p"
        done
        bind-vfio "$A" "$B" "$G" || exit 1
        run ubdirect-gpubar "$s" "$r" --gpu-bar "$G"
        r=$((r + 1))
    done
done
run ubdirect-hugepages 1514 1
exit $rc
