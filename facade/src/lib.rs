//! # ubdirect
//!
//! Userspace poll-mode NVMe and NIC drivers over vfio-pci, with a unified buffer (UB) pool of
//! hugepage memory and device BAR windows mapped once into the IOMMU domain, so that devices
//! DMA straight into it: storage-to-GPU and network-to-GPU with zero CPU copies.
//!
//! This crate is the facade for embedders: it re-exports the driver crates under short names.
//! The `ubdirect` binary (devices, doctor, identify, perf, pipeline, loopback) is the separate
//! `ubdirect-cli` package, built on it.
//!
//! ```no_run
//! use ubdirect::dma::{DmaDomain, UbRegistry};
//! let domain = DmaDomain::new()?;
//! let registry = UbRegistry::new(domain);
//! # Ok::<(), ubdirect::dma::CoreError>(())
//! ```

#![deny(missing_docs)]

/// Hugepage reservation, inspection and allocation.
pub use ubdirect_hugepages as hugepages;

/// The VFIO DMA domain, PCI device access, MMIO and the unified buffer registry and pool
/// (the `ubdirect-core` crate; named `dma` so it does not shadow Rust's own `core`).
pub use ubdirect_core as dma;

/// The NVMe poll-mode driver.
pub use ubdirect_nvme as nvme;

/// The virtio-net poll-mode driver.
pub use ubdirect_virtio_net as virtio_net;

/// CUDA integration (loaded at run time; clear errors where CUDA is absent).
pub use ubdirect_cuda as cuda;

/// The kernel block path (io_uring, O_DIRECT, fixed buffers from the pool).
pub use ubdirect_uring as uring;

/// The pipeline: a block source through the UB pool into a sink, on one polling thread.
pub mod pipeline;
