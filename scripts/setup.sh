#!/bin/sh
# scripts/setup.sh: prepare a machine for ubdirect, in the manner of SPDK's setup.sh.
# POSIX sh (busybox ash, dash, bash); reads sysfs directly, needs no lspci.
# Run `scripts/setup.sh help` for the modes and knobs.

set -u

me=setup.sh
SYS=/sys
STATE_DIR=${UBD_STATE_DIR:-/run/ubdirect}
STATE_FILE=$STATE_DIR/original-drivers
HUGE_STATE=$STATE_DIR/original-hugepages
OWNER_STATE=$STATE_DIR/original-owners
SETTINGS=$STATE_DIR/settings

usage() {
    cat <<'EOF'
Usage: scripts/setup.sh [config|reset|status|help]

Modes:
  config   (default) reserve hugepages, load the vfio modules, bind devices to vfio-pci
  reset    undo what `config` did, and only that (its records in UBD_STATE_DIR): the devices
           it bound go back to the kernel driver they had (else the class default: nvme for
           NVMe, virtio-pci for virtio devices); a device on vfio-pci that setup.sh did not
           bind (a VM's, another program's) is left there and named. A full reset (no
           PCI_ALLOWED/PCI_BLOCKED) also gives back the hugepages config reserved, turns vfio's
           no-IOMMU mode back off if config turned it on, and unmounts a hugetlbfs mount config
           made. A device whose vfio group or device cdev (/dev/vfio/N, noiommu-N,
           devices/vfioN) a process holds open is left bound and the process named.
  status   devices (address, vendor:device, class, driver, IOMMU group, NUMA node) and
           hugepages per node and size
  help     this text

Devices bound by `config`: NVMe controllers (class 0108) unless PCI_ALLOWED is set; then only
the devices it lists (of any class: NICs are bound only when listed). Devices in use are
skipped and their active users named, whatever the device's class: a device node of it (a
disk, partition, /dev/nvmeN, /dev/ngXnY, ...) that a process holds open (pid and command
named: QEMU's raw disk, a database's O_DIRECT file, nvme-cli), matched by major:minor whatever
the path; a disk below the device (NVMe namespace, SATA disk behind an AHCI controller, ...)
or one of its partitions that is mounted in any mount namespace (matched by major:minor or by
the mount's source, so btrfs, bcachefs and ZFS-style anonymous devices count), used as swap,
held by device-mapper/md/LVM, exported by nvmet (subsystem and port named), a LIO backstore,
backing a loop device, a member of a btrfs or bcachefs filesystem or carrying a ZFS label; a
network interface of the device that is up with an address or a default route, or that is
enslaved to a bridge, bond or VLAN (at any depth) which has one.
A second `config` changes nothing and says so. A device that fails to bind gets its
driver_override cleared and goes back to its driver.

Environment:
  HUGEMEM=MiB          hugepage memory to have reserved (decimal; default 1024; 0 leaves
                       hugepages alone). Never shrinks an existing reservation. If the kernel
                       cannot reserve it all, the previous count is restored and nothing is
                       bound. `reset` gives back what `config` added.
  HUGEPGSZ=kB          hugepage size: 2048 (default) or 1048576
  HUGENODE=N[,N...]    reserve HUGEMEM on each of these NUMA nodes (default: system-wide)
  PCI_ALLOWED="BDF..." only these devices (space or comma separated, 0000:00:04.0 or 00:04.0)
  PCI_BLOCKED="BDF..." never these devices
  TARGET_USER=name     hand /dev/vfio/<group> of the devices ubdirect bound (this run or an
                       earlier one) to this user (on a kernel with IOMMUFD, also their
                       /dev/vfio/devices/vfioN and /dev/iommu) and check its memlock limit (`ulimit -l`)
                       against HUGEMEM. No hugetlbfs mount changes owner: ubdirect allocates
                       hugepages with memfd_create(MFD_HUGETLB), which needs none.
                       `reset` gives every node it handed over back to its former owner
                       (/dev/iommu once no device ubdirect bound is left on vfio-pci).
  UBD_ALLOW_NOIOMMU=1  UNSAFE, on machines without an IOMMU only: `config` turns on vfio's
                       no-IOMMU mode (/sys/module/vfio/parameters/enable_unsafe_noiommu_mode),
                       so bound devices get /dev/vfio/noiommu-N groups and can DMA ANYWHERE in
                       memory. Needs a kernel with CONFIG_VFIO_NOIOMMU; programs must also opt
                       in (DomainOptions::allow_noiommu). Ignored when the IOMMU is on.
  UBD_STATE_DIR=dir    where config records what it changed, for reset: the devices it bound
                       and their drivers, hugepage counts, node owners, no-IOMMU mode and
                       the hugetlbfs mount (default /run/ubdirect)

Exit status: 0 done (or nothing to do; devices skipped because they are in use are named on
stderr), 1 an error or something left undone, 2 bad usage. `config` and `reset` need root.
EOF
}

say() { echo "$me: $*"; }
warn() { echo "$me: warning: $*" >&2; }
die() {
    echo "$me: error: $*" >&2
    exit 1
}
usage_die() {
    echo "$me: error: $*" >&2
    echo "$me: run 'scripts/setup.sh help' for usage" >&2
    exit 2
}

# ---------------------------------------------------------------------------------------------
# sysfs helpers (no lspci)

# norm_bdf ADDR: print the canonical 0000:00:04.0 form, or fail.
norm_bdf() {
    nb=$(printf '%s' "$1" | tr 'A-F' 'a-f')
    case $nb in
    [0-9a-f][0-9a-f][0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[01][0-9a-f].[0-7]) ;;
    [0-9a-f][0-9a-f]:[01][0-9a-f].[0-7]) nb=0000:$nb ;;
    *) return 1 ;;
    esac
    printf '%s\n' "$nb"
}

dev_dir() { printf '%s\n' "$SYS/bus/pci/devices/$1"; }

# read_attr FILE: the file's first line, or empty.
read_attr() {
    ra=
    [ -r "$1" ] && read -r ra <"$1" 2>/dev/null
    printf '%s\n' "$ra"
}

driver_of() {
    do_l=$(readlink "$(dev_dir "$1")/driver" 2>/dev/null) || do_l=
    printf '%s\n' "${do_l##*/}"
}

group_of() {
    go_l=$(readlink "$(dev_dir "$1")/iommu_group" 2>/dev/null) || go_l=
    printf '%s\n' "${go_l##*/}"
}

# class4 ADDR: base class + subclass, e.g. 0108.
class4() {
    c=$(read_attr "$(dev_dir "$1")/class")
    c=${c#0x}
    printf '%s\n' "$c" | cut -c1-4
}

class_name() {
    case $1 in
    0108) echo NVMe ;;
    0200) echo Ethernet ;;
    02*) echo network ;;
    0300) echo VGA ;;
    0302) echo 3D ;;
    03*) echo display ;;
    0500) echo RAM ;;
    05*) echo memory ;;
    01*) echo storage ;;
    06*) echo bridge ;;
    *) echo other ;;
    esac
}

in_list() { # in_list ITEM LIST
    for il in $2; do [ "$il" = "$1" ] && return 0; done
    return 1
}

