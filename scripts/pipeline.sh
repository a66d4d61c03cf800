#!/usr/bin/env bash
# The main job: stream an NVMe namespace through the unified buffer pool into GPU memory.
#
#   scripts/pipeline.sh [extra `ubdirect pipeline` options]
#
# - On a machine where an NVMe controller is bound to vfio-pci (scripts/setup.sh), it runs
#     ubdirect pipeline --source nvme:<that controller> --sink cuda --verify
#   (--sink null when there is no NVIDIA GPU; UBD_SINK overrides, e.g. bar:0000:17:00.0/1),
#   built with `cargo build --release`.
# - Otherwise it runs the same pipeline in the QEMU guest test bed (scripts/vm/run.sh): the
#   emulated NVMe streams through the real kernel vfio-pci driver into the ivshmem "GPU BAR"
#   (peer to peer, zero copy) with --verify, then into null; after the guest exits the host
#   checks that the BAR's backing file holds exactly the NVMe image's bytes.
# Exit status: 0 when the pipeline ran and every check held.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

vfio_nvme() {
    local d
    for d in /sys/bus/pci/devices/*; do
        [[ $(cat "$d/class" 2>/dev/null) == 0x010802 ]] || continue
        [[ $(basename "$(readlink "$d/driver" 2>/dev/null)" 2>/dev/null) == vfio-pci ]] || continue
        basename "$d"
        return 0
    done
    return 1
}

if [[ ${UBD_PIPELINE_GUEST:-0} != 1 ]] && nvme=$(vfio_nvme); then
    echo "pipeline.sh: NVMe $nvme is bound to vfio-pci: running on this machine"
    cargo build --release -p ubdirect --quiet
    sink=${UBD_SINK:-}
    if [[ -z $sink ]]; then
        if nvidia-smi -L >/dev/null 2>&1; then sink=cuda; else sink=null; fi
    fi
    set -x
    exec target/release/ubdirect pipeline --source "nvme:$nvme" --sink "$sink" --verify "$@"
fi

echo "pipeline.sh: no NVMe bound to vfio-pci here: running in the QEMU guest test bed"
cargo build -p ubdirect --quiet
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/ubd-pipeline.XXXXXX")
extra="$*"
guest_cmd='set -e
bind-vfio $UBD_NVME $UBD_IVSHMEM >/dev/null
nv=${UBD_NVME%%,*}
echo "== nvme -> BAR (peer to peer, zero copy), verified"
ubdirect pipeline --source nvme:$nv --sink bar:$UBD_IVSHMEM/2 --block-size 1M --qd 4 --blocks 8 --bytes 32M --verify --hostcheck pipeline-nvme0-bar,nvme0.img,gpubar '"$extra"'
echo "== nvme -> null, verified"
ubdirect pipeline --source nvme:$nv --sink null --block-size 1M --qd 8 --verify '"$extra"'
echo "== nvme -> null, segments and JSON"
ubdirect pipeline --source nvme:$nv --sink null --block-size 256K --qd 16 --seconds 2 --segments --json '"$extra"' | grep -E "\"(label|gb_per_s|cycles_per_completion)\""'
set +e
scripts/vm/run.sh --devices "nvme0 ivshmem" --timeout 600 --run-dir "$run_dir" -- "$guest_cmd" | tee "$run_dir/pipeline.log"
rc=${PIPESTATUS[0]}
set -e
echo "pipeline.sh: guest exit status $rc"
hc=0
if grep -q UBD-HOSTCHECK "$run_dir/pipeline.log"; then
    scripts/vm/hostcheck.sh "$run_dir" "$run_dir/pipeline.log" || hc=$?
else
    echo "pipeline.sh: the guest printed no host checks" && hc=1
fi
if ((rc == 0 && hc == 0)); then
    echo "pipeline.sh: OK: NVMe -> BAR bytes verified in the guest and in the BAR's backing file on the host"
    rm -rf "$run_dir"
else
    echo "pipeline.sh: FAILED (guest $rc, host checks $hc); logs and backing files in $run_dir"
    exit 1
fi
