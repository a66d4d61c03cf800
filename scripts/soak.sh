#!/bin/sh
# scripts/soak.sh: soak test in the QEMU guest. For a set time, verified mixed I/O on
# both NVMe controllers, NIC loop-back and the NVMe -> BAR pipeline, with faults injected at
# random; prints I/Os, faults injected and survived, bytes verified, mismatches, hangs, leaks.
#
#   scripts/soak.sh [--duration 60s|10m] [--seed N] [--round SECONDS] [--fault-rate PCT]
#                   [--min-rounds N] [--no-build]
# (--round: seconds each perf/loopback job runs, default 4; --fault-rate: percent of rounds
# that get a guest-side fault once each kind has been injected, default 50; --min-rounds:
# rounds the soak must complete, default 4; --seed: the choices' seed, random when not given:
# scripts/test.sh gives a fixed one)
#
# Host side (this mode): builds ubdirect (unless --no-build), boots the guest once with
# scripts/vm/run.sh and a QMP monitor (--qmp), with its own nvme1 (namespace 1 behind QEMU
# blkdebug: reads of byte 61 MiB fail with EIO; namespace 2 behind a throttle group) and a third
# controller nvme2 behind a PCIe root port (hot-pluggable), and injects at random from the host:
#   throttle  namespace 2 of nvme1 slowed to 40 IOPS for a few seconds (qom-set on the group)
#   unplug    nvme2 hot-unplugged (device_del; the guest must let it go) and plugged back
#             (device_add); survived when the guest runs a verified job on it again
# Guest side (`--guest`, run inside the guest by the host side): rounds of parallel jobs
#   nvme0  perf -w rw --verify, or pipeline nvme0 -> ivshmem BAR --verify
#   nvme1  perf -w rw --verify on namespace 1 (below the bad region) or namespace 2, in turn
#   nic    loopback nic0 -> nic1 (frames verified byte-exact)
#   nvme2  perf -w rw --verify while it is plugged in
# and injects at random:
#   blkdebug  a read of nvme1's bad region: the EIO must come back as an I/O error, no hang
#   reset     sysfs reset (FLR) of nvme0 under a running job: the next nvme0 job must pass
# The first fault rounds inject each guest kind once (blkdebug, then reset), the host injects
# each of its kinds once (unplug, then throttle); after that the kinds are chosen at random.
# Every job runs under a deadline (a kill counts as a hang). After each round: free hugepages
# back to their start and no /dev/vfio file open (leaks); inside each perf job, the pool blocks
# and DMA mappings its --json output reports still held at exit must be 0 (leaks too).
# Exit status: 0 when there were no mismatches, hangs, leaks, unexpected job failures, faults
# not survived or not verified (a fault whose survival no later round showed is a failure),
# at least --min-rounds rounds, and every fault kind injected at least once; the last line is
# "soak: N passed, N failed" (the checks above).

# The whole script is one { ...; exit; } block: sh reads a script as it runs it, so editing this
# file during a (long) soak could make the running soak execute fragments of the new text.
{
set -u

# ---- shared ------------------------------------------------------------------------------------
me=soak.sh
die() {
    echo "$me: error: $*" >&2
    exit 2
}

# seconds DURATION: "60s", "10m", "90" -> seconds
seconds() {
    case $1 in
    *[!0-9smh]* | '' | [smh]*) return 1 ;;
    *h) echo $((${1%h} * 3600)) ;;
    *m) echo $((${1%m} * 60)) ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
    esac
}

duration=60 seed= round=4 guest=no build=yes rate=50 min_rounds=4
while [ $# -gt 0 ]; do
    case $1 in
    --duration)
        duration=$(seconds "${2:-}") || die "--duration '${2:-}': write 60s, 10m or a number of seconds"
        shift 2
        ;;
    --seed)
        case ${2:-} in '' | *[!0-9]*) die "--seed wants a number" ;; esac
        seed=$2
        shift 2
        ;;
    --round)
        case ${2:-} in '' | *[!0-9]* | 0) die "--round wants whole seconds > 0" ;; esac
        round=$2
        shift 2
        ;;
    --fault-rate)
        case ${2:-} in '' | *[!0-9]*) die "--fault-rate wants a percentage" ;; esac
        rate=$2
        shift 2
        ;;
    --min-rounds)
        case ${2:-} in '' | *[!0-9]*) die "--min-rounds wants a number" ;; esac
        min_rounds=$2
        shift 2
        ;;
    --guest) guest=yes && shift ;;
    --no-build) build=no && shift ;;
    -h | --help)
        sed -n '2,/^# The whole script/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
done
[ "$duration" -gt 0 ] || die "--duration must be > 0"
[ -n "$seed" ] || seed=$(($(date +%s) % 100000))

