#!/usr/bin/env bash
# Multiqueue check on a device: boots the test-bed guest with a third virtio-net NIC on a
# 2-queue tap backend (mq=on) and runs tests/guest_net_mq.rs against it, while
# bench/mq-feed.py sends UDP flows (127.0.0.1 -> 127.0.0.2, varying ports) into the tap. The tap lives in a
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
# In the namespace: QEMU creates the tap; a feeder brings it up and sends flows into it, so
# the guest's NIC receives on both queue pairs (UBD_NET_MQ_RX=1 makes the test require that).
exec unshare -n bash -c '
    feed() {
        for _ in $(seq 300); do ip link set ubdmq0 up 2>/dev/null && break; sleep 0.1; done
        exec python3 drivers/virtio-net/bench/mq-feed.py 120
    }
    feed & fpid=$!
    scripts/vm/run.sh --devices "ivshmem nic0 nic1" --extra-qemu "$1" --env UBD_NET_MQ_RX=1 --test-bin "$2" -- \
        "bind-vfio \$UBD_TEST_DEVICES && tests-bin/$3 --ignored --test-threads=1 --nocapture"
    rc=$?
    kill $fpid 2>/dev/null
    exit $rc' mq-check "$extra" "$bin" "$name"
