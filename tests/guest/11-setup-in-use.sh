#!/bin/sh
# Guest test (TAP): scripts/setup.sh never takes a device the system uses, and leaves nothing
# behind. In-use detection beyond the basics of 10-setup-sh.sh: a mount whose
# major:minor is anonymous but whose source names the namespace (btrfs, bcachefs, ZFS), a mount
# in another mount namespace, a ZFS label, an md holder, a NIC enslaved to a bridge or under a
# VLAN that has an address, a SATA disk behind an AHCI controller named in PCI_ALLOWED. Then
# hugepages (an impossible HUGEMEM is refused before the count is touched and binds nothing; HUGEMEM is decimal;
# reset gives back what config added), driver_override after a failed bind and in reset,
# TARGET_USER touching only what ubdirect bound, and UBD_ALLOW_NOIOMMU refused.
# UBD_SETUP (default scripts/setup.sh) runs another copy, e.g. main's, to show these fail there.

cd /ubd || exit 1
SETUP="sh ${UBD_SETUP:-scripts/setup.sh}"
export UBD_STATE_DIR=/tmp/ubd-setup-in-use
rm -rf "$UBD_STATE_DIR"

OUT=/tmp/setup-in-use.out
ERR=/tmp/setup-in-use.err
# shellcheck source=tests/guest/lib/tap.sh
. tests/guest/lib/tap.sh

# shellcheck source=tests/guest/lib/setup.sh
. tests/guest/lib/setup.sh
# skipped_inuse ADDR DRIVER: setup left ADDR on DRIVER and said it is in use.
skipped_inuse() { is_drv "$1" "$2" && err_has "in use, skipped"; }
# kernel_again ADDR...: put devices a failed case left on vfio-pci back on their kernel driver,
# so that one failure does not spoil the cases after it.
kernel_again() {
    for ka in "$@"; do
        [ "$(drv "$ka")" = vfio-pci ] && bind-kernel "$ka" >/dev/null 2>&1
    done
    find_blk
}

bind-kernel $UBD_TEST_DEVICES >/dev/null 2>&1

# find_blk: nvme0's namespace block device (its name can change when nvme0 is rebound)
find_blk() {
    ctrl=$(ls -d /sys/bus/pci/devices/"$NVME0"/nvme/nvme* 2>/dev/null | head -n1)
    ns=$(ls "$ctrl" 2>/dev/null | grep -m1 -E '^nvme[0-9]+(c[0-9]+)?n[0-9]+$' | sed 's/c[0-9]*n/n/')
    blk=/dev/$ns
    i=0
    while [ ! -b "$blk" ] && [ $i -lt 25 ]; do sleep 0.2; i=$((i + 1)); done
}
find_blk
mkdir -p /tmp/m9a /tmp/m9b /tmp/m9c

# ---- mounts: anonymous major:minor, source names the disk (btrfs / ZFS / bcachefs style) -------
# A tmpfs mounted with the namespace as its source reads in mountinfo exactly like a btrfs
# mount of it: "0:NN ... - btrfs /dev/nvme0n1".
mount -t tmpfs "$blk" /tmp/m9a
run_setup config HUGEMEM=0 "PCI_ALLOWED=$NVME0"
check "a mount with an anonymous major:minor whose source is the namespace (btrfs style) keeps the NVMe" \
    eval 'skipped_inuse "$NVME0" nvme && err_has "$blk mounted on /tmp/m9a (tmpfs)"'
umount /tmp/m9a
kernel_again "$NVME0"
# bcachefs names every member, joined by ':'; a by-id style symlink names it indirectly
ln -sf "$blk" /tmp/m9-by-id
mount -t tmpfs "/dev/null:/tmp/m9-by-id" /tmp/m9b
run_setup config HUGEMEM=0 "PCI_ALLOWED=$NVME0"
check "a multi-device source (bcachefs style) naming the namespace through a symlink keeps the NVMe" \
    eval 'skipped_inuse "$NVME0" nvme && err_has "$blk mounted on /tmp/m9b (tmpfs)"'
