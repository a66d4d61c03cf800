//! [`QueuePair`] over PCIe: [`IoQueuePair`]'s own submit calls, one per [`IoOp`].

use super::{IoCommand, IoOp, QueuePair};
use crate::error::NvmeError;
use crate::io_queue::IoQueuePair;
use crate::io_types::{IoCompletion, IoPayload, Rejected};
use crate::namespace::Namespace;

impl<P: IoPayload + Default> QueuePair for IoQueuePair<P> {
    type Payload = P;

    fn namespace(&self, nsid: u32) -> Result<Namespace, NvmeError> {
        IoQueuePair::namespace(self, nsid)
    }

    #[inline]
    fn submit(&mut self, cmd: IoCommand<P>) -> Result<(), Rejected<P>> {
        let IoCommand {
            op,
            ns,
            lba,
            payload,
            flags,
            tag,
        } = cmd;
        match op {
            IoOp::Read => self.submit_read(&ns, lba, payload, flags, tag),
            IoOp::Write => self.submit_write(&ns, lba, payload, flags, tag),
            IoOp::Flush => self.submit_flush_with(&ns, payload, tag),
            IoOp::WriteZeroes { blocks } => self.submit_write_zeroes(&ns, lba, blocks, tag),
            IoOp::Deallocate { blocks } => self.submit_deallocate(&ns, lba, blocks, tag),
        }
    }

    #[inline]
    fn ring(&mut self) {
        IoQueuePair::ring(self)
    }

    #[inline]
    fn poll(&mut self, max: usize, done: impl FnMut(IoCompletion<P>)) -> Result<usize, NvmeError> {
        IoQueuePair::poll(self, max, done)
    }

    fn in_flight(&self) -> usize {
        IoQueuePair::in_flight(self)
    }

    fn depth(&self) -> usize {
        IoQueuePair::depth(self)
    }
}
