# shellcheck shell=bash disable=SC2034 # sourced; the variables are used by the sourcing scripts
# Shared settings and helpers for scripts/vm/*.sh (sourced, not run).
#
# Everything built here is cached under $UBD_VM_CACHE (default <repo>/.vm-cache, git-ignored).

UBD_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
UBD_VM_DIR="$UBD_REPO/scripts/vm"
UBD_VM_CACHE=${UBD_VM_CACHE:-$UBD_REPO/.vm-cache}
# Kernel series for the guest: 6.12 (bookworm-backports, preferred) or 6.1 (bookworm).
UBD_VM_KERNEL=${UBD_VM_KERNEL:-6.12}
# Modules the guest loads at boot, with their dependencies (resolved by modprobe on the host).
# md_mod bridge 8021q: tests/guest/11-setup-in-use.sh; vfat and its code pages:
# tests/guest/10-setup-sh.sh mounts a filesystem on a namespace.
UBD_VM_MODULES=${UBD_VM_MODULES:-vfio-pci vfio_iommu_type1 nvme virtio_pci virtio_net md_mod bridge 8021q vfat nls_cp437 nls_iso8859-1 nls_utf8 nls_ascii ahci sd_mod}
# Modules put in the initramfs (with their dependencies, modprobe-able) but not loaded at boot:
# the NVMe-oF target and the kernel's NVMe/TCP initiator (scripts/vm/nvmet.sh loads them), and
# the kernel's igb PF driver (drivers/igb/tests/guest_igbvf.rs loads it to create VFs).
UBD_VM_MODULES_ONDEMAND=${UBD_VM_MODULES_ONDEMAND-nvmet nvmet-tcp nvme-tcp crc32c_generic igb}

vm_log() { printf 'vm: %s\n' "$*" >&2; }
vm_die() {
    printf 'vm: error: %s\n' "$*" >&2
    exit 2
}

# Print the newest linux-image-<kver>-amd64 package name for the chosen series.
vm_kernel_package() {
    local series=$1 ver pkg
    # The linux-image-amd64 metapackage of each suite names the current ABI package.
    while read -r ver; do
        [[ $ver == "$series".* ]] || continue
        pkg=$(apt-cache show "linux-image-amd64=$ver" 2>/dev/null |
            sed -n 's/^Depends: \(linux-image-[^ ,]*\).*/\1/p' | head -n1 || true)
        if [[ -n $pkg ]]; then
            echo "$pkg"
            return 0
        fi
    done < <(apt-cache madison linux-image-amd64 | awk '{print $3}')
    return 1
}
