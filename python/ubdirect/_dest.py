"""Destinations: anything exposing ``__cuda_array_interface__`` (torch CUDA tensors, cupy
arrays, :class:`ubdirect.DeviceBuffer`) or a writable, C-contiguous buffer (numpy arrays,
bytearray, memoryview, torch CPU tensors through numpy)."""

import ctypes
import sys
from typing import Any, NamedTuple, Optional

from ._errors import InvalidArgument


class Dest(NamedTuple):
    """A resolved destination: where the bytes go and what keeps them alive."""

    cuda: bool
    addr: int
    nbytes: int
    keep: Any
    # CUDA Array Interface v3 "stream": work queued on it may still use the memory.
    stream: Optional[int] = None


def _itemsize(typestr: str) -> int:
    try:
        return int(typestr[2:])
    except ValueError:
        raise InvalidArgument(f"__cuda_array_interface__ typestr {typestr!r} is not understood") from None


def _cuda(obj: Any) -> Optional[Dest]:
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        return None
    except RuntimeError as e:  # torch: a tensor that requires grad
        raise InvalidArgument(f"the destination cannot be written through __cuda_array_interface__: {e}") from None
    shape = tuple(cai["shape"])
    size = _itemsize(cai["typestr"])
    n = 1
    for d in shape:
        n *= d
    strides = cai.get("strides")
    if strides is not None and n > 0:
        want = []
        s = size
        for d in reversed(shape):
            want.append(s)
            s *= d
        if tuple(reversed(want)) != tuple(strides):
            raise InvalidArgument("the CUDA destination is not C-contiguous: pass a contiguous array (e.g. tensor.contiguous())")
    ptr, readonly = cai["data"]
    if readonly:
        raise InvalidArgument("the CUDA destination is read-only")
    stream = cai.get("stream")
    torch = sys.modules.get("torch")
    if stream is None and torch is not None and isinstance(obj, torch.Tensor):
        # torch's interface names no stream: its current stream (0: the legacy default one).
        stream = torch.cuda.current_stream(obj.device).cuda_stream
    return Dest(True, int(ptr or 0), n * size, obj, None if stream is None else int(stream))


def _host(obj: Any) -> Dest:
    if hasattr(obj, "numpy") and hasattr(obj, "is_cuda"):  # a torch CPU tensor
        obj = obj.numpy()
    try:
        m = memoryview(obj)
    except TypeError:
        raise InvalidArgument(
            f"a {type(obj).__name__} is not a destination: pass an object with __cuda_array_interface__ "
            "(torch CUDA tensor, cupy array) or a writable buffer (numpy array, bytearray)"
        ) from None
    if m.readonly:
        raise InvalidArgument(f"the destination ({type(obj).__name__}) is read-only: pass a bytearray or a writable numpy array")
    if not m.c_contiguous:
        raise InvalidArgument("the destination is not C-contiguous: pass a contiguous array")
    if m.nbytes == 0:
        return Dest(False, 0, 0, m)
    flat = m.cast("B")
    addr = ctypes.addressof(ctypes.c_char.from_buffer(flat))
    return Dest(False, addr, m.nbytes, (m, flat))


def resolve(obj: Any) -> Dest:
    """Where the bytes of a read into ``obj`` go."""
    d = _cuda(obj)
    return d if d is not None else _host(obj)
