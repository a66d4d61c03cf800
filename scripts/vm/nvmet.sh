#!/bin/sh
# NVMe-oF (TCP) target and kernel initiator for the guest test bed (busybox sh; runs IN the guest,
# in PATH there as /ubd/scripts/vm/nvmet.sh). The kernel's nvmet target is driven through configfs.
#
#   nvmet.sh ADDR [--dev /dev/nvmeXnY | --file PATH [--size 64M]] [--port 4420] [--nqn NQN]
#       export one namespace (nsid 1) as subsystem NQN (default nqn.2026-11.io.ubdirect:test,
#       any host allowed) on TCP ADDR:PORT. Default backing: --file /tmp/nvmet-ns1.img, 64 MiB
#       of zeros. A test-bed NVMe namespace on the kernel nvme driver (--dev /dev/nvme0n1) puts the
#       bytes in the host's image file, so the host can check them.
#   nvmet.sh --remove                  tear the whole target down (ports, subsystems, namespaces)
#   nvmet.sh --remove-port [--port N]  unlink the subsystem from the port and remove the port: the
#       target is gone mid-flight (connections drop, the subsystem and its data stay)
#   nvmet.sh --add-port ADDR [--port N] [--nqn NQN]   the port back (after --remove-port)
#   nvmet.sh --connect ADDR [--port N] [--nqn NQN] [--wait SECONDS] [--ctrl-loss-tmo SECONDS]
#       the kernel's NVMe/TCP initiator (writes /dev/nvme-fabrics, no nvme-cli needed), retried
#       until SECONDS (default 30) pass; prints the namespace's block device (/dev/nvmeXn1).
#       --ctrl-loss-tmo: give up on a lost target after that long (kernel default 600 s; with
#       reconnect_delay=1), so I/O to a removed port fails instead of waiting
#       --hostnqn HOSTNQN: connect as that host (its hostid is the UUID of a uuid-form NQN);
#       --dhchap-secret-file FILE / --dhchap-ctrl-secret-file FILE: authenticate with the DHHC-1
#       host secret in FILE (dhchap_secret=), and the controller too with the one in the other
#       (dhchap_ctrl_secret=); a refused authentication is not retried
#   nvmet.sh --disconnect [--nqn NQN]  delete every fabrics controller connected to NQN
#   nvmet.sh --allow-host HOSTNQN [--dhchap-key-file FILE [--dhchap-ctrl-key-file FILE]
#            [--dhchap-hash HASH] [--dhchap-dhgroup GROUP]] [--nqn NQN]
#       admit HOSTNQN on NQN through allowed_hosts (attr_allow_any_host 0: only the hosts
#       admitted this way connect), authenticated with DH-HMAC-CHAP when a key file is given:
#       FILE holds the host's DHHC-1 secret (dhchap_key), the controller key FILE makes it
#       bidirectional (dhchap_ctrl_key); HASH hmac(sha256) (default), hmac(sha384) or
#       hmac(sha512); GROUP null (default), ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144 or
#       ffdhe8192. Run again to replace the host's settings. Secrets come from files, never
#       from arguments (they would show in ps).
#   nvmet.sh --deny-host HOSTNQN [--nqn NQN]   the host entry removed; when no admitted host
#       is left, NQN admits any host again (attr_allow_any_host 1)
#
# Kernels: the ubd kernel has nvmet, nvmet-tcp and nvme-tcp built in; on Debian's kernels they are
# modules in the initramfs (UBD_VM_MODULES_ONDEMAND) and loaded here with modprobe.
# Exit status: 0 done, 1 failed (the reason on stderr), 2 usage, 3 this kernel lacks
# DH-HMAC-CHAP (CONFIG_NVME_TARGET_AUTH for --allow-host with a key, CONFIG_NVME_HOST_AUTH for
# --connect with a secret; the reason on stderr).
set -u

nqn=nqn.2026-11.io.ubdirect:test
port=4420
mode=up addr='' dev='' file='' size=64M wait=30 opts=''
host='' keyf='' ctrlkeyf='' hash='' dhgroup='' hostnqn='' secretf='' ctrlsecretf=''
cfg=/sys/kernel/config/nvmet

