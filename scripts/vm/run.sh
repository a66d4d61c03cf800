#!/usr/bin/env bash
# Run a command line in the ubdirect QEMU guest and return its output and exit status.
#
#   scripts/vm/run.sh [options] -- <command line run by the guest's sh in /ubd>
#
# Options (each also settable by the environment variable shown):
#   --kernel 6.12|6.1|ubd  guest kernel: Debian's 6.12 / 6.1, or ubd, built from linux-source-7.3
#                          with IOMMUFD, vfio cdev, no-IOMMU, dma-buf, NVMe-oF built in
#                          (scripts/vm/kernel-build.sh)             (UBD_VM_KERNEL, 6.12)
#   --no-iommu             no emulated IOMMU; vfio in unsafe no-IOMMU mode
#                          (vfio.enable_unsafe_noiommu_mode=1; needs --kernel ubd; the guest
#                          sees UBD_VM_NO_IOMMU=1)                  (UBD_VM_NO_IOMMU=1)
#   --devices "LIST"       device blocks, any of: nvme0 nvme1 ivshmem nic0 nic1 nvmemdts0 nicmq nvmecmb sata igb
#                          (igb: two Intel 82576 NICs on their own hub; nvmemdts0: an MDTS-0 controller; nicmq: a 2-queue virtio-net NIC on a
#                          tap in a private network namespace, needs root; nvmecmb: a controller
#                          with a 1 MiB Controller Memory Buffer) (UBD_VM_DEVICES, all)
#   --extra-qemu "ARGS"    more QEMU arguments, word-split          (UBD_VM_QEMU_EXTRA)
#   --append "ARGS"        more kernel command-line arguments       (UBD_VM_APPEND)
#   --mem SIZE --smp N     guest memory and vCPUs            (UBD_VM_MEM 3584M, UBD_VM_SMP 2)
#                          (with 3G the 1 GiB hugepage finds no free aligned gigabyte at boot)
#   --hugepages "ARGS"     hugepage kernel arguments                (UBD_VM_HUGEPAGES)
#   --tick periodic|oneshot the guest's timer tick: periodic (nohz=off highres=off: a lost
#                          timer interrupt is followed by the next one, 4 ms later) or the
#                          kernel's own one-shot high-resolution timers (the benchmarks use it:
#                          sub-millisecond sleeps)                  (UBD_VM_TICK, periodic)
#   --timeout SECONDS      deadline; the guest is killed and the run fails (UBD_VM_TIMEOUT, 900)
#   --files DIR            copy DIR's contents into the guest's /ubd (repeatable)
#   --bin FILE             an executable for the guest's /ubd/bin (PATH), libraries included
#   --test-bin FILE        a test executable for /ubd/tests-bin (run by the test plan)
#   --env NAME=VALUE       exported in the guest (repeatable)
#   --peer listen|connect:PATH:IP/LEN
#                          one more virtio-net NIC (0000:00:0c.0, on its kernel driver, UBD_NIC_PEER)
#                          joined to another guest's by a QEMU stream socket at the unix PATH
#                          (listen: this guest makes it; connect: retried until it exists); /init
#                          gives it IP/LEN. scripts/vm/pair.sh boots two guests this way. (UBD_VM_PEER)
#   --qmp SOCKET           also open a QMP monitor on this unix socket (hot-plug, throttling
#                          and other faults driven from the host, e.g. by scripts/soak.sh) (UBD_VM_QMP)
#   --run-dir DIR          where backing files and logs go (default: a fresh
#                          .vm-cache/runs/<time>-<pid>; the last UBD_VM_KEEP_RUNS=8 are kept)
#
# Always in the guest: scripts/ and tests/guest/ of this repository (in /ubd), target/debug/ubdirect
# when built and no other --bin .../ubdirect is given (in /ubd/bin), bash, busybox, bind-vfio,
# bind-kernel, ubd-plan.
# Exit status: the guest command's status; 124 when the deadline killed the guest; 125 when the
# guest stopped without reporting a status (kernel panic, /init died); 123 when the guest froze
# (its heartbeat, written every 2 s by /init to a second serial port, stopped for
# UBD_VM_FREEZE_DEADLINE seconds, default 120, 0 = no watch; or a vCPU had no timer for 100 s:
# "GUEST-CPU-STALL"): QEMU's threads and every vCPU's registers go to freeze-diag.log and QEMU
# is stopped; 2 for a setup error.
# A guest that dies before reaching /init, or does not reach it within UBD_VM_BOOT_DEADLINE
# seconds (default 300; a TCG boot can hang on a starved vCPU), is booted once more
# (UBD_VM_BOOT_ATTEMPTS=2).
# The whole script is one { ...; exit; } block: bash parses it all before running any of it, so
# editing this file while a (long) run is in progress cannot make that run execute fragments of
# the new text. (It did: a run resumed mid-way into the awk program below and ran
# `printf "" > dm`, leaving an empty file `dm` in the repository root.)
{
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

UBD_VM_DEVICES=${UBD_VM_DEVICES:-nvme0 nvme1 ivshmem nic0 nic1 nvmemdts0 nicmq nvmecmb sata igb}
UBD_VM_QEMU_EXTRA=${UBD_VM_QEMU_EXTRA:-}
UBD_VM_APPEND=${UBD_VM_APPEND:-}
UBD_VM_MEM=${UBD_VM_MEM:-3584M}
UBD_VM_SMP=${UBD_VM_SMP:-2}
UBD_VM_HUGEPAGES=${UBD_VM_HUGEPAGES:-default_hugepagesz=2M hugepagesz=2M hugepages=768 hugepagesz=1G hugepages=1}
UBD_VM_TIMEOUT=${UBD_VM_TIMEOUT:-900}
UBD_VM_TICK=${UBD_VM_TICK:-periodic}
UBD_VM_KEEP_RUNS=${UBD_VM_KEEP_RUNS:-8}
UBD_VM_STRIP=${UBD_VM_STRIP:-1}
UBD_VM_QMP=${UBD_VM_QMP:-}
UBD_VM_FREEZE_DEADLINE=${UBD_VM_FREEZE_DEADLINE:-120}
UBD_VM_NO_IOMMU=${UBD_VM_NO_IOMMU:-0}
UBD_VM_PEER=${UBD_VM_PEER:-}
files=() bins=() test_bins=() envs=() run_dir=

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit 2
}

