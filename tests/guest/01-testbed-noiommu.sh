#!/bin/sh
# shellcheck disable=SC2034 # variables read through eval in t()
# Guest test: the IOMMU mode the guest was booted in and the vfio nodes each kernel gives.
# Runs in every boot, with what each boot must show:
#   Debian kernel (6.12/6.1): intel-iommu on, no /dev/iommu (no IOMMUFD), /dev/vfio/<group> only
#   ubd kernel:               intel-iommu on, /dev/iommu, /dev/vfio/<group> AND the device cdev
#                             /dev/vfio/devices/vfio<n>
#   ubd --no-iommu:           no IOMMU unit, vfio.enable_unsafe_noiommu_mode=Y, /dev/iommu,
#                             /dev/vfio/noiommu-<group> and /dev/vfio/devices/vfio<n>
#   (scripts/vm/suite.sh --kernel ubd --no-iommu --filter noiommu runs this file alone)
# The ivshmem device (no kernel driver) is bound to vfio-pci and released again. Every boot
# carries the test-bed marker that soak.sh --guest demands (scripts/vm/guest/in-testbed).
# POSIX sh (busybox). Prints TAP.

n=0
ok() {
    n=$((n + 1))
    echo "ok $n - $*"
}
not_ok() {
    n=$((n + 1))
    echo "not ok $n - $*"
}
t() {
    if eval "$2"; then ok "$1"; else not_ok "$1"; fi
}
echo "1..7"

kernel=${UBD_VM_KERNEL:-6.12}
noiommu=${UBD_VM_NO_IOMMU:-0}
dev=$UBD_IVSHMEM
sys=/sys/bus/pci/devices/$dev
param=/sys/module/vfio/parameters/enable_unsafe_noiommu_mode
echo "# kernel $kernel ($(uname -r)), no-IOMMU boot: $noiommu, device $dev"

if [ "$noiommu" = 1 ]; then
    t "no IOMMU unit (/sys/class/iommu is empty)" '[ -z "$(ls /sys/class/iommu 2>/dev/null)" ]'
    t "vfio's unsafe no-IOMMU mode is on" '[ "$(cat $param 2>/dev/null)" = Y ]'
else
    t "intel-iommu is on (/sys/class/iommu/dmar*)" 'ls -d /sys/class/iommu/dmar* >/dev/null 2>&1'
    t "vfio's no-IOMMU mode is off or absent" '[ ! -e $param ] || [ "$(cat $param)" = N ]'
fi
if [ "$kernel" = ubd ]; then
    t "/dev/iommu (IOMMUFD) exists" '[ -c /dev/iommu ]'
else
    t "no /dev/iommu on Debian's kernel (no CONFIG_IOMMUFD)" '[ ! -e /dev/iommu ]'
fi

bind-vfio "$dev" 2>/tmp/noiommu-err
group=$(readlink "$sys/iommu_group" 2>/dev/null)
group=${group##*/}
if [ "$noiommu" = 1 ]; then
    t "bound: the group node is /dev/vfio/noiommu-$group" '[ -n "$group" ] && [ -c "/dev/vfio/noiommu-$group" ] || { cat /tmp/noiommu-err; false; }'
else
    t "bound: the group node is /dev/vfio/$group" '[ -n "$group" ] && [ -c "/dev/vfio/$group" ] || { cat /tmp/noiommu-err; false; }'
fi
cdev=$(ls "$sys/vfio-dev" 2>/dev/null | head -n1)
if [ "$kernel" = ubd ]; then
    t "the device cdev /dev/vfio/devices/$cdev exists" '[ -n "$cdev" ] && [ -c "/dev/vfio/devices/$cdev" ]'
else
    # The vfio-dev class device (sysfs) exists on 6.12 too; the char node does not.
    t "no device cdev node on Debian's kernel (no CONFIG_VFIO_DEVICE_CDEV)" '[ -z "$(ls /dev/vfio/devices 2>/dev/null)" ]'
fi
bind-kernel "$dev" 2>/dev/null
t "the test-bed marker is present (ubdirect.testbed=1 and /run/ubdirect-testbed: in-testbed)" 'in-testbed -v'
t "released: $dev is off vfio-pci again" '[ ! -e "$sys/driver" ] || [ "$(basename "$(readlink "$sys/driver")")" != vfio-pci ]'
