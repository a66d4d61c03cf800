//! ubdirect-nvme: a userspace poll-mode NVMe driver over vfio-pci.

#[cfg(not(target_endian = "little"))]
compile_error!(
    "ubdirect-nvme writes NVMe structures in native byte order: little-endian hosts only"
);

pub mod prp;
pub mod spec;
pub mod status;

pub use status::NvmeStatus;