while (($# > 0)); do
    case $1 in
    --kernel) UBD_VM_KERNEL=$2 && shift 2 ;;
    --devices) UBD_VM_DEVICES=$2 && shift 2 ;;
    --extra-qemu) UBD_VM_QEMU_EXTRA="$UBD_VM_QEMU_EXTRA $2" && shift 2 ;;
    --append) UBD_VM_APPEND="$UBD_VM_APPEND $2" && shift 2 ;;
    --mem) UBD_VM_MEM=$2 && shift 2 ;;
    --smp) UBD_VM_SMP=$2 && shift 2 ;;
    --hugepages) UBD_VM_HUGEPAGES=$2 && shift 2 ;;
    --tick) UBD_VM_TICK=$2 && shift 2 ;;
    --timeout) UBD_VM_TIMEOUT=$2 && shift 2 ;;
    --files) files+=("$2") && shift 2 ;;
    --bin) bins+=("$2") && shift 2 ;;
    --test-bin) test_bins+=("$2") && shift 2 ;;
    --env) envs+=("$2") && shift 2 ;;
    --run-dir) run_dir=$2 && shift 2 ;;
    --qmp) UBD_VM_QMP=$2 && shift 2 ;;
    --no-iommu) UBD_VM_NO_IOMMU=1 && shift ;;
    --peer) UBD_VM_PEER=$2 && shift 2 ;;
    -h | --help) usage ;;
    --) shift && break ;;
    *) vm_die "unknown option '$1' (the guest command goes after --; see --help)" ;;
    esac
done
(($# > 0)) || vm_die "no command: scripts/vm/run.sh [options] -- <command line> (see --help)"
guest_cmd="$*"
[[ $UBD_VM_TIMEOUT =~ ^[0-9]+$ ]] || vm_die "--timeout wants whole seconds, got '$UBD_VM_TIMEOUT'"
case $UBD_VM_TICK in
periodic) tick_arg='nohz=off highres=off' ;;
oneshot) tick_arg= ;;
*) vm_die "--tick wants periodic or oneshot, got '$UBD_VM_TICK'" ;;
esac
[[ $UBD_VM_NO_IOMMU == 0 || $UBD_VM_KERNEL == ubd ]] ||
    vm_die "--no-iommu needs --kernel ubd: Debian's $UBD_VM_KERNEL kernel has no CONFIG_VFIO_NOIOMMU"
