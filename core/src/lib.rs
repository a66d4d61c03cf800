//! ubdirect-core: the VFIO DMA domain, PCI device access, MMIO accessors and the unified
//! buffer (UB) registry and pool that every ubdirect driver stands on.

pub mod testbed;
pub mod topology;
