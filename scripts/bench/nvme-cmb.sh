#!/usr/bin/env bash
# NVMe I/O submission queues in host memory vs in the Controller Memory Buffer (issue 12), in
# ONE guest boot: a null-co NVMe controller with a 1 MiB CMB (QEMU `cmb_size_mb=1`, so the
# controller is the limit, not a disk image) at 00:10.0, 1 vCPU, release build. ROUNDS
# interleaved rounds; in each, for every depth, `ubdirect perf` with the SQ in host memory and
# with `--sq-in-cmb` (the order alternates between rounds), 4 KiB random reads. Prints every run,
# then medians per placement and depth and the ratio CMB / host.
#
#   scripts/bench/nvme-cmb.sh        (env: ROUNDS=3 DEPTHS="1 32 128" SECS=2 BIN=target/release/ubdirect)
#
# Build first: cargo build --release --bin ubdirect
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/ubdirect}
[[ -x $BIN ]] || { echo "nvme-cmb.sh: $BIN missing: cargo build --release --bin ubdirect" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-"1 32 128"}
SECS=${SECS:-2}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "# $(date -u '+%F %T UTC'), host load average: $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD)"
scripts/vm/run.sh --smp 1 --devices nvme0 --bin "$BIN" \
    --extra-qemu "-drive driver=null-co,size=1G,read-zeroes=on,if=none,id=nullb -device nvme,serial=ubdnullcmb,drive=nullb,cmb_size_mb=1,addr=0x10" \
    --env "ROUNDS=$ROUNDS" --env "DEPTHS=$DEPTHS" --env "SECS=$SECS" \
    -- 'sh scripts/bench/nvme-cmb-guest.sh' | tee "$log" | grep -E '^(R|FAIL|#) ' || true
echo "# done $(date -u '+%T UTC'), host load average: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$log" <<'PY'
import sys, statistics as st, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 8 and f[0] == "R":
        runs[(f[2], int(f[3]))].append(tuple(float(x) for x in f[4:]))
depths = sorted({q for _, q in runs})
med = lambda e, q, i: st.median([r[i] for r in runs[(e, q)]]) if runs.get((e, q)) else None
print("\n| QD | SQ in | runs | IOPS median (range) | mean lat (us) | p50 (us) | p99 (us) |")
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
for q in depths:
    for e in ("host", "cmb"):
        v = runs.get((e, q), [])
        if not v:
            print(f"| {q} | {e} | 0 | failed | | | |"); continue
        io = [r[0] for r in v]
        print(f"| {q} | {e} | {len(v)} | {st.median(io):,.0f} ({min(io):,.0f}-{max(io):,.0f}) | "
              f"{med(e,q,1)/1e3:.1f} | {med(e,q,2)/1e3:.1f} | {med(e,q,3)/1e3:.1f} |")
print("\n| QD | CMB / host (IOPS) | CMB / host (mean latency) |")
print("| ---: | ---: | ---: |")
for q in depths:
    h, c = med("host", q, 0), med("cmb", q, 0)
    hl, cl = med("host", q, 1), med("cmb", q, 1)
    r = lambda a, b: f"{a/b:.2f}" if a and b else "n/a"
    print(f"| {q} | {r(c, h)} | {r(cl, hl)} |")
PY