umount /tmp/m9b
kernel_again "$NVME0"

# ---- a mount in another mount namespace -----------------------------------------------------
rm -f /tmp/m9-ns-ready
unshare -m sh -c "mount -t tmpfs $blk /tmp/m9c && touch /tmp/m9-ns-ready && exec sleep 60" &
nsholder=$!
i=0
while [ ! -e /tmp/m9-ns-ready ] && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
if [ -e /tmp/m9-ns-ready ] && ! grep -q /tmp/m9c /proc/self/mountinfo; then
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NVME0"
    check "a mount only in another mount namespace keeps the NVMe and names the namespace's process" \
        eval 'skipped_inuse "$NVME0" nvme && err_has "mounted on /tmp/m9c (tmpfs, mount namespace of $nsholder(sleep))"'
else
    not_ok "could not set up a mount in a private mount namespace (unshare -m)"
fi
kill "$nsholder" 2>/dev/null
wait "$nsholder" 2>/dev/null
kernel_again "$NVME0"

# ---- a ZFS label (pool member, imported or not) ----------------------------------------------
dd if="$blk" of=/tmp/m9-label bs=1024 skip=128 count=8 2>/dev/null
for k in 0 1 2 3; do
    # uberblock magic 0x00bab10c, little-endian, at the start of four 1 KiB slots
    printf '\014\261\272\000\000\000\000\000' | dd of="$blk" bs=1 seek=$((131072 + k * 1024)) conv=notrunc 2>/dev/null
done
sync
run_setup config HUGEMEM=0 "PCI_ALLOWED=$NVME0"
check "a namespace carrying a ZFS label (pool member) keeps the NVMe" \
    eval 'skipped_inuse "$NVME0" nvme && err_has "$blk carries a ZFS label"'
kernel_again "$NVME0"
dd if=/tmp/m9-label of="$blk" bs=1024 seek=128 count=8 conv=notrunc,fsync 2>/dev/null
dd if="$blk" of=/tmp/m9-label2 bs=1024 skip=128 count=8 2>/dev/null
check "the namespace's bytes under the fake label are restored" cmp -s /tmp/m9-label /tmp/m9-label2

# ---- an md holder (device-mapper / md / LVM show up the same way: holders/) --------------------
if [ -e /sys/module/md_mod/parameters/new_array ]; then
    echo md_ubd9 >/sys/module/md_mod/parameters/new_array 2>/dev/null
    md=/sys/block/md_ubd9/md
    echo none >$md/metadata_version 2>/dev/null
    echo "$(cat /sys/class/block/$ns/dev)" >$md/new_dev 2>/dev/null
    if [ -e "/sys/class/block/$ns/holders/md_ubd9" ]; then
        run_setup config HUGEMEM=0 "PCI_ALLOWED=$NVME0"
        check "a namespace held by an md array keeps the NVMe and names the holder" \
            eval 'skipped_inuse "$NVME0" nvme && err_has "$blk held by md_ubd9"'
    else
        not_ok "could not make md_ubd9 hold $blk (sysfs new_dev)"
    fi
    echo clear >$md/array_state 2>/dev/null
    kernel_again "$NVME0"
    check "the md array let go of the namespace" eval '[ ! -e "/sys/class/block/$ns/holders/md_ubd9" ]'
else
    skip "no md_mod in this guest (UBD_VM_MODULES): md holder"
    skip "no md_mod in this guest (UBD_VM_MODULES): md holder"
fi

