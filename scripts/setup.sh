#!/bin/sh
# scripts/setup.sh: prepare a machine for ubdirect, in the manner of SPDK's setup.sh.
# POSIX sh (busybox ash, dash, bash); reads sysfs directly, needs no lspci.
# Run `scripts/setup.sh help` for the modes and knobs.

set -u

me=setup.sh
SYS=/sys
STATE_DIR=${UBD_STATE_DIR:-/run/ubdirect}
STATE_FILE=$STATE_DIR/original-drivers

usage() {
    cat <<'EOF'
Usage: scripts/setup.sh [config|reset|status|help]

Modes:
  config   (default) reserve hugepages, load the vfio modules, bind devices to vfio-pci
  reset    give devices back to their kernel drivers (the one they had before `config`,
           else the class default: nvme for NVMe, virtio-pci for virtio devices)
  status   devices (address, vendor:device, class, driver, IOMMU group, NUMA node) and
           hugepages per node and size
  help     this text

Devices bound by `config`: NVMe controllers (class 0108) unless PCI_ALLOWED is set; then only
the devices it lists (of any class: NICs are bound only when listed). Devices in use are
skipped and named: an NVMe with a mounted filesystem, swap or holder on one of its
namespaces/partitions, a NIC that is up with an address or a default route.
A second `config` changes nothing and says so.

Environment:
  HUGEMEM=MiB          hugepage memory to have reserved (default 1024; 0 leaves hugepages alone).
                       Never shrinks an existing reservation.
  HUGEPGSZ=kB          hugepage size: 2048 (default) or 1048576
  HUGENODE=N[,N...]    reserve HUGEMEM on each of these NUMA nodes (default: system-wide)
  PCI_ALLOWED="BDF..." only these devices (space or comma separated, 0000:00:04.0 or 00:04.0)
  PCI_BLOCKED="BDF..." never these devices
  TARGET_USER=name     hand /dev/vfio/<group> and the hugetlbfs mount to this user and check
                       its memlock limit (`ulimit -l`) against HUGEMEM
  UBD_ALLOW_NOIOMMU=yes  allow vfio's unsafe no-IOMMU mode when the machine has no IOMMU
                       (devices can then DMA anywhere; needs CONFIG_VFIO_NOIOMMU)
  UBD_STATE_DIR=dir    where the original drivers are remembered (default /run/ubdirect)

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
UBD_ALLOW_NOIOMMU=${UBD_ALLOW_NOIOMMU:-no}

case $HUGEMEM in
'' | *[!0-9]*) usage_die "HUGEMEM='$HUGEMEM' is not a number of MiB (e.g. HUGEMEM=1024; 0 leaves hugepages alone)" ;;
esac
HUGEMEM=$((HUGEMEM + 0))
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
case $UBD_ALLOW_NOIOMMU in
yes | no) ;;
*) usage_die "UBD_ALLOW_NOIOMMU='$UBD_ALLOW_NOIOMMU': write yes to allow vfio's unsafe no-IOMMU mode, or leave it unset" ;;
esac

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

# group_users GROUP: "pid(name)" of the processes holding /dev/vfio/GROUP open.
group_users() {
    gu=
    for fd in /proc/[0-9]*/fd/*; do
        t=$(readlink "$fd" 2>/dev/null) || continue
        if [ "$t" = "/dev/vfio/$1" ]; then
            pid=${fd#/proc/}
            pid=${pid%%/*}
            gu="$gu $pid($(read_attr "/proc/$pid/comm"))"
        fi
    done
    printf '%s\n' "$gu"
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

# ---------------------------------------------------------------------------------------------
# config: in-use checks

# nvme_in_use ADDR: print why the NVMe controller is in use, if it is: a namespace or a
# partition mounted (matched by major:minor in /proc/self/mountinfo), used as swap, or held
# (device-mapper, md).
nvme_in_use() {
    why=
    for ns in "$(dev_dir "$1")"/nvme/nvme*/nvme*n*; do
        [ -d "$ns" ] || continue
        # A multipath path node nvme<S>c<C>n<N> stands for the block device nvme<S>n<N>.
        head=$(printf '%s\n' "${ns##*/}" | sed 's/c[0-9]*n/n/')
        for blk in "$SYS/block/$head" "$SYS/block/$head/$head"p*; do
            [ -d "$blk" ] || continue
            b=${blk##*/}
            mm=$(read_attr "$blk/dev")
            at=$(awk -v mm="$mm" '$3 == mm { printf " %s", $5 }' /proc/self/mountinfo 2>/dev/null)
            [ -n "$mm" ] && [ -n "$at" ] && why="$why /dev/$b mounted on$at;"
            if awk -v d="/dev/$b" '$1 == d { f = 1 } END { exit !f }' /proc/swaps 2>/dev/null; then
                why="$why /dev/$b is swap;"
            fi
            for h in "$blk"/holders/*; do
                [ -e "$h" ] && why="$why /dev/$b held by ${h##*/};"
            done
        done
    done
    printf '%s\n' "$why"
}