# rand N: R = a number in 0..N-1 from a seeded LCG (same seed, same choices). Sets R rather
# than printing it: a $(rand) subshell would not advance the generator.
RNG=$seed
R=0
rand() {
    RNG=$(((RNG * 1103515245 + 12345) % 2147483648))
    R=$(((RNG / 65536) % $1))
}

# The bad region of nvme1 namespace 1 (blkdebug): 512-byte sector 124928 = byte 61 MiB.
BAD_SECTOR=124928
BAD_MIB=61

# =================================================================================================
# guest side
# =================================================================================================
guest_main() {
    cd /ubd || exit 1
    W=/tmp/soak
    rm -rf "$W"
    mkdir -p "$W"
    up() { cut -d. -f1 /proc/uptime; }
    drv_of() {
        l=$(readlink "/sys/bus/pci/devices/$1/driver" 2>/dev/null)
        echo "${l##*/}"
    }
    NVME0= NVME1=
    for a in $(echo "$UBD_NVME" | tr ',' ' '); do
        case $a in
        0000:00:*) if [ -z "$NVME0" ]; then NVME0=$a; elif [ -z "$NVME1" ]; then NVME1=$a; fi ;;
        *) NVME2=$a ;;
        esac
    done
    NVME2=${NVME2:-}
    NIC0=${UBD_NICS%%,*}
    NIC1=${UBD_NICS#*,}
    BAR=$UBD_IVSHMEM
    [ -n "$NVME0" ] && [ -n "$NVME1" ] && [ -n "$NIC1" ] && [ -n "$BAR" ] ||
        die "the guest lacks devices (nvme: $UBD_NVME, nics: $UBD_NICS, ivshmem: $BAR)"
    HUGEMEM=0 PCI_ALLOWED="$NVME0 $NVME1 $NVME2 $BAR $NIC0 $NIC1" UBD_STATE_DIR=$W/state \
        sh scripts/setup.sh config >"$W/setup.out" 2>&1 || {
        cat "$W/setup.out"
        die "scripts/setup.sh config failed"
    }
    hp2=/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages
    hp1=/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages
    free0="$(cat $hp2 2>/dev/null) $(cat $hp1 2>/dev/null)"
    T=$round
    DL=$((T + 120)) # deadline of one job: its own time plus two minutes (TCG on a loaded host)

    rounds=0 ios=0 bytes=0 mism=0 hangs=0 leaks=0 finj=0 fsurv=0 fails=0 nblk=0 nrst=0
    pending_reset=0 nvme2_state=absent last_round=$((T + 10))
    [ -n "$NVME2" ] && [ -e "/sys/bus/pci/devices/$NVME2" ] && nvme2_state=ready

    # run_job NAME CMD...: in the background, output in $W/NAME.out, status in $W/NAME.rc.
    run_job() {
        rj=$1
        shift
        (
            timeout -s KILL "$DL" "$@" >"$W/$rj.out" 2>&1
            echo $? >"$W/$rj.rc"
        ) &
        pids="$pids $!"
    }
    # wait_jobs: wait for the jobs run_job started (not the watchdog)
    wait_jobs() {
        # shellcheck disable=SC2086 # a list of pids
        wait $pids
        pids=
    }
    pids=
    # Watchdog: a round older than a job's deadline + 60 s has a job the KILL could not end (a
    # task stuck in the kernel): print the blocked tasks' kernel stacks (and sysrq-w to the
    # kernel log) once, so the hang can be diagnosed; the host stops QEMU later.
    (
        while sleep 10; do
            t0=$(cat "$W/round.t0" 2>/dev/null) || continue
            [ $(($(up) - t0)) -gt $((DL + 60)) ] || continue
            echo "SOAK-STUCK the round that started at ${t0}s has not ended at $(up)s; blocked tasks:"
            for p in /proc/[0-9]*; do
                grep -q '^State:.*D' "$p/status" 2>/dev/null || continue
                echo "SOAK-STUCK pid ${p#/proc/} $(cat "$p/comm") ($(tr '\0' ' ' <"$p/cmdline" | cut -c1-120)): $(tr '\n' ' ' <"$p/stack" 2>/dev/null)"
            done
            echo w >/proc/sysrq-trigger 2>/dev/null
            dmesg 2>/dev/null | tail -n 80 | sed 's/^/SOAK-STUCK dmesg /'
            break
        done
    ) &
    watchdog=$!
    # jnum FILE KEY: the last number after "KEY": in a JSON file (0 when none)
    jnum() { v=$(grep -o "\"$2\": *[0-9]*" "$1" 2>/dev/null | tail -n1 | grep -o '[0-9]*$'); echo "${v:-0}"; }
    # perf_result / pipe_result / loop_result NAME: a finished job's outcome: ok, fail or hang
    # (killed at its deadline). Run in $(...): the figures are added up by the caller.
    rc_of() { cat "$W/$1.rc" 2>/dev/null || echo 137; }
    perf_result() {
        pr_rc=$(rc_of "$1")
        if [ "$pr_rc" = 137 ]; then
            echo hang
        elif [ "$pr_rc" = 0 ] && [ "$(jnum "$W/$1.out" verify_errors)" = 0 ] && [ "$(jnum "$W/$1.out" ios)" -gt 0 ]; then
            echo ok
        else
            echo fail
        fi
    }
    pipe_result() {
        pp_rc=$(rc_of "$1")
        if [ "$pp_rc" = 137 ]; then
            echo hang
        elif [ "$pp_rc" = 0 ] && grep -q 'verify.*: OK' "$W/$1.out"; then
            echo ok
        else
            echo fail
        fi
    }
    loop_result() {
        lp_rc=$(rc_of "$1")
        lp_rx=$(sed -n 's/.*received \([0-9]*\) byte-exact.*/\1/p' "$W/$1.out" | head -n1)
        lp_mm=$(sed -n 's/.*mismatches \([0-9]*\).*/\1/p' "$W/$1.out" | head -n1)
        if [ "$lp_rc" = 137 ]; then
            echo hang
        elif [ "$lp_rc" = 0 ] && [ "${lp_mm:-1}" = 0 ] && [ "${lp_rx:-0}" -gt 0 ]; then
            echo ok
        else
            echo fail
        fi
    }
    show_fail() { sed 's/^/#   /' "$W/$1.out" | tail -n 6; }
    # leak_check NAME: a finished perf job's in-process leak report (pool blocks still out, DMA
    # mappings beyond its own); a non-zero count is a leak. A job that printed no report (it
    # failed before the end of its run) is not counted here.
    leak_check() {
        grep -q '"pool_blocks_in_use"' "$W/$1.out" 2>/dev/null || return 0
        lb=$(jnum "$W/$1.out" pool_blocks_in_use)
        lmap=$(jnum "$W/$1.out" mappings_beyond_expected)
        if [ "$lb" != 0 ] || [ "$lmap" != 0 ]; then
            leaks=$((leaks + 1))
            echo "SOAK-LEAK round $rounds $1: $lb pool block(s) and $lmap DMA mapping(s) still held at exit"
        fi
    }

    echo "SOAK-START duration=${duration}s seed=$seed round=${T}s nvme0=$NVME0 nvme1=$NVME1 nvme2=${NVME2:-none} bar=$BAR nics=$NIC0,$NIC1"
    end=$(($(up) + duration))
    extra=0
    # past the end, up to 3 more rounds while a reset still waits for a round to prove it survived
    while [ "$(up)" -lt "$end" ] || { [ "$pending_reset" -gt 0 ] && [ "$extra" -lt 3 ]; }; do
        [ "$(up)" -lt "$end" ] || extra=$((extra + 1))
        rounds=$((rounds + 1))
        rm -f "$W"/*.rc
        fault=none
        # no fault in the last two rounds' time: a fault needs a round after it to be survived;
        # each kind once first (blkdebug, reset), then at random
        if [ $(($(up) + 2 * last_round)) -lt "$end" ]; then
            if [ "$nblk" = 0 ]; then
                fault=blkdebug
            elif [ "$nrst" = 0 ]; then
                fault=reset
            else
                rand 100
                if [ "$R" -lt "$rate" ]; then
                    rand 2
                    case $R in 0) fault=blkdebug ;; 1) fault=reset ;; esac
                fi
            fi
        fi
        round_t0=$(up)
        echo "$round_t0" >"$W/round.t0"
        # nvme2 came back (hot-plug): give it to vfio-pci
        if [ -n "$NVME2" ] && [ -e "/sys/bus/pci/devices/$NVME2" ] && [ "$(drv_of "$NVME2")" != vfio-pci ]; then
            HUGEMEM=0 PCI_ALLOWED="$NVME2" UBD_STATE_DIR=$W/state sh scripts/setup.sh config >"$W/rebind.out" 2>&1
            echo "SOAK-EVENT nvme2 back on $(drv_of "$NVME2")"
            nvme2_state=back
        fi
        rand 2
        if [ "$R" = 0 ]; then
            j0=perf
            run_job nvme0 ubdirect perf -w rw -M 50 --verify -q 16 -t "$T" --span-mib 32 --json "$NVME0"
        else
            j0=pipe
            run_job nvme0 ubdirect pipeline --source "nvme:$NVME0" --sink "bar:$BAR/2" --block-size 256K --qd 8 --blocks 16 --bytes 16M --verify
        fi
        # namespaces in turn: a throttle of ns2 (host) is checked within two rounds
        if [ $((rounds % 2)) = 1 ]; then
            n1=1
            run_job nvme1 ubdirect perf -w rw -M 50 --verify -q 16 -t "$T" --ns 1 --span-mib 56 --json "$NVME1"
        else
            n1=2
            run_job nvme1 ubdirect perf -w rw -M 50 --verify -q 16 -t "$T" --ns 2 --json "$NVME1"
        fi
        run_job nic ubdirect loopback --tx "$NIC0" --rx "$NIC1" --seconds "$T"
        j2=none
        if [ -n "$NVME2" ] && [ "$(drv_of "$NVME2")" = vfio-pci ]; then
            j2=perf
            run_job nvme2 ubdirect perf -w rw -M 50 --verify -q 8 -t "$T" --json "$NVME2"
        fi
        if [ "$fault" = reset ]; then
            rand 3
            sleep $((1 + R))
            if echo 1 >"/sys/bus/pci/devices/$NVME0/reset" 2>"$W/reset.err"; then
                finj=$((finj + 1))
                nrst=$((nrst + 1))
                pending_reset=$((pending_reset + 1))
                echo "SOAK-FAULT round $rounds reset (FLR) of nvme0 $NVME0 under a running $j0 job"
            else
                echo "SOAK-FAULT round $rounds reset of nvme0 refused: $(cat "$W/reset.err")"
                fault=none
            fi
        fi
        wait_jobs
        if [ "$j0" = perf ]; then r0=$(perf_result nvme0); else r0=$(pipe_result nvme0); fi
        r1=$(perf_result nvme1)
        rn=$(loop_result nic)
        r2=-
        [ "$j2" = perf ] && r2=$(perf_result nvme2)
        # the figures: I/Os, bytes verified (perf: verified blocks x 4 KiB I/O size), mismatches
        for f in nvme0 nvme1 nvme2; do
            [ -f "$W/$f.out" ] || continue
            case $f in nvme0) [ "$j0" = perf ] || continue ;; nvme2) [ "$j2" = perf ] || continue ;; esac
            ios=$((ios + $(jnum "$W/$f.out" ios)))
            bytes=$((bytes + 4096 * $(grep -o '"verified_blocks": *[0-9]*' "$W/$f.out" | grep -o '[0-9]*$' | awk '{ s += $1 } END { print s + 0 }')))
            mism=$((mism + $(jnum "$W/$f.out" verify_errors)))
        done
        # A command the controller answered only after the driver wrote its SQ doorbell again
        # (a doorbell write the controller lost: RELIABILITY.md S9-3): not a failure, shown.
        for f in nvme0 nvme1 nvme2 nic; do
            [ -f "$W/$f.out" ] || continue
            grep -h 'SQ doorbell was written again' "$W/$f.out" | cut -c1-240 | sed "s/^/SOAK-EVENT round $rounds $f: /"
        done
        if [ "$j0" = pipe ] && [ "$r0" = ok ]; then
            ios=$((ios + 64))
            bytes=$((bytes + 16777216))
        fi
        [ "$j0" = pipe ] && grep -q 'verify.*MISMATCH' "$W/nvme0.out" && mism=$((mism + 1))
        lx=$(sed -n 's/.*received \([0-9]*\) byte-exact.*/\1/p' "$W/nic.out" | head -n1)
        lf=$(sed -n 's/.* frames of \([0-9]*\) B.*/\1/p' "$W/nic.out" | head -n1)
        lm=$(sed -n 's/.*mismatches \([0-9]*\).*/\1/p' "$W/nic.out" | head -n1)
        ios=$((ios + ${lx:-0}))
        bytes=$((bytes + ${lx:-0} * ${lf:-0}))
        mism=$((mism + ${lm:-0}))
        for r in "$r0" "$r1" "$rn" "$r2"; do [ "$r" = hang ] && hangs=$((hangs + 1)); done

        # outcomes: a failure right after a fault on that device is expected; others are not
        if [ "$fault" = reset ]; then
            echo "SOAK-FAULT-RESULT round $rounds nvme0 $j0 under the reset: $r0 (exit $(rc_of nvme0)): $(grep -m1 -i 'error' "$W/nvme0.out" | cut -c1-200)"
        elif [ "$r0" != ok ]; then
            fails=$((fails + 1))
            echo "SOAK-FAIL round $rounds nvme0 $j0: $r0"
            show_fail nvme0
            if [ "$pending_reset" -gt 0 ]; then
                echo "SOAK-NOT-SURVIVED round $rounds: nvme0 still fails after $pending_reset reset(s)"
                pending_reset=0
            fi
        elif [ "$pending_reset" -gt 0 ]; then
            fsurv=$((fsurv + pending_reset))
            echo "SOAK-SURVIVED round $rounds: nvme0 passes a verified $j0 job after $pending_reset reset(s)"
            pending_reset=0
        fi
        if [ "$r1" != ok ]; then
            fails=$((fails + 1))
            echo "SOAK-FAIL round $rounds nvme1 ns$n1: $r1"
            show_fail nvme1
        fi
        if [ "$rn" != ok ]; then
            fails=$((fails + 1))
            echo "SOAK-FAIL round $rounds nic loopback: $rn"
            show_fail nic
        fi
        if [ "$j2" = perf ]; then
            if [ "$r2" = ok ]; then
                if [ "$nvme2_state" = back ]; then
                    echo "SOAK-EVENT nvme2 verified again after re-plug"
                    nvme2_state=ready
                fi
            elif [ "$(drv_of "$NVME2")" = vfio-pci ] && [ "$r2" != hang ]; then
                # still the device the job opened (a re-plugged one comes back on nvme)
                fails=$((fails + 1))
                echo "SOAK-FAIL round $rounds nvme2: $r2"
                show_fail nvme2
            else
                echo "SOAK-EVENT nvme2 job ended by the unplug ($r2)"
            fi
        fi
        if [ -n "$NVME2" ] && [ ! -e "/sys/bus/pci/devices/$NVME2" ] && [ "$nvme2_state" != absent ]; then
            nvme2_state=absent
            echo "SOAK-EVENT nvme2 gone"
        fi

        # the blkdebug fault: a read of the bad region must fail with an I/O error, not hang
        if [ "$fault" = blkdebug ]; then
            finj=$((finj + 1))
            nblk=$((nblk + 1))
            run_job bad ubdirect perf -w read -q 4 -t 1 --ns 1 --offset-mib "$BAD_MIB" --span-mib 1 --json "$NVME1"
            wait_jobs
            brc=$(cat "$W/bad.rc" 2>/dev/null || echo 137)
            berr=$(jnum "$W/bad.out" errors)
            if [ "$brc" = 137 ]; then
                hangs=$((hangs + 1))
                echo "SOAK-NOT-SURVIVED round $rounds blkdebug: the read of the bad region hung"
            elif [ "$brc" != 0 ] && [ "$berr" -gt 0 ]; then
                fsurv=$((fsurv + 1))
                echo "SOAK-SURVIVED round $rounds blkdebug: $berr I/O errors reported, exit $brc"
            else
                echo "SOAK-NOT-SURVIVED round $rounds blkdebug: exit $brc, errors $berr (an EIO was expected)"
                show_fail bad
            fi
        fi

        # leaks inside the processes: every perf job that finished, except where its device
        # failed on purpose: the reset round's nvme0 job (a command in flight when the
        # controller resets stays with its dead queue, and its buffer with it, until recovery
        # completes it) and an nvme2 job the unplug ended (its queue died with the device). The
        # blkdebug read's I/O errors are completions: its buffers come back, so it is checked.
        [ "$j0" = perf ] && [ "$fault" != reset ] && [ "$r0" != hang ] && leak_check nvme0
        [ "$r1" != hang ] && leak_check nvme1
        [ "$j2" = perf ] && [ "$r2" = ok ] && leak_check nvme2
        [ "$fault" = blkdebug ] && [ "$brc" != 137 ] && leak_check bad
        # leaks: hugepages back, no vfio file open
        free_now="$(cat $hp2 2>/dev/null) $(cat $hp1 2>/dev/null)"
        open_vfio=$(ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c '/dev/vfio/[0-9]')
        if [ "$free_now" != "$free0" ] || [ "$open_vfio" != 0 ]; then
            sleep 1
            free_now="$(cat $hp2 2>/dev/null) $(cat $hp1 2>/dev/null)"
            open_vfio=$(ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c '/dev/vfio/[0-9]')
            if [ "$free_now" != "$free0" ] || [ "$open_vfio" != 0 ]; then
                leaks=$((leaks + 1))
                echo "SOAK-LEAK round $rounds: free hugepages $free_now (start $free0), open vfio files $open_vfio"
                free0=$free_now
            fi
        fi
        last_round=$(($(up) - round_t0))
        echo "SOAK-ROUND $rounds t=$(up)s nvme0=$r0($j0) nvme1=$r1(ns$n1) nic=$rn nvme2=$r2 fault=$fault"
    done
    kill "$watchdog" 2>/dev/null
    [ "$pending_reset" -gt 0 ] && echo "SOAK-NOT-SURVIVED: the last reset(s) had no round after them"
    echo "SOAK-SUMMARY rounds=$rounds ios=$ios bytes_verified=$bytes mismatches=$mism hangs=$hangs leaks=$leaks faults_injected=$finj faults_survived=$fsurv failures=$fails blkdebug=$nblk reset=$nrst"
    [ $((mism + hangs + leaks + fails)) = 0 ] && [ "$finj" = "$fsurv" ]
}