# Helpers called outside $(...) share the caller's variables (POSIX sh has no `local`): their
# own variables carry a prefix.
has_iommu() {
    for hi_u in "$SYS"/class/iommu/*; do [ -e "$hi_u" ] && return 0; done
    # vfio's no-IOMMU mode makes IOMMU groups of its own (/dev/vfio/noiommu-N): not an IOMMU.
    [ "$(read_attr "$noiommu_param" 2>/dev/null)" = Y ] && return 1
    for hi_g in "$SYS"/kernel/iommu_groups/*; do [ -e "$hi_g" ] && return 0; done
    return 1
}

noiommu_param=$SYS/module/vfio/parameters/enable_unsafe_noiommu_mode

# ---------------------------------------------------------------------------------------------
# input validation: everything is checked before anything is changed

mode=${1:-config}
[ $# -le 1 ] || usage_die "too many arguments: $* (one mode: config, reset, status or help)"
case $mode in
config | reset | status) ;;
help | -h | --help)
    usage
    exit 0
    ;;
*) usage_die "unknown mode '$mode': use config, reset, status or help" ;;
esac

HUGEMEM=${HUGEMEM:-1024}
HUGEPGSZ=${HUGEPGSZ:-2048}
HUGENODE=$(printf '%s' "${HUGENODE:-}" | tr ',' ' ')
TARGET_USER=${TARGET_USER:-}

case $HUGEMEM in
'' | *[!0-9]*) usage_die "HUGEMEM='$HUGEMEM' is not a number of MiB (e.g. HUGEMEM=1024; 0 leaves hugepages alone)" ;;
esac
# Decimal, whatever the leading zeros (sh arithmetic would read 010 as octal 8).
hm=$(printf '%s' "$HUGEMEM" | sed 's/^0*//')
[ ${#hm} -le 9 ] || usage_die "HUGEMEM='$HUGEMEM' is too large (at most 999999999 MiB)"
HUGEMEM=${hm:-0}
case $HUGEPGSZ in
2048 | 1048576) ;;
*) usage_die "HUGEPGSZ='$HUGEPGSZ' is not a hugepage size in kB: use 2048 (2 MiB) or 1048576 (1 GiB)" ;;
esac
for n in $HUGENODE; do
    case $n in
    '' | *[!0-9]*) usage_die "HUGENODE='${HUGENODE}': '$n' is not a NUMA node number (e.g. HUGENODE=0,1)" ;;
    esac
    [ -d "$SYS/devices/system/node/node$n" ] ||
        usage_die "HUGENODE: NUMA node $n does not exist (see $SYS/devices/system/node)"
done
if [ -n "${UBD_ALLOW_NOIOMMU+set}" ] && [ "$UBD_ALLOW_NOIOMMU" != 1 ]; then
    usage_die "UBD_ALLOW_NOIOMMU='$UBD_ALLOW_NOIOMMU' is not understood: set UBD_ALLOW_NOIOMMU=1 to turn on vfio's unsafe no-IOMMU mode (machines without an IOMMU only), or unset it"
fi
if [ "${UBD_ALLOW_NOIOMMU:-}" = 1 ] && [ "$mode" = config ]; then
    warn "UBD_ALLOW_NOIOMMU=1: UNSAFE. Without an IOMMU every device bound to vfio-pci can read and write ALL of memory (a driver bug or a malicious device corrupts the kernel). Use it only on a machine you can lose, never with untrusted users or devices."
fi

# norm_list NAME LIST MUST_EXIST: canonical addresses, or die naming the bad one.
norm_list() {
    nl_out=
    for a in $(printf '%s' "$2" | tr ',' ' '); do
        nl_a=$(norm_bdf "$a") || usage_die "$1: '$a' is not a PCI address (write 0000:00:04.0 or 00:04.0)"
        if [ "$3" = yes ] && [ ! -e "$(dev_dir "$nl_a")" ]; then
            usage_die "$1: no PCI device $nl_a (see '$0 status' or $SYS/bus/pci/devices)"
        fi
        nl_out="$nl_out $nl_a"
    done
    printf '%s\n' "$nl_out"
}
PCI_ALLOWED=$(norm_list PCI_ALLOWED "${PCI_ALLOWED:-}" yes) || exit 2
PCI_BLOCKED=$(norm_list PCI_BLOCKED "${PCI_BLOCKED:-}" no) || exit 2

if [ -n "$TARGET_USER" ]; then
    id -u "$TARGET_USER" >/dev/null 2>&1 ||
        usage_die "TARGET_USER='$TARGET_USER': no such user (create it first, or check the spelling)"
fi

if [ "$HUGEMEM" -gt 0 ] && [ "$mode" = config ] &&
    [ ! -d "$SYS/kernel/mm/hugepages/hugepages-${HUGEPGSZ}kB" ]; then
    die "this kernel has no ${HUGEPGSZ}kB hugepages ($SYS/kernel/mm/hugepages/hugepages-${HUGEPGSZ}kB is missing): try HUGEPGSZ=2048"
fi

# ---------------------------------------------------------------------------------------------
# status

status() {
    if has_iommu; then
        ni=$(ls "$SYS/kernel/iommu_groups" | wc -l)
        iommu="IOMMU on ($ni groups)"
    else
        iommu="no IOMMU"
    fi
    noi=$(read_attr "$noiommu_param")
    [ "$noi" = Y ] && iommu="$iommu; vfio no-IOMMU mode ON (unsafe)"
    echo "$iommu"
    echo
    printf '%-13s %-10s %-16s %-11s %-6s %s\n' BDF VENDOR:DEV CLASS DRIVER GROUP NUMA
    for d in "$SYS"/bus/pci/devices/*; do
        [ -e "$d" ] || continue
        a=${d##*/}
        c=$(class4 "$a")
        drv=$(driver_of "$a")
        case $c in
        0108 | 02* | 03* | 05*) ;;
        *) [ "$drv" = vfio-pci ] || continue ;;
        esac
        v=$(read_attr "$d/vendor")
        p=$(read_attr "$d/device")
        g=$(group_of "$a")
        numa=$(read_attr "$d/numa_node")
        [ "$numa" = -1 ] && numa=-
        printf '%-13s %-10s %-16s %-11s %-6s %s\n' "$a" "${v#0x}:${p#0x}" "$(class_name "$c") ($c)" \
            "${drv:--}" "${g:--}" "${numa:--}"
    done
    echo
    echo "Hugepages"
    printf '%-6s %-12s %-8s %s\n' NODE SIZE TOTAL FREE
    found=no
    for nd in "$SYS"/devices/system/node/node*; do
        [ -d "$nd/hugepages" ] || continue
        for h in "$nd"/hugepages/hugepages-*; do
            [ -d "$h" ] || continue
            found=yes
            printf '%-6s %-12s %-8s %s\n' "${nd##*/node}" "${h##*/hugepages-}" \
                "$(read_attr "$h/nr_hugepages")" "$(read_attr "$h/free_hugepages")"
        done
    done
    if [ $found = no ]; then
        for h in "$SYS"/kernel/mm/hugepages/hugepages-*; do
            [ -d "$h" ] || continue
            printf '%-6s %-12s %-8s %s\n' all "${h##*/hugepages-}" \
                "$(read_attr "$h/nr_hugepages")" "$(read_attr "$h/free_hugepages")"
        done
    fi
    mnt=$(awk '$3 == "hugetlbfs" { print $2 }' /proc/mounts 2>/dev/null | tr '\n' ' ')
    echo "hugetlbfs mounts: ${mnt:-none}"
}

if [ "$mode" = status ]; then
    status
    exit 0
fi

[ "$(id -u)" = 0 ] || die "'$mode' changes drivers and hugepages: run it as root (sudo scripts/setup.sh $mode)"

# ---------------------------------------------------------------------------------------------
# shared by config and reset

changes=0
failed=0

# selected ADDR: in PCI_ALLOWED (when set) and not in PCI_BLOCKED.
selected() {
    in_list "$1" "$PCI_BLOCKED" && return 1
    [ -z "${PCI_ALLOWED# }" ] && return 0
    in_list "$1" "$PCI_ALLOWED"
}