die() {
    echo "nvmet.sh: $*" >&2
    exit 1
}
usage() {
    sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case $1 in
    --dev) dev=$2 && shift 2 ;;
    --file) file=$2 && shift 2 ;;
    --size) size=$2 && shift 2 ;;
    --port) port=$2 && shift 2 ;;
    --nqn) nqn=$2 && shift 2 ;;
    --wait) wait=$2 && shift 2 ;;
    --ctrl-loss-tmo) opts=",ctrl_loss_tmo=$2,reconnect_delay=1" && shift 2 ;;
    --remove) mode=remove && shift ;;
    --remove-port) mode=remove-port && shift ;;
    --add-port) mode=add-port && addr=$2 && shift 2 ;;
    --connect) mode=connect && addr=$2 && shift 2 ;;
    --disconnect) mode=disconnect && shift ;;
    --allow-host) mode=allow-host && host=$2 && shift 2 ;;
    --deny-host) mode=deny-host && host=$2 && shift 2 ;;
    --dhchap-key-file) keyf=$2 && shift 2 ;;
    --dhchap-ctrl-key-file) ctrlkeyf=$2 && shift 2 ;;
    --dhchap-hash) hash=$2 && shift 2 ;;
    --dhchap-dhgroup) dhgroup=$2 && shift 2 ;;
    --hostnqn) hostnqn=$2 && shift 2 ;;
    --dhchap-secret-file) secretf=$2 && shift 2 ;;
    --dhchap-ctrl-secret-file) ctrlsecretf=$2 && shift 2 ;;
    -h | --help) usage ;;
    -*) echo "nvmet.sh: unknown option '$1'" >&2 && usage ;;
    *) addr=$1 && shift ;;
    esac
done

# A port id for configfs: the TCP port number itself (one address per port number here).
portdir=$cfg/ports/$port
subdir=$cfg/subsystems/$nqn

# load MODULE...: modprobe each unless built in / loaded (the ubd kernel has them built in).
load() {
    for m in "$@"; do
        mm=$(echo "$m" | tr - _)
        [ -d "/sys/module/$mm" ] && continue
        modprobe "$m" 2>/dev/null || die "cannot load $m: is it in the initramfs (UBD_VM_MODULES_ONDEMAND) or built in?"
    done
}

configfs() {
    if ! grep -q ' /sys/kernel/config configfs ' /proc/mounts; then
        mount -t configfs configfs /sys/kernel/config || die "cannot mount configfs on /sys/kernel/config"
    fi
    [ -d "$cfg" ] || die "no $cfg: the nvmet target is not in this kernel"
}

add_port() {
    [ -n "$addr" ] || die "no address: nvmet.sh --add-port ADDR (e.g. 127.0.0.1)"
    [ -d "$subdir" ] || die "no subsystem $nqn: set the target up first (nvmet.sh ADDR)"
    if [ ! -d "$portdir" ]; then
        mkdir "$portdir" || die "cannot create $portdir"
        echo tcp >"$portdir/addr_trtype"
        echo ipv4 >"$portdir/addr_adrfam"
        echo "$addr" >"$portdir/addr_traddr"
        echo "$port" >"$portdir/addr_trsvcid"
    fi
    [ -e "$portdir/subsystems/$nqn" ] || ln -s "$subdir" "$portdir/subsystems/$nqn" ||
        die "cannot link $nqn to port $port (is $addr:$port an address of this guest? see dmesg)"
}

