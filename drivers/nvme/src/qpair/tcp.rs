//! [`QueuePair`] over NVMe/TCP: [`TcpQueuePair`], an I/O queue of a [`TcpController`] taking
//! the same commands and payloads as a PCIe [`crate::IoQueuePair`].

use super::{IoCommand, IoOp, QueuePair};
use crate::controller::PAGE_SIZE;
use crate::error::NvmeError;
use crate::io_commands::{check_lbas, check_range};
use crate::io_queue::NsLimits;
use crate::io_types::{IoBufs, IoCompletion, Rejected};
use crate::namespace::{limits, Namespace};
use crate::spec::command::{io_opcode, DSM_ATTR_DEALLOCATE};
use crate::spec::Sqe;
use crate::transport::tcp::buf::DataBuf;
use crate::transport::tcp::ctrl::TcpController;
use crate::transport::tcp::fabrics;
use crate::transport::tcp::queue::{TcpCommand, TcpCompletion, TcpQueue};
use crate::transport::tcp::TcpError;

/// Largest command this queue pair builds when the controller reports no MDTS.
const DEFAULT_MAX_COMMAND: usize = 2 << 20;
/// Most blocks in one command's 16-bit zero-based NLB field.
const MAX_NLB: u64 = 1 << 16;

/// What a queued NVMe/TCP command carries: the caller's payload, and for a deallocate the
/// Dataset Management range it sends as data.
#[derive(Debug)]
enum TcpPayload {
    Caller(IoBufs),
    Range(Box<[u8; 16]>, IoBufs),
}

impl TcpPayload {
    fn into_caller(self) -> IoBufs {
        match self {
            TcpPayload::Caller(b) | TcpPayload::Range(_, b) => b,
        }
    }
}

// SAFETY: the window of an `IoBufs::One` is `len` bytes of its pool block, which the payload
// owns while it is in the queue (reads into a read-only block are refused before submit); a
// range lives in its own heap allocation, so its address survives moves of the payload; no
// other variant has data (length 0).
unsafe impl DataBuf for TcpPayload {
    fn data_ptr(&mut self) -> *mut u8 {
        match self {
            TcpPayload::Caller(IoBufs::One(b)) => b.buf().as_ptr().wrapping_add(b.offset()),
            TcpPayload::Range(r, _) => r.as_mut_ptr(),
            TcpPayload::Caller(_) => std::ptr::null_mut(),
        }
    }
    fn data_len(&self) -> usize {
        match self {
            TcpPayload::Caller(IoBufs::One(b)) => b.len(),
            TcpPayload::Range(r, _) => r.len(),
            TcpPayload::Caller(_) => 0,
        }
    }
}

/// An NVMe/TCP I/O queue (its own connection) behind the transport-independent
/// [`QueuePair`] API. Commands are sent as they are queued and in [`QueuePair::poll`]; a
/// command carries one buffer window ([`IoBufs::One`]) or none.
pub struct TcpQueuePair {
    q: TcpQueue<TcpPayload>,
    ns: Box<[NsLimits]>,
    depth: usize,
}

impl std::fmt::Debug for TcpQueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpQueuePair")
            .field("qid", &self.q.qid())
            .field("depth", &self.depth)
            .field("in_flight", &self.q.in_flight())
            .finish()
    }
}

impl TcpQueuePair {
    /// A new I/O queue of `ctrl` holding up to `depth` commands (fewer when the controller
    /// bounds it), for the namespaces `nsids` (each identified now; one that is not active is
    /// [`NvmeError::NamespaceMissing`]).
    pub fn open(
        ctrl: &TcpController,
        nsids: &[u32],
        depth: usize,
    ) -> Result<TcpQueuePair, NvmeError> {
        let max_cmd = ctrl
            .info()
            .max_transfer(PAGE_SIZE)
            .map_or(DEFAULT_MAX_COMMAND, |m| m.min(DEFAULT_MAX_COMMAND));
        let mut ns = Vec::with_capacity(nsids.len());
        for &nsid in nsids {
            let info = ctrl.namespace(nsid).map_err(|e| match e {
                TcpError::DeviceInput { .. } => NvmeError::NamespaceMissing { nsid, active: 0 },
                e => NvmeError::from(e),
            })?;
            ns.push(limits(&info, max_cmd));
        }
        let q = ctrl.io_queue::<TcpPayload>(depth)?;
        let depth = q.free_slots();
        Ok(TcpQueuePair {
            q,
            ns: ns.into_boxed_slice(),
            depth,
        })
    }

    fn ns_limits(&self, nsid: u32) -> Result<NsLimits, NvmeError> {
        self.ns
            .iter()
            .find(|n| n.nsid == nsid)
            .copied()
            .ok_or(NvmeError::NamespaceMissing {
                nsid,
                active: self.ns.len(),
            })
    }