peer_args=() peer_ip=
if [[ -n $UBD_VM_PEER ]]; then
    [[ $UBD_VM_PEER =~ ^(listen|connect):(/[^:,]+):([0-9.]+/[0-9]+)$ ]] ||
        vm_die "--peer wants listen:PATH:IP/LEN or connect:PATH:IP/LEN (e.g. listen:/tmp/ubd-pair.sock:10.77.0.1/24), got '$UBD_VM_PEER'"
    peer_ip=${BASH_REMATCH[3]}
    if [[ ${BASH_REMATCH[1]} == listen ]]; then
        rm -f "${BASH_REMATCH[2]}"
        peer_args=(-netdev "stream,id=peer0,server=on,addr.type=unix,addr.path=${BASH_REMATCH[2]}")
    else
        peer_args=(-netdev "stream,id=peer0,server=off,reconnect-ms=500,addr.type=unix,addr.path=${BASH_REMATCH[2]}")
    fi
    # The MAC's last byte: the IP's last byte (two guests on one link need two MACs).
    last=${peer_ip%/*}
    last=${last##*.}
    peer_args+=(-device "virtio-net-pci,netdev=peer0,mac=52:54:00:00:01:$(printf %02x "$((last & 255))"),romfile=,addr=0c.0")
fi
command -v qemu-system-x86_64 >/dev/null || vm_die "qemu-system-x86_64 not found: run scripts/deps.sh"
for d in $UBD_VM_DEVICES; do
    case $d in nvme0 | nvme1 | ivshmem | nic0 | nic1 | nvmemdts0 | nicmq | nvmecmb | sata | igb) ;; *)
        vm_die "unknown device block '$d' in --devices/UBD_VM_DEVICES (known: nvme0 nvme1 ivshmem nic0 nic1 nvmemdts0 nicmq nvmecmb sata igb)" ;;
    esac
done
# The multiqueue NIC's backend is a 2-queue tap that QEMU opens in a private network namespace
# (gone with the run: no host network change, no traffic anywhere).
# A caller that made the namespace and the tap itself (drivers/virtio-net/bench/mq-check.sh, to
# feed it traffic) is used as it is.
netns=()
if [[ " $UBD_VM_DEVICES " == *" nicmq "* ]] && ! ip link show ubdmq0 >/dev/null 2>&1; then
    unshare -n true 2>/dev/null && [[ -c /dev/net/tun ]] ||
        vm_die "the multiqueue NIC (device block nicmq) needs root and /dev/net/tun for its tap in a private network namespace: run as root, or leave it out with --devices \"nvme0 nvme1 ivshmem nic0 nic1 nvmemdts0\" (its test then reports a skip)"
    netns=(unshare -n sh -c 'ip tuntap add dev ubdmq0 mode tap multi_queue && ip link set ubdmq0 up && exec "$@"' ubd-netns)
fi

t_start=$(date +%s.%N)
mkdir -p "$UBD_VM_CACHE"
# Several runs may share the cache (one working tree, several users): prepare under a lock.
exec 4>"$UBD_VM_CACHE/.prepare.lock"
flock 4
kdir=$("$UBD_VM_DIR/kernel.sh" "$UBD_VM_KERNEL")
base=$("$UBD_VM_DIR/initramfs.sh" "$kdir")
images=$("$UBD_VM_DIR/images.sh")

# ---- the run directory: backing files, logs ----
runs="$UBD_VM_CACHE/runs"
if [[ -z $run_dir ]]; then
    mkdir -p "$runs"
    # Keep the newest UBD_VM_KEEP_RUNS-1 old runs (each holds 256 MiB of backing files); a run
    # still in progress (its .lock held) is never removed.
    { ls -1dt "$runs"/2* 2>/dev/null || true; } | tail -n "+$UBD_VM_KEEP_RUNS" | while read -r old; do
        if flock -n "$old/.lock" true 2>/dev/null || [[ ! -e $old/.lock ]]; then rm -rf "$old"; fi
    done
    run_dir="$runs/$(date +%Y%m%d-%H%M%S)-$$"
    ln -sfn "$(basename "$run_dir")" "$runs/latest"
fi
mkdir -p "$run_dir"
run_dir=$(cd "$run_dir" && pwd)
exec 5>"$run_dir/.lock"
flock 5
exec 4>&-
vm_log "run directory: $run_dir"
# For scripts driving run.sh (suite.sh): where this run's files are.
if [[ -n ${UBD_VM_RUN_DIR_FILE:-} ]]; then echo "$run_dir" >"$UBD_VM_RUN_DIR_FILE"; fi

for f in nvme0.img nvme1-ns1.img nvme1-ns2.img; do
    cp --sparse=never "$images/$f" "$run_dir/$f"
done
rm -f "$run_dir/gpubar"
truncate -s 64M "$run_dir/gpubar"
if [[ " $UBD_VM_DEVICES " == *" nvmemdts0 "* ]]; then
    rm -f "$run_dir/nvme-mdts0.img"
    truncate -s 64M "$run_dir/nvme-mdts0.img"
fi
if [[ " $UBD_VM_DEVICES " == *" nvmecmb "* ]]; then
    rm -f "$run_dir/nvme-cmb.img"
    truncate -s 64M "$run_dir/nvme-cmb.img"
fi
if [[ " $UBD_VM_DEVICES " == *" sata "* ]]; then
    rm -f "$run_dir/sata.img"
    truncate -s 16M "$run_dir/sata.img"
fi

# ---- the per-run initramfs layer: /init, project files, binaries and their libraries ----
stage="$run_dir/initrd.d"
rm -rf "$stage"
mkdir -p "$stage/ubd/bin" "$stage/ubd/tests-bin" "$stage/ubd/tests"

# add_elf SRC DEST: copy an executable (debug info stripped) and the libraries ldd lists.
add_elf() {
    local src=$1 dst="$stage$2" lib
    mkdir -p "$(dirname "$dst")"
    if [[ $UBD_VM_STRIP == 1 ]] && strip --strip-debug -o "$dst" "$src" 2>/dev/null; then
        :
    else
        cp -L "$src" "$dst"
    fi
    chmod +x "$dst"
    for lib in $(ldd "$src" 2>/dev/null | grep -o '/[^ ]*' || true); do
        [[ -e $stage$lib ]] && continue
        mkdir -p "$(dirname "$stage$lib")"
        cp -L "$lib" "$stage$lib"
    done
}

install -m 0755 "$UBD_VM_DIR/guest/init" "$stage/init"
for h in bind-vfio bind-kernel ubd-plan cpuwatch in-testbed; do
    install -m 0755 "$UBD_VM_DIR/guest/$h" "$stage/ubd/bin/$h"
done
add_elf /bin/bash /bin/bash
cp -a "$UBD_REPO/scripts" "$stage/ubd/scripts"
if [[ -d $UBD_REPO/tests/guest ]]; then cp -a "$UBD_REPO/tests/guest" "$stage/ubd/tests/guest"; fi
default_cli="${CARGO_TARGET_DIR:-$UBD_REPO/target}/debug/ubdirect"
if [[ -x $default_cli && " ${bins[*]##*/} " != *" ubdirect "* ]]; then add_elf "$default_cli" /ubd/bin/ubdirect; fi
for d in "${files[@]}"; do
    [[ -d $d ]] || vm_die "--files $d: not a directory"
    cp -a "$d/." "$stage/ubd/"
