#!/usr/bin/env bash
# The Python package on a CUDA machine (the H200 device machine), in one call of the device tool:
# the pytest suite (GPU tests included) against the wheel, then file -> GPU from an 8 GiB
# /dev/shm file: the CLI's mapped pipeline, ubdirect.Loader, a PyTorch-style threaded loader,
# and KvikIO when its wheels are carried.
#
# Usage: python/bench/h200.sh CARRY_DIR [OUT_DIR]
#   CARRY_DIR holds the wheel (pip wheel ./python), `ubdirect` (the release CLI), optionally
#   wheels/ (pytest and its dependencies, for a machine without pytest) and kvikio/ (kvikio-cu13,
#   libkvikio-cu13, rapids-logger, cuda-pathfinder, nvidia-cufile: installed --no-deps, without
#   cupy: KvikIO reads into torch tensors); TESTS (python/tests beside this script) the suite.
# Env: SHM_GIB (8), ITEM_MIB ("256,64": Loader item sizes), THREADS ("8,16"), PASSES (3),
#   KVIKIO_THREADS ("1,8,16").
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TESTS=${TESTS:-$here/../tests}
CARRY=${1:?usage: h200.sh CARRY_DIR [OUT_DIR]}
OUT=${2:-${OUT:-/tmp/ubd-py}}
SHM_GIB=${SHM_GIB:-8}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
log() { echo "== $*" | tee -a "$LOG"; }
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
{ date -u; uname -r; nproc; ldd --version | head -1; python3 --version; nvidia-smi -L;
  python3 -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)'; } >> "$LOG" 2>&1

# The wheel unpacked onto PYTHONPATH (no network, no pip index needed).
PKG="$OUT/site"
rm -rf "$PKG" && mkdir -p "$PKG"
whl=$(ls "$CARRY"/ubdirect-*.whl | head -1)
python3 -m zipfile -e "$whl" "$PKG"
export PYTHONPATH="$PKG"
log "wheel $(basename "$whl"): $(python3 -c 'import ubdirect; print("imports; GPUs:", ubdirect.cuda_device_count())' 2>&1)"

if ! python3 -c 'import pytest' 2>/dev/null; then
    # pytest and its dependencies from the carried wheels (pure Python).
    python3 -m pip install -q --no-index --find-links "$CARRY/wheels" --target "$OUT/pytest" pytest >> "$LOG" 2>&1
    export PYTHONPATH="$PKG:$OUT/pytest"
fi
log "pytest $TESTS"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs "$TESTS" 2>&1 | tail -n 25 | tee -a "$LOG"

SHM=/dev/shm/ubd-src.bin
log "making $SHM (${SHM_GIB} GiB of random data)"
head -c 1G /dev/urandom > /dev/shm/ubd-1g.bin
: > "$SHM"
for _ in $(seq "$SHM_GIB"); do cat /dev/shm/ubd-1g.bin >> "$SHM"; done
rm -f /dev/shm/ubd-1g.bin
GPU_BDF=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null | head -1 | tr 'A-F' 'a-f' | sed 's/^0000\(....\)/\1/')
LOCAL=$(cat "/sys/bus/pci/devices/${GPU_BDF,,}/local_cpulist" 2>/dev/null || echo 0-$(($(nproc)-1)))
CORE=$(( $(echo "$LOCAL" | cut -d, -f1 | cut -d- -f1) + 1 ))
echo 2048 > /proc/sys/vm/nr_hugepages 2>/dev/null || true

log "CLI: ubdirect pipeline --source file:$SHM --sink cuda --core $CORE --qd 32 --io mapped --bytes ${SHM_GIB}G --repeat 2"
RUST_LOG=warn timeout 90 "$CARRY/ubdirect" pipeline --source "file:$SHM" --sink cuda --core "$CORE" --qd 32 \
    --io mapped --bytes "${SHM_GIB}G" --repeat 2 --json > "$OUT/cli.json" 2> "$OUT/cli.err"
python3 - "$OUT/cli.json" <<'PY' | tee -a "$LOG"
import json, sys
try:
    for r in json.load(open(sys.argv[1]))["runs"]:
        m = r.get("mapped") or {}
        print(json.dumps({"label": r["label"], "bytes": r["bytes"], "seconds": r["seconds"],
                          "gb_per_s": round(r["bytes_per_s"] / 1e9, 2), "cpu_s_per_gb": round(r["cpu_ns_per_byte"], 4),
                          "cores": round(r["cores_used"], 2), "registered": m.get("windows_registered")}))
except Exception as e:
    print("cli: no JSON:", e, open(sys.argv[1].replace(".json", ".err")).read()[-2000:])
PY

log "loader_bench.py $SHM ${ITEM_MIB:-256,64} ${THREADS:-8,16} ${PASSES:-3}"
timeout 150 python3 "$here/loader_bench.py" "$SHM" "${ITEM_MIB:-256,64}" "${THREADS:-8,16}" "${PASSES:-3}" 2>&1 | tee -a "$LOG"

if ls "$CARRY"/kvikio/*.whl > /dev/null 2>&1; then
    log "KvikIO: pip install --no-index --no-deps --target $OUT/kvikio $CARRY/kvikio/*.whl"
    python3 -m pip install -q --no-index --no-deps --target "$OUT/kvikio" "$CARRY"/kvikio/*.whl 2>&1 | tail -n 5 | tee -a "$LOG"
    export PYTHONPATH="$PYTHONPATH:$OUT/kvikio"
    python3 -c 'import kvikio; print("kvikio", kvikio.__version__, "imports")' 2>&1 | tail -n 5 | tee -a "$LOG"
    log "kvikio_bench.py $SHM ${KVIKIO_THREADS:-1,8,16} 2"
    timeout 120 python3 "$here/kvikio_bench.py" "$SHM" "${KVIKIO_THREADS:-1,8,16}" 2 2>&1 | tail -n 20 | tee -a "$LOG"
fi
rm -f "$SHM"
