#!/usr/bin/env bash
# The file -> GPU measurement on a CUDA machine (the H200 device machine), everything in one call:
# - page cache (/dev/shm): `--io mapped` (the file's pages mapped read-only, registered once with
#   CUDA, read in place by the copy engines) beside the pinned host->GPU ceiling measured in the
#   same process (--segments), one cold pass with its registration time, --verify; then
#   `--io buffered` (io_uring reads into the UB pool: the earlier "direct" mode), copy mode,
#   `--io auto`, and the PyTorch-style loader peer (threads pread() into pinned tensors +
#   non_blocking copies on per-thread streams) at 1..16 threads;
# - two GPUs when there are two (`--sink cuda:0,1`): H2D ceiling, mapped, --verify, plus the host
#   memory read bandwidth (torch CPU sum over 16 threads) that bounds the aggregate;
# - disk (/var/tmp, O_DIRECT, cache dropped): the source alone vs O_DIRECT -> GPU vs --io auto;
# - optionally (SECTIONS=cufile) cuFile reads of the same files.
#
# Usage: scripts/h200-bench.sh [BIN_DIR] [OUT_DIR]
#   BIN_DIR holds `ubdirect` (and optionally `cuda_sink`, the ubdirect-cuda test binary), built
#   on the build host with `cargo build --release -p ubdirect-cli` (see BENCHMARKS.md, "File -> GPU (H200)").
# Env: SHM_GIB (16), DISK_GIB (8), SECS (3), QD (64), BS (4M), CORE (auto: a CPU near the GPU),
#      RUN_TIMEOUT (120 s per run),
#      SECTIONS ("tests shm torch gpu2 disk": which parts to run; add "cufile" for cuFile).
set -u
BIN_DIR=${1:-.device-carry}
OUT=${2:-${OUT:-/tmp/ubd-h200}}
UBD="$BIN_DIR/ubdirect"
SHM_GIB=${SHM_GIB:-16}
DISK_GIB=${DISK_GIB:-8}
SECS=${SECS:-3}
QD=${QD:-64}
BS=${BS:-4M}
SECTIONS=${SECTIONS:-tests shm torch gpu2 disk}
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
mkdir -p "$OUT"
LOG="$OUT/log.txt"
log() { echo "== $*" | tee -a "$LOG"; }

# CUDA libraries (NVRTC for the verify kernel) where the toolkit keeps them.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export RUST_LOG=${RUST_LOG:-warn}

log "machine"
{ uname -a; nproc; free -g; nvidia-smi -L; python3 -c "import cuda.bindings as b; print('cuda.bindings', b.__version__)";
  cat /etc/cufile.json 2>/dev/null | grep -i -E "allow_compat_mode|compat" ; nvidia-smi --query-gpu=pci.bus_id,pcie.link.gen.current,pcie.link.width.current --format=csv;
  df -hT / /dev/shm; ldd --version | head -1; } >> "$LOG" 2>&1
GPU_BDF=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null | head -1 | tr 'A-F' 'a-f' | sed 's/^0000\(....\)/\1/')
LOCAL=$(cat "/sys/bus/pci/devices/${GPU_BDF,,}/local_cpulist" 2>/dev/null || echo 0-$(($(nproc)-1)))
FIRST=$(echo "$LOCAL" | cut -d, -f1 | cut -d- -f1)
CORE=${CORE:-$((FIRST + 1))}
log "GPU $GPU_BDF local CPUs $LOCAL; polling core $CORE"

# Hugepages for the UB pool (root here); the pipeline falls back to ordinary memory without.
echo 1024 > /proc/sys/vm/nr_hugepages 2>/dev/null || true
grep -i huge /proc/meminfo >> "$LOG"

# GPU tests of the CUDA sink (checksum kernel, stream/event reuse, dma-buf export).
if want tests && [ -x "$BIN_DIR/cuda_sink" ]; then
    log "cuda_sink tests (--ignored)"
    timeout 120 "$BIN_DIR/cuda_sink" --ignored --test-threads=1 --nocapture > "$OUT/cuda_sink_tests.txt" 2>&1
    echo "rc=$?" >> "$OUT/cuda_sink_tests.txt"
    tail -5 "$OUT/cuda_sink_tests.txt" | tee -a "$LOG"