done
for b in "${bins[@]}"; do
    [[ -f $b ]] || vm_die "--bin $b: no such file"
    add_elf "$b" "/ubd/bin/$(basename "$b")"
done
for b in "${test_bins[@]}"; do
    [[ -f $b ]] || vm_die "--test-bin $b: no such file"
    add_elf "$b" "/ubd/tests-bin/$(basename "$b")"
done
# The host's repository path also leads to /ubd, for tests that name files by it.
mkdir -p "$stage$(dirname "$UBD_REPO")"
ln -sfn /ubd "$stage$UBD_REPO"

printf '%s\n' "$guest_cmd" >"$stage/ubd/cmd"
# The roles of the extra devices, by the addresses given to them below (the guest's /init exports
# UBD_NVME_MDTS0 and UBD_NIC_MQ from these and keeps them out of UBD_NVME and UBD_NICS).
roles=
[[ " $UBD_VM_DEVICES " == *" nvmemdts0 "* ]] && roles="$roles 0000:00:0a.0=nvme_mdts0"
[[ " $UBD_VM_DEVICES " == *" nicmq "* ]] && roles="$roles 0000:00:09.0=nic_mq"
[[ " $UBD_VM_DEVICES " == *" nvmecmb "* ]] && roles="$roles 0000:00:0b.0=nvme_cmb"
[[ -n $UBD_VM_PEER ]] && roles="$roles 0000:00:0c.0=nic_peer"
{
    echo "export UBD_RUN_DIR='$run_dir'"
    echo "export UBD_VM_ROLES='${roles# }'"
    echo "export UBD_VM_KERNEL='$UBD_VM_KERNEL' UBD_VM_NO_IOMMU='$UBD_VM_NO_IOMMU' UBD_PEER_IP='$peer_ip'"
    for e in "${envs[@]}"; do
        [[ $e == *=* ]] || vm_die "--env wants NAME=VALUE, got '$e'"
        printf "export %s='%s'\n" "${e%%=*}" "$(printf '%s' "${e#*=}" | sed "s/'/'\\\\''/g")"
    done
} >"$stage/ubd/env"

initrd="$run_dir/initrd.cpio"
{
    cat "$base"
    (cd "$stage" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
        cpio --null -o -H newc --owner 0:0 --quiet)
} >"$initrd"
rm -rf "$stage"
vm_log "initramfs: $(($(stat -c %s "$initrd") >> 20)) MiB (base $(($(stat -c %s "$base") >> 20)) MiB)"

# ---- the machine ----
dev_args=()
for d in $UBD_VM_DEVICES; do
    case $d in
    nvme0)
        dev_args+=(-drive "file=$run_dir/nvme0.img,if=none,id=nv0,format=raw"
            -device "nvme,id=nvme0,serial=ubd0,drive=nv0,addr=04.0") ;;
    nvme1)
        dev_args+=(-device "nvme,id=nvme1,serial=ubd1,mdts=2,addr=05.0"
            -drive "file=$run_dir/nvme1-ns1.img,if=none,id=nv1n1,format=raw"
            -device "nvme-ns,drive=nv1n1,bus=nvme1,nsid=1"
            -drive "file=$run_dir/nvme1-ns2.img,if=none,id=nv1n2,format=raw"
            -device "nvme-ns,drive=nv1n2,bus=nvme1,nsid=2,logical_block_size=4096,physical_block_size=4096") ;;
    ivshmem)
        dev_args+=(-object "memory-backend-file,id=gpubar,share=on,mem-path=$run_dir/gpubar,size=64M"
            -device "ivshmem-plain,memdev=gpubar,addr=06.0") ;;
    nic0 | nic1)
        n=${d#nic}
        dev_args+=(-netdev "hubport,id=hp$n,hubid=0"
            -device "virtio-net-pci,netdev=hp$n,disable-legacy=on,iommu_platform=on,mac=52:54:00:00:00:0$((n + 1)),romfile=,addr=0$((7 + n)).0") ;;
    nicmq)
        # 2 queue pairs + the control queue: 2 * 2 + 1 MSI-X vectors and one for config changes.
        dev_args+=(-netdev "tap,id=mq0,ifname=ubdmq0,script=no,downscript=no,queues=2,vhost=off"
            -device "virtio-net-pci,netdev=mq0,mq=on,vectors=6,disable-legacy=on,iommu_platform=on,mac=52:54:00:00:00:09,romfile=,addr=09.0") ;;
    nvmemdts0)
        dev_args+=(-drive "file=$run_dir/nvme-mdts0.img,if=none,id=nvmdts0,format=raw"
            -device "nvme,id=nvmemdts0,serial=ubdprp,mdts=0,drive=nvmdts0,addr=0a.0") ;;
    nvmecmb)
        dev_args+=(-drive "file=$run_dir/nvme-cmb.img,if=none,id=nvcmb,format=raw"
            -device "nvme,id=nvmecmb,serial=ubdcmb,cmb_size_mb=1,drive=nvcmb,addr=0b.0") ;;
    igb) # two Intel 82576 PFs on their own hub (what one sends the other receives), each below
        # its own PCIe root port (00:0d.0, 00:0e.0): a PF claims slots 0x80 devfns above its own
        # for its VFs, so two on one bus collide
        for n in 0 1; do
            dev_args+=(-device "pcie-root-port,id=igbrp$n,chassis=$((10 + n)),addr=$(printf %02x $((13 + n))).0"
                -netdev "hubport,id=igbp$n,hubid=1"
                -device "igb,bus=igbrp$n,netdev=igbp$n,mac=52:54:00:00:02:0$((n + 1)),romfile=")
        done ;;
    sata) # a disk on q35's built-in AHCI controller (00:1f.2): setup.sh's in-use checks of other classes
        dev_args+=(-drive "file=$run_dir/sata.img,if=none,id=sata0,format=raw" -device "ide-hd,bus=ide.0,drive=sata0") ;;
    *) vm_die "unknown device block '$d' in --devices/UBD_VM_DEVICES (known: nvme0 nvme1 ivshmem nic0 nic1 nvmemdts0 nicmq nvmecmb sata igb)" ;;
    esac
