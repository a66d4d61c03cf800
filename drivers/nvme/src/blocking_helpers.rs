//! A blocking convenience layer for tools and tests, on the same queue path: submit, ring,
//! poll until that request completes or the deadline passes.

use std::time::{Duration, Instant};

use crate::error::NvmeError;
use crate::io_flags::IoFlags;
use crate::io_queue::IoQueuePair;
use crate::io_types::{IoBuf, IoBufs, IoCompletion, Rejected, SgList};
use crate::namespace::{Lba, Namespace};

const BLOCKING_TAG: u64 = u64::MAX;

/// The wait loop of [`IoQueuePair::wait_for`] over any `poll`: completions are counted as they
/// reach `f`, so a batch that delivered some and then reported a malformed entry loses none; a
/// malformed entry (skipped by the queue, counted in its stats) does not end the wait; any
/// other error does, after the completions of its batch were delivered.
pub(crate) fn wait_loop(
    want: usize,
    timeout: Duration,
    qid: u16,
    mut poll: impl FnMut(usize, &mut dyn FnMut(IoCompletion)) -> Result<usize, NvmeError>,
    f: &mut dyn FnMut(IoCompletion),
) -> Result<usize, NvmeError> {
    let start = Instant::now();
    let mut got = 0usize;
    let mut spins = 0u32;
    while got < want {
        let mut n = 0usize;
        let r = poll(want - got, &mut |c| {
            n += 1;
            f(c)
        });
        got += n;
        match r {
            Ok(_) => {}
            Err(e @ NvmeError::MalformedCompletion { .. }) => {
                tracing::warn!(error = %e, "malformed NVMe completion skipped");
            }
            Err(e) => return Err(e),
        }
        spins = spins.wrapping_add(1);
        if got < want && spins % 256 == 0 && start.elapsed() > timeout {
            return Err(NvmeError::Timeout {
                then: crate::error::TIMEOUT_WAIT,
                command: "I/O request",
                cid: 0,
                qid,
                waited: start.elapsed(),
            });
        }
        std::hint::spin_loop();
    }
    Ok(got)
}

/// The outcome of a blocking call: its completion when one came, whatever the wait said (a
/// poll may deliver it and report an error in the same call); else the wait's error.
fn blocking_outcome(
    wait: Result<usize, NvmeError>,
    out: Option<IoCompletion>,
) -> Result<(IoBufs, usize), Rejected> {
    let c = match (out, wait) {
        (Some(c), _) => c,
        // The request is still with the device: its buffers come back on a later poll.
        (None, Err(error)) => {
            return Err(Rejected {
                bufs: IoBufs::None,
                error,
            })
        }
        (None, Ok(_)) => {
            return Err(Rejected {
                bufs: IoBufs::None,
                error: NvmeError::InvalidArgument("the wait ended without a completion"),
            })
        }
    };
    debug_assert_eq!(c.tag, BLOCKING_TAG);
    match c.result {
        Ok(n) => Ok((c.bufs, n)),
        Err(error) => Err(Rejected {
            bufs: c.bufs,
            error,
        }),
    }
}

