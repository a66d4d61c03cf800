//! [`BlockQueue`] for [`IoQueuePair`]: byte offsets on the queue's default namespace.

use ubdirect_core::seams::{BlockCompletion, BlockError, BlockErrorKind, BlockQueue};
use ubdirect_core::UbBuf;

use crate::error::NvmeError;
use crate::io_flags::IoFlags;
use crate::io_queue::IoQueuePair;
use crate::io_types::{IoBuf, IoBufs, IoCompletion, Rejected};
use crate::namespace::{Lba, Namespace};

/// Map a driver error to the seam's error kind and message (error path only).
pub fn to_block_error(e: &NvmeError) -> BlockError {
    let kind = match e {
        NvmeError::QueueFull { .. } => BlockErrorKind::QueueFull,
        NvmeError::Timeout { .. } | NvmeError::FailedByReset { .. } => BlockErrorKind::Timeout,
        NvmeError::Wedged { .. } | NvmeError::ResetUnderQueue { .. } => BlockErrorKind::Wedged,
        NvmeError::DeviceGone { .. }
        | NvmeError::ControllerFatal { .. }
        | NvmeError::ControllerNotReady { .. } => BlockErrorKind::DeviceGone,
        NvmeError::MalformedCompletion { .. } => BlockErrorKind::Protocol,
        NvmeError::Command { .. } => BlockErrorKind::Device,
        e if e.is_invalid_request() => BlockErrorKind::InvalidRequest,
        _ => BlockErrorKind::Other,
    };
    BlockError::new(kind, e.to_string())
}

/// A refused single-buffer submission as the seam's error: its buffer back (a submission
/// hands back what it was given: `None` never happens for one buffer in).
fn back(r: Rejected) -> Result<(), (UbBuf, BlockError)> {
    let err = to_block_error(&r.error);
    match r.bufs {
        IoBufs::One(b) => Err((b.into_buf(), err)),
        _ => unreachable!("a single-buffer submission gives its buffer back"),
    }
}

impl IoQueuePair {
    fn lba_of(&self, offset: u64) -> Result<u64, NvmeError> {
        let ns = &self.ns[self.default_ns];
        if offset & (ns.lba_size as u64 - 1) != 0 {
            return Err(NvmeError::OffsetNotBlockAligned {
                offset,
                lba_size: ns.lba_size,
            });
        }
        Ok(offset >> ns.lba_shift)
    }

    /// The seam's submit: byte `offset` to an LBA of the default namespace, then `submit`;
    /// a misaligned offset or a refused request gives the buffer back with the seam's error.
    fn submit_at(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        submit: impl FnOnce(&mut Self, &Namespace, Lba, IoBuf) -> Result<(), Rejected>,
    ) -> Result<(), (UbBuf, BlockError)> {
        let lba = match self.lba_of(offset) {
            Ok(l) => Lba(l),
            Err(e) => return Err((buf, to_block_error(&e))),
        };
        let ns = match self.default_namespace() {
            Ok(ns) => ns,
            Err(e) => return Err((buf, to_block_error(&e))),
        };
        let buf = match IoBuf::new(buf, 0, len) {
            Ok(b) => b,
            Err(e) => return Err((e.buf, to_block_error(&e.error))),
        };
        submit(self, &ns, lba, buf).or_else(back)
    }

    /// Completions of requests without a single buffer (flush, write zeroes, deallocate,
    /// scatter lists: queued through the native API) that [`BlockQueue::poll`] reaped: each goes
    /// to `f` with its result and buffers, oldest first. Returns how many.
    pub fn take_native_completions(&mut self, mut f: impl FnMut(IoCompletion)) -> usize {
        let n = self.held.len();
        for c in self.held.drain(..) {
            f(c);
        }
        n
    }

    /// The namespace the BlockQueue impl uses.
    pub fn default_nsid(&self) -> u32 {
        self.ns[self.default_ns].nsid
    }

    /// The handle of the namespace the BlockQueue impl uses ([`crate::QueueOptions::nsid`]).
    pub fn default_namespace(&self) -> Result<Namespace, NvmeError> {
        Namespace::from_limits(&self.ns[self.default_ns])
    }
}

impl BlockQueue for IoQueuePair {
    fn block_size(&self) -> u32 {
        self.ns[self.default_ns].lba_size
    }
    fn capacity(&self) -> u64 {
        let ns = &self.ns[self.default_ns];
        ns.nsze << ns.lba_shift
    }
    fn depth(&self) -> usize {
        IoQueuePair::depth(self)
    }
    fn max_transfer(&self) -> usize {
        // Requests above MDTS are split; one request may use every command slot.
        self.ns[self.default_ns].max_cmd * IoQueuePair::depth(self)
    }
    fn submit_read(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<(), (UbBuf, BlockError)> {
        self.submit_at(buf, offset, len, |q, ns, lba, buf| {
            IoQueuePair::submit_read(q, ns, lba, buf, IoFlags::empty(), tag)
        })
    }
    fn submit_write(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<(), (UbBuf, BlockError)> {
        self.submit_at(buf, offset, len, |q, ns, lba, buf| {
            IoQueuePair::submit_write(q, ns, lba, buf, IoFlags::empty(), tag)
        })
    }
    fn ring(&mut self) -> Result<(), BlockError> {
        IoQueuePair::ring(self);
        Ok(())
    }
    fn poll(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(BlockCompletion),
    ) -> Result<usize, BlockError> {
        // Requests queued through the native API without a single buffer (flush, write
        // zeroes, scatter lists) have no BlockCompletion shape: they are kept, results and
        // buffers, for `take_native_completions` (capacity for the whole depth was reserved at
        // creation, so this allocates nothing).
        let mut held = std::mem::take(&mut self.held);
        let r = IoQueuePair::poll(self, max, |c| match c.bufs {
            IoBufs::One(buf) => f(BlockCompletion {
                buf: buf.into_buf(),
                tag: c.tag,
                result: c.result.map_err(|e| to_block_error(&e)),
            }),
            bufs => {
                debug_assert!(held.len() < held.capacity());
                held.push(IoCompletion { bufs, ..c });
            }
        });
        self.held = held;
        r.map_err(|e| to_block_error(&e))
    }
    fn in_flight(&self) -> usize {
        IoQueuePair::in_flight(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_controller_is_device_gone_on_the_seam() {
        let e = NvmeError::ControllerNotReady {
            csts: 0,
            during: "waiting for I/O completions",
        };
        let b = to_block_error(&e);
        assert_eq!(b.kind, BlockErrorKind::DeviceGone);
        let msg = e.to_string();
        assert!(msg.contains("CSTS.RDY=0"), "{msg}");
        assert!(msg.contains("Controller::reset"), "{msg}");
        let w = NvmeError::Wedged {
            qid: 3,
            outstanding: 2,
            waited: std::time::Duration::from_secs(2),
        };
        assert_eq!(to_block_error(&w).kind, BlockErrorKind::Wedged);
    }
}