# vfio_users ADDR: the processes holding a vfio node of the device open (" /dev/vfio/N is open
# by PID(COMM);"): its group (/dev/vfio/N, or /dev/vfio/noiommu-N in no-IOMMU mode) and its
# device cdev (/dev/vfio/devices/vfioN, opened through iommufd), whatever path they were opened by.
vfio_users() {
    vu_g=$(group_of "$1")
    vu_specs=$(node_specs_under "$(readlink -f "$(dev_dir "$1")")")
    for vu_c in "$SYS/class/vfio/$vu_g" "$SYS/class/vfio/noiommu-$vu_g"; do
        [ -n "$vu_g" ] && [ -f "$vu_c/dev" ] || continue
        vu_specs="$vu_specs
c $(read_attr "$vu_c/dev") vfio/${vu_c##*/}"
    done
    open_by "$vu_specs"
}

# wait_for PATH: up to 5 s for a device node (udev may create it a moment later).
wait_for() {
    wf_i=0
    while [ ! -e "$1" ] && [ $wf_i -lt 50 ]; do
        sleep 0.1 2>/dev/null || sleep 1
        wf_i=$((wf_i + 1))
    done
    [ -e "$1" ]
}

# remember ADDR DRIVER: note the driver a device had before config (first time only).
remember() {
    mkdir -p "$STATE_DIR" || return 0
    grep -q "^$1 " "$STATE_FILE" 2>/dev/null && return 0
    echo "$1 ${2:-none}" >>"$STATE_FILE"
}

remembered() {
    awk -v a="$1" '$1 == a { print $2; exit }' "$STATE_FILE" 2>/dev/null
}

forget() {
    [ -f "$STATE_FILE" ] || return 0
    awk -v a="$1" '$1 != a' "$STATE_FILE" >"$STATE_FILE.new" && mv "$STATE_FILE.new" "$STATE_FILE"
}

# hand_over NODE: chown NODE to TARGET_USER, noting its owner before the first hand-over.
hand_over() {
    [ "$(stat -c %U "$1")" != "$TARGET_USER" ] || return 0
    if mkdir -p "$STATE_DIR" && ! grep -q "^$1 " "$OWNER_STATE" 2>/dev/null; then
        echo "$1 $(stat -c %u:%g "$1")" >>"$OWNER_STATE"
    fi
    chown "$TARGET_USER" "$1" || die "chown $TARGET_USER $1 failed"
    say "$1 now owned by $TARGET_USER"
    changes=$((changes + 1))
}

# restore_owner NODE...: each NODE config handed over goes back to the owner it had then (root
# when that was not noted); the note is dropped. A node that is gone (its device left vfio-pci)
# is only forgotten.
restore_owner() {
    for ro_n in "$@"; do
        ro_o=$(awk -v n="$ro_n" '$1 == n { print $2; exit }' "$OWNER_STATE" 2>/dev/null)
        if [ -n "$ro_o" ] && [ -e "$ro_n" ]; then
            if chown "$ro_o" "$ro_n"; then
                say "$ro_n given back to $(stat -c %U "$ro_n")"
                changes=$((changes + 1))
            else
                warn "$ro_n: chown $ro_o failed"
                failed=$((failed + 1))
            fi
        fi
        [ -f "$OWNER_STATE" ] || continue
        awk -v n="$ro_n" '$1 != n' "$OWNER_STATE" >"$OWNER_STATE.new" && mv "$OWNER_STATE.new" "$OWNER_STATE"
    done
}

# device_nodes ADDR: the /dev nodes of a device bound to vfio-pci: its group node and, with
# the vfio device cdev, /dev/vfio/devices/vfioN.
device_nodes() {
    dn_g=$(group_of "$1")
    [ -n "$dn_g" ] || return 0
    if [ -e "/dev/vfio/$dn_g" ]; then echo "/dev/vfio/$dn_g"; else echo "/dev/vfio/noiommu-$dn_g"; fi
    for dn_c in "$(dev_dir "$1")"/vfio-dev/vfio*; do
        [ -e "$dn_c" ] && echo "/dev/vfio/devices/${dn_c##*/}"
    done
}

# ---------------------------------------------------------------------------------------------
# config: in-use checks

# MOUNTS: one line per mount of every mount namespace (each namespace read once, through one of
# its processes): "MAJ:MIN SRC_MAJ:MIN SOURCE MOUNTPOINT FSTYPE WHERE", SRC_MAJ:MIN being the
# device the source path names ("-" when it names none) and WHERE "-" for this script's own
# namespace, else "pid(comm)". btrfs, bcachefs and ZFS mounts carry an anonymous MAJ:MIN (0:N):
# only their source names the disk. Built once, on first use.
MOUNTS=
mount_table() {
    [ -n "$MOUNTS" ] && return 0
    MOUNTS=$(mktemp "${TMPDIR:-/tmp}/ubd-setup-mounts.XXXXXX") || die "mktemp failed"
    mt_self=$(readlink /proc/self/ns/mnt 2>/dev/null)
    mt_seen=
    for mt_mi in /proc/self/mountinfo /proc/[0-9]*/mountinfo; do
        mt_pid=${mt_mi#/proc/}
        mt_pid=${mt_pid%/mountinfo}
        # this namespace (read through self): a test, no fork per process
        [ "$mt_pid" != self ] && [ "/proc/$mt_pid/ns/mnt" -ef /proc/self/ns/mnt ] && continue
        mt_ns=$(readlink "/proc/$mt_pid/ns/mnt" 2>/dev/null) || mt_ns="pid$mt_pid"
        case " $mt_seen " in *" $mt_ns "*) continue ;; esac
        mt_seen="$mt_seen $mt_ns"
        mt_where=-
        [ "$mt_pid" = self ] || [ "$mt_ns" = "$mt_self" ] ||
            mt_where="$mt_pid($(read_attr "/proc/$mt_pid/comm"))"
        awk -v w="$mt_where" '{
            for (i = 7; i <= NF && $i != "-"; i++) ;
            print $3, $(i + 2), $5, $(i + 1), w
        }' "$mt_mi" 2>/dev/null
    done | while read -r mt_mm mt_src mt_mp mt_fs mt_w; do
        # the source's own device: a path (bcachefs: several joined by ':') to a block node
        mt_smm=
        case $mt_src in
        /*)
            for mt_p in $(printf '%s\n' "$mt_src" | tr ':' ' '); do
                [ -b "$mt_p" ] || continue
                mt_hex=$(stat -L -c '%t %T' "$mt_p" 2>/dev/null) || continue
                # shellcheck disable=SC2086 # two hex numbers: major minor
                set -- $mt_hex
                [ $# = 2 ] && mt_smm="$mt_smm,$(printf '%d:%d' "0x$1" "0x$2")"
            done
            ;;
        esac
        mt_smm=${mt_smm#,}
        echo "$mt_mm ${mt_smm:--} $mt_src $mt_mp $mt_fs $mt_w"
    done >"$MOUNTS"
}
cleanup() { [ -z "$MOUNTS" ] || rm -f "$MOUNTS"; }
trap cleanup EXIT

# disks_of ADDR: the whole disks below the PCI device (NVMe namespaces, SATA/SAS/virtio disks):
# every /sys/class/block entry whose device path lies under the PCI device, and the block node
# of each NVMe path node nvme<S>c<C>n<N> (native multipath puts the disk elsewhere).
disks_of() {
    do_real=$(readlink -f "$(dev_dir "$1")")
    for do_b in "$SYS"/class/block/*; do
        [ -e "$do_b" ] && [ ! -e "$do_b/partition" ] || continue
        case $(readlink -f "$do_b") in "$do_real"/*) echo "${do_b##*/}" ;; esac
    done
    for do_ns in "$(dev_dir "$1")"/nvme/nvme*/nvme*n*; do
        [ -d "$do_ns" ] || continue
        do_h=$(printf '%s\n' "${do_ns##*/}" | sed 's/c[0-9]*n/n/')
        [ -d "$SYS/class/block/$do_h" ] && echo "$do_h"
    done
}