done

# init_on_alloc=0: Debian turns zero-on-allocation on; with it the boot-time reservation of
# 1.5 GiB of hugepages zeroes them all under TCG (4 s of boot, and the host backs the memory).
# no_timer_check: on a loaded host the TCG vCPU can miss the IO-APIC timer check's window and
# the kernel panics ("timer doesn't work through Interrupt-remapped IO-APIC"; seen here).
# tsc=reliable: no clocksource watchdog, so a loaded host cannot demote the TSC to the HPET
# (every clock read would trap).
# nohz=off highres=off (--tick periodic): the local APIC timer runs in periodic mode, which QEMU
# re-arms by itself. In one-shot mode a timer interrupt that QEMU's TCG loses is never followed
# by another: the kernel believes the event is still programmed, so that vCPU's timers (sleeps,
# the test deadlines) never fire again, even when IPIs wake it ("The whole-guest freeze" in
# RELIABILITY.md).
# --no-iommu: no IOMMU device, and vfio's unsafe no-IOMMU mode on (noiommu-<n> groups and
# /dev/vfio/devices/vfio<n> cdevs bound through /dev/iommu).
iommu_dev=(-device intel-iommu,intremap=on,caching-mode=on)
iommu_arg=intel_iommu=on
if [[ $UBD_VM_NO_IOMMU == 1 ]]; then
    iommu_dev=()
    iommu_arg='intel_iommu=off vfio.enable_unsafe_noiommu_mode=1'