# ---- NICs enslaved to a bridge, or under a VLAN, that has an address --------------------------
ifc=$(ls /sys/bus/pci/devices/"$NIC1"/virtio*/net 2>/dev/null | head -n1)
if [ -n "$ifc" ] && brctl addbr ubdbr9 2>/dev/null; then
    brctl addif ubdbr9 "$ifc"
    ip link set "$ifc" up
    ip addr add 10.79.0.1/24 dev ubdbr9
    ip link set ubdbr9 up
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NIC1"
    check "a NIC enslaved to a bridge that has an address is kept and the bridge named" \
        eval 'skipped_inuse "$NIC1" virtio-pci && err_has "$ifc is enslaved to ubdbr9: ubdbr9 is up with address 10.79.0.1/24"'
    ip link set ubdbr9 down
    brctl delif ubdbr9 "$ifc"
    brctl delbr ubdbr9
    ip link set "$ifc" down
    kernel_again "$NIC1"
else
    skip "no bridge support in this guest (UBD_VM_MODULES)"
fi
if [ -n "$ifc" ] && vconfig add "$ifc" 42 >/dev/null 2>&1; then
    ip link set "$ifc" up
    ip addr add 10.80.0.1/24 dev "$ifc.42"
    ip link set "$ifc.42" up
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NIC1"
    check "a NIC under a VLAN that has an address is kept and the VLAN named" \
        eval 'skipped_inuse "$NIC1" virtio-pci && err_has "$ifc is enslaved to $ifc.42: $ifc.42 is up with address 10.80.0.1/24"'
    vconfig rem "$ifc.42" >/dev/null 2>&1
    kernel_again "$NIC1"
    ip link set "$ifc" down
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NIC1"
    check "the same NIC, VLAN gone and down, is bound" is_drv "$NIC1" vfio-pci
    run_setup reset "PCI_ALLOWED=$NIC1"
else
    skip "no 8021q in this guest (UBD_VM_MODULES)"
    skip "no 8021q in this guest (UBD_VM_MODULES)"
fi