if [ "$guest" = yes ]; then
    # It binds every test device to vfio-pci, writes their namespaces and resets them: never on a
    # real host.
    where=$(sh "$(dirname "$0")/vm/guest/in-testbed" -v) ||
        die "--guest runs only inside the project's test guest (it binds devices to vfio-pci, writes their namespaces and resets them), and this machine is not one ($where). On a host run scripts/soak.sh without --guest: it boots the guest and runs this side there."
    guest_main
    exit
fi

# =================================================================================================
# host side
# =================================================================================================
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 2
cache=${UBD_VM_CACHE:-$repo/.vm-cache}
if [ "$build" = yes ]; then
    cargo build -q --bin ubdirect || die "cargo build --bin ubdirect failed"
fi
[ -x "${CARGO_TARGET_DIR:-$repo/target}/debug/ubdirect" ] || die "no target/debug/ubdirect: build it (cargo build --bin ubdirect)"
command -v python3 >/dev/null || die "python3 is needed for the QMP client"

# keep the 3 newest earlier soak runs (each holds ~300 MiB of backing files); a run in progress
# (its .lock held by run.sh) is never removed
{ ls -1dt "$cache"/runs/soak-* 2>/dev/null || true; } | tail -n +4 | while read -r old; do
    if flock -n "$old/.lock" true 2>/dev/null || [ ! -e "$old/.lock" ]; then rm -rf "$old"; fi