fi
# ubdirect.testbed=1 marks the guest (scripts/vm/guest/in-testbed: soak.sh --guest runs only there).
append="console=ttyS0 rdinit=/init ubdirect.testbed=1 $iommu_arg panic=-1 loglevel=4 init_on_alloc=0 no_timer_check tsc=reliable $tick_arg $UBD_VM_HUGEPAGES $UBD_VM_APPEND"
# shellcheck disable=SC2206 # word splitting of the user's extra arguments is intended
# shellcheck disable=SC2054 # commas belong to QEMU option values
qemu=(qemu-system-x86_64 -nodefaults -no-user-config -accel tcg,thread=multi -cpu max
    -machine q35,kernel-irqchip=split -m "$UBD_VM_MEM" -smp "$UBD_VM_SMP"
    -display none -vga none -serial stdio -no-reboot
    "${iommu_dev[@]}"
    -kernel "$kdir/vmlinux" -initrd "$initrd" -append "$append"
    "${dev_args[@]}" "${peer_args[@]}" $UBD_VM_QEMU_EXTRA)
if [[ -n $UBD_VM_QMP ]]; then qemu+=(-qmp "unix:$UBD_VM_QMP,server=on,wait=off"); fi
# The freeze watch's channels: the guest's heartbeat (ttyS1, written by /init) and a monitor of
# its own for the diagnosis.
qemu+=(-chardev "file,id=ubdhb,path=$run_dir/heartbeat" -device isa-serial,chardev=ubdhb
    -qmp "unix:$run_dir/watch.qmp,server=on,wait=off")
qemu+=(-pidfile "$run_dir/qemu.pid")
printf '%q ' "${netns[@]}" "${qemu[@]}" >"$run_dir/qemu.cmd"
echo >>"$run_dir/qemu.cmd"

# ---- boot; the console goes to guest.log, the guest's dmesg to dmesg.log ----
# UBD-HOSTCHECK lines are collected; when the guest prints "@@UBD-SYNC@@ <n>" (ubd-plan does after
# each test script/binary) and waits, the host runs the checks collected so far against the live
# backing files, appends the results to hostcheck.log and answers "<n>" on the serial line, so
# that later tests cannot overwrite what an earlier test asked to check. The rest run at exit.
# mawk (Debian's awk) reads a pipe in blocks unless told to read line by line.
awk_cmd=(awk)
if awk -W version 2>&1 | grep -q mawk; then awk_cmd=(awk -W interactive); fi
fifo="$run_dir/serial-in"