# nic_in_use ADDR: print why the NIC is in use (up with an address or a default route).
nic_in_use() {
    why=
    for n in "$(dev_dir "$1")"/net/* "$(dev_dir "$1")"/virtio*/net/*; do
        [ -d "$n" ] || continue
        ifc=${n##*/}
        flags=$(read_attr "$n/flags")
        [ -n "$flags" ] && [ $((flags & 1)) -eq 1 ] || continue
        addrs=$(ip -o addr show dev "$ifc" scope global 2>/dev/null | awk '{ printf " %s", $4 }')
        [ -n "$addrs" ] && why="$why $ifc is up with address$addrs;"
        if awk -v i="$ifc" 'NR > 1 && $1 == i && $2 == "00000000" { f = 1 } END { exit !f }' \
            /proc/net/route 2>/dev/null; then
            why="$why $ifc carries the default route;"
        fi
    done
    printf '%s\n' "$why"
}

# ---------------------------------------------------------------------------------------------
# config: steps

load_vfio() {
    if ! has_iommu; then
        if [ "$UBD_ALLOW_NOIOMMU" != yes ]; then
            die "no IOMMU ($SYS/kernel/iommu_groups is empty): enable VT-d/AMD-Vi in firmware and boot with intel_iommu=on or amd_iommu=on; or set UBD_ALLOW_NOIOMMU=yes for vfio's unsafe no-IOMMU mode (no DMA isolation)"
        fi
        [ -e "$noiommu_param" ] || modprobe vfio enable_unsafe_noiommu_mode=1 2>/dev/null
        if [ ! -e "$noiommu_param" ]; then
            die "UBD_ALLOW_NOIOMMU=yes but this kernel has no CONFIG_VFIO_NOIOMMU ($noiommu_param is missing): no-IOMMU mode is impossible here; enable the IOMMU instead"
        fi
        if [ "$(read_attr "$noiommu_param")" != Y ]; then
            echo Y >"$noiommu_param" || die "could not enable vfio no-IOMMU mode"
            warn "vfio no-IOMMU mode ENABLED (UBD_ALLOW_NOIOMMU=yes): bound devices can DMA anywhere in memory"
            changes=$((changes + 1))
        else
            warn "vfio no-IOMMU mode is on: bound devices can DMA anywhere in memory"
        fi
    elif [ "$UBD_ALLOW_NOIOMMU" = yes ]; then
        say "an IOMMU is present: UBD_ALLOW_NOIOMMU=yes is not needed and changes nothing"
    fi
    for m in vfio vfio_iommu_type1 vfio-pci; do
        case $m in
        vfio-pci) present=$SYS/bus/pci/drivers/vfio-pci ;;
        *) present=$SYS/module/$m ;;
        esac
        [ -e "$present" ] && continue
        has_iommu || [ "$m" != vfio_iommu_type1 ] || continue
        modprobe "$m" || die "modprobe $m failed: is the module installed for $(uname -r)?"
        say "loaded $m"
        changes=$((changes + 1))
    done
}

