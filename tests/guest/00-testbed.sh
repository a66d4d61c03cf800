#!/bin/sh
# shellcheck disable=SC2034 # variables read through eval in t()
# Guest test: the test bed itself. The devices, their order and shape, the IOMMU groups, the
# hugepages, binding to vfio-pci (/dev/vfio/<group>) and back to the kernel driver.
# POSIX sh (busybox). Prints TAP.

n=0
fails=0
ok() {
    n=$((n + 1))
    echo "ok $n - $*"
}
not_ok() {
    n=$((n + 1))
    fails=$((fails + 1))
    echo "not ok $n - $*"
}
# t NAME 'SHELL CONDITION': one test from the condition's status (evaluated by eval).
t() {
    if eval "$2"; then ok "$1"; else not_ok "$1"; fi
}
echo "1..20"

sysdev() { echo "/sys/bus/pci/devices/$1"; }
driver_of() { d=$(readlink "$(sysdev "$1")/driver" 2>/dev/null) && echo "${d##*/}"; }
group_of() { g=$(readlink "$(sysdev "$1")/iommu_group" 2>/dev/null) && echo "${g##*/}"; }
count_words() { echo $#; }

nvme=$(echo "$UBD_NVME" | tr ',' ' ')
nics=$(echo "$UBD_NICS" | tr ',' ' ')
# shellcheck disable=SC2086 # split the lists
set -- $nvme
nvme0=$1 nvme1=$2
set -- $nics
nic0=$1 nic1=$2

t "UBD_GUEST=1 exported" '[ "$UBD_GUEST" = 1 ]'
t "two NVMe controllers ($UBD_NVME)" '[ "$(count_words $nvme)" = 2 ]'
t "one ivshmem device ($UBD_IVSHMEM)" '[ -n "$UBD_IVSHMEM" ] && [ -e "$(sysdev "$UBD_IVSHMEM")" ]'
t "two virtio-net NICs ($UBD_NICS)" '[ "$(count_words $nics)" = 2 ]'
t "an MDTS-0 NVMe controller apart ($UBD_NVME_MDTS0) and a multiqueue NIC apart ($UBD_NIC_MQ)" \
    '[ -e "$(sysdev "$UBD_NVME_MDTS0")" ] && [ -e "$(sysdev "$UBD_NIC_MQ")" ] && [ "$(cat "$(sysdev "$UBD_NIC_MQ")/device")" = 0x1041 ]'
t "two Intel 82576 NICs ($UBD_IGB)" '[ "$(count_words $(echo "$UBD_IGB" | tr , " "))" = 2 ]'
t "UBD_TEST_DEVICES holds all 10 ($UBD_TEST_DEVICES)" '[ "$(count_words $UBD_TEST_DEVICES)" = 10 ]'

# NVMe controllers in QEMU order: serials ubd0, ubd1; 1 and 2 namespaces, nsid 2 with 4 KiB LBA.
serial_of() { cat "$(sysdev "$1")"/nvme/nvme*/serial 2>/dev/null | tr -d ' '; }
t "nvme0 ($nvme0) has serial ubd0, nvme1 ($nvme1) ubd1 and the MDTS-0 one ubdprp" \
    '[ "$(serial_of "$nvme0")" = ubd0 ] && [ "$(serial_of "$nvme1")" = ubd1 ] && [ "$(serial_of "$UBD_NVME_MDTS0")" = ubdprp ]'

ns_count() { ls -d "$(sysdev "$1")"/nvme/nvme*/nvme*n* 2>/dev/null | wc -l; }
i=0
while [ $i -lt 100 ] && { [ "$(ns_count "$nvme0")" -lt 1 ] || [ "$(ns_count "$nvme1")" -lt 2 ]; }; do
    sleep 0.1
    i=$((i + 1))
done
t "namespaces on the kernel driver: nvme0 $(ns_count "$nvme0") (want 1), nvme1 $(ns_count "$nvme1") (want 2)" \
    '[ "$(ns_count "$nvme0")" = 1 ] && [ "$(ns_count "$nvme1")" = 2 ]'
# Block devices of the namespaces (not the hidden per-path nvmeXcYnZ ones of native multipath).
lbs=$(for b in /sys/block/nvme*n*; do
    case ${b##*/} in *c*) continue ;; esac
    cat "$b/queue/logical_block_size"
done | sort | tr '\n' ' ')
t "namespace block sizes are 512 512 4096 and the MDTS-0 and CMB ones' 512 (got: $lbs)" '[ "$lbs" = "4096 512 512 512 512 " ]'

mac_of() { cat "$(sysdev "$1")"/virtio*/net/*/address 2>/dev/null; }
t "NIC MACs 52:54:00:00:00:01/02 (got $(mac_of "$nic0") $(mac_of "$nic1"))" \
    '[ "$(mac_of "$nic0")" = 52:54:00:00:00:01 ] && [ "$(mac_of "$nic1")" = 52:54:00:00:00:02 ]'
# virtio feature bit 22 (VIRTIO_NET_F_MQ) negotiated by the kernel's virtio_net: the 23rd of 64.
mq_bit() { cut -c23 "$(sysdev "$1")"/virtio*/features 2>/dev/null; }
t "the multiqueue NIC offers VIRTIO_NET_F_MQ and the hub NICs do not (got $(mq_bit "$UBD_NIC_MQ") $(mq_bit "$nic0") $(mq_bit "$nic1"))" \
    '[ "$(mq_bit "$UBD_NIC_MQ")" = 1 ] && [ "$(mq_bit "$nic0")" = 0 ] && [ "$(mq_bit "$nic1")" = 0 ]'

bar2_size() {
    # shellcheck disable=SC2046 # start, end, flags
    set -- $(sed -n 3p "$(sysdev "$1")/resource")
    echo $(($2 - $1 + 1))
}
t "ivshmem BAR2 is 64 MiB (got $(bar2_size "$UBD_IVSHMEM"))" '[ "$(bar2_size "$UBD_IVSHMEM")" = $((64 << 20)) ]'

# IOMMU: every test device alone in its group, but for the PCIe root port above it (a kernel
# without ACS on QEMU's root ports groups the igb NICs with theirs; vfio allows a bridge there).
alone=1
for a in $UBD_TEST_DEVICES; do
    g=$(group_of "$a")
    others=""
    for m in $(ls "/sys/kernel/iommu_groups/$g/devices" 2>/dev/null); do
        [ "$m" = "$a" ] && continue
        case $(cat "/sys/bus/pci/devices/$m/class" 2>/dev/null) in
        0x0604*) ;;
        *) others="$others $m" ;;
        esac
    done
    if [ -z "$g" ] || [ ! -e "/sys/kernel/iommu_groups/$g/devices/$a" ] || [ -n "$others" ]; then
        echo "# $a: group '$g' holds: $(ls "/sys/kernel/iommu_groups/$g/devices" 2>/dev/null | tr '\n' ' ')"
        alone=0
    fi