fi

# Source files: random data (1 GiB of urandom, repeated; the checksum is position-aware).
SHM=/dev/shm/ubd-src.bin
DISK=/var/tmp/ubd-disk.bin
log "making $SHM (${SHM_GIB} GiB) and $DISK (${DISK_GIB} GiB)"
head -c 1G /dev/urandom > /dev/shm/ubd-1g.bin
: > "$SHM"
for _ in $(seq "$SHM_GIB"); do cat /dev/shm/ubd-1g.bin >> "$SHM"; done
mkdir -p /var/tmp
: > "$DISK"
for _ in $(seq "$DISK_GIB"); do cat /dev/shm/ubd-1g.bin >> "$DISK"; done
sync
rm -f /dev/shm/ubd-1g.bin
ls -l "$SHM" "$DISK" >> "$LOG"

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

# run NAME ARGS...: one pipeline run, JSON kept, stderr kept.
run() {
    local name=$1; shift
    log "$name: ubdirect pipeline $*"
    timeout "${RUN_TIMEOUT:-120}" "$UBD" pipeline "$@" --json > "$OUT/$name.json" 2> "$OUT/$name.err"
    local rc=$?
    echo "   rc=$rc $(python3 -c "import json,sys; d = json.load(open(sys.argv[1])); [print('%s %.2f GB/s %.3f CPU-s/GB %.2f cores' % (r['label'], r['bytes_per_s'] / 1e9, r['cpu_ns_per_byte'], r['cores_used']), end='; ') for r in (d['runs'] if isinstance(d, dict) else d)]" "$OUT/$name.json" 2>/dev/null)" | tee -a "$LOG"
    [ $rc -eq 0 ] || tail -3 "$OUT/$name.err" | tee -a "$LOG"
}

# cuFile read of the same file into GPU memory (python cuda.bindings.cufile), N threads.
cat > "$OUT/cufile_probe.py" <<'PY'
import json, os, sys, threading, time, traceback
try:
    from cuda.bindings import driver as cu, cufile
except Exception:
    print(json.dumps([{"label": "cuFile read", "error": traceback.format_exc()}])); sys.exit(1)
path, secs, nthreads, bs, direct, limit = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", int(sys.argv[6])
def ck(r):
    if r[0] != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(str(r[0]))
    return r[1] if len(r) == 2 else r[1:]
def fail(stage):
    print(json.dumps([{"label": f"cuFile read, {nthreads} thread(s)", "error": f"{stage}: " + traceback.format_exc()}])); sys.exit(1)
try:
    ck(cu.cuInit(0)); dev = ck(cu.cuDeviceGet(0)); ctx = ck(cu.cuDevicePrimaryCtxRetain(dev)); ck(cu.cuCtxSetCurrent(ctx))
    cufile.driver_open()
except Exception:
    fail("init")
fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
def register_ctypes():
    # CUfileDescr_t by hand: { int type; union { int fd; void *handle; } handle; const void *fs_ops; }
    import ctypes
    class D(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("pad", ctypes.c_int), ("fd", ctypes.c_int64), ("fs_ops", ctypes.c_void_p)]
    d = D(1, 0, fd, None)  # CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1
    return cufile.handle_register(ctypes.addressof(d)), d
try:
    descr = cufile.Descr(); descr.type = cufile.FileHandleType.OPAQUE_FD; descr.handle.fd = fd; descr.fs_ops = 0
    fh = cufile.handle_register(descr.ptr)
except Exception:
    first = traceback.format_exc()
    try:
        fh, keep = register_ctypes()
    except Exception:
        fail("handle_register (Descr, then a ctypes CUfileDescr_t; first error: " + first + ")")