# zfs_label DEV: succeed when DEV carries a ZFS vdev label: at least 4 uberblocks (magic
# 0x00bab10c, either byte order, at the start of a 1 KiB slot) in the uberblock array
# (bytes 128 KiB..256 KiB) of label 0 or label 1 (the same at 256 KiB), as blkid decides.
zfs_label() {
    for zl_off in 128 384; do
        # od: 16 bytes a line, so a slot starts every 64 lines
        zl_n=$(dd if="$1" bs=1024 skip=$zl_off count=128 2>/dev/null | od -A n -t x8 -v 2>/dev/null |
            awk '(NR - 1) % 64 == 0 && ($1 == "0000000000bab10c" || $1 == "0cb1ba0000000000") { n++ }
                END { print n + 0 }')
        [ "${zl_n:-0}" -ge 4 ] && return 0
    done
    return 1
}

# blk_users DEV: why the block device DEV (a disk or a partition) is in use, if it is.
blk_users() {
    bu_dir=$SYS/class/block/$1
    bu_mm=$(read_attr "$bu_dir/dev")
    if [ -n "$bu_mm" ]; then
        mount_table
        bu_at=$(awk -v mm="$bu_mm" -v dev="/dev/$1" '
            { n = split($2, s, ",") ; hit = ($1 == mm || $3 == dev); for (i = 1; i <= n; i++) if (s[i] == mm) hit = 1 }
            hit { printf " %s (%s%s)", $4, $5, $6 == "-" ? "" : ", mount namespace of " $6 }' "$MOUNTS")
        [ -n "$bu_at" ] && printf ' /dev/%s mounted on%s;' "$1" "$bu_at"
    fi
    awk -v d="/dev/$1" '$1 == d { f = 1 } END { exit !f }' /proc/swaps 2>/dev/null &&
        printf ' /dev/%s is swap;' "$1"
    for bu_h in "$bu_dir"/holders/*; do
        [ -e "$bu_h" ] || continue
        bu_hn=${bu_h##*/}
        bu_dm=$(read_attr "$bu_h/dm/name")
        printf ' /dev/%s held by %s%s;' "$1" "$bu_hn" "${bu_dm:+ (device-mapper $bu_dm)}"
    done
    for bu_f in "$SYS"/fs/btrfs/*/devices/"$1"; do
        [ -e "$bu_f" ] || continue
        bu_f=${bu_f%/devices/*}
        printf ' /dev/%s is a member of btrfs filesystem %s;' "$1" "${bu_f##*/}"
    done
    for bu_f in "$SYS"/fs/bcachefs/*/dev-*/block; do
        [ -e "$bu_f" ] || continue
        [ "$(readlink -f "$bu_f")" = "$(readlink -f "$bu_dir")" ] || continue
        bu_f=${bu_f%/dev-*}
        printf ' /dev/%s is a member of bcachefs filesystem %s;' "$1" "${bu_f##*/}"
    done
    if [ -b "/dev/$1" ]; then
        if command -v zpool >/dev/null 2>&1 &&
            zpool status -P -L 2>/dev/null | awk -v d="/dev/$1" '$1 == d { f = 1 } END { exit !f }'; then
            printf ' /dev/%s is in a ZFS pool (zpool status);' "$1"
        elif zfs_label "/dev/$1"; then
            printf ' /dev/%s carries a ZFS label (pool member; zpool labelclear it if the pool is gone);' "$1"
        fi
    fi
}

# disk_in_use ADDR: why a disk below the device (or one of its partitions) is in use.
disk_in_use() {
    for di_d in $(disks_of "$1" | sort -u); do
        blk_users "$di_d"
        for di_p in "$SYS/class/block/$di_d/$di_d"*; do
            [ -e "$di_p/partition" ] && blk_users "${di_p##*/}"
        done
    done
}

# ifc_users IFC: why the interface IFC carries traffic: up with a global address or a default
# route (IPv4 or IPv6).
ifc_users() {
    iu_flags=$(read_attr "$SYS/class/net/$1/flags")
    [ -n "$iu_flags" ] && [ $((iu_flags & 1)) -eq 1 ] || return 0
    iu_addrs=$(ip -o addr show dev "$1" scope global 2>/dev/null | awk '{ printf " %s", $4 }')
    [ -n "$iu_addrs" ] && printf ' %s is up with address%s;' "$1" "$iu_addrs"
    if awk -v i="$1" 'NR > 1 && $1 == i && $2 == "00000000" { f = 1 } END { exit !f }' \
        /proc/net/route 2>/dev/null ||
        awk -v i="$1" '$1 == "00000000000000000000000000000000" && $2 == "00" && $NF == i { f = 1 }
            END { exit !f }' /proc/net/ipv6_route 2>/dev/null; then
        printf ' %s carries the default route;' "$1"
    fi
}

# nic_in_use ADDR: why a network interface of the device is in use: itself, or any interface
# stacked on it (bridge, bond, VLAN, macvlan: its master and its upper_* links, at any depth).
nic_in_use() {
    ni_real=$(readlink -f "$(dev_dir "$1")")
    for ni_n in "$SYS"/class/net/*; do
        [ -e "$ni_n/device" ] || continue
        case $(readlink -f "$ni_n/device") in "$ni_real" | "$ni_real"/*) ;; *) continue ;; esac
        ni_if=${ni_n##*/}
        ifc_users "$ni_if"
        ni_todo=$ni_if ni_seen=" $ni_if "
        while [ -n "$ni_todo" ]; do
            ni_cur=${ni_todo%% *}
            ni_todo=${ni_todo#"$ni_cur"}
            ni_todo=${ni_todo# }
            for ni_u in "$SYS/class/net/$ni_cur/master" "$SYS/class/net/$ni_cur"/upper_*; do
                [ -e "$ni_u" ] || continue
                ni_up=$(readlink -f "$ni_u")
                ni_up=${ni_up##*/}
                case $ni_seen in *" $ni_up "*) continue ;; esac
                ni_seen="$ni_seen$ni_up "
                ni_todo="$ni_todo${ni_todo:+ }$ni_up"
                ni_w=$(ifc_users "$ni_up")
                [ -n "$ni_w" ] && printf ' %s is enslaved to %s:%s' "$ni_if" "$ni_up" "$ni_w"
            done
        done
    done
}

# node_specs_under DIR: "T MAJ:MIN NAME" for every device node sysfs shows below DIR (T: b for
# a block device, c for a character device; NAME: its DEVNAME, the path below /dev): disks and
# partitions, NVMe controller and generic char devices, SCSI generic, DRM, the vfio device cdev.
# Symlinks are not followed (the driver, the IOMMU group).
node_specs_under() {
    find "$1" -name dev -type f 2>/dev/null | while read -r ns_f; do
        ns_d=${ns_f%/dev}
        ns_mm=$(read_attr "$ns_f")
        case $ns_mm in [0-9]*:[0-9]*) ;; *) continue ;; esac
        ns_t=c
        case $(readlink "$ns_d/subsystem" 2>/dev/null) in */block) ns_t=b ;; esac
        ns_n=$(sed -n 's/^DEVNAME=//p' "$ns_d/uevent" 2>/dev/null)
        echo "$ns_t $ns_mm ${ns_n:-${ns_d##*/}}"
    done
}

