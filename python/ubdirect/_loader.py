"""``Loader``: a list of (path, offset, length) items read in order into fresh tensors, the
next ones prefetched on one background thread."""

import collections
import queue
import threading
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from ._errors import InvalidArgument
from ._read import check_io, check_range, start_into

try:  # A torch IterableDataset when torch is installed (DataLoader then treats it as one).
    import torch as _torch
    from torch.utils.data import IterableDataset as _Base
except ImportError:  # pragma: no cover - depends on the machine
    _torch = None
    _Base = object

try:
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the machine
    _np = None

Item = Tuple[str, int, int]

_DONE = object()
# The worker queues the copies of the next items before it waits for the oldest one (always
# the next item; more while they total under _AHEAD_ITEMS items and _AHEAD_BYTES), so the GPU's
# copy engines never wait for the thread between items.
_AHEAD_ITEMS = 8
_AHEAD_BYTES = 512 << 20
# How long close() waits for the worker to finish the read it is in.
_JOIN_LIMIT_S = 120.0


def _alloc(length: int, device: Optional[int]) -> Any:
    if device is None:
        if _torch is not None:
            return _torch.empty(length, dtype=_torch.uint8)
        if _np is not None:
            return _np.empty(length, dtype=_np.uint8)
        return bytearray(length)
    if _torch is not None:
        return _torch.empty(length, dtype=_torch.uint8, device=f"cuda:{device}")
    from ._native import DeviceBuffer

    return DeviceBuffer(length, device)


def _over(started: "collections.deque[Tuple[Any, Any, int]]") -> bool:
    return len(started) >= _AHEAD_ITEMS or sum(n for _b, _p, n in started) >= _AHEAD_BYTES


class _Epoch:
    """One pass over the items: the worker thread and the queue of ready buffers."""

    def __init__(self, items: Sequence[Item], device: Optional[int], prefetch: int, io: str) -> None:
        self.items = items
        self.device = device
        self.io = io
        self.ready: "queue.Queue[Any]" = queue.Queue(maxsize=prefetch)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._work, name="ubdirect-loader", daemon=True)
        self.thread.start()

    def _put(self, x: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.ready.put(x, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        started: "collections.deque[Tuple[Any, Any, int]]" = collections.deque()
        try:
            self._read_all(started)
        finally:
            # Copies into the buffers may still run: wait before letting them go.
            for _buf, pending, _n in started:
                try:
                    pending.wait()
                except BaseException:
                    pass

    def _read_all(self, started: "collections.deque[Tuple[Any, Any, int]]") -> None:
        for path, offset, length in self.items:
            if self.stop.is_set():
                return
            try:
                buf = _alloc(length, self.device)
                started.append((buf, start_into(path, buf, offset, length, self.io), length))
            except BaseException as e:  # surfaces in the iterating thread, after the items before
                if self._hand_out(started, drain=True):
                    self._put(e)
                return
            if not self._hand_out(started, drain=False):
                return
        if self._hand_out(started, drain=True):
            self._put(_DONE)

    def _hand_out(self, started: "collections.deque[Tuple[Any, Any, int]]", drain: bool) -> bool:
        """Wait for the oldest started reads, in order, and queue their buffers: all of them
        (``drain``), else while more than one is started and they exceed the look-ahead. False
        when the epoch stopped or a read failed (its error queued)."""
        while started and (drain or (len(started) > 1 and _over(started))):
            buf, pending, _n = started[0]
            try:
                pending.wait()
            except BaseException as e:
                started.popleft()
                self._put(e)
                return False
            started.popleft()
            if not self._put(buf):
                return False
        return True

    def next(self) -> Any:
        while True:
            try:
                x = self.ready.get(timeout=0.05)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.ready.empty():
                    raise RuntimeError("the ubdirect loader thread ended without a result") from None
        if x is _DONE:
            raise StopIteration
        if isinstance(x, BaseException):
            raise x
        return x

    def close(self) -> None:
        self.stop.set()
        while True:  # let a blocked put() see the stop
            try:
                self.ready.get_nowait()
            except queue.Empty:
                break
        self.thread.join(_JOIN_LIMIT_S)


class Loader(_Base):  # type: ignore[misc, valid-type]
    """Reads ``items`` (a list of ``(path, offset, length)``) in order, each into a fresh
    buffer, prefetching up to ``prefetch`` items ahead on one background thread. Besides those,
    the GPU copies of the next items are queued while the thread waits for the current one (the
    next item, and more while they total under 512 MiB): their buffers are allocated then.

    Iterating yields one buffer per item, in order: a ``torch.uint8`` tensor of ``length``
    bytes on ``cuda:<device>`` when torch is installed, else a :class:`DeviceBuffer`
    (``__cuda_array_interface__``); with ``device=None``, host memory (a torch CPU tensor, else a
    numpy array, else a bytearray). Reinterpret it as needed (``t.view(torch.float16)``).

    ``io`` is :func:`read_into`'s. Each iteration is a new pass over the items. An error while
    reading an item is raised in the iterating thread when that item's turn comes.

    It is a ``torch.utils.data.IterableDataset`` when torch is installed: use it directly, or
    in ``DataLoader(loader, batch_size=None)`` with ``num_workers=0`` (the loader has its own
    thread; with worker processes each reads its share of the items). ``close()`` (or leaving a
    ``with`` block) stops the thread.
    """

    def __init__(
        self,
        items: Sequence[Item],
        device: Optional[int] = 0,
        prefetch: int = 2,
        io: str = "auto",
    ) -> None:
        check_io(io)
        if prefetch < 1:
            raise InvalidArgument(f"prefetch={prefetch}: use at least 1")
        if device is not None and device < 0:
            raise InvalidArgument(f"device={device}: use a GPU ordinal (0, 1, ...) or None for host memory")
        checked: List[Item] = []
        for i, it in enumerate(items):
            try:
                path, offset, length = it
            except (TypeError, ValueError):
                raise InvalidArgument(f"item {i} ({it!r}) is not a (path, offset, length) tuple") from None
            check_range(offset, length)
            checked.append((path, int(offset), int(length)))
        self.items = checked
        self.device = device
        self.prefetch = prefetch
        self.io = io
        self._epoch: Optional[_Epoch] = None

    def _shard(self) -> Sequence[Item]:
        if _torch is None:
            return self.items
        info = _torch.utils.data.get_worker_info()
        if info is None:
            return self.items
        return self.items[info.id :: info.num_workers]

    def __iter__(self) -> Iterator[Any]:
        self.close()
        epoch = _Epoch(self._shard(), self.device, self.prefetch, self.io)
        self._epoch = epoch
        return _Iter(self, epoch)

    def __len__(self) -> int:
        return len(self.items)

    def close(self) -> None:
        """Stop the background thread (after the read it is in) and drop prefetched buffers."""
        if self._epoch is not None:
            self._epoch.close()
            self._epoch = None

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class _Iter:
    def __init__(self, loader: Loader, epoch: _Epoch) -> None:
        self.loader = loader
        self.epoch = epoch

    def __iter__(self) -> "_Iter":
        return self

    def __del__(self) -> None:
        # An iterator dropped before the end (a `break`) stops its thread.
        try:
            self.epoch.close()
        except Exception:
            pass

    def __next__(self) -> Any:
        try:
            return self.epoch.next()
        except BaseException:
            if self.loader._epoch is self.epoch:
                self.loader.close()
            else:
                self.epoch.close()
            raise
