"""Error classes and their messages."""

import pytest

import ubdirect


def test_hierarchy():
    for cls in (
        ubdirect.InvalidArgument,
        ubdirect.FileError,
        ubdirect.DeviceError,
        ubdirect.CudaUnavailable,
        ubdirect.CudaError,
    ):
        assert issubclass(cls, ubdirect.Error)
    assert issubclass(ubdirect.InvalidArgument, ValueError)
    assert issubclass(ubdirect.FileError, OSError)


def test_past_eof(data_file, data):
    n = len(data)
    with pytest.raises(ubdirect.InvalidArgument, match=rf"bytes {n - 10}\.\.{n + 10} are not inside .*\({n} bytes\)"):
        ubdirect.read_into(data_file, bytearray(20), offset=n - 10, length=20)
    with pytest.raises(ubdirect.InvalidArgument, match="past the end"):
        ubdirect.read_into(data_file, bytearray(20), offset=n + 1)


def test_bad_arguments(data_file):
    with pytest.raises(ubdirect.InvalidArgument, match="holds 10 bytes, less than the 20"):
        ubdirect.read_into(data_file, bytearray(10), length=20)
    with pytest.raises(ubdirect.InvalidArgument, match='io=\'fast\': use "auto"'):
        ubdirect.read_into(data_file, bytearray(10), io="fast")
    with pytest.raises(ubdirect.InvalidArgument, match="negative"):
        ubdirect.read_into(data_file, bytearray(10), offset=-1)
    with pytest.raises(ubdirect.InvalidArgument, match="read-only"):
        ubdirect.read_into(data_file, b"immutable")
    with pytest.raises(ubdirect.InvalidArgument, match="not a destination"):
        ubdirect.read_into(data_file, 42)


def test_missing_file(tmp_path):
    with pytest.raises(ubdirect.FileError, match="cannot open .*nope.bin: No such file"):
        ubdirect.read_into(tmp_path / "nope.bin", bytearray(1))


def test_cuda_without_a_gpu(data_file):
    if ubdirect.cuda_device_count() > 0:
        pytest.skip("a GPU is present (tests/test_gpu.py covers it)")
    with pytest.raises(ubdirect.CudaUnavailable):
        ubdirect.DeviceBuffer(16)


class FakeCudaArray:
    """A CUDA Array Interface at an address no GPU owns."""

    __cuda_array_interface__ = {"shape": (16,), "typestr": "|u1", "data": (0x1000, False), "version": 3}


def test_fake_cuda_destination_is_refused(data_file):
    with pytest.raises((ubdirect.CudaUnavailable, ubdirect.InvalidArgument)):
        ubdirect.read_into(data_file, FakeCudaArray())


def test_env_bad_pci_address():
    with pytest.raises(ubdirect.InvalidArgument, match=r'device address "zz".*DDDD:BB:DD\.F'):
        ubdirect.Env("zz")


def test_env_absent_controller():
    # Hugepages are checked first, then VFIO, then the device: each a DeviceError in library words.
    with pytest.raises(ubdirect.DeviceError) as e:
        ubdirect.Env("0000:7f:1f.7")
    msg = str(e.value)
    assert "hugepages" in msg or "VFIO is not available" in msg or "0000:7f:1f.7" in msg
