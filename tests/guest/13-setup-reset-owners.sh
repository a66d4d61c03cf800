#!/bin/sh
# Guest test (TAP): `scripts/setup.sh reset` gives back every node `config
# TARGET_USER=...` handed over: each device's /dev/vfio/<group> and /dev/vfio/devices/vfioN
# (vfio device cdev kernels) go back before the unbind, and /dev/iommu (IOMMUFD kernels) once no
# device ubdirect bound is left on vfio-pci; a partial reset (PCI_ALLOWED) keeps /dev/iommu
# with the user, who still holds the other device. Uses the two NICs (no namespaces touched).

cd /ubd || exit 1
SETUP="sh scripts/setup.sh"
export UBD_STATE_DIR=/tmp/ubd-setup-owners
rm -rf "$UBD_STATE_DIR"
OUT=/tmp/setup-owners.out
ERR=/tmp/setup-owners.err
# shellcheck source=tests/guest/lib/tap.sh
. tests/guest/lib/tap.sh
# shellcheck source=tests/guest/lib/setup.sh
. tests/guest/lib/setup.sh

bind-kernel $UBD_TEST_DEVICES >/dev/null 2>&1
grep -q '^ubdtest:' /etc/passwd || echo 'ubdtest:x:1234:1234:ubd test:/tmp:/bin/sh' >>/etc/passwd
grep -q '^ubdtest:' /etc/group || echo 'ubdtest:x:1234:' >>/etc/group

# nodes ADDR: the device's vfio nodes while it is on vfio-pci: its group node and, where the
# kernel makes it (vfio device cdev: ubd; not Debian 6.12), /dev/vfio/devices/vfioN.
nodes() {
    echo "/dev/vfio/$(grp "$1")"
    for c in /sys/bus/pci/devices/"$1"/vfio-dev/vfio*; do
        [ -e "/dev/vfio/devices/${c##*/}" ] && echo "/dev/vfio/devices/${c##*/}"
    done
}
# owned_by USER NODE...: every NODE exists and is owned by USER.
owned_by() {
    ob_u=$1
    shift
    for ob_n in "$@"; do
        [ -e "$ob_n" ] && [ "$(stat -c %U "$ob_n")" = "$ob_u" ] || return 1
    done
}
# none_owned_by USER: no node under /dev/vfio, nor /dev/iommu, is owned by USER.
none_owned_by() {
    [ -z "$(find /dev/vfio /dev/iommu -user "$1" 2>/dev/null)" ]
}

iommufd=no
[ -c /dev/iommu ] && iommufd=yes
run_setup config HUGEMEM=0 TARGET_USER=ubdtest "PCI_ALLOWED=$NIC0 $NIC1"
n0=$(nodes "$NIC0")
n1=$(nodes "$NIC1")
check "config hands both NICs' nodes to TARGET_USER ($(echo $n0 $n1))" \
    eval '[ "$rc" = 0 ] && is_drv "$NIC0" vfio-pci && owned_by ubdtest $n0 $n1'
if [ "$iommufd" = yes ]; then
    check "config hands /dev/iommu to TARGET_USER (IOMMUFD kernel)" owned_by ubdtest /dev/iommu
    check "the vfio device cdev is among the nodes handed over" eval 'echo "$n0" | grep -q "^/dev/vfio/devices/vfio"'
fi

run_setup reset "PCI_ALLOWED=$NIC1"
check "a partial reset gives the NIC back to its driver" eval '[ "$rc" = 0 ] && is_drv "$NIC1" virtio-pci'
check "the other NIC's nodes stay with TARGET_USER" owned_by ubdtest $n0
if [ "$iommufd" = yes ]; then
    check "/dev/iommu stays with TARGET_USER while a device ubdirect bound is on vfio-pci" owned_by ubdtest /dev/iommu
fi

run_setup reset
check "the full reset puts the NICs back on virtio-pci" eval '[ "$rc" = 0 ] && is_drv "$NIC0" virtio-pci && is_drv "$NIC1" virtio-pci'
check "after reset no node under /dev/vfio nor /dev/iommu is TARGET_USER's" none_owned_by ubdtest
if [ "$iommufd" = yes ]; then
    check "/dev/iommu is root's again and reset said so" eval 'owned_by root /dev/iommu && out_has "/dev/iommu given back to root"'
fi
check "reset forgets the owners it gave back" eval '[ ! -s "$UBD_STATE_DIR/original-owners" ]'

# Bound again without TARGET_USER, the new nodes are root's (nothing stale is applied).
run_setup config HUGEMEM=0 "PCI_ALLOWED=$NIC0"
check "config without TARGET_USER leaves every node root's" eval '[ "$rc" = 0 ] && owned_by root $(nodes "$NIC0") && none_owned_by ubdtest'
run_setup reset

echo "1..$n"
echo "setup-owners: $((n - failed - skipped)) passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
