//! [`EnvError`]: why [`EnvBuilder::open`](super::EnvBuilder::open) failed.

use ubdirect_core::CoreError;
use ubdirect_hugepages::HugeError;

/// Why [`EnvBuilder::open`](super::EnvBuilder::open) failed; nothing it opened stays open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// A device address that does not parse.
    #[error("device address {addr:?}: {source}")]
    Address {
        /// The address as given.
        addr: String,
        /// Why it does not parse.
        source: CoreError,
    },
    /// The same device was named twice.
    #[error("device {addr} is named twice: name each NVMe controller and NIC once")]
    Duplicate {
        /// Its address.
        addr: String,
    },
    /// No device was asked for, so the pool's memory could not be mapped for DMA.
    #[error("no device to open: add one with .nvme(\"DDDD:BB:DD.F\") or .nic(\"DDDD:BB:DD.F\") (the pool's memory is mapped for the devices' DMA, so at least one device opens first)")]
    NoDevice,
    /// No pool was asked for, or a NIC was named on an environment opened
    /// [`without_pool`](super::EnvBuilder::without_pool) (its RX ring is filled from the pool).
    #[error("no buffer pool: add one with .pool(PoolConfig {{ block_size, block_count }})")]
    NoPool,
    /// The pool's settings are out of range.
    #[error("the buffer pool: {0}")]
    PoolConfig(CoreError),
    /// The hugepage step failed: too few free hugepages for the pool, or the reservation fell
    /// short. Checked before any device opens.
    #[error("hugepages for the buffer pool: {0}")]
    Hugepages(HugeError),
    /// The DMA domain (the VFIO container) did not open.
    #[error("opening the DMA domain: {0}")]
    Domain(CoreError),
    /// An NVMe controller did not open.
    #[cfg(feature = "nvme")]
    #[error("opening NVMe controller {addr}: {source}")]
    Controller {
        /// Its address.
        addr: String,
        /// Why.
        source: ubdirect_nvme::NvmeError,
    },
    /// A NIC's PCI device did not open (before the pool).
    #[error("opening PCI device {addr}: {source}")]
    Device {
        /// Its address.
        addr: String,
        /// Why.
        source: CoreError,
    },
    /// A virtio-net NIC did not come up (after the pool: its RX ring is filled from it).
    #[cfg(feature = "net")]
    #[error("bringing up virtio-net NIC {addr}: {source}")]
    Nic {
        /// Its address.
        addr: String,
        /// Why.
        source: ubdirect_virtio_net::VirtioNetError,
    },
    /// The pool did not open.
    #[error("creating the buffer pool: {0}")]
    Pool(CoreError),
}
