#!/usr/bin/env bash
# NVMe-oF over TCP: the kernel's NVMe/TCP initiator as the baseline (and, once the
# nvmf helper's code lands, ubdirect's initiator: UBD_NVMF_UBDIRECT=1, see the SLOT in
# scripts/bench/nvmf-guest.sh), 4 KiB reads at QD 1/32/128 and 1 MiB streaming reads, against the
# kernel nvmet target exporting the test bed's nvme0 namespace (QEMU NVMe, file-backed).
#
#   scripts/bench/nvmf.sh [--mode loop|pair] [--kernel 6.12|ubd]
#     loop (default): one guest (1 vCPU), target and initiator on 127.0.0.1 (they share the vCPU)
#     pair: two guests (scripts/vm/pair.sh), 1 vCPU each, over a QEMU stream socket link
#   env: ROUNDS=3 DEPTHS="1 32 128" SECS=3 IOS=2048 STREAM_MIB=64
#        BIN=target/release/ubdirect (else target/debug/ubdirect: the io_uring engine runs
#        through `ubdirect pipeline --source file:/dev/nvmeXn1`; see the guest half)
#        BIN_BEFORE=FILE: a second ubdirect (e.g. built from the commit before a change), run
#        as engine ubdirect-tcp-before right after each ubdirect-tcp run in the same boot
#        (needs UBD_NVMF_UBDIRECT=1): before and after side by side
#        UBD_NVMF_SPIN_TOO=1: ubdirect-tcp-spin, the same build with UBD_NVMF_SPIN=1 (no poll(2)
#        wait when idle), right after each ubdirect-tcp run
#        UBD_NVMF_NOSPIN_TOO=1: ubdirect-tcp-nospin, the same build with UBD_NVMF_IDLE_SPIN_US=0
#        (no bounded spin before the poll(2) wait), right after each
#        ubdirect-tcp run
#        UBD_NVMF_IDLE_SPIN_US=N: the bounded spin of the ubdirect-tcp runs (default 50)
# The kernel engine's reads are one NVMe/TCP command each (merges off on the path device; "# D"
# lines give commands and KiB per command per run, FAIL if a 4 KiB run's reads were merged).
# Prints every run and a table of medians. TCG guest: compare engines side by side in one run,
# never with other tables.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=loop kernel=${UBD_VM_KERNEL:-6.12}
while (($# > 0)); do
    case $1 in
    --mode) mode=$2 && shift 2 ;;
    --kernel) kernel=$2 && shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
    *) echo "nvmf.sh: unknown option '$1' (see --help)" >&2 && exit 2 ;;
    esac
done
bin_args=()
BIN=${BIN:-target/release/ubdirect}
[[ -x $BIN ]] || BIN=target/debug/ubdirect
[[ -x $BIN ]] && bin_args=(--bin "$BIN")
envs=(--env "ROUNDS=${ROUNDS:-3}" --env "DEPTHS=${DEPTHS:-1 32 128}" --env "IOS=${IOS:-2048}" --env "SECS=${SECS:-3}"
    --env "STREAM_MIB=${STREAM_MIB:-64}" --env "UBD_NVMF_UBDIRECT=${UBD_NVMF_UBDIRECT:-0}" --env "UBD_NVMF_SPIN_TOO=${UBD_NVMF_SPIN_TOO:-0}"
    --env "UBD_NVMF_NOSPIN_TOO=${UBD_NVMF_NOSPIN_TOO:-0}")
[[ -n ${UBD_NVMF_IDLE_SPIN_US:-} ]] && envs+=(--env "UBD_NVMF_IDLE_SPIN_US=$UBD_NVMF_IDLE_SPIN_US")
log=$(mktemp)
before_dir=$(mktemp -d)
trap 'rm -rf "$log" "$before_dir"' EXIT
if [[ -n ${BIN_BEFORE:-} ]]; then
    [[ -x $BIN_BEFORE ]] || { echo "nvmf.sh: BIN_BEFORE=$BIN_BEFORE is not an executable" >&2 && exit 2; }
    cp "$BIN_BEFORE" "$before_dir/ubdirect-before"
    bin_args+=(--bin "$before_dir/ubdirect-before")
    envs+=(--env UBD_NVMF_BEFORE=1)
fi
echo "# $(date -u '+%F %T UTC'), mode $mode, kernel $kernel, host load average: $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD)"
case $mode in
loop)
    scripts/vm/run.sh --kernel "$kernel" --smp 1 --tick oneshot --mem 2G --devices nvme0 \
        --hugepages "default_hugepagesz=2M hugepagesz=2M hugepages=128" "${bin_args[@]}" "${envs[@]}" --env TARGET=127.0.0.1 \
        -- 'addr=$(echo $UBD_NVME | cut -d, -f1); scripts/vm/nvmet.sh 127.0.0.1 --dev /dev/$(ls /sys/bus/pci/devices/$addr/nvme)n1 >/dev/null && bash scripts/bench/nvmf-guest.sh' |
        tee "$log" | grep -E '^(R|FAIL|#) ' || true
    ;;
pair)
    scripts/vm/pair.sh --kernel "$kernel" "${bin_args[@]}" "${envs[@]}" --env TARGET=10.77.0.1 \
        -- 'bash scripts/bench/nvmf-guest.sh' | tee "$log" | grep -E '^(R|FAIL|#|pair:) ' || true
    ;;
*) echo "nvmf.sh: --mode loop or pair, not '$mode'" >&2 && exit 2 ;;
esac
echo "# done $(date -u '+%T UTC'), host load average: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$log" <<'PY'
import sys, statistics as st, collections
runs = collections.defaultdict(list)
cpu = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 9 and f[0] == "R":
        runs[(f[2], int(f[3]), int(f[4]))].append([float(x) for x in f[7:]])
    if len(f) == 8 and f[:2] == ["#", "C"] and f[6] == "cpu_s_per_gb":
        cpu[(f[3], int(f[4]), int(f[5]))].append(float(f[7]))
print("\n| engine | QD | block | runs | IOPS median (range) | MiB/s median | mean latency (us) | p99 (us) | CPU-s/GB (runs) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for (e, q, b), v in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
    io = [x[0] for x in v]
    m = lambda i: f"{st.median(x[i] for x in v):,.1f}" if all(len(x) > i for x in v) else ""
    c = ", ".join(f"{x:g}" for x in cpu.get((e, q, b), []))
    print(f"| {e} | {q} | {'1 MiB' if b == 1048576 else '4 KiB'} | {len(v)} | {st.median(io):,.0f} ({min(io):,.0f}-{max(io):,.0f}) | {m(1)} | {m(2)} | {m(3)} | {c} |")
PY
