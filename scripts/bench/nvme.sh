#!/usr/bin/env bash
# NVMe against the floor and the kernel, in ONE guest boot: a null-co NVMe
# controller (QEMU's emulated controller in front of a null block driver, so the controller is
# the limit) at 00:10.0, 1 vCPU, release build. Per round and depth: the floor loop
# (`perf --engine floor`, shadow doorbells off: "floor"; on: "floor-sh"), ubdirect perf with shadow doorbells auto (the default), on and off, then the kernel's
# polled io_uring (`--engine uring-iopoll`: O_DIRECT + IOPOLL + registered buffers on
# /dev/nvmeXn1; `--engine uring-cmd`: NVMe passthrough on /dev/ngXn1), 4 KiB random reads.
# Prints every run, then medians per engine and depth and the ratios ubdirect / floor and
# ubdirect / best kernel.
#
# With --cmb: I/O submission queues in host memory vs in the Controller Memory Buffer
# instead: the same controller with a 1 MiB CMB (QEMU `cmb_size_mb=1`); per round and depth,
# `ubdirect perf` with the SQ in host memory and with `--sq-in-cmb` (the order alternates
# between rounds). Prints every run, then medians per placement and depth and the ratio CMB / host.
#
# With --pad: how much per-I/O work the device's pace hides: per round and depth, the floor loop
# bare and with PADS cycle-counter ticks of busy-waiting per read (`--floor-pad-cycles`, engine
# "floor+N"), and ubdirect perf (shadow doorbells auto and off), no kernel engines. Prints every
# run, the medians, each padded floor / bare floor, and the driver's own submit + complete
# cycles per I/O for comparison.
#
#   scripts/bench/nvme.sh            (env: ROUNDS=3 DEPTHS="1 32 128 256" SECS=2 BIN=target/release/ubdirect)
#   scripts/bench/nvme.sh --pad      (env: ROUNDS=3 DEPTHS="1 32 128" PADS="250 500 1000 2000 4000" SECS=2)
#   scripts/bench/nvme.sh --cmb      (env: ROUNDS=3 DEPTHS="1 32 128" SECS=2 BIN=target/release/ubdirect)
#
# With --capi: what the C API's boundary costs: per round and depth, `ubdirect perf` (shadow
# doorbells auto) and the C perf loop examples/c/perf_loop.c (random reads through libubdirect,
# release build, one callback per I/O that submits the next, as SPDK programs do) on the same
# controller. Prints every run, the medians and the ratio C API / ubdirect perf.
#
#   scripts/bench/nvme.sh --capi     (env: ROUNDS=3 DEPTHS="1 32" SECS=2 BIN=target/release/ubdirect)
#                                    (build first: cargo build --release -p ubdirect-cli --bin ubdirect && cargo build --release -p ubdirect-capi)
#
# OLD_BIN=path/to/an/older/ubdirect adds engine "ubdirect-old" (that binary, shadow doorbells
# auto) to every round: a before/after comparison of a driver change in one boot.
#
# Build first: cargo build --release --bin ubdirect
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=floor
case ${1:-} in
    "") ;;
    --cmb) MODE=cmb ;;
    --pad) MODE=pad ;;
    --capi) MODE=capi ;;
    *) echo "nvme.sh: unknown argument '$1': --cmb (SQs in host memory vs in the CMB), --pad (the floor with per-I/O padding) or --capi (the C API's perf loop beside ubdirect perf)" >&2; exit 2 ;;
esac
BIN=${BIN:-target/release/ubdirect}
[[ -x $BIN ]] || { echo "nvme.sh: $BIN missing: cargo build --release --bin ubdirect" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-2}
if [[ $MODE == cmb ]]; then
    DEPTHS=${DEPTHS:-"1 32 128"}
    ctrl="serial=ubdnullcmb,drive=nullb,cmb_size_mb=1,addr=0x10"
