//! [`DeviceModel`]: the seam that lets a driver's unchanged code run against an in-process
//! model of a device instead of a VFIO device (host tests and fuzzing; see the
//! `ubdirect-devmodel` crate).
//!
//! A [`super::PciDevice`] made with [`super::PciDevice::from_model`] sends config-space access,
//! BAR sizes, `map_bar`, reset and removal queries to the model; the [`crate::Mmio`] windows it
//! maps send every register access to [`DeviceModel::mmio_read`] / [`DeviceModel::mmio_write`].
//! The model reaches driver memory (rings, PRP lists, buffers) through the IOVAs the driver
//! programs, translated with the [`crate::UbRegistry`] of a [`crate::DmaDomain::host_only`]
//! domain, and processes a doorbell synchronously inside `mmio_write`: no threads, and every
//! run is deterministic.

/// An in-process PCI function: config space, BARs as register files, optional reset.
///
/// Accesses come pre-checked: `off + len` lies inside the config space / BAR and MMIO accesses
/// are aligned to their size (1, 2, 4 or 8 bytes).
pub trait DeviceModel: Send + Sync {
    /// Bytes of config space (256 for conventional PCI, 4096 for PCIe).
    fn config_len(&self) -> u16 {
        4096
    }
    /// Read `buf.len()` bytes of config space at `off`.
    fn config_read(&self, off: u16, buf: &mut [u8]);
    /// Write `data` to config space at `off`.
    fn config_write(&self, off: u16, data: &[u8]);
    /// Length of BAR `bar` (0..=5) in bytes; 0 when the model has no such BAR.
    fn bar_len(&self, bar: u8) -> u64;
    /// A register read of `size` bytes at `off` of BAR `bar` (zero-extended).
    fn mmio_read(&self, bar: u8, off: u64, size: u8) -> u64;
    /// A register write of the low `size` bytes of `val` at `off` of BAR `bar`.
    fn mmio_write(&self, bar: u8, off: u64, size: u8, val: u64);
    /// Whether [`DeviceModel::reset`] is implemented (VFIO's "reset method available").
    fn can_reset(&self) -> bool {
        false
    }
    /// A function-level reset (only called when [`DeviceModel::can_reset`]).
    fn reset(&self) {}
    /// True once the model wants the device back (a modelled hot-unplug request).
    fn removal_requested(&self) -> bool {
        false
    }
    /// The NUMA node the modelled device sits on.
    fn numa_node(&self) -> Option<u32> {
        None
    }
}
