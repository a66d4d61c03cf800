#!/usr/bin/env bash
# Run the igb VF guest tests (drivers/igb/tests/guest_igbvf.rs) in a guest shaped for them.
#
#   scripts/vm/igbvf.sh [run.sh options] [-- test-binary arguments]
#
# QEMU 10.0.2 maps an igb VF's BARs at the low 32 bits of their 64-bit addresses, so in the
# standard test bed (3.5 GiB, a 64-bit PCI window) every VF register reads 0. Here the guest
# has a 32-bit physical address space (-cpu max,phys-bits=32, no 64-bit PCI hole, 2 GiB of
# memory, 256 x 2 MiB hugepages), which puts the VF BARs below 4 GiB; only the igb device block
# is created. Builds the test binary (CARGO_TARGET_DIR is honoured) and runs its ignored tests
# one at a time with UBD_IGB_VF=1. Exit status: run.sh's.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

opts=()
while [[ $# -gt 0 && $1 != -- ]]; do opts+=("$1") && shift; done
[[ ${1:-} == -- ]] && shift

build=$(cd "$UBD_REPO" && cargo test -p ubdirect-igb --test guest_igbvf --no-run 2>&1) ||
    vm_die "building guest_igbvf failed: $build"
bin=$(sed -n 's/.*Executable tests\/guest_igbvf.rs (\(.*\))$/\1/p' <<<"$build" | tail -n1)
[[ -x $bin ]] || vm_die "no guest_igbvf test binary in cargo's output: $build"

exec "$UBD_VM_DIR/run.sh" --devices igb --mem 2G --hugepages hugepages=256 \
    --extra-qemu "-cpu max,phys-bits=32 -global q35-pcihost.pci-hole64-size=0" \
    --env UBD_IGB_VF=1 --bin "$bin" "${opts[@]}" -- "${bin##*/} --ignored --test-threads=1 $*"
