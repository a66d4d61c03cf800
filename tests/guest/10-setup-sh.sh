#!/bin/sh
# Guest test (TAP): scripts/setup.sh on the guest's real NVMe controllers, NICs and ivshmem.
# config / status / reset round trip, PCI_ALLOWED / PCI_BLOCKED, idempotence, TARGET_USER,
# bad input (non-zero exit, message, sysfs unchanged), devices in use skipped (mounts, swap,
# processes holding a node open), reset refusing a group that is open, reset leaving devices it
# did not bind and undoing the hugetlbfs mount it made. Devices start on their kernel drivers
# and are given back at the end.

cd /ubd || exit 1
SETUP="sh scripts/setup.sh"
export UBD_STATE_DIR=/tmp/ubd-setup-test
rm -rf "$UBD_STATE_DIR"

OUT=/tmp/setup-test.out
ERR=/tmp/setup-test.err
# shellcheck source=tests/guest/lib/tap.sh
. tests/guest/lib/tap.sh

# shellcheck source=tests/guest/lib/setup.sh
. tests/guest/lib/setup.sh
vfio_node() { [ -c "/dev/vfio/$(grp "$1")" ]; }
no_vfio_node() { [ ! -e "/dev/vfio/$(grp "$1")" ]; }

# Start from the kernel drivers whatever ran before (00-testbed.sh leaves devices on vfio-pci).
bind-kernel $UBD_TEST_DEVICES >/dev/null 2>&1

