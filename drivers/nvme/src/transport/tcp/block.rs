//! [`TcpBlockQueue`]: an NVMe/TCP I/O queue behind the block-queue seam
//! ([`ubdirect_core::seams::BlockQueue`]) the pipeline drives, so a pipeline reads a remote
//! namespace exactly as a local one: C2HData lands in the pipeline's pool buffers (a BAR-carved
//! pool included).

use std::time::{Duration, Instant};

use ubdirect_core::seams::{BlockCompletion, BlockError, BlockErrorKind, BlockQueue};
use ubdirect_core::UbBuf;

use super::error::TcpError;
use super::fabrics;
use super::queue::{TcpCommand, TcpQueue};
use crate::info::NamespaceInfo;

/// One NVMe/TCP I/O queue reading and writing namespace `ns`.
#[derive(Debug)]
pub struct TcpBlockQueue {
    q: TcpQueue<UbBuf>,
    nsid: u32,
    lba: u32,
    capacity: u64,
    depth: usize,
    max_transfer: usize,
    idle_wait: Duration,
    idle_spin: Duration,
    idle_waits: u64,
    spin_hits: u64,
}

/// How long an empty poll with commands in flight waits for the socket by default.
pub const DEFAULT_IDLE_WAIT: Duration = Duration::from_millis(1);

/// How long an empty poll with commands in flight keeps polling before it waits in poll(2), by
/// default: an answer arriving within it is taken without the sleep and wake-up (across
/// two guests, the wake-up of an idle vCPU per arriving segment holds the depth back).
pub const DEFAULT_IDLE_SPIN: Duration = Duration::from_micros(50);

fn kind_of(e: &TcpError) -> BlockErrorKind {
    match e {
        TcpError::Command { .. } => BlockErrorKind::Device,
        TcpError::Timeout { .. } => BlockErrorKind::Timeout,
        TcpError::Request { .. } => BlockErrorKind::InvalidRequest,
        TcpError::Protocol { .. } | TcpError::HeaderDigest { .. } | TcpError::DataDigest { .. } => {
            BlockErrorKind::Protocol
        }
        // The connection is gone: nothing more completes on it.
        _ => BlockErrorKind::DeviceGone,
    }
}

fn block_err(e: &TcpError) -> BlockError {
    BlockError::new(kind_of(e), e.to_string())
}

impl TcpBlockQueue {
    /// Wrap `q` (a connected I/O queue of `depth` entries) for namespace `ns`, at most
    /// `max_transfer` bytes per request.
    pub fn new(q: TcpQueue<UbBuf>, ns: &NamespaceInfo, depth: usize, max_transfer: usize) -> Self {
        TcpBlockQueue {
            q,
            nsid: ns.nsid,
            lba: ns.lba_size,
            capacity: ns.size_bytes(),
            depth,
            max_transfer: max_transfer.max(ns.lba_size as usize),
            idle_wait: DEFAULT_IDLE_WAIT,
            idle_spin: DEFAULT_IDLE_SPIN,
            idle_waits: 0,
            spin_hits: 0,
        }
    }

    /// How long a poll that finds nothing, with commands in flight, waits in poll(2) for the
    /// socket before returning (zero: it returns at once and a caller's loop spins). The wait
    /// ends as soon as data arrives; it gives the CPU to the kernel's network stack (and, on
    /// one machine, to the target) instead of burning it in a loop.
    pub fn set_idle_wait(&mut self, wait: Duration) {
        self.idle_wait = wait;
    }

    /// How long a poll that finds nothing, with commands in flight, keeps polling (back to
    /// back) before it waits in poll(2) ([`DEFAULT_IDLE_SPIN`]; zero: it waits at once). Bounded:
    /// the CPU goes back to the kernel after at most this long.
    pub fn set_idle_spin(&mut self, spin: Duration) {
        self.idle_spin = spin;
    }

    /// How many polls found nothing and waited for the socket.
    pub fn idle_waits(&self) -> u64 {
        self.idle_waits
    }

