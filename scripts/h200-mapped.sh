#!/usr/bin/env bash
# File -> GPU in mapped mode (`--io mapped`) on a CUDA machine (the H200 device machine), in one
# call of the device tool:
# - the copy-size sweep: for each --copy-size, the H2D ceiling with copies of that size (pinned
#   pool blocks -> GPU, --segments) and two mapped runs in the same process (run 1 registers the
#   windows while it streams, run 2 reuses them: the steady rate);
# - cold single passes of the whole file (registration included; a new process each) by
#   registration threads and window length;
# - --verify runs (GPU checksum == read() checksum): default settings, a registry cap smaller
#   than the file (windows let go of and registered ahead), 4 MiB copies;
# - optionally an older binary (BIN_DIR/ubdirect-old) for the same steady and cold runs;
# - with PROBE=1, scripts/h200-register-probe.py (copied beside the binaries): what registration
#   costs and that the driver holds copy submission while it registers;
# - with HUGE=1, the cold passes again from a huge-page tmpfs (mount -t tmpfs -o huge=always).
#
# Usage: scripts/h200-mapped.sh [BIN_DIR] [OUT_DIR]
#   BIN_DIR holds `ubdirect` (cargo build --release -p ubdirect-cli), optionally `ubdirect-old`
#   and `cuda_sink` (the ubdirect-cuda GPU test binary, run with --ignored).
# Env: SHM_GIB (8), SECS (2), QD (32), COPIES ("4M 16M 32M 64M"), THREADS ("1 2 4 8"),
#      WINDOWS ("64M 256M 1G"), COLD_REPEAT (3), CORE (auto: a CPU near the GPU).
set -u
BIN_DIR=${1:-.device-carry}
OUT=${2:-${OUT:-/tmp/ubd-mapped}}
UBD="$BIN_DIR/ubdirect"
OLD="$BIN_DIR/ubdirect-old"
SHM_GIB=${SHM_GIB:-8}
SECS=${SECS:-2}
QD=${QD:-32}
COPIES=${COPIES:-4M 16M 32M 64M}
THREADS=${THREADS:-1 2 4 8}
WINDOWS=${WINDOWS:-64M 256M 1G}
COLD_REPEAT=${COLD_REPEAT:-3}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
log() { echo "== $*" | tee -a "$LOG"; }

for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export RUST_LOG=${RUST_LOG:-warn}

{ date -u; uname -r; nproc; free -g | head -2; nvidia-smi -L;
  nvidia-smi --query-gpu=pci.bus_id,pcie.link.gen.current,pcie.link.width.current,driver_version --format=csv,noheader; } >> "$LOG" 2>&1
GPU_BDF=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null | head -1 | tr 'A-F' 'a-f' | sed 's/^0000\(....\)/\1/')
LOCAL=$(cat "/sys/bus/pci/devices/${GPU_BDF,,}/local_cpulist" 2>/dev/null || echo 0-$(($(nproc)-1)))
FIRST=$(echo "$LOCAL" | cut -d, -f1 | cut -d- -f1)
CORE=${CORE:-$((FIRST + 1))}
log "GPU $GPU_BDF local CPUs $LOCAL; polling core $CORE"
echo 2048 > /proc/sys/vm/nr_hugepages 2>/dev/null || true

if [ -x "$BIN_DIR/cuda_sink" ]; then
    log "cuda_sink tests (--ignored)"
    timeout 120 "$BIN_DIR/cuda_sink" --ignored --test-threads=1 > "$OUT/cuda_sink_tests.txt" 2>&1
    echo "rc=$?" >> "$OUT/cuda_sink_tests.txt"
    grep -E "^test |test result|rc=" "$OUT/cuda_sink_tests.txt" | tee -a "$LOG"
fi

SHM=/dev/shm/ubd-src.bin
log "making $SHM (${SHM_GIB} GiB of random data)"
head -c 1G /dev/urandom > /dev/shm/ubd-1g.bin
: > "$SHM"
for _ in $(seq "$SHM_GIB"); do cat /dev/shm/ubd-1g.bin >> "$SHM"; done
rm -f /dev/shm/ubd-1g.bin

