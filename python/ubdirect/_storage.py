"""``Env``: an NVMe controller bound to vfio-pci, for storage work from Python."""

from typing import Any, Dict, Union

from . import _native
from ._dest import resolve
from ._errors import InvalidArgument


class Env:
    """An NVMe controller bound to vfio-pci, opened through the library's ``Env`` (hugepages
    checked, the DMA domain, the controller, a hugepage buffer pool), and one queue pair.

    ``Env("0000:00:04.0")`` needs the controller bound to vfio-pci (``scripts/setup.sh``),
    access to its VFIO group, and free hugepages for ``pool_blocks`` blocks of ``block_size``
    bytes. A failure raises :class:`DeviceError` (or :class:`InvalidArgument` for a malformed
    address) with the library's message. Use it from one thread at a time (calls are
    serialised); ``close()`` or a ``with`` block releases the device.
    """

    def __init__(self, nvme: str, block_size: int = 2 << 20, pool_blocks: int = 4) -> None:
        self._env = _native.Env(nvme, block_size, pool_blocks)

    def identify(self) -> Dict[str, Any]:
        """The controller (model, serial, firmware, address) and its first namespace (nsid,
        blocks, block_size)."""
        return self._env.identify()

    def read(self, lba: int, count: int) -> bytes:
        """Read ``count`` logical blocks from ``lba``."""
        return bytes(self._env.read(lba, count))

    def read_into(self, lba: int, dst: Any) -> int:
        """Read blocks from ``lba`` into the writable host buffer ``dst`` (a numpy array,
        a bytearray) filling it; its size must be a whole number of blocks. Returns the bytes
        read."""
        d = resolve(dst)
        if d.cuda:
            raise InvalidArgument("Env.read_into fills host memory: read into a numpy array or a bytearray")
        self._env._read_to(lba, d.addr, d.nbytes)
        return d.nbytes

    def write(self, lba: int, data: Union[bytes, bytearray, memoryview, Any]) -> None:
        """Write ``data`` (a whole number of blocks; any bytes-like object) at ``lba``; it is on
        media when the call returns (FUA)."""
        self._env.write(lba, bytes(memoryview(data).cast("B")))

    def close(self) -> None:
        """Close the queue pair, the controller and the pool."""
        self._env.close()

    def __enter__(self) -> "Env":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._env)