# ---- a guest booted without an IOMMU: 14-setup-noiommu.sh has the no-IOMMU cases -------------
if ! ls /sys/kernel/iommu_groups/* >/dev/null 2>&1; then
    echo "1..0 # SKIP no IOMMU in this guest: the no-IOMMU cases of setup.sh are in 14-setup-noiommu.sh"
    exit 0
fi

# ---- status ----------------------------------------------------------------------------------
run_setup status
check "status exits 0" [ "$rc" = 0 ]
all_listed=yes
for a in $NVME0 $NVME1 $NIC0 $NIC1 $IVSHMEM; do
    line=$(grep "^$a " "$OUT")
    case $line in
    *" $(drv "$a" | sed 's/^$/-/') "*" $(grp "$a") "*) ;;
    *) all_listed="no ($a: '$line')" ;;
    esac
done
check "status lists the 2 NVMe, 2 NICs and ivshmem with their real drivers and groups" [ "$all_listed" = yes ]
check "status shows hugepages per node and size" out_has "^0 *2048kB *$(cat /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages) "

# ---- bad input: non-zero exit, a message, nothing changed -----------------------------------
before=$(snapshot)
bad_input() { # bad_input NAME MESSAGE MODE VAR=VALUE...
    bname=$1
    bmsg=$2
    shift 2
    run_setup "$@"
    after=$(snapshot)
    if [ "$rc" != 0 ] && err_has "$bmsg" && [ ! -s "$OUT" ] && [ "$before" = "$after" ]; then
        ok "bad input rejected, nothing changed: $bname"
    else
        not_ok "bad input rejected, nothing changed: $bname (rc=$rc)"
    fi
}
bad_input "unknown mode" "unknown mode 'frobnicate'" frobnicate
bad_input "non-numeric HUGEMEM" "HUGEMEM='lots' is not a number" config HUGEMEM=lots
bad_input "bad HUGEPGSZ" "use 2048 (2 MiB) or 1048576" config HUGEPGSZ=4096
bad_input "non-existent HUGENODE" "NUMA node 9 does not exist" config HUGENODE=9
bad_input "malformed PCI address" "'00:4.0:1' is not a PCI address" config "PCI_ALLOWED=$NVME0 00:4.0:1"
bad_input "non-existent device" "no PCI device 0000:00:1e.7" config PCI_ALLOWED=0000:00:1e.7
bad_input "malformed PCI_BLOCKED" "PCI_BLOCKED: 'nvme0'" reset PCI_BLOCKED=nvme0
bad_input "unknown user" "TARGET_USER='nosuchuser': no such user" config TARGET_USER=nosuchuser
bad_input "no-IOMMU mode: only 1 accepted" "UBD_ALLOW_NOIOMMU='true' is not understood" config UBD_ALLOW_NOIOMMU=true

# ---- config: NVMe only by default ------------------------------------------------------------
run_setup config HUGEMEM=0
check "config exits 0" [ "$rc" = 0 ]
check "config binds nvme0 to vfio-pci" is_drv "$NVME0" vfio-pci
check "config binds nvme1 to vfio-pci" is_drv "$NVME1" vfio-pci
check "/dev/vfio/<group> appears for both NVMe" eval 'vfio_node "$NVME0" && vfio_node "$NVME1"'
check "config leaves the NICs on virtio-pci (not in PCI_ALLOWED)" eval 'is_drv "$NIC0" virtio-pci && is_drv "$NIC1" virtio-pci'
check "config leaves ivshmem alone by default" is_drv "$IVSHMEM" ""
check "config remembers the original driver" grep -q "^$NVME0 nvme$" "$UBD_STATE_DIR/original-drivers"
check "config says what it did" out_has "$NVME0 (NVMe): nvme -> vfio-pci, group $(grp "$NVME0")"

# ---- idempotence -----------------------------------------------------------------------------
before=$(snapshot)
run_setup config HUGEMEM=0
after=$(snapshot)
check "a second config exits 0" [ "$rc" = 0 ]
check "a second config changes nothing and says so" eval '[ "$before" = "$after" ] && out_has "nothing to do"'

# ---- PCI_ALLOWED: a NIC only when listed -----------------------------------------------------
run_setup config HUGEMEM=0 "PCI_ALLOWED=$NIC0"
check "PCI_ALLOWED=nic0 binds nic0" eval '[ "$rc" = 0 ] && is_drv "$NIC0" vfio-pci && vfio_node "$NIC0"'
check "PCI_ALLOWED=nic0 leaves nic1 on virtio-pci" is_drv "$NIC1" virtio-pci

# ---- reset with PCI_BLOCKED --------------------------------------------------------------------
run_setup reset "PCI_BLOCKED=$NVME0"
check "reset exits 0" [ "$rc" = 0 ]
check "reset with PCI_BLOCKED=nvme0 keeps nvme0 on vfio-pci" is_drv "$NVME0" vfio-pci
check "reset gives nvme1 back to nvme" is_drv "$NVME1" nvme
check "reset gives nic0 back to virtio-pci" is_drv "$NIC0" virtio-pci
check "/dev/vfio/<group> goes away for reset devices" eval 'no_vfio_node "$NVME1" && no_vfio_node "$NIC0"'

# ---- config with PCI_BLOCKED -----------------------------------------------------------------
run_setup reset
run_setup config HUGEMEM=0 "PCI_BLOCKED=$NVME1"
check "config with PCI_BLOCKED=nvme1 binds only nvme0" eval 'is_drv "$NVME0" vfio-pci && is_drv "$NVME1" nvme'
check "config names the blocked device" out_has "$NVME1: in PCI_BLOCKED"

# ---- reset refuses a group that is open (would block), without hanging -----------------------
g0=$(grp "$NVME0")
sleep 30 3<"/dev/vfio/$g0" &
holder=$!
sleep 1
t0=$(cut -d. -f1 /proc/uptime)
run_setup reset "PCI_ALLOWED=$NVME0"
t1=$(cut -d. -f1 /proc/uptime)
check "reset of an open group fails, names the holder and leaves the device on vfio-pci" \
    eval '[ "$rc" != 0 ] && err_has "is open by" && err_has " $holder(sleep)" && is_drv "$NVME0" vfio-pci && [ $((t1 - t0)) -lt 20 ]'
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null

# ---- full reset and its idempotence ----------------------------------------------------------
run_setup reset
check "reset returns every device to its kernel driver" eval '[ "$rc" = 0 ] && is_drv "$NVME0" nvme && is_drv "$NVME1" nvme && is_drv "$NIC0" virtio-pci'
# (a kernel with VFIO_DEVICE_CDEV, ubd, may keep an empty /dev/vfio/devices directory)
check "after reset only the container node is left in /dev/vfio" eval '[ "$(ls /dev/vfio | grep -vx devices)" = vfio ] && [ -z "$(ls /dev/vfio/devices 2>/dev/null)" ]'
run_setup reset
check "a second reset has nothing to do" eval '[ "$rc" = 0 ] && out_has "nothing to do"'
check "reset forgets the original drivers" eval '! grep -q . "$UBD_STATE_DIR/original-drivers"'

# ---- ivshmem (no kernel driver) round trip ----------------------------------------------------
run_setup config HUGEMEM=0 "PCI_ALLOWED=$IVSHMEM"
check "ivshmem bound to vfio-pci when listed" eval '[ "$rc" = 0 ] && is_drv "$IVSHMEM" vfio-pci && vfio_node "$IVSHMEM"'
run_setup reset "PCI_ALLOWED=$IVSHMEM"
check "ivshmem reset to no driver" eval '[ "$rc" = 0 ] && is_drv "$IVSHMEM" "" && out_has "vfio-pci -> no driver"'
# Devices someone else put on vfio-pci (a VM's disk, another program's NIC): reset leaves them.
bind-vfio "$NVME1" "$IVSHMEM" "$NIC1" >/dev/null
run_setup reset
check "reset leaves devices bound to vfio-pci by hand (not by setup.sh) there and names them" \
    eval '[ "$rc" = 0 ] && is_drv "$NVME1" vfio-pci && is_drv "$NIC1" vfio-pci && is_drv "$IVSHMEM" vfio-pci && out_has "$NVME1: on vfio-pci but not bound by setup.sh" && out_has "$NIC1: on vfio-pci but not bound by setup.sh"'
run_setup config HUGEMEM=0 "PCI_ALLOWED=$NIC1"
run_setup reset
check "a device config found already on vfio-pci is not taken over: reset still leaves it" \
    eval '[ "$rc" = 0 ] && is_drv "$NIC1" vfio-pci'
bind-kernel "$NVME1" "$IVSHMEM" "$NIC1" >/dev/null 2>&1

# ---- hugepages: grow, never shrink, per node ---------------------------------------------------
hp=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
hp0=$(cat $hp)
run_setup config HUGEMEM=$(((hp0 + 8) * 2)) PCI_ALLOWED=$IVSHMEM
check "HUGEMEM grows the 2 MiB reservation by 8 pages" eval '[ "$rc" = 0 ] && [ "$(cat $hp)" = $((hp0 + 8)) ]'
run_setup config HUGEMEM=2 PCI_ALLOWED=$IVSHMEM
check "a smaller HUGEMEM never shrinks the reservation" eval '[ "$rc" = 0 ] && [ "$(cat $hp)" = $((hp0 + 8)) ] && out_has unchanged'
nodehp=/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages
run_setup config HUGEMEM=$(((hp0 + 10) * 2)) HUGENODE=0 PCI_ALLOWED=$IVSHMEM
check "HUGENODE=0 reserves on node 0" eval '[ "$rc" = 0 ] && [ "$(cat $nodehp)" = $((hp0 + 10)) ] && out_has "on node 0"'
echo "$hp0" >$hp
run_setup config HUGEMEM=1048576 HUGEPGSZ=1048576 PCI_ALLOWED=$IVSHMEM
check "an impossible reservation is refused before any change" eval '[ "$rc" != 0 ] && err_has "needs 1024 x 1048576kB" && err_has "only [0-9]* MiB of memory is available" && err_has "nothing was changed"'
echo 1 >/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages

# ---- TARGET_USER -----------------------------------------------------------------------------
grep -q '^ubdtest:' /etc/passwd || echo 'ubdtest:x:1234:1234:ubd test:/tmp:/bin/sh' >>/etc/passwd
grep -q '^ubdtest:' /etc/group || echo 'ubdtest:x:1234:' >>/etc/group
run_setup config HUGEMEM=64 TARGET_USER=ubdtest
g0=$(grp "$NVME0")
check "TARGET_USER owns /dev/vfio/<group> of every bound device" eval '[ "$rc" = 0 ] && [ "$(stat -c %U /dev/vfio/$g0)" = ubdtest ] && [ "$(stat -c %U /dev/vfio/$(grp "$NVME1"))" = ubdtest ]'
check "TARGET_USER leaves the hugetlbfs mount alone (ubdirect uses memfd hugetlb)" eval '[ "$(stat -c %U /dev/hugepages)" = root ]'
check "TARGET_USER memlock is checked and the need named" eval 'grep -q "memlock.*\(65536 KiB\|unlimited\)" $OUT $ERR'
run_setup config HUGEMEM=64 TARGET_USER=ubdtest
check "TARGET_USER config is idempotent" eval '[ "$rc" = 0 ] && out_has "nothing to do"'
chown root /dev/hugepages
run_setup reset

# ---- devices in use are skipped and named ----------------------------------------------------
# nvme0's namespace as swap: mkswap writes only the first page; it is saved and restored so the
# image pattern the Rust tests check stays intact.
# nvme0_blk: nvme0 back on the kernel nvme driver (a failed in-use check binds it to vfio-pci,
# and its namespace vanishes), and its namespace's block device in $blk (waited for: probing is
# asynchronous, and the name can change when nvme0 is rebound).
nvme0_blk() {
    [ "$(drv "$NVME0")" = nvme ] || bind-kernel "$NVME0" >/dev/null 2>&1
    i=0
    while :; do
        ctrl=$(ls -d /sys/bus/pci/devices/"$NVME0"/nvme/nvme* 2>/dev/null | head -n1)
        ns=$(ls "$ctrl" 2>/dev/null | grep -m1 -E '^nvme[0-9]+(c[0-9]+)?n[0-9]+$' | sed 's/c[0-9]*n/n/')
        blk=/dev/$ns
        [ -n "$ns" ] && [ -b "$blk" ] && return 0
        [ $i -lt 50 ] || return 1
        sleep 0.2
        i=$((i + 1))
    done
}
nvme0_blk
if [ -b "$blk" ]; then
    dd if="$blk" of=/tmp/ns-head bs=4096 count=1 2>/dev/null
    mkswap "$blk" >/dev/null 2>&1 && swapon "$blk"
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NVME0"
    check "an NVMe with swap on its namespace is skipped and named" eval 'is_drv "$NVME0" nvme && err_has "in use" && err_has "$blk is swap"'
    swapoff "$blk" 2>/dev/null
    nvme0_blk
    [ -b "$blk" ] && dd if=/tmp/ns-head of="$blk" bs=4096 count=1 conv=fsync 2>/dev/null
    blockdev --flushbufs "$blk" 2>/dev/null
    dd if="$blk" of=/tmp/ns-head2 bs=4096 count=1 iflag=direct 2>/dev/null ||
        dd if="$blk" of=/tmp/ns-head2 bs=4096 count=1 2>/dev/null
    # ([ -b ]: a dd to a vanished namespace would create a regular file in /dev and "restore" it)
    check "the namespace's first page is restored after the swap test" eval '[ -b "$blk" ] && cmp -s /tmp/ns-head /tmp/ns-head2'
else
    skip "no block device for $NVME0"
    skip "no block device for $NVME0"
fi
modprobe vfat 2>/dev/null
if grep -q vfat /proc/filesystems && [ -b "$blk" ]; then
    dd if="$blk" of=/tmp/ns-1m bs=65536 count=16 2>/dev/null
    mkdir -p /tmp/mnt
    mkdosfs "$blk" >/dev/null 2>&1 && mount -o ro -t vfat "$blk" /tmp/mnt
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NVME0"
    check "an NVMe with a mounted filesystem is skipped and named" eval 'is_drv "$NVME0" nvme && err_has "mounted on /tmp/mnt"'
    umount /tmp/mnt 2>/dev/null
    nvme0_blk
    [ -b "$blk" ] && dd if=/tmp/ns-1m of="$blk" bs=65536 count=16 conv=fsync 2>/dev/null
    blockdev --flushbufs "$blk" 2>/dev/null
    dd if="$blk" of=/tmp/ns-1m2 bs=65536 count=16 iflag=direct 2>/dev/null ||
        dd if="$blk" of=/tmp/ns-1m2 bs=65536 count=16 2>/dev/null
    check "the namespace's first MiB is restored after the mount test" eval '[ -b "$blk" ] && cmp -s /tmp/ns-1m /tmp/ns-1m2'
else
    skip "no vfat in this guest kernel (mount test)"
    skip "no vfat in this guest kernel (mount test)"
fi
# ---- a process holding a device node open: the namespace (by its /dev name or a node made with
# mknod elsewhere, as in a container's /dev), the controller's char device ---------------------
# held_open NODE: a background sleep holding NODE open, its pid in $holder.
held_open() {
    sleep 120 3<"$1" &
    holder=$!
    sleep 0.5
}
let_go() {
    kill "$holder" 2>/dev/null
    wait "$holder" 2>/dev/null
}
nvme0_blk
if [ -b "$blk" ]; then
    held_open "$blk"
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NVME0"
    check "an NVMe whose namespace a process holds open (QEMU raw disk, O_DIRECT database) is skipped, the pid named" \
        eval 'is_drv "$NVME0" nvme && err_has "in use, skipped" && err_has "$blk is open by $holder(sleep)"'
    let_go
    nvme0_blk
    mm=$(cat "/sys/class/block/${blk#/dev/}/dev")
    rm -f /tmp/ubd-own-node
    mknod /tmp/ubd-own-node b "${mm%:*}" "${mm#*:}"
    held_open /tmp/ubd-own-node
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NVME0"
    check "a namespace held open through a node of its own (matched by major:minor) is named too" \
        eval 'is_drv "$NVME0" nvme && err_has "$blk is open by $holder(sleep)"'
    let_go
    rm -f /tmp/ubd-own-node
    nvme0_blk
    cdev=/dev/${ctrl##*/}
    held_open "$cdev"
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NVME0"
    check "an NVMe whose controller node ($cdev) a process holds open is skipped and named" \
        eval 'is_drv "$NVME0" nvme && err_has "$cdev is open by $holder(sleep)"'
    let_go
    # a kernel user, no process: an nvmet namespace exporting it
    nvme0_blk
    if sh scripts/vm/nvmet.sh 127.0.0.1 --dev "$blk" --port 4431 >/dev/null 2>/tmp/setup-nvmet.err; then
        run_setup config HUGEMEM=0 "PCI_ALLOWED=$NVME0"
        check "an NVMe whose namespace nvmet exports is skipped, subsystem and port named" \
            eval 'is_drv "$NVME0" nvme && err_has "$blk is exported by nvmet: subsystem nqn.2026-11.io.ubdirect:test namespace 1, port 4431 (tcp 127.0.0.1:4431)"'
        sh scripts/vm/nvmet.sh --remove >/dev/null 2>&1
    else
        not_ok "nvmet target over $blk could not be set up: $(cat /tmp/setup-nvmet.err)"
    fi
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NVME0"
    check "once let go, the same NVMe is bound" eval '[ "$rc" = 0 ] && is_drv "$NVME0" vfio-pci'
    run_setup reset