# node_specs ADDR: node_specs_under the device, plus the disks below it that sysfs keeps
# elsewhere (native NVMe multipath heads) and their partitions.
node_specs() {
    nsp_real=$(readlink -f "$(dev_dir "$1")")
    node_specs_under "$nsp_real"
    for nsp_d in $(disks_of "$1" | sort -u); do
        case $(readlink -f "$SYS/class/block/$nsp_d") in "$nsp_real"/*) continue ;; esac
        for nsp_b in "$SYS/class/block/$nsp_d" "$SYS/class/block/$nsp_d/$nsp_d"*; do
            [ -f "$nsp_b/dev" ] && echo "b $(read_attr "$nsp_b/dev") ${nsp_b##*/}"
        done
    done
}

# open_by SPECS: the processes holding one of the nodes in SPECS ("T MAJ:MIN NAME" lines) open,
# as " /dev/NAME is open by PID(COMM) ...;" per node. Each open file is matched by the device
# number it points to (stat), so a node opened under any path (a by-id link, a container's
# /dev, a node made with mknod anywhere) counts. Files on network and FUSE filesystems are not
# stat'ed (a dead server would hang it; no device node lives there), nor sockets and pipes.
open_by() {
    [ -n "$1" ] || return 0
    # shellcheck disable=SC2012 # the link targets of /proc/PID/fd, names are fd numbers
    ls -l /proc/[0-9]*/fd/ 2>/dev/null | awk '
        NR == FNR {
            if ($3 ~ /^(nfs4?|cifs|smb3|9p|ceph|glusterfs|afs|lustre|gfs2|ocfs2|fuse.*)$/) skip[++ns] = $2
            next
        }
        /^\/proc\/[0-9]+\/fd\/?:$/ { dir = $0; sub(/\/?:$/, "", dir); next }
        /^l/ {
            for (i = 2; i < NF; i++) if ($i == "->") break
            t = $(i + 1)
            if (i >= NF || t !~ /^\//) next
            for (j = 1; j <= ns; j++)
                if (t == skip[j] || index(t, skip[j] "/") == 1 || skip[j] == "/") next
            print dir "/" $(i - 1)
        }' /proc/mounts - |
        xargs stat -L -c '%F|%t|%T|%n' 2>/dev/null |
        awk -F'|' -v specs="$1" '
            BEGIN {
                n = split(specs, line, "\n")
                for (i = 1; i <= n; i++) {
                    if (split(line[i], f, " ") < 3 || split(f[2], mm, ":") != 2) continue
                    key = f[1] " " sprintf("%x %x", mm[1], mm[2])
                    name[key] = f[3]
                }
            }
            {
                t = $1 ~ /^block/ ? "b" : $1 ~ /^character/ ? "c" : ""
                key = t " " $2 " " $3
                if (!(key in name)) next
                split($4, p, "/")
                if (seen[key, p[3]]++) next
                comm = "?"
                cf = "/proc/" p[3] "/comm"
                if ((getline c < cf) > 0) comm = c
                close(cf)
                if (!(key in who)) order[++k] = key
                who[key] = who[key] " " p[3] "(" comm ")"
            }
            END { for (i = 1; i <= k; i++) printf " /dev/%s is open by%s;", name[order[i]], who[order[i]] }'
}

# kernel_users SPECS: the block devices in SPECS that the kernel itself uses, with no process
# holding them: an enabled nvmet namespace (with its ports), a LIO backstore, a loop device.
kernel_users() {
    ku_specs=$1
    for ku_p in "$SYS"/kernel/config/nvmet/subsystems/*/namespaces/*/device_path \
        "$SYS"/kernel/config/target/core/*/*/udev_path "$SYS"/block/loop*/loop/backing_file; do
        [ -f "$ku_p" ] || continue
        ku_path=$(read_attr "$ku_p")
        [ -b "$ku_path" ] || continue
        ku_hex=$(stat -L -c '%t %T' "$ku_path" 2>/dev/null) || continue
        # shellcheck disable=SC2086 # two hex numbers: major minor
        set -- $ku_hex
        [ $# = 2 ] || continue
        ku_name=$(printf '%s\n' "$ku_specs" | awk -v mm="$(printf '%d:%d' "0x$1" "0x$2")" '$1 == "b" && $2 == mm { print $3; exit }')
        [ -n "$ku_name" ] || continue
        case $ku_p in
        */nvmet/*)
            ku_ns=${ku_p%/device_path}
            [ "$(read_attr "$ku_ns/enable")" = 1 ] || continue
            ku_sub=${ku_ns%/namespaces/*}
            ku_sub=${ku_sub##*/}
            ku_ports=
            for ku_l in "$SYS"/kernel/config/nvmet/ports/*/subsystems/"$ku_sub"; do
                [ -e "$ku_l" ] || continue
                ku_pd=${ku_l%/subsystems/*}
                ku_ports="$ku_ports ${ku_pd##*/} ($(read_attr "$ku_pd/addr_trtype") $(read_attr "$ku_pd/addr_traddr"):$(read_attr "$ku_pd/addr_trsvcid"))"
            done
            printf ' /dev/%s is exported by nvmet: subsystem %s namespace %s, port%s;' "$ku_name" \
                "$ku_sub" "${ku_ns##*/}" "${ku_ports:- none}"
            ;;
        */target/core/*)
            ku_b=${ku_p%/udev_path}
            ku_b=${ku_b#"$SYS"/kernel/config/target/core/}
            printf ' /dev/%s is the LIO backstore %s;' "$ku_name" "$ku_b"
            ;;
        *)
            ku_l=${ku_p%/loop/backing_file}
            printf ' /dev/%s backs /dev/%s;' "$ku_name" "${ku_l##*/}"
            ;;
        esac
    done
}

# in_use ADDR: the device's active users, whatever its class (empty when none).
in_use() {
    disk_in_use "$1"
    nic_in_use "$1"
    iu_specs=$(node_specs "$1")
    open_by "$iu_specs"
    kernel_users "$iu_specs"
}

# ---------------------------------------------------------------------------------------------
# config: steps

# setting_remember WHAT BEFORE [MORE]: note a machine setting config changed ("noiommu N":
# no-IOMMU mode was N; "hugetlbfs DIR mkdir|existed": config mounted DIR), first time only:
# `reset` undoes exactly these.
setting_remember() {
    mkdir -p "$STATE_DIR" || return 0
    grep -q "^$1 " "$SETTINGS" 2>/dev/null && return 0
    echo "$*" >>"$SETTINGS"
}

# noiommu_on: turn on vfio's unsafe no-IOMMU mode (UBD_ALLOW_NOIOMMU=1, no IOMMU).
noiommu_on() {
    if [ ! -e "$SYS/module/vfio" ]; then
        modprobe vfio enable_unsafe_noiommu_mode=1 || die "modprobe vfio failed: is the module installed for $(uname -r)?"
        say "loaded vfio"
        [ "$(read_attr "$noiommu_param")" = Y ] && setting_remember noiommu N
        changes=$((changes + 1))
    fi
    [ -e "$noiommu_param" ] ||
        die "$noiommu_param does not exist: this kernel lacks CONFIG_VFIO_NOIOMMU (Debian's does); boot one with it (scripts/vm/kernel-config/ubd.config) or turn the IOMMU on"
    if [ "$(read_attr "$noiommu_param")" != Y ]; then
        noi_was=$(read_attr "$noiommu_param")
        echo Y >"$noiommu_param" || die "could not write Y to $noiommu_param"
        setting_remember noiommu "${noi_was:-N}"
        warn "vfio no-IOMMU mode is ON: devices bound to vfio-pci now DMA to physical addresses, unprotected"
        changes=$((changes + 1))
    fi
    if [ ! -e "$SYS/bus/pci/drivers/vfio-pci" ]; then
        modprobe vfio-pci || die "modprobe vfio-pci failed: is the module installed for $(uname -r)?"
        say "loaded vfio-pci"
        changes=$((changes + 1))
    fi
}

