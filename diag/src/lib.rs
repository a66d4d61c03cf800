//! ubdirect-diag: what `ubdirect devices` and `ubdirect doctor` read and decide, kept out of the
//! drivers' dependency tree.
//!
//! - [`topology`]: PCI devices, drivers, IOMMU groups, NUMA nodes, links and BARs from sysfs,
//!   plus the system facts a pre-flight check needs.
//! - [`topology::preflight`]: the doctor's rules (findings with a severity and the fix).
//! - [`kmsg`]: IOMMU DMA-fault records from the kernel log (`/dev/kmsg`).

#![deny(missing_docs)]

pub mod kmsg;
pub mod topology;
