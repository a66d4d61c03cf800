"""Shared fixtures: a file of known random bytes."""

import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "guest: needs the QEMU guest's NVMe controller on vfio-pci (UBD_GUEST_NVME)")


@pytest.fixture(scope="session")
def data_file(tmp_path_factory):
    """A 1 MiB + 777 bytes file of random bytes (not a multiple of 4096: the tail is unaligned)."""
    p = tmp_path_factory.mktemp("ubd") / "data.bin"
    p.write_bytes(os.urandom((1 << 20) + 777))
    return p


@pytest.fixture(scope="session")
def data(data_file):
    return data_file.read_bytes()