    /// How many polls found nothing at first but reaped something while spinning (no wait).
    pub fn spin_hits(&self) -> u64 {
        self.spin_hits
    }

    fn reap(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(BlockCompletion),
    ) -> Result<usize, BlockError> {
        let mut n = 0;
        let r = self.q.poll_max(max, &mut |c| {
            n += 1;
            let Some(buf) = c.buf else { return };
            f(BlockCompletion {
                buf,
                tag: c.tag,
                result: c.result.map(|_| c.len as usize).map_err(|e| block_err(&e)),
            })
        });
        r.map(|_| n).map_err(|e| block_err(&e))
    }

    #[allow(clippy::result_large_err)]
    fn submit(
        &mut self,
        write: bool,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<(), (UbBuf, BlockError)> {
        let lba = self.lba as u64;
        if len == 0
            || offset % lba != 0
            || len as u64 % lba != 0
            || len > self.max_transfer
            || len > buf.len()
            || offset
                .checked_add(len as u64)
                .is_none_or(|e| e > self.capacity)
        {
            let msg = format!(
                "{} of {len} bytes at {offset}: not a multiple of the {lba}-byte block, past the namespace's {} bytes, or over {} bytes per request",
                if write { "write" } else { "read" },
                self.capacity,
                self.max_transfer
            );
            return Err((buf, BlockError::new(BlockErrorKind::InvalidRequest, msg)));
        }
        if self.q.free_slots() == 0 {
            return Err((
                buf,
                BlockError::new(BlockErrorKind::QueueFull, "poll first"),
            ));
        }
        let sqe = fabrics::rw(write, self.nsid, offset / lba, (len as u64 / lba) as u32);
        let cmd = if write {
            TcpCommand::new(sqe, "Write").write(0, len as u32)
        } else {
            TcpCommand::new(sqe, "Read").read(0, len as u32)
        };
        let cmd = cmd.buf(buf).tag(tag);
        self.q.submit(cmd).map_err(|(e, b)| {
            let err = block_err(&e);
            (b.expect("the buffer comes back on refusal"), err)
        })
    }
}

impl BlockQueue for TcpBlockQueue {
    fn block_size(&self) -> u32 {
        self.lba
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn depth(&self) -> usize {
        self.depth
    }
    fn max_transfer(&self) -> usize {
        self.max_transfer
    }
    fn submit_read(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<(), (UbBuf, BlockError)> {
        self.submit(false, buf, offset, len, tag)
    }
    fn submit_write(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<(), (UbBuf, BlockError)> {
        self.submit(true, buf, offset, len, tag)
    }
    fn ring(&mut self) -> Result<(), BlockError> {
        // Sending happens in poll (a partial send is resumed there); nothing to ring.
        Ok(())
    }
    /// Reaps at most `max` completions (what else arrived waits for the next poll); on a
    /// connection failure every command in flight comes back failed. A poll that finds
    /// nothing while commands are in flight polls again for up to the idle spin
    /// ([`TcpBlockQueue::set_idle_spin`]), then waits for the socket up to the idle wait
    /// ([`TcpBlockQueue::set_idle_wait`]) and reaps once more: an engine's loop does not spin
    /// longer than the idle spin.
    fn poll(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(BlockCompletion),
    ) -> Result<usize, BlockError> {
        let n = self.reap(max, f)?;
        if n > 0 || max == 0 || self.q.in_flight() == 0 || self.idle_wait.is_zero() {
            return Ok(n);
        }
        if !self.idle_spin.is_zero() {
            let until = Instant::now() + self.idle_spin;
            while Instant::now() < until {
                std::hint::spin_loop();
                let n = self.reap(max, f)?;
                if n > 0 {
                    self.spin_hits += 1;
                    return Ok(n);
                }
            }
        }
        self.idle_waits += 1;
        self.q
            .wait_ready(self.idle_wait)
            .map_err(|e| block_err(&e))?;
        self.reap(max, f)
    }
    fn in_flight(&self) -> usize {
        self.q.in_flight()
    }
}