done
D="$cache/runs/soak-$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$D"
D=$(cd "$D" && pwd)
QMP="$D/qmp.sock"
CON="$D/console.log"
truncate -s 64M "$D/nvme2.img"

# qmp JSON...: send each command (after the capabilities handshake); print the replies.
qmp() {
    python3 - "$QMP" "$@" <<'EOF'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(sys.argv[1])
f = s.makefile("rw")
def reply():
    while True:
        m = json.loads(f.readline())
        if "event" not in m:
            return m
f.readline()
f.write(json.dumps({"execute": "qmp_capabilities"}) + "\n"); f.flush(); reply()
bad = 0
for c in sys.argv[2:]:
    f.write(c + "\n"); f.flush()
    r = reply()
    print(json.dumps(r))
    bad += "error" in r
sys.exit(1 if bad else 0)
EOF
}

# diagnose WHY: the guest stopped making progress (an unplug it did not release, a round stuck):
# record what the host can see before QEMU is stopped, in $D/hang-diag.log, and print a summary.
# A guest whose console has been silent since the stall cannot have run its own watchdog: it is
# frozen as a whole (every vCPU spinning with interrupts off, or halted with no interrupt coming),
# not one task stuck. The vCPUs' instruction pointers, read twice 5 s apart, tell which: a vCPU
# whose RIP moves and whose QEMU thread uses CPU time spins; one at the same RIP halted.
diagnose() {
    dg="$D/hang-diag.log"
    qpid=$(cat "$D/qemu.pid" 2>/dev/null)
    {
        echo "== $(date +%T) $1"
        echo "console: $(wc -l <"$CON") lines, last change $(($(date +%s) - $(stat -c %Y "$CON")))s ago; last guest line: $(grep -v '^\[' "$CON" | tail -n1 | cut -c1-200)"
        qmp '{"execute":"query-status"}' 2>&1
        [ -n "$qpid" ] && "$repo/scripts/vm/vcpu-diag.sh" "$qpid" "$QMP"
        qmp '{"execute":"human-monitor-command","arguments":{"command-line":"info pci"}}' 2>&1 | grep -iE 'bus|device|non-vga|storage' | head -40
    } >>"$dg" 2>&1
    rips=$(grep -oE 'CPU#[0-9]+|RIP=[0-9a-f]+|HLT=[01]' "$dg" | paste -sd' ' | tail -c 300)
    echo "$(date +%T) diagnosis ($1) in $dg: vCPUs (two samples 5 s apart) $rips" >>"$hlog"
}