remove_port() {
    [ -d "$portdir" ] || return 0
    for l in "$portdir"/subsystems/*; do
        [ -L "$l" ] && rm "$l"
    done
    rmdir "$portdir" || die "cannot remove $portdir"
}

# secret FILE: the first line of FILE (a DHHC-1 secret), without its newline.
secret() {
    [ -r "$1" ] || die "cannot read the secret file $1"
    head -n1 "$1" | tr -d '\n'
}

# unsupported WHAT: exit 3, this kernel lacks DH-HMAC-CHAP.
unsupported() {
    echo "nvmet.sh: $*" >&2
    exit 3
}

# drop_host: unlink $host from $subdir's allowed hosts and remove its entry.
drop_host() {
    if [ -L "$subdir/allowed_hosts/$host" ]; then
        rm "$subdir/allowed_hosts/$host" || die "cannot unlink $host from $nqn"
    fi
    if [ -d "$cfg/hosts/$host" ]; then
        rmdir "$cfg/hosts/$host" || die "cannot remove $cfg/hosts/$host (still admitted by another subsystem?)"
    fi
}

# deny_host: drop_host; with no admitted host left, the subsystem admits any host again.
deny_host() {
    drop_host
    for l in "$subdir"/allowed_hosts/*; do
        [ -L "$l" ] && return 0
    done
    echo 1 >"$subdir/attr_allow_any_host"
}

# allow_host: a fresh entry for $host with its DH-HMAC-CHAP settings, admitted by $subdir.
allow_host() {
    [ -d "$subdir" ] || die "no subsystem $nqn: set the target up first (nvmet.sh ADDR)"
    drop_host
    hd=$cfg/hosts/$host
    mkdir "$hd" || die "cannot create $hd"
    if [ -n "$keyf" ]; then
        if [ ! -e "$hd/dhchap_key" ]; then
            rmdir "$hd"
            unsupported "this kernel's nvmet has no DH-HMAC-CHAP (CONFIG_NVME_TARGET_AUTH): no dhchap_key in $hd"
        fi
        secret "$keyf" >"$hd/dhchap_key" || die "the target refused the host key in $keyf (see dmesg)"
        if [ -n "$ctrlkeyf" ]; then
            secret "$ctrlkeyf" >"$hd/dhchap_ctrl_key" || die "the target refused the controller key in $ctrlkeyf (see dmesg)"
        fi
        echo "${hash:-hmac(sha256)}" >"$hd/dhchap_hash" || die "the target refused hash ${hash:-hmac(sha256)}"
        echo "${dhgroup:-null}" >"$hd/dhchap_dhgroup" || die "the target refused DH group ${dhgroup:-null}"
    fi
    echo 0 >"$subdir/attr_allow_any_host"
    ln -s "$hd" "$subdir/allowed_hosts/$host" || die "cannot admit $host on $nqn"
}

case $mode in
up)
    [ -n "$addr" ] || die "no address: nvmet.sh ADDR [--dev DEV | --file PATH] (e.g. 127.0.0.1)"
    [ -z "$dev" ] || [ -z "$file" ] || die "--dev and --file exclude each other"
    if [ -n "$dev" ]; then
        [ -b "$dev" ] || die "$dev is not a block device (a test-bed namespace on the kernel nvme driver, e.g. /dev/nvme0n1)"
        path=$dev
    else
        path=${file:-/tmp/nvmet-ns1.img}
        [ -e "$path" ] || truncate -s "$size" "$path" || die "cannot create $path"
    fi
    load nvmet nvmet-tcp
    configfs
    [ -d "$subdir" ] && die "subsystem $nqn exists already (nvmet.sh --remove first)"
    mkdir "$subdir" || die "cannot create $subdir"
    echo 1 >"$subdir/attr_allow_any_host"
    mkdir "$subdir/namespaces/1" || die "cannot create namespace 1 of $nqn"
    echo "$path" >"$subdir/namespaces/1/device_path"
    [ -n "$dev" ] || echo 1 >"$subdir/namespaces/1/buffered_io" 2>/dev/null
    echo 1 >"$subdir/namespaces/1/enable" || die "cannot enable namespace 1 on $path (see dmesg)"
    add_port
    echo "nvmet.sh: $nqn nsid 1 ($path) on tcp $addr:$port"
    ;;
remove)
    configfs
    for p in "$cfg"/ports/*; do
        [ -d "$p" ] || continue
        portdir=$p && remove_port
    done
    for s in "$cfg"/subsystems/*; do
        [ -d "$s" ] || continue
        for l in "$s"/allowed_hosts/*; do
            [ -L "$l" ] && rm "$l"
        done
        for n in "$s"/namespaces/*; do
            [ -d "$n" ] || continue
            echo 0 >"$n/enable"
            rmdir "$n"
        done
        rmdir "$s" || die "cannot remove $s"
    done
    for h in "$cfg"/hosts/*; do
        [ -d "$h" ] && { rmdir "$h" || die "cannot remove $h"; }
    done
    echo "nvmet.sh: target removed"
    ;;
remove-port)
    configfs
    remove_port
    echo "nvmet.sh: port $port removed"
    ;;
add-port)
    configfs
    add_port
    echo "nvmet.sh: port $port back on $addr"
    ;;
connect)
    [ -n "$addr" ] || die "no address: nvmet.sh --connect ADDR"
    [ -n "$secretf" ] || [ -z "$ctrlsecretf" ] || die "--dhchap-ctrl-secret-file needs --dhchap-secret-file"
    for f in $secretf $ctrlsecretf; do
        [ -r "$f" ] || die "cannot read the secret file $f"
    done
    load nvme-tcp
    [ -c /dev/nvme-fabrics ] || die "no /dev/nvme-fabrics: the kernel's NVMe-oF initiator is missing"
    if [ -n "$hostnqn" ]; then
        opts="$opts,hostnqn=$hostnqn"
        case $hostnqn in *:uuid:*) opts="$opts,hostid=${hostnqn##*:uuid:}" ;; esac
    fi
    retry=1
    if [ -n "$secretf$ctrlsecretf" ]; then
        # Reading /dev/nvme-fabrics unconnected lists the options this kernel parses.
        grep -q dhchap_secret /dev/nvme-fabrics ||
            unsupported "this kernel's NVMe-oF initiator has no DH-HMAC-CHAP (CONFIG_NVME_HOST_AUTH): no dhchap_secret option in /dev/nvme-fabrics"
        [ -n "$secretf" ] && opts="$opts,dhchap_secret=$(secret "$secretf")"
        [ -n "$ctrlsecretf" ] && opts="$opts,dhchap_ctrl_secret=$(secret "$ctrlsecretf")"
        retry=0
    fi
    end=$(($(cut -d. -f1 /proc/uptime) + wait))
    while :; do
        out=$(echo "transport=tcp,traddr=$addr,trsvcid=$port,nqn=$nqn$opts" 2>/dev/null |
            { exec 3<>/dev/nvme-fabrics && cat >&3 && head -n1 <&3; } 2>&1) && break
        [ $retry = 1 ] || die "the connection to $nqn at $addr:$port with DH-HMAC-CHAP was refused ($out; see dmesg)"
        [ "$(cut -d. -f1 /proc/uptime)" -lt "$end" ] ||
            die "cannot connect to $nqn at $addr:$port within ${wait}s ($out): is the target up (nvmet.sh $addr on the target)?"
        sleep 1
    done
    # "instance=N,cntlid=M": the controller is /dev/nvmeN, its namespace nvmeNn1 (wait for it).
    inst=$(echo "$out" | sed -n 's/.*instance=\([0-9]*\).*/\1/p')
    [ -n "$inst" ] || die "unexpected answer from /dev/nvme-fabrics: $out"
    i=0
    while [ ! -b "/dev/nvme${inst}n1" ] && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    [ -b "/dev/nvme${inst}n1" ] || die "connected (nvme$inst) but /dev/nvme${inst}n1 did not appear within 10s"
    echo "/dev/nvme${inst}n1"
    ;;
disconnect)
    n=0
    for c in /sys/class/nvme/nvme*; do
        [ -f "$c/subsysnqn" ] && [ "$(cat "$c/subsysnqn")" = "$nqn" ] || continue
        [ "$(cat "$c/transport")" = pcie ] && continue
        echo 1 >"$c/delete_controller" && n=$((n + 1))
    done
    echo "nvmet.sh: $n controller(s) of $nqn disconnected"
    ;;
allow-host)
    [ -n "$host" ] || die "no host NQN: nvmet.sh --allow-host HOSTNQN"
    [ -n "$keyf" ] || [ -z "$ctrlkeyf$hash$dhgroup" ] ||
        die "--dhchap-ctrl-key-file, --dhchap-hash and --dhchap-dhgroup need --dhchap-key-file"
    for f in $keyf $ctrlkeyf; do
        [ -r "$f" ] || die "cannot read the secret file $f"
    done
    configfs
    allow_host
    echo "nvmet.sh: $host admitted on $nqn${keyf:+ (DH-HMAC-CHAP ${hash:-hmac(sha256)} ${dhgroup:-null}${ctrlkeyf:+, bidirectional})}"
    ;;
deny-host)
    [ -n "$host" ] || die "no host NQN: nvmet.sh --deny-host HOSTNQN"
    configfs
    [ -d "$subdir" ] || die "no subsystem $nqn"
    deny_host
    echo "nvmet.sh: $host no longer admitted on $nqn"
    ;;
esac
exit 0