elif [[ $MODE == pad ]]; then
    DEPTHS=${DEPTHS:-"1 32 128"}
    ctrl="serial=ubdnull,drive=nullb,addr=0x10"
elif [[ $MODE == capi ]]; then
    DEPTHS=${DEPTHS:-"1 32"}
    ctrl="serial=ubdnull,drive=nullb,addr=0x10"
else
    DEPTHS=${DEPTHS:-"1 32 128 256"}
    ctrl="serial=ubdnull,drive=nullb,addr=0x10"
fi
PADS=${PADS:-"250 500 1000 2000 4000"}
log=$(mktemp)
old=$(mktemp -d)
trap 'rm -rf "$log" "$old"' EXIT
extra=()
if [[ -n ${OLD_BIN:-} ]]; then
    [[ -x $OLD_BIN ]] || { echo "nvme.sh: OLD_BIN=$OLD_BIN is not an executable" >&2; exit 2; }
    cp "$OLD_BIN" "$old/ubdirect-old"
    extra=(--bin "$old/ubdirect-old" --env OLD=1)
fi
if [[ $MODE == capi ]]; then
    so=$(dirname "$BIN")/libubdirect.so
    [[ -f $so ]] || { echo "nvme.sh: $so missing: cargo build --release -p ubdirect-capi" >&2; exit 2; }
    # The loop finds libubdirect.so beside it ($ORIGIN): the guest's /ubd/bin holds both.
    mkdir -p "$old/capi/bin"
    cp "$so" "$old/capi/bin/libubdirect.so"
    cc -std=c11 -O2 -Wall -Wextra -Werror -Icapi/include examples/c/perf_loop.c \
        -o "$old/ubd_capi_perf_loop" -L"$old/capi/bin" -Wl,-rpath,'$ORIGIN' -lubdirect ||
        { echo "nvme.sh: cc examples/c/perf_loop.c failed" >&2; exit 2; }
    extra+=(--bin "$old/ubd_capi_perf_loop" --files "$old/capi")
fi
echo "# $(date -u '+%F %T UTC'), host load average: $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD)"
scripts/vm/run.sh --smp 1 --tick oneshot --devices nvme0 --bin "$BIN" \
    --extra-qemu "-drive driver=null-co,size=1G,read-zeroes=on,if=none,id=nullb -device nvme,$ctrl" \
    --env "MODE=$MODE" --env "ROUNDS=$ROUNDS" --env "DEPTHS=$DEPTHS" --env "SECS=$SECS" --env "PADS=$PADS" "${extra[@]}" \
    -- 'sh scripts/bench/nvme-guest.sh' | tee "$log" | grep -E '^(R|C|FAIL|#) ' || true
echo "# done $(date -u '+%T UTC'), host load average: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$log" "$MODE" <<'PY'
import sys, statistics as st, collections
mode = sys.argv[2]
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 8 and f[0] == "R":
        runs[(f[2], int(f[3]))].append(tuple(float(x) for x in f[4:]))
if mode == "cmb":
    column, engines = "SQ in", ["host", "cmb"]
elif mode == "capi":
    column, engines = "engine", ["ubdirect", "capi"]
elif mode == "pad":
    pads = sorted({int(e[6:]) for e, _ in runs if e.startswith("floor+")})
    column, engines = "engine", ["floor"] + [f"floor+{p}" for p in pads] + ["ubdirect", "ubdirect-nosh"]
else:
    column, engines = "engine", ["floor", "floor-sh", "ubdirect", "ubdirect-on", "ubdirect-nosh", "ubdirect-old", "uring-iopoll", "uring-cmd"]
depths = sorted({q for _, q in runs})
def med(e, q, i):
    v = [r[i] for r in runs.get((e, q), [])]
    return st.median(v) if v else None