impl IoQueuePair {
    /// Poll until `want` requests completed or `timeout` passes; every completion goes to `f`.
    /// Returns how many were reaped. Malformed completion entries are skipped (and counted in
    /// [`crate::QueueStats::malformed_completions`]) without ending the wait.
    pub fn wait_for(
        &mut self,
        want: usize,
        timeout: Duration,
        mut f: impl FnMut(IoCompletion),
    ) -> Result<usize, NvmeError> {
        let qid = self.qid();
        wait_loop(want, timeout, qid, |max, g| self.poll(max, g), &mut f)
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
        let wait = self.wait_for(1, timeout, |c| out = Some(c));
        blocking_outcome(wait, out)
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

    /// [`Self::run_blocking`] for a command on one buffer window, which comes back.
    fn run_blocking_one(
        &mut self,
        timeout: Duration,
        buf: IoBuf,
        submit: impl FnOnce(&mut Self, IoBuf) -> Result<(), Rejected>,
    ) -> Result<IoBuf, Rejected> {
        self.run_blocking(timeout, IoBufs::One(buf), |q, b| match b {
            IoBufs::One(b) => submit(q, b),
            other => Err(wrong_kind(other)),
        })
        .and_then(|(b, _)| match b {
            IoBufs::One(b) => Ok(b),
            other => Err(wrong_kind(other)),
        })
    }

    /// [`Self::run_blocking`] for a command on a scatter list, which comes back.
    fn run_blocking_sg(
        &mut self,
        timeout: Duration,
        sg: Box<SgList>,
        submit: impl FnOnce(&mut Self, Box<SgList>) -> Result<(), Rejected>,
    ) -> Result<Box<SgList>, Rejected> {
        self.run_blocking(timeout, IoBufs::Sg(sg), |q, b| match b {
            IoBufs::Sg(sg) => submit(q, sg),
            other => Err(wrong_kind(other)),
        })
        .and_then(|(b, _)| match b {
            IoBufs::Sg(sg) => Ok(sg),
            other => Err(wrong_kind(other)),
        })
    }

    /// Read `buf`'s window from `slba` of `ns` and wait (at most `timeout`); the same window
    /// comes back.
    pub fn read_blocking(
        &mut self,
        ns: &Namespace,
        slba: Lba,
        buf: IoBuf,
        timeout: Duration,
    ) -> Result<IoBuf, Rejected> {
        self.run_blocking_one(timeout, buf, |q, buf| {
            q.submit_read(ns, slba, buf, IoFlags::empty(), BLOCKING_TAG)
        })
    }

    /// Write `buf`'s window to `slba` of `ns` and wait (at most `timeout`).
    pub fn write_blocking(
        &mut self,
        ns: &Namespace,
        slba: Lba,
        buf: IoBuf,
        flags: IoFlags,
        timeout: Duration,
    ) -> Result<IoBuf, Rejected> {
        self.run_blocking_one(timeout, buf, |q, buf| {
            q.submit_write(ns, slba, buf, flags, BLOCKING_TAG)
        })
    }

    /// Read into a scatter list and wait.
    pub fn readv_blocking(
        &mut self,
        ns: &Namespace,
        slba: Lba,
        sg: Box<SgList>,
        timeout: Duration,
    ) -> Result<Box<SgList>, Rejected> {
        self.run_blocking_sg(timeout, sg, |q, sg| {
            q.submit_readv(ns, slba, sg, IoFlags::empty(), BLOCKING_TAG)
        })
    }

    /// Write a scatter list and wait.
    pub fn writev_blocking(
        &mut self,
        ns: &Namespace,
        slba: Lba,
        sg: Box<SgList>,
        flags: IoFlags,
        timeout: Duration,
    ) -> Result<Box<SgList>, Rejected> {
        self.run_blocking_sg(timeout, sg, |q, sg| {
            q.submit_writev(ns, slba, sg, flags, BLOCKING_TAG)
        })
    }

    /// NVMe Flush of `ns` and wait.
    pub fn flush_blocking(&mut self, ns: &Namespace, timeout: Duration) -> Result<(), NvmeError> {
        self.run_blocking_no_data(timeout, |q| q.submit_flush(ns, BLOCKING_TAG))
    }

    /// Write Zeroes and wait.
    pub fn write_zeroes_blocking(
        &mut self,
        ns: &Namespace,
        slba: Lba,
        nlb: u64,
        timeout: Duration,
    ) -> Result<(), NvmeError> {
        self.run_blocking_no_data(timeout, |q| {
            q.submit_write_zeroes(ns, slba, nlb, BLOCKING_TAG)
        })
    }

    /// Deallocate (DSM) and wait.
    pub fn deallocate_blocking(
        &mut self,
        ns: &Namespace,
        slba: Lba,
        nlb: u32,
        timeout: Duration,
    ) -> Result<(), NvmeError> {
        self.run_blocking_no_data(timeout, |q| {
            q.submit_deallocate(ns, slba, nlb, BLOCKING_TAG)
        })
    }
}

/// A completion whose buffers are not the kind submitted: the queue hands back what it was
/// given, so this is a driver bug, reported rather than panicking.
fn wrong_kind(bufs: IoBufs) -> Rejected {
    Rejected {
        bufs,
        error: NvmeError::InvalidArgument(
            "internal: a completion came back with other buffers than its request",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn malformed() -> NvmeError {
        NvmeError::MalformedCompletion {
            qid: 1,
            cid: 999,
            sq_id: 1,
            reason: "command id or SQ id out of range",
        }
    }

    fn done(tag: u64) -> IoCompletion {
        IoCompletion {
            tag,
            bufs: IoBufs::None,
            result: Ok(4096),
        }
    }

    #[test]
    fn a_completion_delivered_with_a_malformed_entry_is_kept() {
        // One poll delivers the request's completion and reports a malformed entry of the
        // same batch: the wait counts the completion and ends with it.
        let mut calls = 0;
        let mut seen = Vec::new();
        let r = wait_loop(
            1,
            Duration::from_secs(1),
            1,
            |_, g| {
                calls += 1;
                g(done(BLOCKING_TAG));
                Err(malformed())
            },
            &mut |c| seen.push(c.tag),
        );
        assert_eq!(r.unwrap(), 1);
        assert_eq!((calls, seen), (1, vec![BLOCKING_TAG]));
    }

    #[test]
    fn a_malformed_entry_alone_does_not_end_the_wait() {
        let mut calls = 0;
        let r = wait_loop(
            1,
            Duration::from_secs(1),
            1,
            |_, g| {
                calls += 1;
                if calls == 1 {
                    return Err(malformed());
                }
                g(done(7));
                Ok(1)
            },
            &mut |_| {},
        );
        assert_eq!(r.unwrap(), 1);
        assert_eq!(calls, 2);
    }

    #[test]
    fn other_errors_end_the_wait_and_the_blocking_call_keeps_its_completion() {
        let timeout = NvmeError::Timeout {
            then: crate::error::TIMEOUT_WAIT,
            command: "Read",
            cid: 3,
            qid: 1,
            waited: Duration::from_secs(1),
        };
        let mut out = None;
        let wait = wait_loop(
            1,
            Duration::from_secs(1),
            1,
            |_, g| {
                g(done(BLOCKING_TAG));
                Err(NvmeError::Timeout {
                    then: crate::error::TIMEOUT_WAIT,
                    command: "Read",
                    cid: 3,
                    qid: 1,
                    waited: Duration::from_secs(1),
                })
            },
            &mut |c| out = Some(c),
        );
        assert!(matches!(wait, Err(NvmeError::Timeout { cid: 3, .. })));
        // The request did complete (successfully): the blocking call returns it.
        let (_, n) = blocking_outcome(wait, out).unwrap();
        assert_eq!(n, 4096);
        // Without a completion the wait's error comes back.
        let e = blocking_outcome(Err(timeout), None).unwrap_err();
        assert!(matches!(e.error, NvmeError::Timeout { .. }), "{}", e.error);
    }
}
