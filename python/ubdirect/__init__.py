"""ubdirect: files into CUDA tensors and host buffers at page-cache speed, a prefetching
loader for training loops, and NVMe blocks over vfio-pci.

>>> import ubdirect, torch
>>> t = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
>>> ubdirect.read_into("/data/shard0.bin", t)          # doctest: +SKIP
1073741824
"""

from typing import Any

from . import _native
from ._errors import CudaError, CudaUnavailable, DeviceError, Error, FileError, InvalidArgument
from ._read import read_into

DeviceBuffer = _native.DeviceBuffer
from ._storage import Env


def cuda_device_count() -> int:
    """GPUs the CUDA driver sees (0 without an NVIDIA driver)."""
    return _native.cuda_device_count()


def registered_bytes() -> int:
    """Bytes of file page cache registered with CUDA now (``io="mapped"`` keeps them)."""
    return _native.registered_bytes()


def release_windows() -> None:
    """Let go of every registered file window no read is using (they are registered again on
    the next mapped read)."""
    _native.release_windows()


def __getattr__(name: str) -> Any:
    # The Loader imports torch when it is installed (to be a torch IterableDataset): only on
    # first use, so `import ubdirect` stays fast.
    if name == "Loader":
        from ._loader import Loader

        globals()["Loader"] = Loader
        return Loader
    raise AttributeError(f"module 'ubdirect' has no attribute {name!r}")


__all__ = [
    "CudaError",
    "CudaUnavailable",
    "DeviceBuffer",
    "DeviceError",
    "Env",
    "Error",
    "FileError",
    "InvalidArgument",
    "Loader",
    "cuda_device_count",
    "read_into",
    "registered_bytes",
    "release_windows",
]