extra="-device nvme,id=nvme1,serial=ubd1,mdts=2,addr=05.0"
extra="$extra -blockdev {\"driver\":\"blkdebug\",\"node-name\":\"n1bd\",\"inject-error\":[{\"event\":\"none\",\"iotype\":\"read\",\"errno\":5,\"sector\":$BAD_SECTOR}],\"image\":{\"driver\":\"file\",\"filename\":\"$D/nvme1-ns1.img\"}}"
extra="$extra -device nvme-ns,drive=n1bd,bus=nvme1,nsid=1"
extra="$extra -object throttle-group,id=tg0"
extra="$extra -blockdev driver=file,filename=$D/nvme1-ns2.img,node-name=n1f2"
extra="$extra -blockdev driver=throttle,throttle-group=tg0,file=n1f2,node-name=n1t2"
extra="$extra -device nvme-ns,drive=n1t2,bus=nvme1,nsid=2,logical_block_size=4096,physical_block_size=4096"
extra="$extra -device pcie-root-port,id=rp2,chassis=2,slot=2,addr=0c.0"
extra="$extra -blockdev driver=file,filename=$D/nvme2.img,node-name=n2f"
extra="$extra -device nvme,id=nvme2,serial=ubd2,bus=rp2,drive=n2f"
NVME2_ADD='{"execute":"device_add","arguments":{"driver":"nvme","id":"nvme2","serial":"ubd2","bus":"rp2","drive":"n2f"}}'