# ---- a device of another class named in PCI_ALLOWED: an AHCI controller with its disk ---------
# (the test bed's `sata` device block: a disk on q35's AHCI controller; ahci and sd_mod in
# UBD_VM_MODULES). First mounted, as a root disk would be; then as swap.
ahci= sd=
for b in /sys/class/block/sd?; do
    [ -e "$b" ] || continue
    p=$(readlink -f "$b")
    for d in /sys/bus/pci/devices/*; do
        case $p in "$(readlink -f "$d")"/*) ahci=${d##*/} sd=${b##*/} ;; esac
    done
done
if [ -n "$ahci" ]; then
    mkdir -p /tmp/m9r
    mkdosfs "/dev/$sd" >/dev/null 2>&1 && mount -t vfat "/dev/$sd" /tmp/m9r
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$ahci"
    check "an AHCI controller ($ahci) named in PCI_ALLOWED whose disk is mounted (a root-like disk) is kept" \
        eval 'skipped_inuse "$ahci" ahci && err_has "/dev/$sd mounted on /tmp/m9r (vfat)"'
    umount /tmp/m9r
    kernel_again "$ahci"
    mkswap "/dev/$sd" >/dev/null 2>&1 && swapon "/dev/$sd"
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$ahci"
    check "an AHCI controller ($ahci) named in PCI_ALLOWED whose disk is swap is kept" \
        eval 'skipped_inuse "$ahci" ahci && err_has "/dev/$sd is swap"'
    swapoff "/dev/$sd"
    kernel_again "$ahci"
else
    skip "no SATA disk behind a PCI storage controller in this guest"
    skip "no SATA disk behind a PCI storage controller in this guest"
fi

# ---- an impossible HUGEMEM: the count comes back, nothing is bound ------------------------------
hp=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
hp0=$(cat $hp)
run_setup config HUGEMEM=1000000 "PCI_ALLOWED=$NVME0"
avail=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
nv0=$(drv "$NVME0")
kernel_again "$NVME0"
check "an impossible HUGEMEM (2 MiB pages) is refused before the count is touched and binds nothing" \
    eval '[ "$rc" = 1 ] && [ "$(cat $hp)" = "$hp0" ] && [ "$nv0" = nvme ] && err_has "needs 500000 x 2048kB" && err_has "only [0-9]* MiB of memory is available" && err_has "nothing was changed and no device was bound"'
check "after the impossible HUGEMEM the memory is available again (MemAvailable $avail kB > 100 MiB)" \
    [ "${avail:-0}" -gt 102400 ]
echo "$hp0" >$hp # (main's setup.sh left it raised: the rest of the test needs the memory)

# ---- HUGEMEM is decimal ---------------------------------------------------------------------
run_setup config HUGEMEM=010 "PCI_ALLOWED=$IVSHMEM"
check "HUGEMEM=010 is 10 MiB (5 pages), not octal 8" eval '[ "$rc" = 0 ] && out_has "HUGEMEM=10 MiB needs 5)"'
run_setup config HUGEMEM=09 "PCI_ALLOWED=$IVSHMEM"
check "HUGEMEM=09 is 9 MiB (not an octal error)" eval '[ "$rc" = 0 ] && out_has "HUGEMEM=9 MiB needs 5)"'
run_setup reset

# ---- reset gives back the hugepages config added ----------------------------------------------
run_setup config HUGEMEM=$(((hp0 + 6) * 2)) "PCI_ALLOWED=$IVSHMEM"
grown=$(cat $hp)
run_setup reset
check "reset gives back the hugepages config reserved ($hp0 -> $grown -> $(cat $hp))" \
    eval '[ "$grown" = $((hp0 + 6)) ] && [ "$rc" = 0 ] && [ "$(cat $hp)" = "$hp0" ] && out_has "back to $hp0"'
echo "$hp0" >$hp

# ---- driver_override after a failed bind, and in reset ------------------------------------------
# vfio-pci missing and modprobe "succeeding" without loading it (a broken module install): the
# bind cannot succeed.
mkdir -p /tmp/m9-fakebin
printf '#!/bin/sh\nexit 0\n' >/tmp/m9-fakebin/modprobe
chmod +x /tmp/m9-fakebin/modprobe
kernel_again "$NVME1"
kmod=$(cat /proc/sys/kernel/modprobe)
if rmmod vfio_pci 2>/dev/null; then
    # nor may the kernel load it on its own
    echo /nonexistent >/proc/sys/kernel/modprobe
    # bash, not busybox sh: busybox runs its own modprobe applet whatever PATH says
    env HUGEMEM=0 "PCI_ALLOWED=$NVME1" "PATH=/tmp/m9-fakebin:$PATH" bash ${UBD_SETUP:-scripts/setup.sh} config >"$OUT" 2>"$ERR"
    rc=$?
    echo "$kmod" >/proc/sys/kernel/modprobe
    ovr=$(cat /sys/bus/pci/devices/$NVME1/driver_override)
    check "a bind that fails clears driver_override and gives the NVMe back to nvme" \
        eval '[ "$rc" = 1 ] && [ "$ovr" = "(null)" ] && is_drv "$NVME1" nvme && err_has "driver_override cleared"'
    modprobe vfio-pci
    echo "" >/sys/bus/pci/devices/$NVME1/driver_override
    [ -n "$(drv "$NVME1")" ] || echo "$NVME1" >/sys/bus/pci/drivers_probe
elif [ -d /sys/module/vfio_pci ] && ! grep -q '^vfio_pci ' /proc/modules; then
    # the ubd kernel: vfio-pci is built in, so "the module is missing" cannot happen there
    skip "vfio_pci is built into this kernel: it cannot be unloaded to make a bind fail"
else
    not_ok "could not unload vfio_pci to make a bind fail"
fi
kernel_again "$NVME1"
# A bind config recorded that stopped half-way: the override is set, the device still on nvme.
echo vfio-pci >/sys/bus/pci/devices/$NVME1/driver_override
mkdir -p "$UBD_STATE_DIR"
echo "$NVME1 nvme" >>"$UBD_STATE_DIR/original-drivers"
run_setup reset
ovr=$(cat /sys/bus/pci/devices/$NVME1/driver_override)
check "reset clears a stale driver_override=vfio-pci config left on a device still on nvme" \
    eval '[ "$rc" = 0 ] && [ "$ovr" = "(null)" ] && is_drv "$NVME1" nvme && out_has "stale driver_override"'
# The same override set by someone else (no record): reset leaves it and says so.
echo vfio-pci >/sys/bus/pci/devices/$NVME1/driver_override
run_setup reset
ovr=$(cat /sys/bus/pci/devices/$NVME1/driver_override)
check "reset leaves a driver_override=vfio-pci setup.sh did not set" \
    eval '[ "$rc" = 0 ] && [ "$ovr" = vfio-pci ] && out_has "$NVME1: driver_override=vfio-pci left alone"'
echo >/sys/bus/pci/devices/$NVME1/driver_override

# ---- TARGET_USER: only what ubdirect bound; no hugetlbfs mount -----------------------------------
grep -q '^ubdtest:' /etc/passwd || echo 'ubdtest:x:1234:1234:ubd test:/tmp:/bin/sh' >>/etc/passwd
grep -q '^ubdtest:' /etc/group || echo 'ubdtest:x:1234:' >>/etc/group
bind-vfio "$NIC0" >/dev/null # someone else's device (a VM's), already on vfio-pci
gn=$(grp "$NIC0")
chown root "/dev/vfio/$gn"
run_setup config HUGEMEM=64 TARGET_USER=ubdtest "PCI_ALLOWED=$NVME0 $NIC0"
g0=$(grp "$NVME0")
check "TARGET_USER gets /dev/vfio/<group> of the device this run bound" \
    eval '[ "$rc" = 0 ] && [ "$(stat -c %U /dev/vfio/$g0)" = ubdtest ]'
check "TARGET_USER does not get the group of a device on vfio-pci that ubdirect did not bind" \
    eval '[ "$(stat -c %U /dev/vfio/$gn)" = root ] && out_has "$NIC0: on vfio-pci but not bound by ubdirect"'
check "TARGET_USER changes no hugetlbfs mount's owner" \
    eval '[ "$(stat -c %U /dev/hugepages)" = root ] && [ "$(stat -c %U /dev/hugepages1G)" = root ]'
run_setup config HUGEMEM=64 TARGET_USER=ubdtest "PCI_ALLOWED=$NVME0"
check "a later run still hands over the group of a device an earlier run bound" \
    eval '[ "$rc" = 0 ] && [ "$(stat -c %U /dev/vfio/$g0)" = ubdtest ]'
chown root /dev/hugepages /dev/hugepages1G
run_setup reset
check "reset gives back the device config bound and leaves the one someone else put on vfio-pci" \
    eval '[ "$rc" = 0 ] && is_drv "$NVME0" nvme && is_drv "$NIC0" vfio-pci && out_has "$NIC0: on vfio-pci but not bound by setup.sh"'
bind-kernel "$NIC0" >/dev/null 2>&1

# ---- UBD_ALLOW_NOIOMMU takes only 1 -------------------------------------------------------
before=$(snapshot)
run_setup config HUGEMEM=0 UBD_ALLOW_NOIOMMU=yes
check "UBD_ALLOW_NOIOMMU=yes is refused (exit 2, names =1) and nothing changes" \
    eval '[ "$rc" = 2 ] && err_has "set UBD_ALLOW_NOIOMMU=1 to turn on" && [ "$before" = "$(snapshot)" ]'

run_setup reset
check "the test leaves every device on its kernel driver" \
    eval 'is_drv "$NVME0" nvme && is_drv "$NVME1" nvme && is_drv "$NIC0" virtio-pci && is_drv "$NIC1" virtio-pci'

echo "1..$n"
echo "setup-in-use: $((n - failed - skipped)) passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
