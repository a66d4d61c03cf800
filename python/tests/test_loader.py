"""Loader: order, prefetch, errors in the worker, threads after close."""

import threading
import time

import pytest

import ubdirect
from ubdirect import _loader


def items_of(path, n, size):
    return [(str(path), i * size, size) for i in range(n)]


def as_bytes(buf):
    if hasattr(buf, "numpy"):
        buf = buf.numpy()
    return bytes(memoryview(buf).cast("B"))


def test_yields_in_order(data_file, data):
    size = 4096 + 3
    with ubdirect.Loader(items_of(data_file, 40, size), device=None, prefetch=3) as loader:
        got = [as_bytes(b) for b in loader]
    assert len(got) == 40
    for i, b in enumerate(got):
        assert b == data[i * size : (i + 1) * size]


def test_each_iteration_is_a_new_pass(data_file, data):
    loader = ubdirect.Loader(items_of(data_file, 3, 100), device=None)
    assert [as_bytes(b) for b in loader] == [as_bytes(b) for b in loader]
    assert len(loader) == 3
    loader.close()


def test_prefetches_ahead_of_the_consumer(data_file):
    loader = ubdirect.Loader(items_of(data_file, 10, 1000), device=None, prefetch=4)
    it = iter(loader)
    next(it)
    deadline = time.monotonic() + 5
    # The worker fills the queue (4 ready) and is blocked handing over the next.
    while loader._epoch.ready.qsize() < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loader._epoch.ready.qsize() == 4
    loader.close()


def test_worker_error_surfaces_in_order(data_file, data):
    n = len(data)
    items = items_of(data_file, 2, 100) + [(str(data_file), n - 10, 100)] + items_of(data_file, 2, 100)
    loader = ubdirect.Loader(items, device=None)
    it = iter(loader)
    next(it), next(it)
    with pytest.raises(ubdirect.InvalidArgument, match="not inside"):
        next(it)
    loader.close()


def test_bad_items_and_settings():
    with pytest.raises(ubdirect.InvalidArgument, match="not a \\(path, offset, length\\)"):
        ubdirect.Loader([("a", 0)])
    with pytest.raises(ubdirect.InvalidArgument, match="prefetch"):
        ubdirect.Loader([], prefetch=0)
    with pytest.raises(ubdirect.InvalidArgument, match="io="):
        ubdirect.Loader([], io="nope")


def loader_threads():
    return [t for t in threading.enumerate() if t.name == "ubdirect-loader"]


def test_no_thread_left_after_close(data_file):
    before = len(loader_threads())
    for _ in range(5):
        loader = ubdirect.Loader(items_of(data_file, 50, 1000), device=None, prefetch=2)
        it = iter(loader)
        next(it)  # the worker is now blocked on a full queue
        loader.close()
    with ubdirect.Loader(items_of(data_file, 50, 1000), device=None) as loader:
        next(iter(loader))
    assert len(loader_threads()) == before
    # Exhausted and abandoned iterators leave nothing either.
    assert len(list(ubdirect.Loader(items_of(data_file, 3, 10), device=None))) == 3
    kept = ubdirect.Loader(items_of(data_file, 50, 1000), device=None)
    for _ in kept:
        break  # the iterator goes with the loop; the loader stays
    assert len(loader_threads()) == before
    kept.close()


def test_host_buffers_without_torch(data_file, monkeypatch):
    monkeypatch.setattr(_loader, "_torch", None)
    (b,) = list(ubdirect.Loader(items_of(data_file, 1, 10), device=None))
    np = pytest.importorskip("numpy")
    assert isinstance(b, np.ndarray) and b.dtype == np.uint8
    monkeypatch.setattr(_loader, "_np", None)
    (b,) = list(ubdirect.Loader(items_of(data_file, 1, 10), device=None))
    assert isinstance(b, bytearray)
