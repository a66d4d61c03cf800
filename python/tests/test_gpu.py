"""CUDA destinations (skipped without a GPU): torch CUDA tensors and DeviceBuffer, byte-exact
against numpy.fromfile, for every io mode."""

import os

import pytest

import ubdirect

np = pytest.importorskip("numpy")

pytestmark = pytest.mark.skipif(ubdirect.cuda_device_count() == 0, reason="needs an NVIDIA GPU and driver")

RANGES = [(0, 4096), (1, 1), (123, 100_000), (4095, (1 << 20) - 4095 + 777), (0, (1 << 20) + 777)]


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    """A file of 600 MiB + 5 bytes: three 256 MiB windows, the last one short and unaligned."""
    p = tmp_path_factory.mktemp("gpu") / "big.bin"
    rng = np.random.default_rng(7)
    with open(p, "wb") as f:
        for _ in range(6):
            f.write(rng.integers(0, 256, 100 << 20, dtype=np.uint8).tobytes())
        f.write(b"\x01\x02\x03\x04\x05")
    return p


@pytest.mark.parametrize("io", ["auto", "mapped", "direct", "buffered"])
@pytest.mark.parametrize("offset,length", RANGES)
def test_device_buffer(data_file, io, offset, length):
    buf = ubdirect.DeviceBuffer(length)
    try:
        n = ubdirect.read_into(data_file, buf, offset, length, io=io)
    except ubdirect.InvalidArgument as e:
        assert io == "direct" and "O_DIRECT" in str(e)
        pytest.skip(str(e))
    assert n == length
    ref = np.fromfile(data_file, dtype=np.uint8, count=length, offset=offset)
    assert buf.to_bytes() == ref.tobytes()


@pytest.mark.parametrize("io", ["auto", "mapped", "direct", "buffered"])
def test_torch_tensor_across_windows(big_file, io):
    torch = pytest.importorskip("torch")
    size = os.path.getsize(big_file)
    for offset, length in [(0, size), ((256 << 20) - 3, (300 << 20) + 11), (size - 5, 5)]:
        t = torch.empty(length, dtype=torch.uint8, device="cuda")
        try:
            assert ubdirect.read_into(big_file, t, offset, length, io=io) == length
        except ubdirect.InvalidArgument as e:
            assert io == "direct" and "O_DIRECT" in str(e)
            pytest.skip(str(e))
        ref = np.fromfile(big_file, dtype=np.uint8, count=length, offset=offset)
        assert np.array_equal(t.cpu().numpy(), ref), (offset, length)


def test_torch_other_dtype_and_device_check(data_file):
    torch = pytest.importorskip("torch")
    t = torch.zeros(256, dtype=torch.float16, device="cuda")
    assert ubdirect.read_into(data_file, t, offset=10) == 512
    assert t.cpu().numpy().tobytes() == np.fromfile(data_file, dtype=np.uint8, count=512, offset=10).tobytes()
    with pytest.raises(ubdirect.InvalidArgument, match="not C-contiguous"):
        ubdirect.read_into(data_file, torch.zeros((8, 8), dtype=torch.uint8, device="cuda").t())


def test_loader_cuda_tensors(big_file):
    torch = pytest.importorskip("torch")
    size = 64 << 20
    items = [(str(big_file), i * size + i, size) for i in range(8)]
    with ubdirect.Loader(items, device=0, prefetch=2) as loader:
        assert isinstance(loader, torch.utils.data.IterableDataset)
        for (path, off, ln), t in zip(items, loader):
            assert t.is_cuda and t.dtype == torch.uint8 and t.numel() == ln
            ref = np.fromfile(path, dtype=np.uint8, count=ln, offset=off)
            assert np.array_equal(t.cpu().numpy(), ref)
    dl = torch.utils.data.DataLoader(ubdirect.Loader(items[:2], device=0), batch_size=None)
    assert [t.numel() for t in dl] == [size, size]


def test_mapped_windows_stay_registered(big_file):
    t = ubdirect.DeviceBuffer(1 << 20)
    ubdirect.read_into(big_file, t, 0, 1 << 20, io="mapped")
    assert ubdirect.registered_bytes() >= 256 << 20
    ubdirect.release_windows()
    assert ubdirect.registered_bytes() == 0


def test_started_reads_overlap(big_file):
    """Several mapped reads queued before any is waited for land byte-exact."""
    torch = pytest.importorskip("torch")
    from ubdirect._read import start_into

    size = os.path.getsize(big_file)
    ranges = [(0, 200 << 20), ((200 << 20) + 1, 300 << 20), (size - (90 << 20), 90 << 20)]
    bufs = [torch.empty(ln, dtype=torch.uint8, device="cuda") for _, ln in ranges]
    started = [start_into(big_file, b, off, ln, io="mapped") for b, (off, ln) in zip(bufs, ranges)]
    assert [p.wait() for p in started] == [(ln, "mapped") for _, ln in ranges]
    assert started[0].wait() == (0, "done")
    for b, (off, ln) in zip(bufs, ranges):
        ref = np.fromfile(big_file, dtype=np.uint8, count=ln, offset=off)
        assert np.array_equal(b.cpu().numpy(), ref), (off, ln)


@pytest.mark.parametrize("item_mib", [256, 7])
def test_loader_mapped_whole_file(big_file, item_mib):
    """The Loader with copies of several items queued at once: every item byte-exact, in order."""
    pytest.importorskip("torch")
    size = os.path.getsize(big_file)
    item = item_mib << 20
    items = [(str(big_file), off, min(item, size - off)) for off in range(0, size, item)]
    ref = np.fromfile(big_file, dtype=np.uint8)
    n = 0
    with ubdirect.Loader(items, device=0, prefetch=2, io="mapped") as loader:
        for (_, off, ln), t in zip(items, loader):
            assert np.array_equal(t.cpu().numpy(), ref[off : off + ln]), (off, ln)
            n += 1
    assert n == len(items)


def test_loader_error_after_good_items_and_early_stop(big_file, tmp_path):
    pytest.importorskip("torch")
    good = [(str(big_file), i << 20, 1 << 20) for i in range(3)]
    items = good + [(str(tmp_path / "missing.bin"), 0, 1 << 20)] + good
    got = []
    with pytest.raises(ubdirect.FileError, match="missing.bin"):
        for t in ubdirect.Loader(items, device=0, io="mapped"):
            got.append(t.cpu().numpy().tobytes())
    ref = np.fromfile(big_file, dtype=np.uint8, count=3 << 20)
    assert got == [ref[i << 20 : (i + 1) << 20].tobytes() for i in range(3)]
    loader = ubdirect.Loader([(str(big_file), 0, 64 << 20)] * 16, device=0, io="mapped")
    for i, _t in enumerate(loader):
        if i == 2:
            break
    loader.close()