done
t "every test device is alone in its IOMMU group (intel-iommu on), bridges above it aside" '[ $alone = 1 ]'

# Hugepages: 768 x 2 MiB and 1 x 1 GiB, hugetlbfs mounted.
hp() { cat "/sys/kernel/mm/hugepages/hugepages-$1/$2" 2>/dev/null; }
t "768 free 2 MiB hugepages (total $(hp 2048kB nr_hugepages), free $(hp 2048kB free_hugepages))" \
    '[ "$(hp 2048kB free_hugepages)" -ge 768 ]'
t "one free 1 GiB hugepage (free $(hp 1048576kB free_hugepages))" '[ "$(hp 1048576kB free_hugepages)" -ge 1 ]'
t "hugetlbfs mounted on /dev/hugepages" 'grep -q " /dev/hugepages hugetlbfs " /proc/mounts'

# Binding: vfio-pci, /dev/vfio/<group>, and back.
# Loaded modules on the Debian kernels, built in on ubd: /sys/module/<name> exists either way.
t "vfio_iommu_type1 and vfio-pci present (modules or built in)" '[ -d /sys/module/vfio_iommu_type1 ] && [ -d /sys/module/vfio_pci ] && [ -d /sys/bus/pci/drivers/vfio-pci ]'
t "bind-vfio binds every test device" 'bind-vfio $UBD_TEST_DEVICES'
bound=1
for a in $UBD_TEST_DEVICES; do
    if [ "$(driver_of "$a")" != vfio-pci ] || [ ! -c "/dev/vfio/$(group_of "$a")" ]; then
        echo "# $a: driver '$(driver_of "$a")', /dev/vfio/$(group_of "$a") $([ -c "/dev/vfio/$(group_of "$a")" ] && echo present || echo missing)"
        bound=0
    fi
done
t "each on vfio-pci with /dev/vfio/<group>, plus /dev/vfio/vfio" '[ $bound = 1 ] && [ -c /dev/vfio/vfio ]'

bind-kernel "$nvme0"
i=0
while [ $i -lt 100 ] && [ "$(ns_count "$nvme0")" -lt 1 ]; do
    sleep 0.1
    i=$((i + 1))
done
t "bind-kernel gives nvme0 back to nvme (driver '$(driver_of "$nvme0")', $(ns_count "$nvme0") namespace)" \
    '[ "$(driver_of "$nvme0")" = nvme ] && [ "$(ns_count "$nvme0")" = 1 ]'

[ $fails = 0 ]