# freeze_watch: after /init is ready, stop QEMU when the guest's heartbeat (scripts/vm/guest/init
# writes its uptime to ttyS1 every 2 s) has not grown for UBD_VM_FREEZE_DEADLINE seconds, or the
# guest's CPU watch reported a vCPU without timer interrupts for 100 s; record why in
# $run_dir/frozen and what the host sees in freeze-diag.log first.
freeze_watch() {
    set +e +o pipefail
    ((UBD_VM_FREEZE_DEADLINE > 0)) || return 0
    local size=-1 now last=$SECONDS why=
    until [[ -e $run_dir/guest.log.ready ]]; do sleep 1; done
    while sleep 5; do
        now=$(stat -c %s "$run_dir/heartbeat" 2>/dev/null || echo 0)
        ((now != size)) && size=$now last=$SECONDS
        if ((SECONDS - last >= UBD_VM_FREEZE_DEADLINE)); then
            why="no guest heartbeat for $((SECONDS - last)) s (last: uptime $(tail -n1 "$run_dir/heartbeat" 2>/dev/null | tr -dc 0-9.)s)"
        elif [[ -e $run_dir/guest.log-cpu-stall ]]; then
            why="the guest's $(head -n1 "$run_dir/guest.log-cpu-stall" | cut -c1-120)"
        fi
        [[ -n $why ]] || continue
        freeze_diag "$why" >"$run_dir/freeze-diag.log" 2>&1
        echo "$why" >"$run_dir/frozen"
        [[ -s $run_dir/qemu.pid ]] && kill "$(cat "$run_dir/qemu.pid")" 2>/dev/null
        return 0
    done
}

# freeze_diag WHY: the last guest lines, then what scripts/vm/vcpu-diag.sh sees.
freeze_diag() {
    echo "== $(date +%T) $1"
    echo "last guest lines:"
    grep -v '^\[' "$run_dir/guest.log" | tail -n 5
    "$UBD_VM_DIR/vcpu-diag.sh" "$(cat "$run_dir/qemu.pid" 2>/dev/null)" "$run_dir/watch.qmp"
}

# boot: one QEMU run; sets qemu_rc, t_boot, t_end.
boot() {
    t_boot=$(date +%s.%N)
    : >"$run_dir/guest.log"
    : >"$run_dir/dmesg.log"
    : >"$run_dir/hostcheck.log"
    : >"$run_dir/hostcheck.pending"
    rm -f "$fifo" "$run_dir/qemu.pid" "$run_dir/guest.log.ready" "$run_dir/boot-stuck" \
        "$run_dir/frozen" "$run_dir/guest.log-cpu-stall" "$run_dir/heartbeat"
    mkfifo "$fifo"
    exec 3<>"$fifo"
    # Boot watchdog: a TCG guest can hang before /init (seen: a vCPU starved by RCU stalls
    # while another guest loaded the host, no panic, QEMU alive). If /init has not said
    # @@UBD-READY@@ within UBD_VM_BOOT_DEADLINE seconds, QEMU is stopped and the boot counts as
    # one that died before /init (retried once below).
    (
        deadline=$((SECONDS + ${UBD_VM_BOOT_DEADLINE:-300}))
        while ((SECONDS < deadline)); do
            [[ -e $run_dir/guest.log.ready ]] && exit 0
            sleep 1
        done
        [[ -e $run_dir/guest.log.ready ]] && exit 0
        : >"$run_dir/boot-stuck"
        [[ -s $run_dir/qemu.pid ]] && kill "$(cat "$run_dir/qemu.pid")" 2>/dev/null
        exit 0
    ) &
    watchdog=$!
    freeze_watch &
    freezewatch=$!
    set +e
    timeout -k 10 "$UBD_VM_TIMEOUT" "${netns[@]}" "${qemu[@]}" <&3 2>"$run_dir/qemu.stderr" |
        "${awk_cmd[@]}" -v lf="$run_dir/guest.log" -v dm="$run_dir/dmesg.log" -v fifo="$fifo" \
            -v hc="'$UBD_VM_DIR/hostcheck.sh' '$run_dir' '$run_dir/hostcheck.pending' >>'$run_dir/hostcheck.log'" \
            -v pend="$run_dir/hostcheck.pending" '
            function checks() { if (npend > 0) { close(pend); system(hc); printf "" > pend; npend = 0 } }
            { sub(/\r+$/, ""); print > lf; fflush(lf) }
            /^@@UBD-READY@@/ { printf "" > (lf ".ready"); close(lf ".ready") }
            $0 == "@@UBD-DMESG-BEGIN@@" { d = 1; printf "" > dm; next }
            $0 == "@@UBD-DMESG-END@@" { d = 0; next }
            d { print > dm; next }
            index($0, "UBD-HOSTCHECK ") { print > pend; npend++ }
            /^GUEST-CPU-STALL cpu [0-9]+: no heartbeat for [0-9][0-9][0-9]+ s/ { print > (lf "-cpu-stall"); close(lf "-cpu-stall") }
            /^@@UBD-SYNC@@ [0-9]+$/ { fflush(lf); checks(); print $2 > fifo; fflush(fifo); next }
            { print; fflush() }
            END { checks() }'
    qemu_rc=${PIPESTATUS[0]}
    kill "$watchdog" "$freezewatch" 2>/dev/null
    wait "$watchdog" "$freezewatch" 2>/dev/null
    set -e
    t_end=$(date +%s.%N)
    exec 3>&-
}

