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
//! ## Features
//!
//! | feature | gives | default |
//! |---|---|---|
//! | `nvme` | [`nvme`]: the NVMe poll-mode driver | yes |
//! | `nvmf` | the NVMe/TCP host in [`nvme`] (`nvme::transport::tcp`, `nvme::qpair::TcpQueuePair`) and the pipeline's `SourceSpec::Tcp` (implies `nvme`) | yes |
//! | `net` | [`virtio_net`]: the virtio-net poll-mode driver | yes |
//! | `igb` | [`igb`]: the Intel 82576 (igb) poll-mode driver | no |
//! | `cuda` | [`cuda`], and the pipeline's CUDA sinks: `pipeline::CudaSinks`, `pipeline::run_mapped` | yes |
//! | `uring` | [`uring`]: the kernel block path (io_uring, O_DIRECT) | yes |
//! | `progress` | the pipeline's progress bar on stderr (indicatif) | yes |
//!
//! [`Env`] (with `nvme` or `net`) opens everything in one call: hugepages checked, the DMA
//! domain, the NVMe controllers and NICs, then the pool.
//! [`pipeline::Pipeline`] (with `nvme`; file reads need `uring`, CUDA sinks `cuda`) runs a
//! whole pipeline from a source and sink description, with the policy of `ubdirect pipeline`.
//! [`dma`], [`hugepages`], [`diag`] and [`pipeline`] are always there. The pipeline's
//! [`pipeline::NullSink`] and [`pipeline::BarSink`] need no feature; CUDA device memory as a sink
//! needs `cuda`. An embedder that only drives NVMe writes
//! `ubdirect = { version = "0.1", default-features = false, features = ["nvme"] }` and compiles
//! no clap, indicatif, cudarc or io-uring, and no NVMe/TCP (`examples/embedder-nvme-only`).
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
#[cfg(feature = "nvme")]
pub use ubdirect_nvme as nvme;

/// The virtio-net poll-mode driver.
#[cfg(feature = "net")]
pub use ubdirect_virtio_net as virtio_net;

/// The Intel 82576 (igb) poll-mode driver.
#[cfg(feature = "igb")]
pub use ubdirect_igb as igb;

/// CUDA integration (loaded at run time; clear errors where CUDA is absent).
#[cfg(feature = "cuda")]
pub use ubdirect_cuda as cuda;

/// The kernel block path (io_uring, O_DIRECT, fixed buffers from the pool).
#[cfg(feature = "uring")]
pub use ubdirect_uring as uring;

/// Diagnostics: PCI topology from sysfs, the pre-flight (doctor) rules, kernel-log IOMMU faults.
pub use ubdirect_diag as diag;

#[cfg(any(feature = "nvme", feature = "net"))]
mod env;
#[cfg(any(feature = "nvme", feature = "net"))]
pub use env::{Env, EnvBuilder, EnvError, Hugepages, PoolMemory};

/// The pipeline: a block source through the UB pool into a sink, on one polling thread.
pub mod pipeline;
