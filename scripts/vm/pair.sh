#!/usr/bin/env bash
# Two guests joined by a network link: an NVMe-oF target and an initiator (the NVMe/TCP test bed).
#
#   scripts/vm/pair.sh [--target-cmd CMD] [--target-kernel K] [run.sh options] -- <initiator command>
#
# The target guest (1 vCPU, 1 GiB, no hugepages, nvme0 only: small, for a 2-core host) gets
# 10.77.0.1/24 on its peer NIC, exports nvme0's namespace with scripts/vm/nvmet.sh
# (nqn.2026-11.io.ubdirect:test, TCP 10.77.0.1:4420) and serves until the initiator says it is done
# (a TCP connection to 10.77.0.1:4421; pair_done below) or the deadline. --target-cmd replaces
# what it runs. The initiator guest (1 vCPU, 2 GiB, 256 x 2 MiB hugepages, nvme0; the run.sh
# options given here change it) gets 10.77.0.2/24 and runs the command; in it:
#   pair_target_up [SECONDS]   wait until the target's port 4420 answers (default 120 s)
#   pair_done                  tell the target to stop (done anyway when the command ends)
# The NICs are joined by a QEMU stream netdev on a unix socket (works across run.sh's private
# network namespaces). The initiator may print, besides UBD-HOSTCHECK (checked against its own
# run directory),
#   UBD-TARGETCHECK <name> file-bytes|file-eq ...   (the same syntax)
# which are checked against the TARGET's run directory after both guests stopped; a request
# that was printed but never checked (or a count the initiator never gave) is a failed check.
# Prints both run directories, the target's log on failure, and "pair: initiator status N,
# target status N, targetcheck N passed, N failed". Exit: the initiator's status, else 1 when
# the target or a target check failed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

target_cmd='nvmet.sh 10.77.0.1 --dev "/dev/$(ls /sys/bus/pci/devices/$(echo $UBD_NVME | cut -d, -f1)/nvme)n1" && echo @@UBD-TARGET-READY@@ && nc -l -p 4421 >/dev/null; nvmet.sh --remove'
target_kernel=$UBD_VM_KERNEL
init_args=()
while (($# > 0)); do
    case $1 in
    --target-cmd) target_cmd=$2 && shift 2 ;;
    --target-kernel) target_kernel=$2 && shift 2 ;;
    --kernel) target_kernel=$2 && init_args+=("$1" "$2") && shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
    --) shift && break ;;
    *) init_args+=("$1") && shift ;;
    esac
done
(($# > 0)) || vm_die "no initiator command: scripts/vm/pair.sh [options] -- <command> (see --help)"
init_cmd="$*"
timeout=${UBD_VM_TIMEOUT:-900}

sock="/tmp/ubd-pair-$$.sock"
work=$(mktemp -d /tmp/ubd-pair.XXXXXX)
tpid=
cleanup() {
    [[ -n $tpid ]] && kill "$tpid" 2>/dev/null
    rm -rf "$work" "$sock"
}
trap cleanup EXIT

# ---- the target, in the background ----
UBD_VM_RUN_DIR_FILE=$work/target.dir "$UBD_VM_DIR/run.sh" --kernel "$target_kernel" --devices nvme0 \
    --mem 1G --smp 1 --hugepages hugepages=0 --timeout "$((timeout + 60))" \
    --peer "listen:$sock:10.77.0.1/24" -- "PATH=/ubd/scripts/vm:\$PATH; $target_cmd" \
    >"$work/target.out" 2>&1 &
tpid=$!
# The initiator's QEMU connects to the socket the target's QEMU makes (after its preparation,
# which can take minutes when the kernel cache is (re)built on a loaded host: seen > 5 min).
# Bounded by the target's own deadline: no socket while it lives means it is still preparing.
end=$((SECONDS + timeout + 60))
while ((SECONDS < end)); do
    [[ -S $sock ]] && break
    kill -0 "$tpid" 2>/dev/null || break
    sleep 0.5
done
[[ -S $sock ]] || { cat "$work/target.out" >&2; vm_die "the target guest did not start (no socket $sock)"; }

# ---- the initiator, in the foreground ----
helpers='pair_target_up() { end=$(($(cut -d. -f1 /proc/uptime) + ${1:-120})); until timeout 3 bash -c "exec 3<>/dev/tcp/10.77.0.1/4420" 2>/dev/null; do [ "$(cut -d. -f1 /proc/uptime)" -lt "$end" ] || { echo "pair: the target 10.77.0.1:4420 did not answer within ${1:-120}s" >&2; return 1; }; sleep 1; done; }; pair_done() { timeout 5 bash -c "echo done >/dev/tcp/10.77.0.1/4421" 2>/dev/null; true; }'
# The command's output is kept to count its UBD-TARGETCHECK requests: "@@UBD-TARGETCHECKS@@ N"
# (scripts/vm/targetcheck.sh compares it with the checks that ran).
count_wrap="{ ( $init_cmd ); echo \$? >/tmp/ubd-init.rc; } 2>&1 | tee /tmp/ubd-init.out; rc=\$(cat /tmp/ubd-init.rc); echo \"@@UBD-TARGETCHECKS@@ \$(grep -c 'UBD-TARGETCHECK ' /tmp/ubd-init.out)\"; pair_done; exit \$rc"
set +e
UBD_VM_RUN_DIR_FILE=$work/init.dir "$UBD_VM_DIR/run.sh" --devices nvme0 --mem 2G --smp 1 \
    --hugepages "default_hugepagesz=2M hugepagesz=2M hugepages=256" --timeout "$timeout" \
    "${init_args[@]}" --peer "connect:$sock:10.77.0.2/24" \
    -- "PATH=/ubd/scripts/vm:\$PATH; $helpers; $count_wrap"
irc=$?
wait "$tpid"
trc=$?
tpid=
set -e

tdir=$(cat "$work/target.dir" 2>/dev/null || true)
idir=$(cat "$work/init.dir" 2>/dev/null || true)
# The target-side checks, against those the initiator requested (scripts/vm/targetcheck.sh).
"$UBD_VM_DIR/targetcheck.sh" "$tdir" "$idir/guest.log" >"$work/tc.out" 2>&1 || true
sed 's/^/pair: /' "$work/tc.out" >&2
tpass='' tfail=''
read -r tpass tfail < <(sed -n 's/^targetcheck: \([0-9]*\) passed, \([0-9]*\) failed.*/\1 \2/p' "$work/tc.out" | tail -n1) || true
tpass=${tpass:-0} tfail=${tfail:-1}
if ((trc != 0)); then
    sed 's/^/pair: target: /' "$work/target.out" | tail -n 40 >&2
fi
echo "pair: target run directory $tdir; initiator run directory $idir"
echo "pair: initiator status $irc, target status $trc, targetcheck $tpass passed, $tfail failed"
((irc == 0)) || exit "$irc"
((trc == 0 && tfail == 0)) || exit 1
exit 0
