"""The exceptions ubdirect raises. Every one is a :class:`Error`; the message is the library's."""


class Error(Exception):
    """Base class of every ubdirect error."""


class InvalidArgument(Error, ValueError):
    """A bad argument: a range outside the file, a destination too small or read-only, a bad
    ``io=`` value, an unaligned ``io="direct"`` request."""


class FileError(Error, OSError):
    """Opening or reading a file failed (the OS error is in the message)."""


class DeviceError(Error):
    """A device failed or could not be opened: the NVMe controller, VFIO, the DMA domain,
    hugepages."""


class CudaUnavailable(Error):
    """No NVIDIA driver, or no such GPU."""


class CudaError(Error):
    """A CUDA call failed or a copy did not complete in time."""
