//! [`UringQueue`]: an io_uring ring over one file or block device, with the pool regions
//! registered once as fixed buffers, implementing the core `BlockQueue` seam.

use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring};
use ubdirect_core::seams::{BlockCompletion, BlockError, BlockQueue};
use ubdirect_core::{UbBuf, UbRegion};

use crate::error::UringError;
use crate::fixed::FixedTable;
use crate::options::UringOptions;
use crate::slots::{Slot, Slots};
use crate::source::{open_source, OpenedSource};

/// Empty polls between two `io_uring_enter` calls that let the kernel run deferred task work
/// (buffered reads retried after a page-cache wait complete through task work of this thread).
const ENTER_EVERY_EMPTY_POLLS: u32 = 32;
/// How long an empty poll of an O_DIRECT queue waits in the kernel by default.
const DEFAULT_DIRECT_IDLE_WAIT: Duration = Duration::from_millis(1);

/// The longest request: one SQE carries a u32 length; keep it to 1 GiB (a fixed buffer's
/// maximum). Longer requests are refused ([`UringError::TooLarge`]), never cut short.
const MAX_TRANSFER: usize = crate::fixed::MAX_FIXED_LEN;
const _: () = assert!(MAX_TRANSFER <= u32::MAX as usize);

/// An io_uring block queue over one file or block device.
pub struct UringQueue {
    ring: IoUring,
    src: OpenedSource,
    fixed: FixedTable,
    slots: Slots<UbBuf>,
    sqe_flags: squeue::Flags,
    sqpoll: bool,
    unsubmitted: usize,
    empty_polls: u32,
    idle_wait: Duration,
    idle_waits: u64,
    /// Keeps the registered regions alive while the kernel holds them.
    _regions: Vec<Arc<UbRegion>>,
}

impl std::fmt::Debug for UringQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringQueue")
            .field("direct", &self.src.direct)
            .field("capacity", &self.src.capacity)
            .field("depth", &self.slots.capacity())
            .field("fixed_buffers", &self.fixed.len())
            .finish()
    }
}

