"""``read_into``: a file range into a CUDA array or a host buffer."""

import os
from typing import Any, Optional, Union

from . import _native
from ._dest import resolve
from ._errors import InvalidArgument

IO_MODES = ("auto", "mapped", "direct", "buffered")


def check_io(io: str) -> None:
    if io not in IO_MODES:
        raise InvalidArgument(f'io={io!r}: use "auto", "mapped", "direct" or "buffered"')


def check_range(offset: int, length: Optional[int]) -> None:
    if offset < 0:
        raise InvalidArgument(f"offset {offset} is negative")
    if length is not None and length < 0:
        raise InvalidArgument(f"length {length} is negative")


def read_into(
    path: Union[str, "os.PathLike[str]"],
    dst: Any,
    offset: int = 0,
    length: Optional[int] = None,
    io: str = "auto",
) -> int:
    """Read bytes ``offset .. offset + length`` of the file ``path`` into ``dst`` and return
    the number of bytes read.

    ``dst`` is anything with ``__cuda_array_interface__`` (a torch CUDA tensor, a cupy array,
    :class:`DeviceBuffer`), or a writable C-contiguous buffer (a numpy array, a bytearray, a torch
    CPU tensor). The bytes land at the start of ``dst``, whatever its dtype or shape.

    ``length=None`` reads as many bytes as ``dst`` holds, stopping at the end of the file (the
    return value says how many). An explicit range past the end of the file, or longer than
    ``dst``, raises :class:`InvalidArgument`.

    ``io`` chooses how, as the CLI's ``ubdirect pipeline --io`` does:

    - ``"mapped"``: the page cache is mapped read-only and registered with CUDA in 256 MiB
      windows that stay registered (up to half the RAM) for later reads; the GPU's copy engines
      read it in place. CUDA destinations only.
    - ``"direct"``: O_DIRECT reads (no page cache). For host buffers, the offset, length and
      buffer address must be multiples of 4096.
    - ``"buffered"``: reads through the page cache.
    - ``"auto"``: CUDA destinations: mapped when at least 90 % of the range is in the page
      cache, else direct (buffered where the file system refuses O_DIRECT). Host buffers: direct
      when the request is aligned and mostly not cached, else buffered.

    The GIL is released while the bytes move; the call returns once they are in ``dst``. A CUDA
    destination's ``__cuda_array_interface__`` stream (torch: the current stream) is waited for
    first: work queued there before the call still sees the old contents.
    """
    check_io(io)
    check_range(offset, length)
    d = resolve(dst)
    p = os.fsdecode(os.fspath(path))
    if d.cuda:
        n, _how = _native.read_cuda(p, d.addr, d.nbytes, offset, length, io, d.stream)
    else:
        n = _native.read_host(p, d.addr, d.nbytes, offset, length, io)
    return n


class _Finished:
    """A read done before ``start_into`` returned."""

    def __init__(self, n: int) -> None:
        self.n = n

    def wait(self) -> "tuple[int, str]":
        return self.n, "done"


def start_into(
    path: Union[str, "os.PathLike[str]"],
    dst: Any,
    offset: int = 0,
    length: Optional[int] = None,
    io: str = "auto",
) -> Any:
    """``read_into`` that returns once a mapped read's copies are queued: the result's
    ``wait()`` returns (bytes read, the path taken) once they completed. ``dst`` is kept alive
    until then; its contents are undefined before it."""
    check_io(io)
    check_range(offset, length)
    d = resolve(dst)
    p = os.fsdecode(os.fspath(path))
    if d.cuda:
        return _native.start_cuda(p, dst, d.addr, d.nbytes, offset, length, io, d.stream)
    return _Finished(_native.read_host(p, d.addr, d.nbytes, offset, length, io))
