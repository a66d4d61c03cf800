"""File -> CUDA tensors from Python: ubdirect.Loader (pass 1 registers the page cache, pass 2
finds it registered), one read_into of the whole file, and a PyTorch-style threaded loader
(N threads, pread into pinned tensors, non_blocking copies on per-thread streams). One JSON
line per run: GB/s, CPU-s/GB (process user+sys over the run), cores.

Usage: python3 loader_bench.py FILE [ITEM_MIBS=256] [THREADS=8] [PASSES=3]   (lists: comma-separated)
"""

import json
import os
import resource
import sys
import threading
import time

import torch

import ubdirect


def cpu_now():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def report(label, nbytes, wall, cpu, **extra):
    gb = nbytes / 1e9
    print(json.dumps({"label": label, "bytes": nbytes, "seconds": round(wall, 4), "gb_per_s": round(gb / wall, 2),
                      "cpu_s_per_gb": round(cpu / gb, 4), "cores": round(cpu / wall, 2), **extra}), flush=True)


def loader_pass(items, label, io="auto"):
    torch.cuda.synchronize()
    c0, t0 = cpu_now(), time.perf_counter()
    n = 0
    with ubdirect.Loader(items, device=0, prefetch=2, io=io) as loader:
        for t in loader:
            n += t.numel()
    wall, cpu = time.perf_counter() - t0, cpu_now() - c0
    report(label, n, wall, cpu, registered=ubdirect.registered_bytes())


def whole_file(path, size, passes=2):
    dst = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    for p in range(passes):
        torch.cuda.synchronize()
        c0, t0 = cpu_now(), time.perf_counter()
        ubdirect.read_into(path, dst)
        wall, cpu = time.perf_counter() - t0, cpu_now() - c0
        report(f"ubdirect.read_into, the whole file into one tensor, pass {p + 1} (windows registered)", size, wall, cpu)


def threaded(path, size, nthreads, bs=4 << 20):
    """The PyTorch-style peer: one pass over the file, blocks dealt round-robin to threads."""
    fd = os.open(path, os.O_RDONLY)
    nblocks = size // bs
    dev = torch.device("cuda:0")
    totals = [0] * nthreads
    ready = threading.Barrier(nthreads + 1)

    def worker(t):
        stream = torch.cuda.Stream(device=dev)
        bufs = [torch.empty(bs, dtype=torch.uint8).pin_memory() for _ in range(2)]
        views = [b.numpy() for b in bufs]
        dst = torch.empty(size, dtype=torch.uint8, device=dev) if t == 0 else None
        dst = shared[0] if dst is None else dst
        evs = [None, None]
        ready.wait()
        k = 0
        for i in range(t, nblocks, nthreads):
            j = k % 2
            if evs[j] is not None:
                evs[j].synchronize()
            n = os.preadv(fd, [views[j]], i * bs)
            with torch.cuda.stream(stream):
                dst[i * bs : i * bs + n].copy_(bufs[j][:n], non_blocking=True)
                e = torch.cuda.Event()
                e.record(stream)
                evs[j] = e
            totals[t] += n
            k += 1
        stream.synchronize()

    shared = [torch.empty(size, dtype=torch.uint8, device=dev)]
    ths = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
    for t in ths:
        t.start()
    ready.wait()
    c0, t0 = cpu_now(), time.perf_counter()
    for t in ths:
        t.join()
    wall, cpu = time.perf_counter() - t0, cpu_now() - c0
    os.close(fd)
    report(f"PyTorch-style threaded loader, {nthreads} threads (pread into pinned + non_blocking copy, 4 MiB)",
           sum(totals), wall, cpu)


def main():
    path = sys.argv[1]
    item_mibs = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [256]
    nthreads = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [8]
    passes = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    size = os.path.getsize(path)
    torch.cuda.init()
    torch.empty(1, device="cuda:0")
    for k, mib in enumerate(item_mibs):
        item = mib << 20
        items = [(path, off, min(item, size - off)) for off in range(0, size, item)]
        for p in range(passes if k == 0 else 1):
            what = "registers the page cache" if p == 0 and k == 0 else "windows registered"
            loader_pass(items, f"ubdirect.Loader pass {p + 1}, {len(items)} items of {mib} MiB ({what})")
    whole_file(path, size)
    ubdirect.release_windows()
    for n in nthreads:
        threaded(path, size, n)


if __name__ == "__main__":
    main()
