//! ubdirect-core: the VFIO DMA domain, PCI device access, MMIO accessors and the unified
//! buffer (UB) registry and pool that every ubdirect driver stands on.
//!
//! Order of construction: [`DmaDomain::new`] -> [`PciDevice::open`] (the first device sets the
//! IOMMU up) -> [`UbRegistry::new`] -> regions, pools, [`DmaMem`]. Everything holds `Arc`s
//! of what it depends on, so drop order is safe by construction (see [`ub`]).

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
pub use vfio::DmaDomain;