impl UringQueue {
    /// Open `path` and register `regions` (the pool's memory) as fixed buffers once.
    /// Buffers outside the registered regions still work, through plain READ/WRITE.
    pub fn open(
        path: &Path,
        regions: &[Arc<UbRegion>],
        opts: &UringOptions,
    ) -> Result<UringQueue, UringError> {
        let depth = opts.depth.clamp(1, 32768);
        let src = open_source(path, opts.direct, opts.writable)?;
        let mut b = IoUring::builder();
        b.setup_cqsize((2 * depth) as u32);
        if let Some(idle) = opts.sqpoll_idle_ms {
            b.setup_sqpoll(idle);
        }
        let ring = b
            .build(depth.next_power_of_two() as u32)
            .map_err(UringError::Setup)?;
        let ranges: Vec<(usize, usize)> =
            regions.iter().map(|r| (r.vaddr as usize, r.len)).collect();
        let fixed = FixedTable::from_ranges(&ranges);
        if !fixed.is_empty() {
            let iov = fixed.iovecs();
            // SAFETY: every iovec covers memory of a registered UB region that stays mapped for
            // the queue's lifetime: `_regions` holds an Arc to each region until the ring is dropped.
            unsafe { ring.submitter().register_buffers(&iov) }.map_err(|source| {
                UringError::RegisterBuffers {
                    count: iov.len(),
                    source,
                }
            })?;
        }
        if let Some(w) = opts.max_workers {
            let mut max = [w, w];
            ring.submitter()
                .register_iowq_max_workers(&mut max)
                .map_err(UringError::Setup)?;
        }
        if let Some(cpus) = &opts.iowq_cpus {
            // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
                // SAFETY: c < CPU_SETSIZE, so the bit lies inside `set`.
                unsafe { libc::CPU_SET(c, &mut set) };
            }
            ring.submitter()
                .register_iowq_aff(&set)
                .map_err(UringError::Setup)?;
        }
        let force_async = opts.force_async.unwrap_or(!src.direct);
        let idle_wait = opts.idle_wait.unwrap_or(if src.direct {
            DEFAULT_DIRECT_IDLE_WAIT
        } else {
            Duration::ZERO
        });
        let sqe_flags = if force_async {
            squeue::Flags::ASYNC
        } else {
            squeue::Flags::empty()
        };
        Ok(UringQueue {
            sqpoll: opts.sqpoll_idle_ms.is_some(),
            ring,
            src,
            fixed,
            slots: Slots::new(depth),
            sqe_flags,
            unsubmitted: 0,
            empty_polls: 0,
            idle_wait,
            idle_waits: 0,
            _regions: regions.to_vec(),
        })
    }

    /// How long an empty poll waits in the kernel for a completion (zero: it spins).
    pub fn idle_wait(&self) -> Duration {
        self.idle_wait
    }

    /// How many polls found nothing and waited in the kernel.
    pub fn idle_waits(&self) -> u64 {
        self.idle_waits
    }

    /// Whether O_DIRECT is in effect (false after a buffered fallback).
    pub fn is_direct(&self) -> bool {
        self.src.direct
    }

    /// How many fixed buffers (region chunks) are registered.
    pub fn fixed_buffers(&self) -> usize {
        self.fixed.len()
    }

    /// Whether requests are punted to io-wq workers (IOSQE_ASYNC).
    pub fn is_async(&self) -> bool {
        self.sqe_flags.contains(squeue::Flags::ASYNC)
    }

    /// Flush, then poll until at least one completion arrived or `timeout` passed.
    pub fn wait(
        &mut self,
        timeout: Duration,
        f: &mut dyn FnMut(BlockCompletion),
    ) -> Result<usize, UringError> {
        self.flush_inner()?;
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.poll_inner(usize::MAX, f)?;
            if n > 0 || self.slots.is_empty() {
                return Ok(n);
            }
            if Instant::now() >= deadline {
                return Err(UringError::Timeout(timeout));
            }
            self.wait_for_one(Duration::from_millis(1))?;
        }
    }

    /// Sleep in the kernel until a completion arrives or `bound` passes; the bound passing, a
    /// signal, or a ring busy with completions end the sleep without an error.
    fn wait_for_one(&mut self, bound: Duration) -> Result<(), UringError> {
        let ts = types::Timespec::from(bound);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(UringError::Enter(e)),
        }
    }

    fn check(&self, buf: &UbBuf, offset: u64, len: usize) -> Result<(), UringError> {
        if len == 0 {
            return Err(UringError::ZeroLength);
        }
        // One SQE carries a u32 length: a longer request would be cut short silently.
        if len > MAX_TRANSFER {
            return Err(UringError::TooLarge {
                len,
                max: MAX_TRANSFER,
            });
        }
        if len > buf.len() {
            return Err(UringError::BufferTooSmall {
                len,
                buf_len: buf.len(),
            });
        }
        let align = self.src.block_size;
        // A request may run into the last partial block (the kernel returns a short count).
        let limit = self.src.capacity.next_multiple_of(u64::from(align));
        if offset.checked_add(len as u64).is_none_or(|end| end > limit)
            || offset >= self.src.capacity
        {
            return Err(UringError::OutOfRange {
                offset,
                len,
                capacity: self.src.capacity,
            });
        }
        if self.src.direct
            && (offset % u64::from(align) != 0
                || len % align as usize != 0
                || buf.as_ptr() as usize % align as usize != 0)
        {
            return Err(UringError::Unaligned { offset, len, align });
        }
        if self.slots.len() >= self.slots.capacity() {
            return Err(UringError::QueueFull {
                depth: self.slots.capacity(),
            });
        }
        Ok(())
    }

    fn submit(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
        write: bool,
    ) -> Result<(), (UbBuf, UringError)> {
        if write && !self.src.writable {
            return Err((buf, UringError::ReadOnly));
        }
        if let Err(e) = self.check(&buf, offset, len) {
            return Err((buf, e));
        }
        if let Err(e) = check_file_buffer(&buf, write) {
            return Err((buf, e));
        }
        let ptr = buf.as_ptr();
        let fd = types::Fd(self.src.file.as_raw_fd());
        let fixed = self.fixed.index_of(ptr as usize, len);
        let index = match self.slots.insert(Slot {
            buf,
            tag,
            offset,
            write,
        }) {
            Ok(i) => i,
            Err(s) => {
                return Err((
                    s.buf,
                    UringError::QueueFull {
                        depth: self.slots.capacity(),
                    },
                ))
            }
        };
        // len <= MAX_TRANSFER (check), which fits in a u32: nothing is cut off.
        let len32 = len as u32;
        let entry = match (write, fixed) {
            (false, Some(bi)) => opcode::ReadFixed::new(fd, ptr, len32, bi)
                .offset(offset)
                .build(),
            (false, None) => opcode::Read::new(fd, ptr, len32).offset(offset).build(),
            (true, Some(bi)) => opcode::WriteFixed::new(fd, ptr, len32, bi)
                .offset(offset)
                .build(),
            (true, None) => opcode::Write::new(fd, ptr, len32).offset(offset).build(),
        }
        .flags(self.sqe_flags)
        .user_data(u64::from(index));
        // SAFETY: the SQE points at `len` bytes of the buffer now owned by the slot table; the
        // buffer is only handed back after its CQE is reaped (or after the ring is torn down).
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            // The SQ is sized >= depth, so this only happens if unsubmitted entries pile up.
            let s = self
                .slots
                .take(u64::from(index))
                .expect("slot just inserted");
            return Err((
                s.buf,
                UringError::QueueFull {
                    depth: self.slots.capacity(),
                },
            ));
        }
        self.unsubmitted += 1;
        Ok(())
    }

    fn flush_inner(&mut self) -> Result<(), UringError> {
        if self.unsubmitted == 0 {
            return Ok(());
        }
        loop {
            match self.ring.submit() {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(UringError::Enter(e)),
            }
        }
        self.unsubmitted = 0;
        Ok(())
    }

    /// Hand every ready completion (up to `max`) to `f`.
    fn reap(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(BlockCompletion),
    ) -> Result<usize, UringError> {
        let mut n = 0;
        let mut unknown = None;
        {
            let mut cq = self.ring.completion();
            while n < max {
                let Some(cqe) = cq.next() else { break };
                let Some(slot) = self.slots.take(cqe.user_data()) else {
                    unknown = Some(cqe.user_data());
                    continue;
                };
                let res = cqe.result();
                let result = if res >= 0 {
                    Ok(res as usize)
                } else {
                    Err(crate::error::to_block_error(&UringError::Io {
                        op: if slot.write { "write" } else { "read" },
                        offset: slot.offset,
                        source: std::io::Error::from_raw_os_error(-res),
                    }))
                };
                f(BlockCompletion {
                    buf: slot.buf,
                    tag: slot.tag,
                    result,
                });
                n += 1;
            }
        }
        if let Some(u) = unknown {
            return Err(UringError::UnknownCompletion(u));
        }
        Ok(n)
    }

    fn poll_inner(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(BlockCompletion),
    ) -> Result<usize, UringError> {
        let n = self.reap(max, f)?;
        if n == 0 && !self.slots.is_empty() && !self.idle_wait.is_zero() && max > 0 {
            // Sleep in the kernel until one completion or the bound, then reap once more.
            self.idle_waits += 1;
            self.wait_for_one(self.idle_wait)?;
            self.empty_polls = 0;
            return self.reap(max, f);
        }
        if n == 0 && !self.slots.is_empty() && !self.sqpoll {
            self.empty_polls += 1;
            if self.empty_polls >= ENTER_EVERY_EMPTY_POLLS {
                self.empty_polls = 0;
                // Lets the kernel run this task's deferred completions (task work).
                let _ = self.ring.submitter().submit();
            }
        } else {
            self.empty_polls = 0;
        }
        Ok(n)
    }
}

