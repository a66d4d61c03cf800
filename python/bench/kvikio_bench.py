"""KvikIO (RAPIDS) reading a whole file into one torch CUDA tensor with CuFile.read, for each
thread-pool size (4 MiB tasks, the default), then the most threads with 16 MiB tasks; compat mode (POSIX reads into pinned bounce buffers, then copies) where GDS is
not there. One JSON line per run: GB/s, CPU-s/GB (process user+sys over the run), cores; the
first line says KvikIO's settings, the last whether the tensor matches numpy.fromfile.

Usage: python3 kvikio_bench.py FILE [THREADS=1,8,16] [PASSES=2]
"""

import json
import os
import resource
import sys
import time

import numpy as np
import torch

import kvikio
import kvikio.defaults


def cpu_now():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def report(label, nbytes, wall, cpu, **extra):
    gb = nbytes / 1e9
    print(json.dumps({"label": label, "bytes": nbytes, "seconds": round(wall, 4), "gb_per_s": round(gb / wall, 2),
                      "cpu_s_per_gb": round(cpu / gb, 4), "cores": round(cpu / wall, 2), **extra}), flush=True)


def main():
    path = sys.argv[1]
    threads = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 8, 16]
    passes = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    size = os.path.getsize(path)
    dst = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    settings = {k: str(kvikio.defaults.get(k)) for k in ("compat_mode", "task_size", "bounce_buffer_size", "gds_threshold")}
    print(json.dumps({"kvikio": kvikio.__version__, "compat_mode_preferred": kvikio.defaults.is_compat_mode_preferred(),
                      **settings}), flush=True)
    runs = [(n, None) for n in threads] + [(max(threads), 16 << 20)]
    for n, task in runs:
        kvikio.defaults.set({"num_threads": n})
        if task:
            kvikio.defaults.set({"task_size": task})
        for p in range(passes):
            dst.zero_()
            torch.cuda.synchronize()
            c0, t0 = cpu_now(), time.perf_counter()
            f = kvikio.CuFile(path, "r")
            got = f.read(dst)
            f.close()
            torch.cuda.synchronize()
            wall, cpu = time.perf_counter() - t0, cpu_now() - c0
            tasks = f"{int(kvikio.defaults.get('task_size')) >> 20} MiB tasks"
            report(f"KvikIO CuFile.read, {n} threads, {tasks}, pass {p + 1} (whole file -> one CUDA tensor)", got, wall, cpu)
    ref = np.fromfile(path, dtype=np.uint8)
    print(json.dumps({"byte_exact_vs_numpy_fromfile": bool(torch.equal(dst.cpu(), torch.from_numpy(ref)))}), flush=True)


if __name__ == "__main__":
    main()