echo "$me: run directory $D; duration ${duration}s, seed $seed, rounds of ${round}s"
# nokaslr: the vCPUs' RIPs that diagnose() records map to kernel symbols without the boot's offset
scripts/vm/run.sh --run-dir "$D" --qmp "$QMP" --append nokaslr --devices "nvme0 ivshmem nic0 nic1" --extra-qemu "$extra" \
    --timeout $((duration * 3 + 900)) -- "sh scripts/soak.sh --guest --duration ${duration}s --seed $seed --round $round --fault-rate $rate" \
    >"$CON" 2>&1 &
vm=$!
# interrupted: stop QEMU through its monitor (it runs in its own process group under run.sh)
trap 'qmp "{\"execute\":\"quit\"}" >/dev/null 2>&1; wait "$vm"; echo "soak: 0 passed, 1 failed (interrupted)"; exit 130' INT TERM

# fault loop: until the guest has finished (or run.sh is gone)
hinj=0 hsurv=0 hunver=0 nthr=0 nunp=0 hlog="$D/host-faults.log"
: >"$hlog"
guest_done() { grep -q '^SOAK-SUMMARY' "$CON" 2>/dev/null || ! kill -0 "$vm" 2>/dev/null; }
# wait_line REGEX AFTER_LINE SECONDS: a console line matching REGEX after line AFTER_LINE
wait_line() {
    wl_i=0
    while [ $wl_i -lt "$3" ]; do
        tail -n "+$(($2 + 1))" "$CON" | grep -q "$1" && return 0
        guest_done && return 1
        sleep 1
        wl_i=$((wl_i + 1))
    done
    return 1
}
wait_line '^SOAK-START' 0 900 || true
# faults only while the guest has time left for a round after them
stop_at=$(($(date +%s) + duration - 30))
while ! guest_done; do
    rand 10
    sleep $((5 + R))
    guest_done && break
    # a job the KILL could not end (the guest's watchdog printed the blocked tasks): stop QEMU
    # after the kernel's sysrq output had time to reach the console; no summary = a failed soak
    if grep -q '^SOAK-STUCK' "$CON" 2>/dev/null; then
        echo "$(date +%T) the guest reports a round stuck in the kernel: stopping QEMU in 30 s (a hang)" >>"$hlog"
        sleep 30
        diagnose "a round stuck in the guest kernel"
        qmp '{"execute":"quit"}' >/dev/null 2>&1
        break
    fi
    # a vCPU that has lost its timer interrupt for 100 s and more (the guest's cpuwatch wakes it
    # every 2 s, but its sleeping tasks never run again; seen under TCG on a loaded host): the
    # guest cannot finish, so stop QEMU instead of waiting for run.sh's timeout
    if grep -qE '^GUEST-CPU-STALL cpu [0-9]+: no heartbeat for [0-9]{3,} s' "$CON" 2>/dev/null; then
        echo "$(date +%T) a guest vCPU has had no timer interrupt for 100 s or more: stopping QEMU (a hang)" >>"$hlog"
        diagnose "a guest vCPU without timer interrupts for 100 s"
        qmp '{"execute":"quit"}' >/dev/null 2>&1
        break
    fi
    # a guest frozen as a whole prints nothing, not even its watchdog's SOAK-STUCK lines: a
    # console silent for 300 s (a round prints at least one line, a job is killed at T + 120 s)
    if [ $(($(date +%s) - $(stat -c %Y "$CON"))) -gt 300 ]; then
        echo "$(date +%T) the guest console has been silent for over 300 s: stopping QEMU (a hang)" >>"$hlog"
        diagnose "guest console silent for 300 s"
        qmp '{"execute":"quit"}' >/dev/null 2>&1
        break
    fi
    [ "$(date +%s)" -lt "$stop_at" ] || {
        sleep 2
        continue
    }
    # each kind once first (unplug, then throttle), then at random
    if [ "$nunp" = 0 ]; then
        R=1
    elif [ "$nthr" = 0 ]; then
        R=0
    else
        rand 2
    fi
    case $R in
    0)
        rand 6
        hold=$((3 + R))
        qmp '{"execute":"qom-set","arguments":{"path":"/objects/tg0","property":"limits","value":{"iops-total":40}}}' >>"$hlog" 2>&1 ||
            { echo "throttle: QMP failed" >>"$hlog"; continue; }
        hinj=$((hinj + 1))
        nthr=$((nthr + 1))
        echo "$(date +%T) throttle nvme1 ns2 to 40 IOPS for ${hold}s" >>"$hlog"
        sleep "$hold"
        qmp '{"execute":"qom-set","arguments":{"path":"/objects/tg0","property":"limits","value":{"iops-total":0}}}' >>"$hlog" 2>&1
        at=$(wc -l <"$CON")
        if wait_line 'SOAK-ROUND .* nvme1=ok(ns2)' "$at" 300; then
            hsurv=$((hsurv + 1))
            echo "$(date +%T) throttle survived: a later verified round on ns2 passed" >>"$hlog"
        else
            guest_done || echo "$(date +%T) throttle NOT survived: no passing ns2 round within 300 s" >>"$hlog"
            guest_done && echo "$(date +%T) throttle NOT verified: the soak ended before ns2 ran again" >>"$hlog"
            guest_done && hunver=$((hunver + 1))
        fi
        ;;
    1)
        at=$(wc -l <"$CON")
        qmp '{"execute":"device_del","arguments":{"id":"nvme2"}}' >>"$hlog" 2>&1 || continue
        hinj=$((hinj + 1))
        nunp=$((nunp + 1))
        echo "$(date +%T) unplug nvme2 (device_del)" >>"$hlog"
        gone=no i=0
        while [ $i -lt 120 ]; do
            qmp '{"execute":"query-pci"}' 2>/dev/null | grep -q '"qdev_id": "nvme2"' || {
                gone=yes
                break
            }
            sleep 1
            i=$((i + 1))
        done
        if [ "$gone" != yes ]; then
            echo "$(date +%T) unplug NOT survived: the guest did not release nvme2 within 120 s" >>"$hlog"
            # the guest may be stuck for good: give it 300 s to finish, then stop QEMU
            diagnose "nvme2 not released 120 s after device_del"
            if ! wait_line '^SOAK-SUMMARY' 0 300; then
                echo "$(date +%T) the guest printed no summary 300 s later: stopping QEMU (a hang)" >>"$hlog"
                diagnose "no summary 300 s later"
                qmp '{"execute":"quit"}' >/dev/null 2>&1
            fi
            break
        fi
        echo "$(date +%T) nvme2 gone after ${i}s; plugging it back" >>"$hlog"
        sleep 2
        qmp "$NVME2_ADD" >>"$hlog" 2>&1
        if wait_line 'SOAK-EVENT nvme2 verified again' "$at" 300; then
            hsurv=$((hsurv + 1))
            echo "$(date +%T) unplug survived: nvme2 verified again after the re-plug" >>"$hlog"
        elif guest_done; then
            echo "$(date +%T) unplug NOT verified: the soak ended before nvme2 ran again" >>"$hlog"
            hunver=$((hunver + 1))
        else
            echo "$(date +%T) unplug NOT survived: no verified nvme2 job within 300 s of the re-plug" >>"$hlog"
        fi
        ;;
    esac