load_vfio() {
    if ! has_iommu && [ "${UBD_ALLOW_NOIOMMU:-}" = 1 ]; then
        noiommu_on
        return
    fi
    [ "${UBD_ALLOW_NOIOMMU:-}" != 1 ] || say "the IOMMU is on: UBD_ALLOW_NOIOMMU=1 is ignored (no-IOMMU mode stays off)"
    if ! has_iommu; then
        die "no IOMMU ($SYS/kernel/iommu_groups is empty): enable VT-d/AMD-Vi in firmware and boot with intel_iommu=on or amd_iommu=on (or, UNSAFE, opt in to vfio's no-IOMMU mode with UBD_ALLOW_NOIOMMU=1)"
    fi
    for m in vfio vfio_iommu_type1 vfio-pci; do
        case $m in
        vfio-pci) present=$SYS/bus/pci/drivers/vfio-pci ;;
        *) present=$SYS/module/$m ;;
        esac
        [ -e "$present" ] && continue
        modprobe "$m" || die "modprobe $m failed: is the module installed for $(uname -r)?"
        say "loaded $m"
        changes=$((changes + 1))
    done
}

# huge_remember FILE COUNT: note a hugepage count before config first raises it (first time
# only: `reset` restores it).
huge_remember() {
    mkdir -p "$STATE_DIR" || return 0
    grep -q "^$1 " "$HUGE_STATE" 2>/dev/null && return 0
    echo "$1 $2" >>"$HUGE_STATE"
}

# undo_raised: put back every count this run raised ("FILE:COUNT" in RAISED).
undo_raised() {
    for ur in $RAISED; do
        echo "${ur##*:}" >"${ur%:*}" 2>/dev/null
    done
    RAISED=
}

# reserve_pages FILE WANT WHERE: raise the count to WANT, or put it back and stop: a partial
# reservation would leave the machine without free memory (MemAvailable 0) for nothing.
RAISED=
reserve_pages() {
    have=$(read_attr "$1")
    have=${have:-0}
    if [ "$have" -ge "$2" ]; then
        say "hugepages: $have x ${HUGEPGSZ}kB reserved on $3 (HUGEMEM=$HUGEMEM MiB needs $2): unchanged"
        return 0
    fi
    # More than the free memory (less 64 MiB for the system) is refused before the count is
    # touched: the kernel would take every free page while trying, and the machine's processes
    # would meet the OOM killer before the count is put back.
    avail=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
    more=$((($2 - have) * HUGEPGSZ))
    if [ -n "$avail" ] && [ "$more" -gt $((avail - 65536)) ]; then
        die "hugepages: HUGEMEM=$HUGEMEM MiB needs $2 x ${HUGEPGSZ}kB on $3, $((more / 1024)) MiB more than the $have reserved, but only $((avail / 1024)) MiB of memory is available (MemAvailable, of which 64 MiB stay with the system): nothing was changed and no device was bound. Ask for less (HUGEMEM), free memory, or reserve at boot with hugepages=$2 on the kernel command line"
    fi
    echo "$2" >"$1" 2>/dev/null
    got=$(read_attr "$1")
    RAISED="$RAISED $1:$have"
    if [ "${got:-0}" -lt "$2" ]; then
        undo_raised
        die "hugepages: the kernel could reserve only $got of $2 x ${HUGEPGSZ}kB on $3 for HUGEMEM=$HUGEMEM MiB (memory short or fragmented): the reservation is back at $(read_attr "$1") and no device was bound. Ask for less (HUGEMEM), free memory, or reserve at boot with hugepages=$2 on the kernel command line"
    fi
    huge_remember "$1" "$have"
    changes=$((changes + 1))
    say "hugepages: reserved $got x ${HUGEPGSZ}kB on $3 (was $have)"
}

hugepages() {
    [ "$HUGEMEM" -gt 0 ] || return 0
    want=$(((HUGEMEM * 1024 + HUGEPGSZ - 1) / HUGEPGSZ))
    if [ -n "$HUGENODE" ]; then
        for n in $HUGENODE; do
            reserve_pages "$SYS/devices/system/node/node$n/hugepages/hugepages-${HUGEPGSZ}kB/nr_hugepages" \
                "$want" "node $n"
        done
    else
        reserve_pages "$SYS/kernel/mm/hugepages/hugepages-${HUGEPGSZ}kB/nr_hugepages" "$want" "the system"
    fi
    mnt=$(awk '$3 == "hugetlbfs" { print $2; exit }' /proc/mounts)
    if [ -z "$mnt" ]; then
        mnt=/dev/hugepages
        made=mkdir
        [ -d "$mnt" ] && made=existed
        mkdir -p "$mnt" && mount -t hugetlbfs -o "pagesize=${HUGEPGSZ}K" nodev "$mnt" ||
            die "could not mount hugetlbfs on $mnt"
        setting_remember hugetlbfs "$mnt" "$made"
        say "mounted hugetlbfs on $mnt"
        changes=$((changes + 1))
    fi
}

# give_back ADDR DRIVER WHY: binding ADDR failed: clear its driver_override (else the kernel
# would keep offering it to vfio-pci only), let DRIVER (its driver before) take it back, forget
# it, and report.
give_back() {
    echo >"$(dev_dir "$1")/driver_override" 2>/dev/null
    ro_now=$(driver_of "$1")
    if [ -n "$2" ] && [ "$ro_now" != "$2" ]; then
        [ -n "$ro_now" ] && echo "$1" >"$(dev_dir "$1")/driver/unbind" 2>/dev/null
        echo "$1" >"$SYS/bus/pci/drivers_probe" 2>/dev/null
        ro_now=$(driver_of "$1")
    fi
    forget "$1"
    warn "$1: $3; driver_override cleared, the device is on '${ro_now:-no driver}'"
    failed=$((failed + 1))
}

# bind ADDR: hand one device to vfio-pci.
bind_vfio() {
    a=$1
    d=$(dev_dir "$a")
    drv=$(driver_of "$a")
    g=$(group_of "$a")
    if [ "$drv" = vfio-pci ]; then
        say "$a: already bound to vfio-pci (group ${g:-?})"
        BOUND="$BOUND $a"
        [ -n "$(remembered "$a")" ] && OWNED="$OWNED $a"
        return 0
    fi
    c=$(class4 "$a")
    why=$(in_use "$a")
    if [ -n "$why" ]; then
        warn "$a ($(class_name "$c"), ${drv:-no driver}): in use, skipped; active users:$why unmount / swapoff / stop the holder / bring it down first, or list it in PCI_BLOCKED"
        SKIPPED="$SKIPPED $a"
        return 0
    fi
    if [ -z "$g" ] && has_iommu; then
        warn "$a: no IOMMU group although the IOMMU is on: skipped (see dmesg)"
        failed=$((failed + 1))
        return 0
    fi
    remember "$a" "$drv"
    echo vfio-pci >"$d/driver_override" || die "cannot write $d/driver_override"
    if [ -n "$drv" ] && ! echo "$a" >"$d/driver/unbind"; then
        give_back "$a" "$drv" "unbinding from $drv failed"
        return 0
    fi
    echo "$a" >"$SYS/bus/pci/drivers_probe" 2>/dev/null
    changes=$((changes + 1))
    now=$(driver_of "$a")
    g=$(group_of "$a")
    if [ "$now" != vfio-pci ]; then
        give_back "$a" "$drv" "still on '${now:-no driver}' after binding to vfio-pci (see dmesg)"
        return 0
    fi
    node=/dev/vfio/$g
    has_iommu || node=/dev/vfio/noiommu-$g
    if ! wait_for "$node"; then
        warn "$a: bound to vfio-pci but $node did not appear"
        failed=$((failed + 1))
        return 0
    fi
    say "$a ($(class_name "$c")): ${drv:-no driver} -> vfio-pci, group $g ($node)"
    BOUND="$BOUND $a"
    OWNED="$OWNED $a"
}