impl BlockQueue for UringQueue {
    fn block_size(&self) -> u32 {
        self.src.block_size
    }
    fn capacity(&self) -> u64 {
        self.src.capacity
    }
    fn depth(&self) -> usize {
        self.slots.capacity()
    }
    fn max_transfer(&self) -> usize {
        MAX_TRANSFER
    }
    fn submit_read(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<(), (UbBuf, BlockError)> {
        self.submit(buf, offset, len, tag, false)
            .map_err(|(b, e)| (b, crate::error::to_block_error(&e)))
    }
    fn submit_write(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<(), (UbBuf, BlockError)> {
        self.submit(buf, offset, len, tag, true)
            .map_err(|(b, e)| (b, crate::error::to_block_error(&e)))
    }
    fn ring(&mut self) -> Result<(), BlockError> {
        self.flush_inner()
            .map_err(|e| crate::error::to_block_error(&e))
    }
    fn poll(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(BlockCompletion),
    ) -> Result<usize, BlockError> {
        self.poll_inner(max, f)
            .map_err(|e| crate::error::to_block_error(&e))
    }
    fn in_flight(&self) -> usize {
        self.slots.len()
    }
}

impl Drop for UringQueue {
    fn drop(&mut self) {
        // Buffers the kernel may still write must not return to the pool before it is done:
        // submit what is queued and wait (bounded) for every request to complete.
        let _ = self.flush_inner();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.slots.is_empty() && Instant::now() < deadline {
            let _ = self.wait(Duration::from_millis(100), &mut |_c| {});
        }
        if !self.slots.is_empty() {
            // Leak the buffers rather than hand memory the kernel may still write back to the pool.
            tracing::error!(
                "{} io_uring requests still in flight at drop: leaking their buffers",
                self.slots.len()
            );
            for s in self.slots.drain() {
                std::mem::forget(s.buf);
            }
        }
    }
}

/// A block of a file region: a write from it checks its file first ([`UbRegion::check_file`]:
/// one fstat; other regions pay nothing), and a read into it is refused (the region is
/// read-only).
///
/// [`UbRegion::check_file`]: ubdirect_core::UbRegion::check_file
fn check_file_buffer(buf: &UbBuf, write: bool) -> Result<(), UringError> {
    let region = buf.region();
    if write {
        return region.check_file().map_err(UringError::Buffer);
    }
    if region.is_read_only() {
        return Err(UringError::Buffer(ubdirect_core::CoreError::InvalidArgument(format!(
            "a read into a block of read-only UB region {} (a registered file mapping): read into a host pool buffer",
            region.id
        ))));
    }
    Ok(())
}
