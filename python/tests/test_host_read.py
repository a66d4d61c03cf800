"""read_into host buffers: byte-exact against plain file reads and numpy.fromfile."""

import pytest

import ubdirect

np = pytest.importorskip("numpy")

RANGES = [
    (0, 4096),
    (0, 1 << 20),
    (1, 1),
    (123, 4096),
    (4095, 10_001),
    (8192, 65536),
    ((1 << 20) - 5, 782),  # up to the last byte, unaligned
]


@pytest.mark.parametrize("offset,length", RANGES)
@pytest.mark.parametrize("io", ["auto", "buffered"])
def test_numpy_matches_fromfile(data_file, offset, length, io):
    a = np.empty(length, dtype=np.uint8)
    assert ubdirect.read_into(data_file, a, offset, length, io=io) == length
    ref = np.fromfile(data_file, dtype=np.uint8, count=length, offset=offset)
    assert np.array_equal(a, ref)


def test_bytearray_and_memoryview(data_file, data):
    b = bytearray(1000)
    assert ubdirect.read_into(str(data_file), b, offset=77) == 1000
    assert bytes(b) == data[77:1077]
    big = bytearray(3000)
    m = memoryview(big)[1000:2000]
    assert ubdirect.read_into(data_file, m, offset=5) == 1000
    assert bytes(big[1000:2000]) == data[5:1005]
    assert big[:1000] == bytearray(1000) and big[2000:] == bytearray(1000)


def test_other_dtypes_receive_raw_bytes(data_file, data):
    a = np.zeros((16, 4), dtype=np.float32)
    assert ubdirect.read_into(data_file, a, offset=64) == 256
    assert a.tobytes() == data[64:320]


def test_length_none_fills_the_destination_or_stops_at_eof(data_file, data):
    a = np.zeros(1000, dtype=np.uint8)
    assert ubdirect.read_into(data_file, a) == 1000
    assert a.tobytes() == data[:1000]
    tail = np.zeros(5000, dtype=np.uint8)
    n = ubdirect.read_into(data_file, tail, offset=len(data) - 300)
    assert n == 300 and tail[:300].tobytes() == data[-300:]
    assert ubdirect.read_into(data_file, tail, offset=len(data)) == 0


def test_direct_aligned_matches(data_file, data):
    # O_DIRECT needs an aligned address: carve one out of a larger array.
    raw = np.zeros(3 * 4096, dtype=np.uint8)
    start = (-raw.ctypes.data) % 4096
    a = raw[start : start + 8192]
    try:
        n = ubdirect.read_into(data_file, a, offset=4096, length=8192, io="direct")
    except ubdirect.InvalidArgument as e:  # tmpfs refuses O_DIRECT
        assert "O_DIRECT" in str(e)
        pytest.skip(f"the test file system refuses O_DIRECT: {e}")
    assert n == 8192 and a.tobytes() == data[4096:12288]


def test_direct_unaligned_is_refused_clearly(data_file):
    a = np.zeros(100, dtype=np.uint8)
    with pytest.raises(ubdirect.InvalidArgument, match="multiples of 4096"):
        ubdirect.read_into(data_file, a, offset=1, length=100, io="direct")


def test_mapped_needs_a_cuda_destination(data_file):
    with pytest.raises(ubdirect.InvalidArgument, match="CUDA destination"):
        ubdirect.read_into(data_file, bytearray(10), io="mapped")