# warn_groups: name the other members of each bound device's IOMMU group.
warn_groups() {
    seen=
    for a in $BOUND; do
        g=$(group_of "$a")
        [ -n "$g" ] || continue
        in_list "$g" "$seen" && continue
        seen="$seen $g"
        others=
        for m in "$SYS/kernel/iommu_groups/$g/devices"/*; do
            [ -e "$m" ] || continue
            m=${m##*/}
            [ "$m" = "$a" ] && continue
            others="$others $m ($(driver_of "$m" | sed 's/^$/no driver/'))"
        done
        [ -n "$others" ] &&
            warn "IOMMU group $g of $a also holds:$others; vfio needs every device of a group on vfio-pci (or no driver) to open it"
    done
}

# target_user: /dev/vfio/<group> of the devices ubdirect bound (OWNED: by this run, or by an
# earlier one as the state file says) to TARGET_USER; never a group of a device someone else put
# on vfio-pci (a VM's), never a hugetlbfs mount (ubdirect uses memfd hugetlb: no mount needed).
target_user() {
    [ -n "$TARGET_USER" ] || return 0
    for a in $BOUND; do
        if ! in_list "$a" "$OWNED"; then
            say "$a: on vfio-pci but not bound by ubdirect: /dev/vfio/$(group_of "$a") left to its owner"
            continue
        fi
        g=$(group_of "$a")
        node=/dev/vfio/$g
        has_iommu || node=/dev/vfio/noiommu-$g
        [ -e "$node" ] || continue
        # A kernel with IOMMUFD and the vfio device cdev (ubdirect then picks iommufd): the
        # device's /dev/vfio/devices/vfioN and /dev/iommu too.
        cdevs=
        for cd_d in "$(dev_dir "$a")"/vfio-dev/vfio*; do
            [ -e "/dev/vfio/devices/${cd_d##*/}" ] && cdevs="$cdevs /dev/vfio/devices/${cd_d##*/}"
        done
        [ -n "$cdevs" ] && [ -c /dev/iommu ] && cdevs="$cdevs /dev/iommu"
        for node in "$node" $cdevs; do
            hand_over "$node"
        done
    done
    need_kb=$((HUGEMEM * 1024))
    if [ "$need_kb" -eq 0 ]; then
        for h in "$SYS"/kernel/mm/hugepages/hugepages-*kB; do
            [ -d "$h" ] || continue
            sz=${h##*hugepages-}
            sz=${sz%kB}
            need_kb=$((need_kb + $(read_attr "$h/nr_hugepages") * sz))
        done
    fi
    lim=$(su -s /bin/sh "$TARGET_USER" -c 'ulimit -l' 2>/dev/null) || lim=
    case $lim in
    unlimited) say "memlock of $TARGET_USER: unlimited" ;;
    '' | *[!0-9]*) warn "could not read the memlock limit of $TARGET_USER (su failed): it needs at least $need_kb KiB" ;;
    *)
        if [ "$lim" -lt "$need_kb" ]; then
            warn "memlock limit of $TARGET_USER is $lim KiB, the hugepages need $need_kb KiB: add '$TARGET_USER - memlock $need_kb' (or unlimited) to /etc/security/limits.conf and log in again"
        else
            say "memlock of $TARGET_USER: $lim KiB (needs $need_kb KiB)"
        fi
        ;;
    esac
}

config() {
    load_vfio
    hugepages
    mount_table
    BOUND= SKIPPED= OWNED=
    cand=
    if [ -n "${PCI_ALLOWED# }" ]; then
        cand=$PCI_ALLOWED
    else
        for d in "$SYS"/bus/pci/devices/*; do
            [ -e "$d" ] || continue
            [ "$(class4 "${d##*/}")" = 0108 ] && cand="$cand ${d##*/}"
        done
    fi
    for a in $cand; do
        if in_list "$a" "$PCI_BLOCKED"; then
            say "$a: in PCI_BLOCKED, left alone"
            continue
        fi
        bind_vfio "$a"
    done
    [ -n "$cand" ] || say "no devices to bind (no NVMe controllers; list others in PCI_ALLOWED)"
    warn_groups
    target_user
    [ -z "$SKIPPED" ] || warn "skipped (in use):$SKIPPED"
    if [ $changes -eq 0 ] && [ $failed -eq 0 ]; then
        say "config: nothing to do, everything is already set up"
    fi
}

# ---------------------------------------------------------------------------------------------
# reset

default_driver() {
    case $(class4 "$1") in
    0108)
        echo nvme
        return
        ;;
    esac
    # virtio: vendor 0x1af4, devices 0x1000-0x107f (0x1af4:0x1110 is ivshmem: no kernel driver)
    dd_v=$(read_attr "$(dev_dir "$1")/vendor")
    dd_d=$(read_attr "$(dev_dir "$1")/device")
    if [ "$dd_v" = 0x1af4 ] && [ $((dd_d)) -ge $((0x1000)) ] && [ $((dd_d)) -le $((0x107f)) ]; then
        echo virtio-pci
        return
    fi
    # Intel 82576: the virtual function (0x10ca) has its own driver, the physical functions igb;
    # when that driver is neither loaded nor installed, no driver.
    dd_to=none
    if [ "$dd_v" = 0x8086 ]; then
        case $dd_d in
        0x10ca) dd_to=igbvf ;;
        0x10c9 | 0x10e6 | 0x10e7 | 0x10e8 | 0x1526 | 0x150a | 0x1518 | 0x150d) dd_to=igb ;;
        esac
    fi
    if [ "$dd_to" != none ] && { [ -e "$SYS/bus/pci/drivers/$dd_to" ] || modinfo "$dd_to" >/dev/null 2>&1; }; then
        echo "$dd_to"
        return
    fi
    echo none
}

reset_one() {
    a=$1
    d=$(dev_dir "$a")
    users=$(vfio_users "$a")
    if [ -n "$users" ]; then
        warn "$a: in use, left on vfio-pci:$users stop those first (unbinding would block until they let go)"
        failed=$((failed + 1))
        return 0
    fi
    to=$(remembered "$a")
    [ -n "$to" ] && [ "$to" != vfio-pci ] || to=$(default_driver "$a")
    # Its nodes go back before the unbind (a failed unbind leaves them root's, not a user's).
    # shellcheck disable=SC2046 # one node per word
    restore_owner $(device_nodes "$a")
    echo >"$d/driver_override"
    echo "$a" >"$d/driver/unbind" || {
        warn "$a: unbinding from vfio-pci failed"
        failed=$((failed + 1))
        return 0
    }
    changes=$((changes + 1))
    forget "$a"
    if [ "$to" = none ]; then
        say "$a: vfio-pci -> no driver"
        return 0
    fi
    [ -e "$SYS/bus/pci/drivers/$to" ] || modprobe "$to" 2>/dev/null
    echo "$a" >"$SYS/bus/pci/drivers_probe" 2>/dev/null
    now=$(driver_of "$a")
    if [ "$now" != "$to" ] && [ -e "$SYS/bus/pci/drivers/$to" ]; then
        [ -n "$now" ] && echo "$a" >"$d/driver/unbind"
        echo "$a" >"$SYS/bus/pci/drivers/$to/bind" 2>/dev/null
        now=$(driver_of "$a")
    fi
    if [ "$now" = "$to" ]; then
        say "$a: vfio-pci -> $to"
    else
        warn "$a: wanted $to, got '${now:-no driver}' (is the $to module available?)"
        failed=$((failed + 1))
    fi
}

