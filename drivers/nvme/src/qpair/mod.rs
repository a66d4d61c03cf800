//! One queue-pair API for every NVMe transport (SPDK's qpair model): the same typed commands,
//! submit, ring, poll, [`IoCompletion`] and [`Rejected`] whether the controller sits on PCIe
//! ([`crate::IoQueuePair`]) or across the network (`TcpQueuePair`, with the `nvmf` feature).
//! An embedder's I/O code written against [`QueuePair`] moves from a local controller to a
//! remote one unchanged:
//!
//! ```no_run
//! use ubdirect_nvme::qpair::{QueuePair, Read, Write};
//! use ubdirect_nvme::{IoBuf, IoBufs, Lba, NvmeError};
//!
//! /// Write `buf` at LBA 0 and read it back, on any transport.
//! fn roundtrip<Q: QueuePair<Payload = IoBufs>>(q: &mut Q, buf: IoBuf) -> Result<IoBufs, NvmeError> {
//!     let ns = q.namespace(1)?;
//!     q.submit(Write::new(&ns, Lba(0), buf).tag(1)).map_err(|r| r.error)?;
//!     q.ring();
//!     let mut back = None;
//!     while back.is_none() {
//!         q.poll(8, |c| back = Some(c))?;
//!     }
//!     let c = back.unwrap();
//!     c.result?;
//!     q.submit(Read::new(&ns, Lba(0), c.bufs).tag(2)).map_err(|r| r.error)?;
//!     q.ring();
//!     let mut back = None;
//!     while back.is_none() {
//!         q.poll(8, |c| back = Some(c))?;
//!     }
//!     let c = back.unwrap();
//!     c.result.map(|_| c.bufs)
//! }
//! ```

mod command;
mod pcie;
#[cfg(feature = "nvmf")]
mod tcp;

pub use command::{Deallocate, Flush, IoCommand, IoOp, Read, Write, WriteZeroes};
#[cfg(feature = "nvmf")]
pub use tcp::TcpQueuePair;

use crate::error::NvmeError;
use crate::io_types::{IoCompletion, Rejected};
use crate::namespace::Namespace;

/// A queue pair of one controller, whatever its transport. `Send`, not `Sync`: one thread
/// owns it. A payload moves in at [`QueuePair::submit`] and comes back exactly once: in the
/// [`Rejected`] of a refused submit (nothing was queued), or in the [`IoCompletion`] its
/// command ends with.
pub trait QueuePair: Send {
    /// What a command carries (its data buffers, or a caller context).
    type Payload;

    /// The handle of namespace `nsid` as this queue pair knows it:
    /// [`NvmeError::NamespaceMissing`] when it is not active.
    fn namespace(&self, nsid: u32) -> Result<Namespace, NvmeError>;

    /// Queue `cmd`, checked against the namespace and the payload first: when refused, the
    /// payload comes back with the reason ([`NvmeError::QueueFull`]: poll, then resubmit). The
    /// command reaches the controller at the next [`QueuePair::ring`] (or sooner, where the
    /// transport sends as it goes).
    #[allow(clippy::result_large_err)]
    fn submit(&mut self, cmd: IoCommand<Self::Payload>) -> Result<(), Rejected<Self::Payload>>;

    /// Make the commands queued so far reach the controller.
    fn ring(&mut self);

    /// Reap at most `max` finished commands, handing each to `done` with its payload;
    /// returns how many. An error means the queue pair cannot go on (the controller or the
    /// connection failed): every command in flight has then come back through `done`, failed.
    fn poll(
        &mut self,
        max: usize,
        done: impl FnMut(IoCompletion<Self::Payload>),
    ) -> Result<usize, NvmeError>;

    /// Commands queued or in flight.
    fn in_flight(&self) -> usize;

    /// Most commands in flight at once.
    fn depth(&self) -> usize;
}
