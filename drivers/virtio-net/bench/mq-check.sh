#!/usr/bin/env bash
# Multiqueue check on a device: boots the test-bed guest with its multiqueue NIC (device block
# nicmq: a 2-queue tap backend, mq=on) and runs tests/guest_net_mq.rs against it, while
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
# In a private namespace: the 2-queue tap that the test bed's nicmq device block opens (run.sh
# uses a tap ubdmq0 that already exists), up, and a feeder sending flows into it, so the guest's
# NIC receives on both queue pairs (UBD_NET_MQ_RX=1 makes the test require that).
exec unshare -n bash -c '
    ip tuntap add dev ubdmq0 mode tap multi_queue && ip link set ubdmq0 up || exit 2
    python3 drivers/virtio-net/bench/mq-feed.py 120 & fpid=$!
    scripts/vm/run.sh --devices "ivshmem nic0 nic1 nicmq" --env UBD_NET_MQ_RX=1 --test-bin "$1" -- \
        "bind-vfio \$UBD_TEST_DEVICES && tests-bin/$2 --ignored --test-threads=1 --nocapture"
    rc=$?
    kill $fpid 2>/dev/null
    exit $rc' mq-check "$bin" "$name"