# clear_override ADDR: a device left with driver_override=vfio-pci but not on vfio-pci (a bind
# that failed half-way): clear the override and, when it has no driver, probe its own.
clear_override() {
    echo >"$(dev_dir "$1")/driver_override" || {
        warn "$1: cannot clear driver_override"
        failed=$((failed + 1))
        return 0
    }
    changes=$((changes + 1))
    co_now=$(driver_of "$1")
    if [ -z "$co_now" ]; then
        co_to=$(remembered "$1")
        [ -n "$co_to" ] && [ "$co_to" != vfio-pci ] || co_to=$(default_driver "$1")
        [ "$co_to" = none ] || echo "$1" >"$SYS/bus/pci/drivers_probe" 2>/dev/null
        co_now=$(driver_of "$1")
    fi
    forget "$1"
    say "$1: stale driver_override=vfio-pci cleared (on '${co_now:-no driver}')"
}

# reset_hugepages: put back the hugepage counts `config` raised (full resets only).
reset_hugepages() {
    [ -s "$HUGE_STATE" ] || return 0
    if [ -n "${PCI_ALLOWED# }" ] || [ -n "${PCI_BLOCKED# }" ]; then
        say "hugepages: left as they are (PCI_ALLOWED/PCI_BLOCKED set; a full reset gives them back)"
        return 0
    fi
    while read -r rh_f rh_n; do
        rh_now=$(read_attr "$rh_f")
        [ "${rh_now:-0}" -gt "$rh_n" ] || continue
        echo "$rh_n" >"$rh_f" 2>/dev/null
        rh_got=$(read_attr "$rh_f")
        changes=$((changes + 1))
        if [ "$rh_got" = "$rh_n" ]; then
            say "hugepages: $rh_f back to $rh_n (was $rh_now)"
        else
            warn "hugepages: $rh_f is at $rh_got, wanted $rh_n (was $rh_now)"
            failed=$((failed + 1))
        fi
    done <"$HUGE_STATE"
    rm -f "$HUGE_STATE"
}

# reset_settings: undo what config itself set on the machine (the SETTINGS record; full resets
# only): vfio's no-IOMMU mode goes back off unless a device is still in a no-IOMMU group, a
# hugetlbfs mount config made is unmounted (and its directory removed when config made it).
reset_settings() {
    [ -s "$SETTINGS" ] || return 0
    if [ -n "${PCI_ALLOWED# }" ] || [ -n "${PCI_BLOCKED# }" ]; then
        say "settings: vfio no-IOMMU mode and hugetlbfs mount left as they are (PCI_ALLOWED/PCI_BLOCKED set; a full reset undoes them)"
        return 0
    fi
    : >"$SETTINGS.new"
    while read -r rs_line; do
        # shellcheck disable=SC2086 # the record's words: what, then its values
        set -- $rs_line
        case ${1:-} in
        noiommu) undo_noiommu "${2:-N}" || echo "$rs_line" >>"$SETTINGS.new" ;;
        hugetlbfs) undo_mount "${2:-}" "${3:-}" || echo "$rs_line" >>"$SETTINGS.new" ;;
        esac
    done <"$SETTINGS"
    mv "$SETTINGS.new" "$SETTINGS"
    [ -s "$SETTINGS" ] || rm -f "$SETTINGS"
}

# undo_noiommu BEFORE: put vfio's no-IOMMU mode back to BEFORE (N) unless a device still sits in
# a no-IOMMU group (a device reset left alone: new binds would fail for its owner); fail (keep
# the record) when it stays on.
undo_noiommu() {
    [ "$(read_attr "$noiommu_param")" = Y ] || return 0
    un_left=
    for un_g in "$SYS"/class/vfio/noiommu-*; do
        [ -e "$un_g" ] && un_left="$un_left ${un_g##*/}"
    done
    if [ -n "$un_left" ]; then
        warn "vfio no-IOMMU mode left ON (config turned it on): no-IOMMU groups are still in use:$un_left"
        return 1
    fi
    if echo "${1:-N}" >"$noiommu_param" 2>/dev/null; then
        say "vfio no-IOMMU mode: back to ${1:-N} (config had turned it on)"
        changes=$((changes + 1))
        return 0
    fi
    warn "could not write ${1:-N} to $noiommu_param: vfio no-IOMMU mode is still ON"
    failed=$((failed + 1))
    return 1
}

# undo_mount DIR MADE: unmount the hugetlbfs mount config made on DIR (and remove DIR when MADE
# is "mkdir"); fail (keep the record) when it is busy.
undo_mount() {
    if ! awk -v m="$1" '$2 == m && $3 == "hugetlbfs" { f = 1 } END { exit !f }' /proc/mounts; then
        return 0
    fi
    if ! umount "$1" 2>/dev/null; then
        warn "hugetlbfs on $1 (mounted by config) is busy, left mounted: files in it are in use (fuser -m $1)"
        failed=$((failed + 1))
        return 1
    fi
    say "unmounted hugetlbfs from $1 (config had mounted it)"
    changes=$((changes + 1))
    [ "$2" = mkdir ] && rmdir "$1" 2>/dev/null
    return 0
}

# reset_device ADDR: give one device back when setup.sh bound it (its record); a device on
# vfio-pci that setup.sh did not bind (a VM's, another program's) is left alone and named.
reset_device() {
    rd_d=$(dev_dir "$1")
    rd_rec=$(remembered "$1")
    rd_drv=$(driver_of "$1")
    if [ "$rd_drv" != vfio-pci ]; then
        [ -n "$rd_rec" ] || {
            [ "$(read_attr "$rd_d/driver_override")" = vfio-pci ] && selected "$1" &&
                say "$1: driver_override=vfio-pci left alone: setup.sh did not set it (no record in $STATE_FILE)"
            return 0
        }
        selected "$1" || return 0
        if [ "$(read_attr "$rd_d/driver_override")" = vfio-pci ]; then
            clear_override "$1"
        else
            forget "$1"
            say "$1: on '${rd_drv:-no driver}', no longer on vfio-pci: forgotten"
        fi
        return 0
    fi
    if ! selected "$1"; then
        say "$1: not selected by PCI_ALLOWED/PCI_BLOCKED, left on vfio-pci"
        return 0
    fi
    if [ -z "$rd_rec" ]; then
        say "$1: on vfio-pci but not bound by setup.sh (no record in $STATE_FILE): left alone (a VM's or another program's device); to give it back by hand: echo > $rd_d/driver_override; echo $1 > $SYS/bus/pci/drivers/vfio-pci/unbind; echo $1 > $SYS/bus/pci/drivers_probe"
        return 0
    fi
    reset_one "$1"
}

reset() {
    for d in "$SYS"/bus/pci/devices/*; do
        [ -e "$d" ] || continue
        reset_device "${d##*/}"
    done
    reset_hugepages
    # /dev/iommu serves every device: it goes back once none that ubdirect bound is left.
    [ -s "$STATE_FILE" ] || restore_owner /dev/iommu
    reset_settings
    if [ $changes -eq 0 ] && [ $failed -eq 0 ]; then
        say "reset: nothing to do, no device that setup.sh bound is on vfio-pci"
    fi
}

case $mode in
config) config ;;
reset) reset ;;
esac
[ $failed -eq 0 ]