# reserve_pages FILE WANT WHERE
reserve_pages() {
    have=$(read_attr "$1")
    if [ "${have:-0}" -ge "$2" ]; then
        say "hugepages: $have x ${HUGEPGSZ}kB reserved on $3 (HUGEMEM=$HUGEMEM MiB needs $2): unchanged"
        return 0
    fi
    echo "$2" >"$1" 2>/dev/null
    got=$(read_attr "$1")
    changes=$((changes + 1))
    if [ "${got:-0}" -lt "$2" ]; then
        warn "hugepages: only $got of $2 x ${HUGEPGSZ}kB reserved on $3 (memory fragmented or short): free memory, or reserve at boot with hugepages=$2 on the kernel command line"
        failed=$((failed + 1))
    else
        say "hugepages: reserved $got x ${HUGEPGSZ}kB on $3 (was $have)"
    fi
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
        mkdir -p "$mnt" && mount -t hugetlbfs -o "pagesize=${HUGEPGSZ}K" nodev "$mnt" ||
            die "could not mount hugetlbfs on $mnt"
        say "mounted hugetlbfs on $mnt"
        changes=$((changes + 1))
    fi
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
        return 0
    fi
    c=$(class4 "$a")
    case $c in
    0108) why=$(nvme_in_use "$a") ;;
    02*) why=$(nic_in_use "$a") ;;
    *) why= ;;
    esac
    if [ -n "$why" ]; then
        warn "$a ($(class_name "$c"), $drv): in use, skipped:$why unmount / swapoff / bring it down first, or list it in PCI_BLOCKED"
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
    [ -n "$drv" ] && echo "$a" >"$d/driver/unbind"
    echo "$a" >"$SYS/bus/pci/drivers_probe" 2>/dev/null
    changes=$((changes + 1))
    now=$(driver_of "$a")
    g=$(group_of "$a")
    if [ "$now" != vfio-pci ]; then
        warn "$a: still on '${now:-no driver}' after binding to vfio-pci (see dmesg)"
        failed=$((failed + 1))
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

target_user() {
    [ -n "$TARGET_USER" ] || return 0
    for a in $BOUND; do
        g=$(group_of "$a")
        node=/dev/vfio/$g
        has_iommu || node=/dev/vfio/noiommu-$g
        [ -e "$node" ] || continue
        if [ "$(stat -c %U "$node")" != "$TARGET_USER" ]; then
            chown "$TARGET_USER" "$node" || die "chown $TARGET_USER $node failed"
            say "$node now owned by $TARGET_USER"
            changes=$((changes + 1))
        fi
    done
    for mnt in $(awk '$3 == "hugetlbfs" { print $2 }' /proc/mounts); do
        if [ "$(stat -c %U "$mnt")" != "$TARGET_USER" ]; then
            chown "$TARGET_USER" "$mnt" || die "chown $TARGET_USER $mnt failed"
            say "hugetlbfs $mnt now owned by $TARGET_USER"
            changes=$((changes + 1))
        fi
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
    BOUND= SKIPPED=
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
    echo none
}

reset_one() {
    a=$1
    d=$(dev_dir "$a")
    g=$(group_of "$a")
    users=$(group_users "$g")
    if [ -n "$g" ] && [ -n "$users" ]; then
        warn "$a: /dev/vfio/$g is open by$users: skipped (stop those first; unbinding would block)"
        failed=$((failed + 1))
        return 0
    fi
    to=$(remembered "$a")
    [ -n "$to" ] && [ "$to" != vfio-pci ] || to=$(default_driver "$a")
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

reset() {
    for d in "$SYS"/bus/pci/devices/*; do
        [ -e "$d" ] || continue
        a=${d##*/}
        [ "$(driver_of "$a")" = vfio-pci ] || continue
        if ! selected "$a"; then
            say "$a: not selected by PCI_ALLOWED/PCI_BLOCKED, left on vfio-pci"
            continue
        fi
        reset_one "$a"
    done
    if [ $changes -eq 0 ] && [ $failed -eq 0 ]; then
        say "reset: nothing to do, no device is bound to vfio-pci"
    fi
}

case $mode in
config) config ;;
reset) reset ;;
esac
[ $failed -eq 0 ]
