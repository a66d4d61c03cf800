#!/usr/bin/env bash
# Multiqueue check on a device: boots the test-bed guest with a third virtio-net NIC on a
# 2-queue tap backend (mq=on) and runs tests/guest_net_mq.rs against it. The tap lives in a
# private network namespace (unshare -n) that disappears with the run: no host network change,
# no traffic anywhere. Needs root and /dev/net/tun. From the repository root:
#   drivers/virtio-net/bench/mq-check.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
bin=$(cargo test -p ubdirect-virtio-net --test guest_net_mq --no-run --message-format=json 2>/dev/null |
    jq -r 'select(.reason == "compiler-artifact" and .executable != null) | .executable' | tail -n1)
[[ -x $bin ]] || { echo "mq-check: could not build tests/guest_net_mq.rs" >&2; exit 2; }
name=$(basename "$bin")
extra="-netdev tap,id=mq0,ifname=ubdmq0,script=no,downscript=no,queues=2,vhost=off"
extra="$extra -device virtio-net-pci,netdev=mq0,mq=on,vectors=6,disable-legacy=on,iommu_platform=on,mac=52:54:00:00:00:09,romfile=,addr=09.0"
exec unshare -n scripts/vm/run.sh --devices "ivshmem nic0 nic1" --extra-qemu "$extra" --test-bin "$bin" -- \
    "bind-vfio \$UBD_TEST_DEVICES && tests-bin/$name --ignored --test-threads=1 --nocapture"
