//! ubdirect-nvme: a userspace poll-mode NVMe driver over vfio-pci.
//!
//! # The model
//! - The facade's `ubdirect::Env` opens the DMA domain, the controllers (and NICs), then the
//!   buffer pool, in one call: the pool's memory is mapped for device DMA, so a device must be
//!   open first. With this crate alone the order is the one below: domain, [`Controller`], pool.
//! - A [`Namespace`] handle (from [`Controller::namespace`] / [`Controller::first_namespace`])
//!   carries the nsid, the LBA size, the size in blocks and the per-command limit (MDTS).
//! - Requests are in [`Lba`]s (a byte offset does not compile there) with an [`IoBuf`]: a window
//!   (offset, length) of a pool buffer; [`IoFlags`] for FUA and limited retry. Each request is
//!   checked against the namespace before anything is queued; a refused one comes back as
//!   [`Rejected`] with its buffers and nothing changed on the device.
//! - One [`IoQueuePair`] per thread (`Send`, not `Sync`; the [`Controller`] is shared):
//!   `submit_*` queues, [`IoQueuePair::ring`] writes the SQ doorbell once for the batch,
//!   [`IoQueuePair::poll`] reaps completions, each handing back exactly the payload submitted,
//!   with its type: the queue pair's [`IoPayload`] `P` ([`IoBufs`] by default, the enum of every
//!   request kind; `IoQueuePair::<IoBuf>::with_payload` for windows handed back as [`IoBuf`]s,
//!   `(IoBuf, T)` for a window and the caller's context, `Box<SgList>` for scatter lists). The
//!   I/O path allocates nothing and makes no system call. Every wait has a deadline
//!   ([`QueueOptions::io_timeout`], then [`Recovery`]).
//! - The `*_blocking` helpers (submit, ring, wait for that one request) are conveniences for
//!   tools and tests over the same calls, with the same types, returned typed.
//! - Limits: 4 KiB memory pages, PRP lists only (no SGL), no metadata / protection information
//!   (a namespace formatted with metadata is refused), polled completions (no interrupts).
//! - Features: `nvmf` (default) builds the NVMe/TCP host (`transport::tcp`,
//!   `qpair::TcpQueuePair`); with `default-features = false` only the PCIe driver is compiled.
//!
//! ```no_run
//! # use std::time::Duration;
//! # use ubdirect_core::{DmaDomain, PoolConfig, UbPool, UbRegistry};
//! # use ubdirect_nvme::{Controller, ControllerOptions, IoBuf, IoQueuePair, Lba, QueueOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = UbRegistry::new(DmaDomain::new()?);
//! let ctrl = Controller::open(&registry, "0000:00:04.0".parse()?, ControllerOptions::default())?;
//! let pool = UbPool::with_hugepages(&registry, PoolConfig { block_size: 1 << 20, block_count: 8 }, None)?;
//! let ns = ctrl.first_namespace()?;
//! let mut qp = IoQueuePair::new(&ctrl, QueueOptions::default())?;
//! let buf = IoBuf::prefix(pool.get()?, 4096)?;
//! let buf = qp.read_blocking(&ns, Lba(0), buf, Duration::from_secs(5))?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

#[cfg(not(target_endian = "little"))]
compile_error!(
    "ubdirect-nvme writes NVMe structures in native byte order: little-endian hosts only"
);

mod admin_queue;
mod block_queue_seam;
mod blocking_helpers;
pub mod cmb;
mod command_set;
pub mod controller;
mod doorbell;
pub mod error;
pub mod info;
mod io_commands;
mod io_flags;
pub mod io_queue;
pub mod io_types;
pub mod log_pages;
mod namespace;
pub mod perf;
pub mod prp;
pub mod qpair;
mod ring;
pub mod spec;
pub mod status;
#[cfg(feature = "nvmf")]
pub mod transport;

pub use block_queue_seam::to_block_error;
pub use cmb::{Cmb, CmbLayout};
pub use command_set::{command_set_from_descriptors, CommandSet};
pub use controller::{Controller, ControllerOptions, ShadowDecision, ShadowDoorbells};
pub use error::{NvmeError, Result, TIMEOUT_ABORTED, TIMEOUT_ADMIN, TIMEOUT_WAIT};
pub use info::{ControllerInfo, LbaFormatInfo, NamespaceInfo};
pub use io_flags::IoFlags;
pub use io_queue::IoQueuePair;
pub use io_types::{
    IoBuf, IoBufError, IoBufs, IoCompletion, IoData, IoPayload, QueueOptions, QueueStats, Recovery,
    Rejected, Segment, SgList, MAX_SEGMENTS,
};
pub use log_pages::{ErrorLogEntry, SmartLog};
pub use namespace::{Lba, Namespace};
pub use status::NvmeStatus;

// The threading contract: a controller is shared, a queue pair moves to its thread.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Controller>();
    send::<IoQueuePair>();
};