else
    not_ok "no block device for $NVME0 (process holder tests)"
fi

ifc=$(ls /sys/bus/pci/devices/"$NIC1"/virtio*/net 2>/dev/null | head -n1)
if [ -n "$ifc" ]; then
    ip addr add 10.77.0.1/24 dev "$ifc" && ip link set "$ifc" up
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NIC1"
    check "a NIC that is up with an address is skipped and named" eval 'is_drv "$NIC1" virtio-pci && err_has "$ifc is up with address 10.77.0.1/24"'
    ip addr flush dev "$ifc"
    ip route add default dev "$ifc"
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NIC1"
    check "a NIC that is up without an address but with the default route is skipped" \
        eval 'is_drv "$NIC1" virtio-pci && err_has "$ifc carries the default route"'
    ip route del default dev "$ifc"
    ip link set "$ifc" down
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$NIC1"
    check "the same NIC, down and without address, is bound" is_drv "$NIC1" vfio-pci
    run_setup reset "PCI_ALLOWED=$NIC1"
else
    skip "no net interface for $NIC1"
    skip "no net interface for $NIC1"
    skip "no net interface for $NIC1"
fi

# ---- a shared IOMMU group is named (q35's ICH9 functions 00:1f.x share one) ---------------------
shared=
for gdir in /sys/kernel/iommu_groups/*; do
    [ "$(ls "$gdir/devices" | wc -l)" -gt 1 ] || continue
    for m in "$gdir"/devices/*; do
        m=${m##*/}
        # an SMBus controller without a driver: nothing in the guest uses it
        [ "$(cat /sys/bus/pci/devices/$m/class)" = 0x0c0500 ] && [ -z "$(drv "$m")" ] && shared=$m
    done