r = lambda a, b: f"{a/b:.2f}" if a and b else "n/a"
print(f"\n| QD | {column} | runs | IOPS median (range) | mean lat (us) | p50 (us) | p99 (us) |")
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
for q in depths:
    for e in engines:
        v = runs.get((e, q), [])
        if not v:
            if e == "ubdirect-old" and not any(k[0] == e for k in runs):
                continue  # no OLD_BIN given
            print(f"| {q} | {e} | 0 | failed | | | |"); continue
        io = [r[0] for r in v]
        us = lambda i: f"{med(e,q,i)/1e3:.1f}" if med(e, q, i) else "n/a"
        print(f"| {q} | {e} | {len(v)} | {st.median(io):,.0f} ({min(io):,.0f}-{max(io):,.0f}) | "
              f"{us(1)} | {us(2)} | {us(3)} |")
cyc = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 8 and f[0] == "C":
        cyc[(f[2], int(f[3]))].append(tuple(float(x) for x in f[4:]))
if cyc:
    print("\n| QD | engine | submit cycles/IO | complete cycles/IO | SQ doorbells/IO | CQ doorbells/IO |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for q in depths:
        for e in engines:
            v = cyc.get((e, q), [])
            if v:
                m = [st.median(x[i] for x in v) for i in range(4)]
                print(f"| {q} | {e} | {m[0]:,.0f} | {m[1]:,.0f} | {m[2]:.3f} | {m[3]:.3f} |")
if mode == "cmb":
    print("\n| QD | CMB / host (IOPS) | CMB / host (mean latency) |")
    print("| ---: | ---: | ---: |")
    for q in depths:
        print(f"| {q} | {r(med('cmb', q, 0), med('host', q, 0))} | {r(med('cmb', q, 1), med('host', q, 1))} |")
    sys.exit(0)
if mode == "capi":
    print("\n| QD | C API / ubdirect perf (IOPS) |")
    print("| ---: | ---: |")
    for q in depths:
        print(f"| {q} | {r(med('capi', q, 0), med('ubdirect', q, 0))} |")
    sys.exit(0)
if mode == "pad":
    print("\n| QD | engine | padding cycles/IO | IOPS / bare floor | driver's own cycles/IO (submit + complete) |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for q in depths:
        fl = med("floor", q, 0)
        for e in engines:
            if not med(e, q, 0):
                continue
            pad = e[6:] if e.startswith("floor+") else ("0" if e == "floor" else "")
            c = cyc.get((e, q), [])
            own = f"{st.median(x[0] + x[1] for x in c):,.0f}" if c and e.startswith("ubdirect") else ""
            print(f"| {q} | {e} | {pad} | {r(med(e, q, 0), fl)} | {own} |")
    sys.exit(0)
if any(e == "ubdirect-old" for e, _ in runs):
    print("\n| QD | ubdirect-old IOPS | ubdirect IOPS | new / old | old / floor | new / floor |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for q in depths:
        o, n, fl = med("ubdirect-old", q, 0), med("ubdirect", q, 0), med("floor", q, 0)
        if o and n and fl:
            print(f"| {q} | {o:,.0f} | {n:,.0f} | {n/o:.2f} | {o/fl:.2f} | {n/fl:.2f} |")
print("\n| QD | ubdirect (auto) / floor (IOPS) | ubdirect-on / floor-sh | ubdirect-nosh / floor | floor / ubdirect mean latency | best kernel | ubdirect (auto) / best kernel |")
print("| ---: | ---: | ---: | ---: | ---: | --- | ---: |")
for q in depths:
    fl, u, uo, un = med("floor", q, 0), med("ubdirect", q, 0), med("ubdirect-on", q, 0), med("ubdirect-nosh", q, 0)
    ks = [(med(k, q, 0), k) for k in ("uring-iopoll", "uring-cmd") if med(k, q, 0)]
    best = max(ks) if ks else None
    lat = r(med("floor", q, 1), med("ubdirect", q, 1))
    print(f"| {q} | {r(u, fl)} | {r(uo, med('floor-sh', q, 0))} | {r(un, fl)} | {lat} | {best[1] + f' {best[0]:,.0f}' if best else 'n/a'} | {r(u, best[0] if best else None)} |")
PY