# A boot that dies before /init ran anything (a kernel panic on an overloaded host) is retried
# once: no test has run and no backing file changed. Anything later is never retried.
attempt=1
while :; do
    boot
    if ((qemu_rc == 124 || qemu_rc == 137)) || grep -q '^@@UBD-READY@@' "$run_dir/guest.log" ||
        ((attempt >= ${UBD_VM_BOOT_ATTEMPTS:-2})); then
        break
    fi
    mv "$run_dir/guest.log" "$run_dir/guest.boot$attempt.log"
    if [[ -e $run_dir/boot-stuck ]]; then
        vm_log "the guest did not reach /init within ${UBD_VM_BOOT_DEADLINE:-300} s (stopped; log: guest.boot$attempt.log); booting again"
    else
        vm_log "the guest died before /init (qemu status $qemu_rc; $(grep -m1 -o 'Kernel panic.*' "$run_dir/guest.boot$attempt.log" || echo 'no panic message')); booting again (log: guest.boot$attempt.log)"
    fi
    attempt=$((attempt + 1))
done
rm -f "$initrd" "$fifo" "$run_dir/hostcheck.pending"

guest_rc=$(sed -n 's/^@@UBD-EXIT@@ \([0-9]*\).*/\1/p' "$run_dir/guest.log" | tail -n1)
ready=$(sed -n 's/^@@UBD-READY@@ uptime=\([0-9.]*\)s.*/\1/p' "$run_dir/guest.log" | tail -n1)
timing=$(awk -v a="$t_start" -v b="$t_boot" -v c="$t_end" -v r="${ready:-?}" \
    'BEGIN { printf "prepare %.1fs, guest %.1fs (boot to /init %ss)", b - a, c - b, r }')
echo "$timing" >"$run_dir/timing"
# QEMU's stderr, less the expected warning about the NIC hub having no host side.
grep -v 'hub 0 is not connected to host network' "$run_dir/qemu.stderr" | sed 's/^/vm: qemu: /' >&2 || true
if [[ -e $run_dir/frozen ]]; then
    vm_log "FROZE: $(cat "$run_dir/frozen") ($timing); QEMU stopped; diagnosis: $run_dir/freeze-diag.log; log: $run_dir/guest.log"
    exit 123
fi
if ((qemu_rc == 124 || qemu_rc == 137)); then
    vm_log "DEADLINE: the guest did not finish within ${UBD_VM_TIMEOUT}s and was killed ($timing); log: $run_dir/guest.log"
    exit 124
fi
if [[ -z $guest_rc ]]; then
    why=$(grep -m1 -o 'Kernel panic.*' "$run_dir/guest.log" || echo "no panic message: /init died?")
    vm_log "FAILED: the guest stopped without reporting an exit status (qemu status $qemu_rc; $why); log: $run_dir/guest.log"
    exit 125
fi
if [[ -s $run_dir/hostcheck.log ]]; then
    vm_log "host checks: $(grep -c '^ok ' "$run_dir/hostcheck.log") passed, $(grep -c '^not ok ' "$run_dir/hostcheck.log") failed (hostcheck.log)"
    grep '^not ok ' "$run_dir/hostcheck.log" | sed 's/^/vm: /' >&2 || true
fi
vm_log "guest exit status $guest_rc; $timing; logs and backing files: $run_dir"
exit "$guest_rc"
}