done
wait "$vm"
vmrc=$?

grep -E '^SOAK-(START|FAULT|SURVIVED|NOT-SURVIVED|FAIL|LEAK|EVENT|STUCK)|^GUEST-CPU-STALL|^#   ' "$CON" | tail -n 140
sed 's/^/host: /' "$hlog" | grep -v '"return"' | tail -n 30
sum=$(grep '^SOAK-SUMMARY' "$CON" | tail -n1)
get() { echo "$sum" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
if [ -z "$sum" ]; then
    echo "$me: the guest printed no summary (run.sh status $vmrc); log: $CON; its last lines:"
    tail -n 40 "$CON" | sed 's/^/console: /'
    echo "$me: the guest printed no summary (run.sh status $vmrc)"
    echo "soak: 0 passed, 1 failed"
    exit 1
fi
finj=$(($(get faults_injected) + hinj))
fsurv=$(($(get faults_survived) + hsurv))
echo "soak ($duration s, seed $seed): rounds $(get rounds) (at least $min_rounds), I/Os $(get ios), bytes verified $(get bytes_verified), mismatches $(get mismatches), hangs $(get hangs), leaks $(get leaks), faults injected $finj (guest $(get faults_injected): blkdebug $(get blkdebug), reset $(get reset); host $hinj: unplug $nunp, throttle $nthr), faults survived $fsurv, not verified $hunver, job failures $(get failures); log: $CON"
pass=0 fail=0
tally() { if [ "$1" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi; }
tally "$(get mismatches)"
tally "$(get hangs)"
tally "$(get leaks)"
tally "$(get failures)"
# a fault not shown survived (failed, or no round after it to show it) is a failure
tally $((finj - fsurv))
tally "$vmrc"
# enough rounds, and every kind of fault injected at least once
tally $(($(get rounds) >= min_rounds ? 0 : 1))
missing=
for k in "blkdebug $(get blkdebug)" "reset $(get reset)" "unplug $nunp" "throttle $nthr"; do
    set -- $k
    [ "${2:-0}" -gt 0 ] || missing="$missing $1"
done
[ -z "$missing" ] || echo "$me: fault kinds never injected:$missing (a longer --duration gives them room)"
tally $([ -z "$missing" ] && echo 0 || echo 1)
echo "soak: $pass passed, $fail failed"
[ "$fail" = 0 ]
exit
}
