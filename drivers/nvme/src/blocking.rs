//! A blocking convenience layer for tools and tests, on the same queue path: submit, ring,
//! poll until that request completes or the deadline passes.

use std::time::{Duration, Instant};

use ubdirect_core::UbBuf;

use crate::error::NvmeError;
use crate::io_queue::IoQueuePair;
use crate::io_types::{IoBufs, IoCompletion, Rejected, SgList};

const BLOCKING_TAG: u64 = u64::MAX;

impl IoQueuePair {
    /// Poll until `pred` has seen `want` completions or `timeout` passes; every completion goes
    /// to `f`. Returns how many were reaped.
    pub fn wait_for(
        &mut self,
        want: usize,
        timeout: Duration,
        mut f: impl FnMut(IoCompletion),
    ) -> Result<usize, NvmeError> {
        let start = Instant::now();
        let mut got = 0usize;
        let mut spins = 0u32;
        while got < want {
            got += self.poll(want - got, &mut f)?;
            spins = spins.wrapping_add(1);
            if got < want && spins % 256 == 0 && start.elapsed() > timeout {
                let waited = start.elapsed();
                return Err(NvmeError::Timeout {
                    command: "I/O request",
                    cid: 0,
                    qid: self.qid(),
                    waited,
                });
            }
            std::hint::spin_loop();
        }
        Ok(got)
    }

    fn run_blocking(
        &mut self,
        timeout: Duration,
        bufs_on_busy: IoBufs,
        submit: impl FnOnce(&mut Self, IoBufs) -> Result<(), Rejected>,
    ) -> Result<(IoBufs, usize), Rejected> {
        if self.in_flight() != 0 {
            return Err(Rejected {
                bufs: bufs_on_busy,
                error: NvmeError::InvalidArgument(
                    "blocking calls need an idle queue pair: poll every request in flight first",
                ),
            });
        }
        submit(self, bufs_on_busy)?;
        self.ring();
        let mut out = None;
        if let Err(error) = self.wait_for(1, timeout, |c| out = Some(c)) {
            // The request is still with the device: its buffers come back on a later poll.
            return Err(Rejected {
                bufs: IoBufs::None,
                error,
            });
        }
        let c = out.expect("wait_for returned one completion");
        debug_assert_eq!(c.tag, BLOCKING_TAG);
        match c.result {
            Ok(n) => Ok((c.bufs, n)),
            Err(error) => Err(Rejected {
                bufs: c.bufs,
                error,
            }),
        }
    }

    /// [`Self::run_blocking`] for a command that moves no data buffer (flush, write zeroes,
    /// deallocate): only its status comes back.
    fn run_blocking_no_data(
        &mut self,
        timeout: Duration,
        submit: impl FnOnce(&mut Self) -> Result<(), Rejected>,
    ) -> Result<(), NvmeError> {
        self.run_blocking(timeout, IoBufs::None, |q, _| submit(q))
            .map(|_| ())
            .map_err(|r| r.error)
    }

    /// [`Self::run_blocking`] for a command on one buffer, which comes back.
    fn run_blocking_one(
        &mut self,
        timeout: Duration,
        buf: UbBuf,
        submit: impl FnOnce(&mut Self, UbBuf) -> Result<(), Rejected>,
    ) -> Result<UbBuf, Rejected> {
        self.run_blocking(timeout, IoBufs::One(buf), |q, b| {
            submit(q, b.into_one().expect("one buffer"))
        })
        .map(|(b, _)| b.into_one().expect("one buffer comes back"))
    }

    /// Read `len` bytes at LBA `slba` into `buf` at `offset` and wait (at most `timeout`).
    pub fn read_blocking(
        &mut self,
        nsid: u32,
        slba: u64,
        buf: UbBuf,
        offset: usize,
        len: usize,
        timeout: Duration,
    ) -> Result<UbBuf, Rejected> {
        self.run_blocking_one(timeout, buf, |q, buf| {
            q.submit_read(nsid, slba, buf, offset, len, BLOCKING_TAG)
        })
    }

    /// Write `len` bytes of `buf` at `offset` to LBA `slba` and wait (at most `timeout`).
    #[allow(clippy::too_many_arguments)]
    pub fn write_blocking(
        &mut self,
        nsid: u32,
        slba: u64,
        buf: UbBuf,
        offset: usize,
        len: usize,
        fua: bool,
        timeout: Duration,
    ) -> Result<UbBuf, Rejected> {
        self.run_blocking_one(timeout, buf, |q, buf| {
            q.submit_write(nsid, slba, buf, offset, len, fua, BLOCKING_TAG)
        })
    }

    /// Read into a scatter list and wait.
    pub fn readv_blocking(
        &mut self,
        nsid: u32,
        slba: u64,
        sg: Box<SgList>,
        timeout: Duration,
    ) -> Result<Box<SgList>, Rejected> {
        self.run_blocking(timeout, IoBufs::Sg(sg), |q, b| {
            q.submit_readv(nsid, slba, b.into_sg().expect("sg"), BLOCKING_TAG)
        })
        .map(|(b, _)| b.into_sg().expect("sg comes back"))
    }

    /// Write a scatter list and wait.
    pub fn writev_blocking(
        &mut self,
        nsid: u32,
        slba: u64,
        sg: Box<SgList>,
        timeout: Duration,
    ) -> Result<Box<SgList>, Rejected> {
        self.run_blocking(timeout, IoBufs::Sg(sg), |q, b| {
            q.submit_writev(nsid, slba, b.into_sg().expect("sg"), false, BLOCKING_TAG)
        })
        .map(|(b, _)| b.into_sg().expect("sg comes back"))
    }

    /// Flush and wait.
    pub fn flush_blocking(&mut self, nsid: u32, timeout: Duration) -> Result<(), NvmeError> {
        self.run_blocking_no_data(timeout, |q| q.submit_flush(nsid, BLOCKING_TAG))
    }

    /// Write Zeroes and wait.
    pub fn write_zeroes_blocking(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u64,
        timeout: Duration,
    ) -> Result<(), NvmeError> {
        self.run_blocking_no_data(timeout, |q| {
            q.submit_write_zeroes(nsid, slba, nlb, BLOCKING_TAG)
        })
    }

    /// Deallocate (DSM) and wait.
    pub fn deallocate_blocking(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        timeout: Duration,
    ) -> Result<(), NvmeError> {
        self.run_blocking_no_data(timeout, |q| {
            q.submit_deallocate(nsid, slba, nlb, BLOCKING_TAG)
        })
    }
}