    /// The [`TcpCommand`] of `cmd` (its SQE and data transfer; no buffer yet, its tag),
    /// checked against the namespace.
    fn build(&self, cmd: &IoCommand<IoBufs>) -> Result<TcpCommand<TcpPayload>, NvmeError> {
        let ns = self.ns_limits(cmd.ns.nsid())?;
        let slba = cmd.lba.0;
        match cmd.op {
            IoOp::Read | IoOp::Write => {
                let len = match &cmd.payload {
                    IoBufs::One(b) if cmd.op == IoOp::Read && b.buf().region().is_read_only() => {
                        return Err(NvmeError::InvalidArgument(
                            "a read needs a writable buffer: this one is in a read-only UB region (a registered file)",
                        ))
                    }
                    IoBufs::One(b) => b.len(),
                    IoBufs::None => {
                        return Err(NvmeError::InvalidArgument("a data transfer needs a buffer"))
                    }
                    IoBufs::Sg(_) => {
                        return Err(NvmeError::InvalidArgument(
                            "NVMe/TCP commands carry one buffer window (IoBufs::One), not a scatter list",
                        ))
                    }
                };
                let nlb = check_range(&ns, slba, len)?;
                if len > ns.max_cmd {
                    return Err(NvmeError::TransferTooLarge {
                        len: len as u64,
                        max: ns.max_cmd as u64,
                    });
                }
                let write = cmd.op == IoOp::Write;
                let mut sqe = fabrics::rw(write, ns.nsid, slba, nlb as u32);
                sqe.cdw12 |= cmd.flags.bits();
                let c = TcpCommand::new(sqe, cmd.op.name());
                Ok(if write {
                    c.write(0, len as u32)
                } else {
                    c.read(0, len as u32)
                })
            }
            IoOp::Flush => {
                let mut sqe = Sqe::new(io_opcode::FLUSH);
                sqe.nsid = ns.nsid;
                Ok(TcpCommand::new(sqe, cmd.op.name()))
            }
            IoOp::WriteZeroes { blocks } => {
                check_lbas(&ns, slba, blocks)?;
                if blocks > MAX_NLB {
                    return Err(NvmeError::TransferTooLarge {
                        len: blocks * ns.lba_size as u64,
                        max: MAX_NLB * ns.lba_size as u64,
                    });
                }
                let mut sqe = Sqe::new(io_opcode::WRITE_ZEROES);
                sqe.nsid = ns.nsid;
                sqe.set_slba(slba);
                sqe.cdw12 = (blocks as u32 - 1) | cmd.flags.bits();
                Ok(TcpCommand::new(sqe, cmd.op.name()))
            }
            IoOp::Deallocate { blocks } => {
                check_lbas(&ns, slba, u64::from(blocks))?;
                let mut sqe = Sqe::new(io_opcode::DATASET_MANAGEMENT);
                sqe.nsid = ns.nsid;
                sqe.cdw10 = 0; // one range (zero-based)
                sqe.cdw11 = DSM_ATTR_DEALLOCATE;
                Ok(TcpCommand::new(sqe, cmd.op.name()).write(0, 16))
            }
        }
    }
}

/// The Dataset Management range of a deallocate: context attributes 0, `blocks`, `slba`.
fn dsm_range(slba: u64, blocks: u32) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[4..8].copy_from_slice(&blocks.to_le_bytes());
    r[8..16].copy_from_slice(&slba.to_le_bytes());
    r
}

fn completion(c: TcpCompletion<TcpPayload>) -> IoCompletion<IoBufs> {
    let bufs = c.buf.map_or(IoBufs::None, TcpPayload::into_caller);
    let result = match c.result {
        Ok(_) => Ok(c.len as usize),
        Err(TcpError::Command { command, status }) => Err(NvmeError::Command { command, status }),
        Err(e) => Err(NvmeError::from(e)),
    };
    IoCompletion {
        tag: c.tag,
        bufs,
        result,
    }
}

impl QueuePair for TcpQueuePair {
    type Payload = IoBufs;

    fn namespace(&self, nsid: u32) -> Result<Namespace, NvmeError> {
        Namespace::from_limits(&self.ns_limits(nsid)?)
    }

    fn submit(&mut self, cmd: IoCommand<IoBufs>) -> Result<(), Rejected<IoBufs>> {
        let tcp_cmd = match self.build(&cmd) {
            Ok(b) => b,
            Err(error) => {
                return Err(Rejected {
                    bufs: cmd.payload,
                    error,
                })
            }
        };
        if self.q.free_slots() == 0 {
            return Err(Rejected {
                bufs: cmd.payload,
                error: NvmeError::QueueFull {
                    qid: self.q.qid(),
                    depth: self.depth,
                    needed: 1,
                },
            });
        }
        let payload = match cmd.op {
            IoOp::Deallocate { blocks } => {
                TcpPayload::Range(Box::new(dsm_range(cmd.lba.0, blocks)), cmd.payload)
            }
            _ => TcpPayload::Caller(cmd.payload),
        };
        self.q
            .submit(tcp_cmd.buf(payload).tag(cmd.tag))
            .map_err(|(e, b)| Rejected {
                bufs: b.map_or(IoBufs::None, TcpPayload::into_caller),
                error: NvmeError::from(e),
            })
    }

    fn ring(&mut self) {
        // A send the socket cannot take now resumes in poll; a broken connection shows there.
        let _ = self.q.send_queued();
    }

    fn poll(
        &mut self,
        max: usize,
        mut done: impl FnMut(IoCompletion<IoBufs>),
    ) -> Result<usize, NvmeError> {
        self.q
            .poll_max(max, &mut |c| done(completion(c)))
            .map_err(NvmeError::from)
    }

    fn in_flight(&self) -> usize {
        self.q.in_flight()
    }

    fn depth(&self) -> usize {
        self.depth
    }
}