# run NAME BINARY ARGS...: one pipeline run; a line per report.
run() {
    local name=$1 bin=$2; shift 2
    [ -x "$bin" ] || return 0
    echo "$name: $(basename "$bin") pipeline $*" >> "$LOG"
    timeout 120 "$bin" pipeline "$@" --json > "$OUT/$name.json" 2> "$OUT/$name.err"
    local rc=$?
    python3 - "$OUT/$name.json" "$name" "$rc" <<'PY' | tee -a "$LOG"
import json, sys
path, name, rc = sys.argv[1:]
try:
    runs = json.load(open(path))["runs"]
except Exception as e:
    print(f"{name}: rc={rc} no JSON ({e})"); sys.exit()
for r in runs:
    m = r.get("mapped") or {}
    extra = ""
    if m:
        extra = (f" reg {m.get('windows_registered')}x{m.get('window', 0) >> 20}M in {m.get('register_s', 0):.3f}s"
                 f" t{m.get('register_threads', '-')} wait {m.get('register_wait_s', 0):.3f}s reused {m.get('windows_reused')}")
    v = r.get("verify")
    if v:
        extra += " verify " + ("OK" if v["ok"] else "MISMATCH")
    print(f"{name}: {r['label'][:34]:34} copy {r['block_size'] >> 10:6} KiB {r['bytes_per_s'] / 1e9:6.2f} GB/s"
          f" {r['cpu_ns_per_byte']:.4f} CPU-s/GB {r['cores_used']:.2f} cores{extra}")
PY
    [ "$rc" -eq 0 ] || tail -3 "$OUT/$name.err" | tee -a "$LOG"
}

S="--source file:$SHM --sink cuda --core $CORE --qd $QD --io mapped"
log "copy-size sweep: ceiling (same copy size) + run 1 (registers) + run 2 (steady), one process each"
for cs in $COPIES; do
    run "sweep-$cs" "$UBD" $S --seconds "$SECS" --segments --repeat 2 --copy-size "$cs"
done
run sweep-old "$OLD" $S --seconds "$SECS" --segments --repeat 2
log "cold single passes of ${SHM_GIB} GiB (registration included, a new process each)"
for i in $(seq "$COLD_REPEAT"); do
    run "cold-default-$i" "$UBD" $S --bytes "${SHM_GIB}G"
    run "cold-old-$i" "$OLD" $S --bytes "${SHM_GIB}G"
done
for t in $THREADS; do
    run "cold-t$t" "$UBD" $S --bytes "${SHM_GIB}G" --register-threads "$t"
done
for w in $WINDOWS; do
    run "cold-w$w" "$UBD" $S --bytes "${SHM_GIB}G" --map-window "$w"
done
log "verify"
run verify-default "$UBD" $S --bytes "${SHM_GIB}G" --verify
run verify-cap1g "$UBD" $S --bytes "${SHM_GIB}G" --verify --map-cap 1G
run verify-4m "$UBD" $S --bytes "${SHM_GIB}G" --verify --copy-size 4M
if [ "${PROBE:-0}" = 1 ] && [ -f "$BIN_DIR/h200-register-probe.py" ]; then
    log "registration probe (1 GiB windows)"
    timeout 120 python3 "$BIN_DIR/h200-register-probe.py" "$SHM" 1024 8 2>&1 | tee -a "$LOG"
fi
if [ "${HUGE:-0}" = 1 ]; then
    log "cold passes from a huge-page tmpfs"
    mkdir -p /mnt/ubd-hp && mount -t tmpfs -o size=$((SHM_GIB + 2))G,huge=always tmpfs /mnt/ubd-hp \
        && cp "$SHM" /mnt/ubd-hp/src.bin && grep ShmemHugePages /proc/meminfo | tee -a "$LOG"
    H="--source file:/mnt/ubd-hp/src.bin --sink cuda --core $CORE --qd $QD --io mapped"
    for i in $(seq "$COLD_REPEAT"); do
        run "hp-cold-$i" "$UBD" $H --bytes "${SHM_GIB}G"
        run "hp-cold-old-$i" "$OLD" $H --bytes "${SHM_GIB}G"
    done
    run hp-cold-qd128 "$UBD" $H --bytes "${SHM_GIB}G" --qd 128
    umount /mnt/ubd-hp
fi
rm -f "$SHM"
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" && echo "results: $OUT.tgz"