done
if [ -n "$shared" ]; then
    sg=$(grp "$shared")
    run_setup config HUGEMEM=0 "PCI_ALLOWED=$shared"
    check "a device in a shared IOMMU group: bound, and the other members named with their drivers" \
        eval '[ "$rc" = 0 ] && is_drv "$shared" vfio-pci && err_has "IOMMU group $sg of $shared also holds: .*(no driver)"'
    run_setup reset "PCI_ALLOWED=$shared"
    check "the shared-group device goes back to no driver" eval '[ "$rc" = 0 ] && is_drv "$shared" ""'
else
    skip "no shared IOMMU group with a driverless SMBus controller"
    skip "no shared IOMMU group with a driverless SMBus controller"
fi

# ---- reset undoes the hugetlbfs mount config made, and only that --------------------------------
# (the guest's init mounts /dev/hugepages and /dev/hugepages1G: taken away for the test, put back)
umount /dev/hugepages1G 2>/dev/null
umount /dev/hugepages 2>/dev/null
mounted() { grep -q " $1 hugetlbfs " /proc/mounts; }
if ! grep -q hugetlbfs /proc/mounts; then
    run_setup config HUGEMEM=2 "PCI_ALLOWED=$IVSHMEM"
    check "config with no hugetlbfs mount mounts /dev/hugepages and records it" \
        eval '[ "$rc" = 0 ] && mounted /dev/hugepages && grep -q "^hugetlbfs /dev/hugepages existed$" "$UBD_STATE_DIR/settings"'
    : >/dev/hugepages/ubd-busy
    held_open /dev/hugepages/ubd-busy
    run_setup reset
    check "reset leaves a busy hugetlbfs mount it made mounted, says why and fails" \
        eval '[ "$rc" = 1 ] && mounted /dev/hugepages && err_has "busy, left mounted"'
    let_go
    run_setup reset
    check "the next reset unmounts it (the directory, which existed, stays) and forgets it" \
        eval '[ "$rc" = 0 ] && ! mounted /dev/hugepages && [ -d /dev/hugepages ] && out_has "unmounted hugetlbfs from /dev/hugepages" && [ ! -s "$UBD_STATE_DIR/settings" ]'
else
    not_ok "could not unmount the guest's hugetlbfs mounts to test the one config makes"
fi
mounted /dev/hugepages || mount -t hugetlbfs -o pagesize=2M hugetlbfs /dev/hugepages
mounted /dev/hugepages1G || mount -t hugetlbfs -o pagesize=1G hugetlbfs /dev/hugepages1G 2>/dev/null
run_setup config HUGEMEM=2 "PCI_ALLOWED=$IVSHMEM"
run_setup reset
check "reset leaves a hugetlbfs mount config did not make" eval '[ "$rc" = 0 ] && mounted /dev/hugepages'

# ---- leave the devices as the runner expects: on their kernel drivers --------------------------
run_setup reset
check "the test leaves every device on its kernel driver" eval 'is_drv "$NVME0" nvme && is_drv "$NVME1" nvme && is_drv "$NIC0" virtio-pci && is_drv "$NIC1" virtio-pci'

echo "1..$n"
echo "setup-sh: $((n - failed - skipped)) passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
