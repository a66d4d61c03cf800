//! ubdirect-core: the VFIO DMA domain, PCI device access, MMIO accessors and the unified
//! buffer (UB) registry and pool that every ubdirect driver stands on.
//!
//! Order of construction: [`DmaDomain::new`] -> [`PciDevice::open`] (the first device sets the
//! IOMMU up) -> [`UbRegistry::new`] -> regions, pools, [`DmaMem`]. Everything holds `Arc`s
//! of what it depends on, so drop order is safe by construction (see [`ub`]).
//!
//! A VFIO domain learns its IOVA ranges and page sizes when its first device opens, so
//! [`DmaDomain::map`] before that is [`CoreError::NoDevice`] (`ubdirect::Env` opens things
//! in the right order). A device opens once per domain ([`CoreError::AlreadyOpen`] otherwise:
//! share the `Arc<PciDevice>`). VFIO drops the IOMMU and every mapping when the last device of
//! a container closes: the domain keeps its mappings on record and replays them at the same
//! IOVAs when a device opens again.

#![deny(missing_docs)]

pub mod barrier;
mod error;
pub mod iova;
pub mod mmio;
pub mod pci;
pub mod seams;
pub mod ub;
pub mod util;
pub mod vfio;

pub use error::{CoreError, Result};
pub use mmio::Mmio;
pub use pci::{DeviceModel, PciAddress, PciCapability, PciDevice};
pub use seams::{
    BlockCompletion, BlockError, BlockErrorKind, BlockQueue, Sink, SinkError, SinkErrorKind,
};
pub use ub::{
    DmaMem, PoolConfig, PoolStats, RegionId, RegionKind, RegionOwner, UbBuf, UbPool, UbRegion,
    UbRegistry,
};
pub use ubdirect_hugepages::PageSize;
pub use vfio::{DmaDomain, DomainId};
