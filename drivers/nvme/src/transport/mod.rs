//! Transports other than PCIe. Today: NVMe/TCP ([`tcp`]), the host side of the NVMe/TCP
//! transport (NVMe/TCP transport specification 1.0) and the fabrics commands it needs.
//!
//! The PCIe transport is the rest of this crate (queues in host memory, doorbells in BAR0);
//! it keeps its own hot path untouched: nothing here is called on it.

pub mod tcp;
