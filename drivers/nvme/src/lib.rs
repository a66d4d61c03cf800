//! ubdirect-nvme: a userspace poll-mode NVMe driver over vfio-pci.
//!
//! ```no_run
//! # use std::time::Duration;
//! # use ubdirect_core::{DmaDomain, UbRegistry, UbPool, PoolConfig};
//! # use ubdirect_nvme::{Controller, ControllerOptions, IoBuf, IoQueuePair, Lba, QueueOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = UbRegistry::new(DmaDomain::new()?);
//! let ctrl = Controller::open(&registry, "0000:00:04.0".parse()?, ControllerOptions::default())?;
//! let pool = UbPool::with_hugepages(&registry, PoolConfig { block_size: 1 << 20, block_count: 8 }, None)?;
//! let ns = ctrl.first_namespace()?;
//! let mut qp = IoQueuePair::new(&ctrl, QueueOptions::default())?;
//! let buf = qp.read_blocking(&ns, Lba(0), IoBuf::prefix(pool.get()?, 4096)?, Duration::from_secs(5))?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

#[cfg(not(target_endian = "little"))]
compile_error!(
    "ubdirect-nvme writes NVMe structures in native byte order: little-endian hosts only"
);

pub mod admin;
mod admin_queue;
mod block_queue;
mod blocking;
pub mod controller;
mod doorbell;
pub mod env;
pub mod error;
pub mod info;
mod io_commands;
mod io_flags;
pub mod io_queue;
pub mod io_types;
mod namespace;
pub mod perf;
pub mod prp;
mod ring;
pub mod spec;
pub mod status;

pub use block_queue::to_block_error;
pub use controller::{Controller, ControllerOptions};
pub use env::{Env, EnvBuilder, EnvError, PoolMemory};
pub use error::{NvmeError, Result, TIMEOUT_ABORTED, TIMEOUT_ADMIN, TIMEOUT_WAIT};
pub use info::{ControllerInfo, LbaFormatInfo, NamespaceInfo};
pub use io_flags::IoFlags;
pub use io_queue::IoQueuePair;
pub use io_types::{
    IoBuf, IoBufError, IoBufs, IoCompletion, QueueOptions, QueueStats, Recovery, Rejected, Segment,
    SgList, MAX_SEGMENTS,
};
pub use namespace::{Lba, Namespace};
pub use status::NvmeStatus;

// The threading contract: a controller is shared, a queue pair moves to its thread.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Controller>();
    send::<IoQueuePair>();
};