size = os.fstat(fd).st_size
nblocks = size // bs
limit_blocks = (limit // bs) if limit > 0 else None
bufs = []
try:
    for _ in range(nthreads):
        p = ck(cu.cuMemAlloc(bs)); cufile.buf_register(int(p), bs, 0); bufs.append(p)
except Exception:
    fail("alloc/buf_register")
totals = [0] * nthreads
errors = []
start = time.perf_counter(); deadline = start + secs
def worker(t):
    ck(cu.cuCtxSetCurrent(ctx))
    i = t
    try:
        while (limit_blocks is None and time.perf_counter() < deadline) or (limit_blocks is not None and i < limit_blocks):
            n = cufile.read(fh, int(bufs[t]), bs, (i % nblocks) * bs, 0)
            if n != bs:
                raise RuntimeError(f"cufile.read returned {n}")
            totals[t] += n
            i += nthreads
    except Exception:
        errors.append(traceback.format_exc())
ths = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
[t.start() for t in ths]; [t.join() for t in ths]
el = time.perf_counter() - start
tot = sum(totals)
print(json.dumps([{"label": f"cuFile read, {nthreads} thread(s){' O_DIRECT' if direct else ''}", "bytes": tot, "seconds": el, "gb_per_s": tot / el / 1e9, "errors": errors[:3]}]))
PY
cufile_run() {
    local name=$1; shift
    log "$name: cufile_probe $*"
    (cd "$OUT" && CUFILE_FORCE_COMPAT_MODE=${CUFILE_FORCE_COMPAT_MODE:-true} CUFILE_LOGGING_LEVEL=${CUFILE_LOGGING_LEVEL:-INFO} \
        timeout 120 python3 "$OUT/cufile_probe.py" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err")
    echo "   rc=$? $(cat "$OUT/$name.json" 2>/dev/null | head -c 300)" | tee -a "$LOG"
}

S="--source file:$SHM"
C="--core $CORE --block-size $BS"
SB="$((SHM_GIB))G"
# ---- page cache (/dev/shm) ----
if want shm; then
# The ceiling (pinned UB pool -> GPU) and the mapped run in one process, twice (the second run
# reuses the registered windows).
run shm-mapped-seg       $S --sink cuda $C --qd 32 --seconds $SECS --io mapped --segments --repeat 2
run shm-mapped-1pass     $S --sink cuda $C --qd 32 --bytes $SB --io mapped
run shm-mapped-verify    $S --sink cuda $C --qd 32 --bytes $SB --io mapped --verify
run shm-mapped-qd8       $S --sink cuda $C --qd 8 --seconds $SECS --io mapped
run shm-auto             $S --sink cuda $C --qd 32 --seconds $SECS
run shm-buffered-qd32    $S --sink cuda $C --qd 32 --seconds $SECS --io buffered
run shm-buffered-seg     $S --sink cuda $C --qd 32 --seconds $SECS --io buffered --segments
run shm-copy             $S --sink cuda $C --mode copy --seconds $SECS
run shm-mapped-seg-again $S --sink cuda $C --qd 32 --seconds $SECS --io mapped --segments
fi
# ---- the PyTorch-style loader peer ----
cat > "$OUT/torch_loader.py" <<'PY'
# Threads pread() blocks of the file into pinned tensors (double-buffered per thread) and copy
# them with non_blocking=True on a per-thread CUDA stream: what a PyTorch input pipeline does.
import json, os, resource, sys, threading, time
import torch
path, secs, bs, nthreads = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_RDONLY)
nblocks = os.fstat(fd).st_size // bs
dev = torch.device("cuda:0")
torch.cuda.init()
totals = [0] * nthreads
ready = threading.Barrier(nthreads + 1)
def worker(t):
    stream = torch.cuda.Stream(device=dev)
    bufs = [torch.empty(bs, dtype=torch.uint8).pin_memory() for _ in range(2)]
    views = [b.numpy() for b in bufs]
    dst = torch.empty(bs, dtype=torch.uint8, device=dev)
    evs = [None, None]
    ready.wait()
    i, k = t, 0
    while time.perf_counter() < deadline[0]:
        j = k % 2
        if evs[j] is not None:
            evs[j].synchronize()
        n = os.preadv(fd, [views[j]], (i % nblocks) * bs)
        with torch.cuda.stream(stream):
            dst.copy_(bufs[j], non_blocking=True)
            e = torch.cuda.Event(); e.record(stream); evs[j] = e
        totals[t] += n
        i += nthreads; k += 1
    stream.synchronize()
deadline = [float("inf")]
ths = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
[t.start() for t in ths]
ready.wait()
ru0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
deadline[0] = t0 + secs
[t.join() for t in ths]
el = time.perf_counter() - t0; ru1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
gb = sum(totals) / 1e9
print(json.dumps([{"label": f"PyTorch-style loader, {nthreads} thread(s) (pread into pinned + non_blocking copy)",
    "bytes": sum(totals), "seconds": el, "gb_per_s": gb / el, "cpu_s_per_gb": cpu / gb if gb else 0, "cores": cpu / el,
    "torch": torch.__version__}]))
PY
torch_run() {
    local name=$1; shift
    log "$name: torch_loader.py $*"
    timeout 60 python3 "$OUT/torch_loader.py" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
    echo "   rc=$? $(head -c 300 "$OUT/$name.json")" | tee -a "$LOG"
}
if want torch; then
    for t in 1 2 4 8 16; do torch_run shm-torch-${t}t "$SHM" "$SECS" 4194304 "$t"; done
fi
# ---- two GPUs ----
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if want gpu2 && [ "$NGPU" -ge 2 ]; then
    run gpu2-mapped-seg      $S --sink cuda:0,1 $C --qd 32 --seconds $SECS --io mapped --segments --repeat 2
    run gpu2-mapped-verify   $S --sink cuda:0,1 $C --qd 32 --bytes $SB --io mapped --verify
    run gpu2-buffered        $S --sink cuda:0,1 $C --qd 32 --seconds $SECS --io buffered
    run gpu1-mapped-seg      $S --sink cuda:1 $C --qd 32 --seconds $SECS --io mapped --segments
    log "host memory read bandwidth (torch CPU sum of 4 GiB, $(nproc) threads)"
    python3 - > "$OUT/hostmem.json" 2> "$OUT/hostmem.err" <<'PY'
import json, os, time, torch
torch.set_num_threads(os.cpu_count())
x = torch.ones(1 << 29, dtype=torch.float64)  # 4 GiB
x.sum()
t = time.perf_counter(); n = 10
for _ in range(n): x.sum()
el = time.perf_counter() - t
print(json.dumps([{"label": f"host memory read bandwidth (torch sum, {os.cpu_count()} threads)", "bytes": n * x.numel() * 8, "seconds": el, "gb_per_s": n * x.numel() * 8 / el / 1e9}]))
PY
    echo "   $(head -c 300 "$OUT/hostmem.json")" | tee -a "$LOG"
elif want gpu2; then
    log "gpu2: only $NGPU GPU(s) here: two-GPU runs skipped"
fi
# ---- disk (ext4 on the root device), O_DIRECT, cold cache; alternated and repeated, since a
# virtual disk's rate drifts (bursts, host cache) ----
D="--source file:$DISK"
DB="$((DISK_GIB))G"
if want disk; then
for rep in 1 2; do
    drop_caches; run disk-null-qd32-r$rep   $D --sink null $C --qd 32 --bytes $DB --io direct
    drop_caches; run disk-cuda-qd32-r$rep   $D --sink cuda $C --qd 32 --bytes $DB --io direct
done
drop_caches; run disk-auto        $D --sink cuda $C --qd 32 --bytes $DB
drop_caches; run disk-cuda-verify $D --sink cuda $C --qd 32 --bytes $DB --io direct --verify
drop_caches; run disk-copy        $D --sink cuda $C --mode copy --bytes $DB
fi
if want cufile; then
    # cuFile's handle registration asks udev for the volume's ID_FS_USAGE; a VM without a udev
    # database fails it ("unable to get volume attributes"). Describe both volumes to it.
    for f in "$DISK" "$SHM"; do
        mm=$(python3 -c "import os,sys; d=os.stat(sys.argv[1]).st_dev; print(f'{os.major(d)}:{os.minor(d)}')" "$f")
        if [ ! -e "/run/udev/data/b$mm" ] && [ "${CUFILE_FAKE_UDEV:-1}" = 1 ]; then
            mkdir -p /run/udev/data
            printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$(findmnt -no FSTYPE --target "$f")" > "/run/udev/data/b$mm"
            log "wrote /run/udev/data/b$mm for $f (no udev database on this machine) for cuFile"
        fi
    done
    drop_caches; cufile_run disk-cufile-1t "$DISK" 600 1 4194304 1 $((DISK_GIB << 30))
    drop_caches; cufile_run disk-cufile-8t "$DISK" 600 8 4194304 1 $((DISK_GIB << 30))
    drop_caches; run disk-cuda-qd8      $D --sink cuda $C --qd 8 --bytes $DB --io direct
    cufile_run shm-cufile-1t  "$SHM" "$SECS" 1 4194304 0 0
    cufile_run shm-cufile-8t  "$SHM" "$SECS" 8 4194304 0 0
    run shm-cuda-qd1          $S --sink cuda $C --qd 1 --seconds $SECS --io buffered
    run shm-mapped-qd1        $S --sink cuda $C --qd 1 --seconds $SECS --io mapped
fi

# ---- table ----
python3 - "$OUT" > "$OUT/table.md" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
print("| run | what | GB/s | CPU-s/GB | cores | notes |")
print("| --- | --- | ---: | ---: | ---: | --- |")
for f in sorted(glob.glob(os.path.join(out, "*.json")), key=os.path.getmtime):
    name = os.path.basename(f)[:-5]
    try:
        rs = json.load(open(f))
        # ubdirect documents ({"schema": "ubdirect/1", "runs": [...]}, docs/json.md) in the
        # units of the cuFile probe's list: GB/s, CPU-s/GB (= ns/byte), microseconds.
        if isinstance(rs, dict):
            rs = rs["runs"]
            for r in rs:
                r["gb_per_s"] = r["bytes_per_s"] / 1e9
                r["qd"] = r["queue_depth"]
                r["cpu_s_per_gb"] = r["cpu_ns_per_byte"]
                r["cores"] = r["cores_used"]
                for g in r.get("gpus") or []:
                    g["gb_per_s"] = g["bytes_per_s"] / 1e9
                r["latency"] = {k + "_us": v / 1e3 for k, v in r["latency_ns"].items()}
    except Exception:
        print(f"| {name} | (failed: see {name}.err) | | | | |"); continue
    for r in rs:
        if "gb_per_s" not in r:
            print(f"| {name} | {r.get('label', '?')}: failed (see {name}.json) | | | | |"); continue
        notes = []
        lat = r.get("latency") or {}
        if lat.get("p50_us"):
            notes.append(f"p50/p99 {lat['p50_us']:.0f}/{lat['p99_us']:.0f} us")
        for g in r.get("gpus") or []:
            notes.append(f"{g['gpu'].split(' ')[0]} {g['gb_per_s']:.2f}")
        m = r.get("mapped")
        if m:
            notes.append(f"{m['resident']*100:.0f}% resident, {m['windows_registered']} win registered in {m['register_s']:.3f} s, {m['windows_reused']} reused, {m['gb_per_s_with_register']:.2f} GB/s with registration")
        v = r.get("verify")
        if v:
            notes.append("verify " + ("OK" if v["ok"] else "MISMATCH"))
        what = r["label"] + (f" ({r['source']} -> {r['sink']}, qd {r['qd']}, {r['block_size']>>10} KiB)" if "source" in r else "")
        cpu = r.get("cpu_s_per_gb"); cores = r.get("cores")
        print(f"| {name} | {what} | {r['gb_per_s']:.2f} | {'' if cpu is None else f'{cpu:.3f}'} | {'' if cores is None else f'{cores:.2f}'} | {'; '.join(notes)} |")
PY
cat "$OUT/table.md" | tee -a "$LOG"
rm -f "$SHM" "$DISK"
cp "$OUT"/cufile*.log "$OUT"/ 2>/dev/null || true
# One archive of everything (the device tool brings back a limited number of files).
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" && echo "results: $OUT.tgz"
