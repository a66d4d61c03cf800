#!/bin/sh
# NIC loop-back A/B in the test-bed guest: the kernel virtio-net driver (AF_PACKET) against the
# ubdirect userspace driver with buffers in the GPU-BAR stand-in, same NICs, same frames, one
# boot. Run from the host (release build first):
#   cargo build --release -p ubdirect --bin ubdirect
#   scripts/vm/run.sh --devices "ivshmem nic0 nic1" --bin target/release/ubdirect \
#       --files drivers/virtio-net/bench -- 'sh loopback-ab.sh'
# Env: AB_SECONDS (per run, default 5), AB_SIZES (default "60 512 1514"), AB_BATCH (default 32).
secs=${AB_SECONDS:-5}
sizes=${AB_SIZES:-60 512 1514}
batch=${AB_BATCH:-32}
A=${UBD_NICS%,*}
B=${UBD_NICS#*,}
rc=0
echo "AB: kernel $(uname -r), NICs $A -> $B, ivshmem $UBD_IVSHMEM, ${secs}s per run, batch $batch"
# (a) the kernel path: NICs on virtio-pci (as booted).
for s in $sizes; do
    ubdirect loopback --kernel --tx "$A" --rx "$B" --frame-size "$s" --batch "$batch" --seconds "$secs" --json >/tmp/k$s.json || rc=1
    echo "AB-RESULT kernel $s $(tr -d ' \n' </tmp/k$s.json)"
done
# (b) the userspace path: NICs (and ivshmem) on vfio-pci.
bind-vfio $A $B $UBD_IVSHMEM || exit 1
for s in $sizes; do
    ubdirect loopback --tx "$A" --rx "$B" --gpu-bar "$UBD_IVSHMEM" --frame-size "$s" --batch "$batch" --seconds "$secs" --json >/tmp/u$s.json || rc=1
    echo "AB-RESULT ubdirect-gpubar $s $(tr -d ' \n' </tmp/u$s.json)"
done
s=1514
ubdirect loopback --tx "$A" --rx "$B" --frame-size "$s" --batch "$batch" --seconds "$secs" --json >/tmp/h$s.json || rc=1
echo "AB-RESULT ubdirect-hugepages $s $(tr -d ' \n' </tmp/h$s.json)"
exit $rc
