"""``Env`` on the QEMU guest's emulated NVMe controller (tests/guest/60-python.sh runs these).

Marked ``guest`` and skipped unless ``UBD_GUEST_NVME`` names a controller bound to vfio-pci:
the test bed's nvme0 (one 512-byte namespace of 64 MiB holding the known pattern of
``ubdirect_testbed::pattern_word``: little-endian 64-bit words ``image_id << 56 | offset``,
image id 1). Writes go to blocks no other guest test checks, and the original bytes are put
back.
"""

import array
import os
import struct

import pytest

import ubdirect

NVME = os.environ.get("UBD_GUEST_NVME", "")
pytestmark = [
    pytest.mark.guest,
    pytest.mark.skipif(not NVME, reason="UBD_GUEST_NVME=<PCI address> names the guest's NVMe controller"),
]

try:
    import numpy as np
except ImportError:  # the guest image carries no numpy: bytes, bytearray and memoryview only
    np = None

IMAGE_ID = 1
BLOCK = 512
BLOCKS = (64 << 20) // BLOCK
# The scratch range: 16 blocks near the end of the namespace, put back after each test.
SCRATCH_LBA = BLOCKS - 4096
SCRATCH_BLOCKS = 16


def pattern(offset, length):
    """The test bed's pattern bytes of image ``IMAGE_ID`` at ``offset`` (a multiple of 8)."""
    return b"".join(struct.pack("<Q", (IMAGE_ID << 56) | (offset + i)) for i in range(0, length, 8))


@pytest.fixture(scope="module")
def env():
    with ubdirect.Env(NVME, block_size=64 << 10, pool_blocks=4) as e:
        yield e


@pytest.fixture
def scratch(env):
    """The scratch range's original bytes; put back (and checked) after the test."""
    original = env.read(SCRATCH_LBA, SCRATCH_BLOCKS)
    yield original
    env.write(SCRATCH_LBA, original)
    assert env.read(SCRATCH_LBA, SCRATCH_BLOCKS) == original


def test_identify(env):
    info = env.identify()
    assert info["address"] in (NVME, "0000:" + NVME)
    assert info["model"] and info["serial"]
    assert info["nsid"] == 1
    assert info["block_size"] == BLOCK
    assert info["blocks"] == BLOCKS


def test_read_holds_the_testbed_pattern(env):
    assert env.read(0, 8) == pattern(0, 8 * BLOCK)
    lba = 1000
    assert env.read(lba, 3) == pattern(lba * BLOCK, 3 * BLOCK)


def test_write_then_read_back_bytes(env, scratch):
    data = os.urandom(SCRATCH_BLOCKS * BLOCK)
    assert data != scratch
    env.write(SCRATCH_LBA, data)
    assert env.read(SCRATCH_LBA, SCRATCH_BLOCKS) == data
    # one block at a time lands at the right LBAs
    for i in (0, 7, SCRATCH_BLOCKS - 1):
        assert env.read(SCRATCH_LBA + i, 1) == data[i * BLOCK : (i + 1) * BLOCK]


def test_write_larger_than_a_pool_block(env):
    # 160 KiB through 64 KiB pool blocks: three chunks each way.
    lba = SCRATCH_LBA + SCRATCH_BLOCKS
    n = (160 << 10) // BLOCK
    original = env.read(lba, n)
    try:
        data = os.urandom(n * BLOCK)
        env.write(lba, memoryview(bytearray(data)))
        assert env.read(lba, n) == data
    finally:
        env.write(lba, original)
    assert env.read(lba, n) == original


def test_read_into_host_buffers(env, scratch):
    data = os.urandom(SCRATCH_BLOCKS * BLOCK)
    env.write(SCRATCH_LBA, bytearray(data))
    ba = bytearray(SCRATCH_BLOCKS * BLOCK)
    assert env.read_into(SCRATCH_LBA, ba) == len(data)
    assert bytes(ba) == data
    words = array.array("Q", bytes(SCRATCH_BLOCKS * BLOCK))
    assert env.read_into(SCRATCH_LBA, words) == len(data)
    assert words.tobytes() == data
    if np is not None:
        a = np.zeros(SCRATCH_BLOCKS * BLOCK, dtype=np.uint8)
        assert env.read_into(SCRATCH_LBA, a) == len(data)
        assert a.tobytes() == data


def test_block_errors(env):
    with pytest.raises(ubdirect.InvalidArgument, match="not a positive multiple of the namespace's 512-byte"):
        env.write(SCRATCH_LBA, b"x" * 100)
    with pytest.raises(ubdirect.InvalidArgument, match=rf"blocks {BLOCKS - 1}\.\.{BLOCKS + 1} are not inside namespace 1"):
        env.read(BLOCKS - 1, 2)
    with pytest.raises(ubdirect.InvalidArgument, match="read-only"):
        env.read_into(0, b"\0" * BLOCK)


def test_absent_controller_is_a_device_error():
    with pytest.raises(ubdirect.DeviceError, match="0000:00:1f.7"):
        ubdirect.Env("0000:00:1f.7")


def test_malformed_address_is_an_invalid_argument():
    with pytest.raises(ubdirect.InvalidArgument, match=r'device address "00:zz".*DDDD:BB:DD\.F'):
        ubdirect.Env("00:zz")


def test_file_read_into_a_host_buffer(tmp_path):
    p = tmp_path / "guest.bin"
    data = os.urandom((1 << 20) + 333)
    p.write_bytes(data)
    buf = bytearray(len(data))
    ubdirect.read_into(p, buf)
    assert bytes(buf) == data
    part = bytearray(4096)
    ubdirect.read_into(p, part, offset=12345, length=4096)
    assert bytes(part) == data[12345 : 12345 + 4096]

