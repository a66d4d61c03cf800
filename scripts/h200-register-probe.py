#!/usr/bin/env python3
"""What registering a page-cache file with CUDA costs, and whether copies go on meanwhile.

Run on a CUDA machine (the H200 device machine) over a file in /dev/shm (or a huge-page tmpfs):
  python3 scripts/h200-register-probe.py FILE [WINDOW_MIB] [WINDOWS]
Prints JSON lines:
  - register: cuMemHostRegister(PORTABLE | READ_ONLY) of fresh read-only MAP_SHARED windows, one
    at a time, with and without the page tables faulted in first (MADV_POPULATE_READ), the
    populate and register times apart;
  - populate-parallel: N threads fault N windows in at once (wall time);
  - register-parallel: N threads register N (populated or not) windows at once (wall time);
  - copies-during-register: one thread queues 64 MiB host->device copies from a pinned buffer on
    4 streams and measures GB/s and the longest host-side call, alone and while another thread
    registers windows.
Only libcuda (ctypes) and libc: no CUDA Python packages needed.
"""
import ctypes
import json
import os
import sys
import threading
import time

path = sys.argv[1]
WMIB = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
NWIN = int(sys.argv[3]) if len(sys.argv) > 3 else 8
W = WMIB << 20

cu = ctypes.CDLL("libcuda.so.1")
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
cu.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cu.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
cu.cuMemHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
cu.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
cu.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
cu.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]


def ck(r, what):
    if r != 0:
        raise RuntimeError(f"{what} failed: CUresult {r}")


ck(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
PORTABLE, READ_ONLY, POPULATE_READ = 0x01, 0x08, 22


def out(**kw):
    print(json.dumps(kw), flush=True)


def mapw(i):
    p = libc.mmap(None, W, 1, 1, fd, (i * W) % size)  # PROT_READ, MAP_SHARED
    if p in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    return p


def populate(p):
    t = time.perf_counter()
    r = libc.madvise(p, W, POPULATE_READ)
    return time.perf_counter() - t, r


def register(p):
    cu.cuCtxSetCurrent(ctx)
    t = time.perf_counter()
    ck(cu.cuMemHostRegister_v2(p, W, PORTABLE | READ_ONLY), "cuMemHostRegister")
    return time.perf_counter() - t


def release(ps):
    for p in ps:
        cu.cuMemHostUnregister(p)
        libc.munmap(p, W)


def serial(pop):
    ps, tp, tr = [], 0.0, 0.0
    for i in range(NWIN):
        p = mapw(i)
        if pop:
            dt, r = populate(p)
            tp += dt
        tr += register(p)
        ps.append(p)
    release(ps)
    out(test="register", window_mib=WMIB, windows=NWIN, populate_first=pop, populate_s=round(tp, 4),
        register_s=round(tr, 4), gb_per_s=round(NWIN * W / 1e9 / (tp + tr), 2))


def parallel(n, what, pop=False):
    ps = [mapw(i) for i in range(n)]
    if pop and what == "register":
        for p in ps:
            populate(p)
    ts = []
    t = time.perf_counter()
    th = [threading.Thread(target=lambda p=p: ts.append(populate(p)[0] if what == "populate" else register(p))) for p in ps]
    [x.start() for x in th]
    [x.join() for x in th]
    wall = time.perf_counter() - t
    if what == "populate":
        for p in ps:
            libc.munmap(p, W)
    else:
        release(ps)
    out(test=f"{what}-parallel", threads=n, window_mib=WMIB, populated=pop, wall_s=round(wall, 4),
        per_thread_s=[round(x, 4) for x in ts], gb_per_s=round(n * W / 1e9 / wall, 2))


def copies(during, pop=False, secs=0.6):
    piece = 64 << 20
    host = ctypes.c_void_p()
    ck(cu.cuMemHostAlloc(ctypes.byref(host), 4 * piece, 0), "cuMemHostAlloc")
    d = ctypes.c_uint64()
    ck(cu.cuMemAlloc_v2(ctypes.byref(d), 4 * piece), "cuMemAlloc")
    streams = []
    for _ in range(4):
        s = ctypes.c_void_p()
        ck(cu.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
        streams.append(s)
    stop = [False]
    reg = {}

    def registrar():
        ps = [mapw(i) for i in range(NWIN)]
        if pop:
            for p in ps:
                populate(p)
        t = time.perf_counter()
        for p in ps:
            register(p)
        reg["s"] = time.perf_counter() - t
        stop[0] = True
        release(ps)

    th = threading.Thread(target=registrar) if during else None
    moved, longest, n = 0, 0.0, 0
    t0 = time.perf_counter()
    if th:
        th.start()
    while (during and not stop[0]) or (not during and time.perf_counter() - t0 < secs):
        for i, s in enumerate(streams):
            c = time.perf_counter()
            ck(cu.cuMemcpyHtoDAsync_v2(d.value + i * piece, host.value + i * piece, piece, s), "copy")
            longest = max(longest, time.perf_counter() - c)
        for s in streams:
            ck(cu.cuStreamSynchronize(s), "sync")
        moved += 4 * piece
        n += 4
    wall = time.perf_counter() - t0
    if th:
        th.join()
    out(test="copies-during-register" if during else "copies-alone", populated=pop, gb_per_s=round(moved / 1e9 / wall, 2),
        wall_s=round(wall, 4), register_s=round(reg.get("s", 0), 4), longest_submit_ms=round(longest * 1e3, 2), copies=n)


out(test="setup", file=path, size=size, window_mib=WMIB, windows=NWIN,
    shmem_thp=open("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read().strip())
serial(False)
serial(True)
serial(False)
serial(True)
parallel(4, "populate")
parallel(4, "register", pop=False)
parallel(4, "register", pop=True)
copies(False)
copies(True, pop=False)
copies(True, pop=True)
