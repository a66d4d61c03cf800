//! `struct ubd_qpair`: one I/O queue pair of a controller for one thread, its completion
//! callbacks and `ubd_qpair_process_completions`.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ubdirect::nvme::qpair::QueuePair;
use ubdirect::nvme::{IoBufs, IoCompletion, IoQueuePair, NvmeError, QueueOptions};

use crate::buf::ubd_buf;
use crate::ctrlr::{ctrlr_ref, ubd_ctrlr};
use crate::error::{guard, guard_value, set_last, Error};

/// How a command ended, handed to its callback (valid during the callback only).
#[repr(C)]
pub struct ubd_completion {
    /// 0, or a negative errno (-EIO for a command the device failed: see `nvme_sct`/`nvme_sc`;
    /// `ubd_last_error_message` then says why, on the polling thread).
    pub status: c_int,
    /// NVMe Status Code Type of a command the device failed, else 0.
    pub nvme_sct: u8,
    /// NVMe Status Code of a command the device failed, else 0.
    pub nvme_sc: u8,
    /// Bytes transferred (0 for commands without data).
    pub bytes: u64,
    /// The buffer given to the submit, the caller's again from now on; NULL for commands
    /// without a buffer.
    pub buf: *mut ubd_buf,
}

/// A completion callback: `cb_arg` as given to the submit, and how the command ended.
pub type ubd_cmd_cb = Option<extern "C" fn(cb_arg: *mut c_void, cpl: *const ubd_completion)>;

/// Options of `ubd_qpair_alloc`; fill with `ubd_qpair_opts_init`.
#[repr(C)]
pub struct ubd_qpair_opts {
    /// Commands in flight at most (capped by the controller); default 128.
    pub depth: u32,
    /// 0 (default): a submit rings the doorbell at once (one made from a completion callback
    /// rings when the callbacks of that `ubd_qpair_process_completions` call are done). 1:
    /// every submit waits for the next `ubd_qpair_process_completions`, which rings once for
    /// all of them (SPDK's delay_cmd_submit).
    pub delay_doorbell: u32,
}

/// What a command in flight calls back.
#[derive(Clone, Copy)]
pub(crate) struct Ctx {
    pub(crate) cb: ubd_cmd_cb,
    pub(crate) cb_arg: *mut c_void,
    pub(crate) buf: *mut ubd_buf,
}

/// A queue pair. Opaque; from `ubd_qpair_alloc`, closed by `ubd_qpair_free`.
pub struct ubd_qpair {
    pub(crate) qp: IoQueuePair,
    /// Per command tag: its callback (a slot of `free` while unused).
    pub(crate) ctxs: Box<[Ctx]>,
    pub(crate) free: Vec<u32>,
    /// Completions reaped and not yet called back (capacity: the depth).
    done: VecDeque<IoCompletion>,
    /// Callbacks are running (a nested process call is refused; their submits ring once
    /// after them).
    pub(crate) dispatching: bool,
    pub(crate) delay_doorbell: bool,
}

/// Fill `opts` with the defaults (depth 128, a doorbell per submit). 0, or -EINVAL for NULL.
#[no_mangle]
pub extern "C" fn ubd_qpair_opts_init(opts: *mut ubd_qpair_opts) -> c_int {
    guard(|| {
        // SAFETY: the caller passes a writable ubd_qpair_opts or NULL (checked).
        let o = unsafe { opts.as_mut() }.ok_or_else(|| Error::null("opts"))?;
        *o = ubd_qpair_opts {
            depth: 128,
            delay_doorbell: 0,
        };
        Ok(0)
    })
}

/// Create an I/O queue pair on the controller (`opts` NULL: the defaults) into `*out`: 0, or
/// -EBUSY when the controller has no I/O queue left, -EINVAL for NULL arguments. A queue pair
/// belongs to one thread at a time: every call on it (submit, process, free) from that thread;
/// it may move to another thread between calls. Any number of queue pairs per controller.
#[no_mangle]
pub extern "C" fn ubd_qpair_alloc(
    ctrlr: *const ubd_ctrlr,
    opts: *const ubd_qpair_opts,
    out: *mut *mut ubd_qpair,
) -> c_int {
    guard(|| {
        let c = ctrlr_ref(ctrlr)?;
        if out.is_null() {
            return Err(Error::null("out"));
        }
        // SAFETY: the caller passes a readable ubd_qpair_opts or NULL (defaults).
        let (depth, delay) = match unsafe { opts.as_ref() } {
            Some(o) => (o.depth as usize, o.delay_doorbell != 0),
            None => (128, false),
        };
        if depth == 0 {
            return Err(Error::new(
                libc::EINVAL,
                "queue pair depth 0: give 1 or more",
            ));
        }
        let qo = QueueOptions {
            depth,
            ..QueueOptions::default()
        };
        let qp = IoQueuePair::new(&c.ctrl, qo)?;
        let n = QueuePair::depth(&qp);
        let empty = Ctx {
            cb: None,
            cb_arg: std::ptr::null_mut(),
            buf: std::ptr::null_mut(),
        };
        let h = Box::new(ubd_qpair {
            qp,
            ctxs: vec![empty; n].into_boxed_slice(),
            free: (0..n as u32).rev().collect(),
            done: VecDeque::with_capacity(n),
            dispatching: false,
            delay_doorbell: delay,
        });
        // SAFETY: `out` is non-NULL (checked) and writable by the caller's contract.
        unsafe { *out = Box::into_raw(h) };
        Ok(0)
    })
}

/// The queue pair behind a handle pointer, or -EINVAL for NULL. The reference is not held
/// across a callback (a callback may submit on the same queue pair).
pub(crate) fn qpair_mut<'a>(qp: *mut ubd_qpair) -> Result<&'a mut ubd_qpair, Error> {
    // SAFETY: a non-NULL handle comes from `ubd_qpair_alloc` and is used by one thread at a
    // time (the caller's contract).
    unsafe { qp.as_mut() }.ok_or_else(|| Error::null("qpair"))
}

/// The completion of `c` for C, with its context; frees the tag and gives the buffer back.
fn finish(h: &mut ubd_qpair, c: IoCompletion) -> (Ctx, ubd_completion) {
    let ctx = h.ctxs[c.tag as usize];
    h.free.push(c.tag as u32);
    if let IoBufs::One(b) = c.bufs {
        if let Some(cb) = buf_mut_of(ctx.buf) {
            cb.give_back(b.into_buf());
        }
    }
    let mut cpl = ubd_completion {
        status: 0,
        nvme_sct: 0,
        nvme_sc: 0,
        bytes: 0,
        buf: ctx.buf,
    };
    match c.result {
        Ok(n) => cpl.bytes = n as u64,
        Err(e) => {
            if let NvmeError::Command { status, .. } = &e {
                cpl.nvme_sct = status.sct;
                cpl.nvme_sc = status.sc;
            }
            cpl.status = -crate::error::nvme_errno(&e);
            set_last(&e.to_string());
        }
    }
    (ctx, cpl)
}

/// The buffer handle a context names, if any.
fn buf_mut_of<'a>(b: *mut ubd_buf) -> Option<&'a mut ubd_buf> {
    // SAFETY: a context's buffer handle is lent to its command: the caller cannot put it (its
    // put returns -EBUSY) until this gives it back.
    unsafe { b.as_mut() }
}

/// Call back every reaped completion, oldest first, without holding the queue pair across a
/// callback; returns how many.
fn dispatch(qp: *mut ubd_qpair) -> Result<usize, Error> {
    let mut n = 0;
    loop {
        let h = qpair_mut(qp)?;
        let Some(c) = h.done.pop_front() else {
            h.dispatching = false;
            return Ok(n);
        };
        let (ctx, cpl) = finish(h, c);
        n += 1;
        if let Some(cb) = ctx.cb {
            cb(ctx.cb_arg, &cpl);
        }
    }
}

/// Ring the doorbell for batched submits, reap at most `max` finished commands (0: as many as
/// are ready, up to the depth) and call each one's callback on this thread, in completion
/// order; a callback may submit on this queue pair (not process it): its submits reach the
/// device together, when the callbacks are done. Returns how many were
/// called back, or a negative errno when the queue pair cannot go on (the controller failed):
/// every command in flight has then been called back with an error; free the queue pair.
/// -EBUSY when called from one of this queue pair's callbacks. Never blocks.
#[no_mangle]
pub extern "C" fn ubd_qpair_process_completions(qp: *mut ubd_qpair, max: u32) -> c_int {
    guard(|| {
        let h = qpair_mut(qp)?;
        if h.dispatching {
            return Err(Error::new(
                libc::EBUSY,
                "ubd_qpair_process_completions was called from a completion callback of the same queue pair",
            ));
        }
        if h.delay_doorbell {
            QueuePair::ring(&mut h.qp);
        }
        let cap = h.done.capacity();
        let max = if max == 0 {
            cap
        } else {
            (max as usize).min(cap)
        };
        let ubd_qpair { qp: q, done, .. } = h;
        let polled = QueuePair::poll(q, max, |c| done.push_back(c));
        h.dispatching = true;
        let n = dispatch(qp)?;
        // What the callbacks submitted: one doorbell write for all of them.
        QueuePair::ring(&mut qpair_mut(qp)?.qp);
        polled?;
        Ok(n as c_int)
    })
}

/// Commands submitted on the queue pair and not yet called back; 0 for NULL.
#[no_mangle]
pub extern "C" fn ubd_qpair_get_num_outstanding(qp: *const ubd_qpair) -> u32 {
    guard_value(0, || {
        // SAFETY: a non-NULL handle comes from `ubd_qpair_alloc` (caller's contract).
        unsafe { qp.as_ref() }.map_or(0, |h| (h.ctxs.len() - h.free.len()) as u32)
    })
}

/// How long `ubd_qpair_free` waits for commands in flight.
const FREE_WAIT: Duration = Duration::from_secs(15);

/// Close the queue pair `*qp` and set `*qp` to NULL (a second call, or NULL, does nothing).
/// It first waits (up to 15 s, the driver's command deadlines included) for the commands in
/// flight and calls their callbacks; a command still not back then is called back with
/// -ETIMEDOUT and its buffer is lost (`ubd_buf_put` it, never read it). Call it from the queue
/// pair's thread; from one of its callbacks it does nothing (the queue pair stays open).
#[no_mangle]
pub extern "C" fn ubd_qpair_free(qp: *mut *mut ubd_qpair) {
    guard_value((), || {
        // SAFETY: the caller passes a writable handle pointer or NULL.
        let Some(slot) = (unsafe { qp.as_mut() }) else {
            return;
        };
        let h = *slot;
        match qpair_mut(h) {
            Err(_) => return,
            Ok(q) if q.dispatching => {
                set_last("ubd_qpair_free was called from a completion callback of the same queue pair: free it after ubd_qpair_process_completions returns");
                return;
            }
            Ok(_) => *slot = std::ptr::null_mut(),
        }
        drain(h);
        // SAFETY: `h` came from Box::into_raw in ubd_qpair_alloc and is dropped once.
        drop(unsafe { Box::from_raw(h) });
    })
}

/// Call back every command in flight: as they complete, until the deadline; then the rest with
/// -ETIMEDOUT and their buffers lost.
fn drain(h: *mut ubd_qpair) {
    let deadline = Instant::now() + FREE_WAIT;
    while ubd_qpair_get_num_outstanding(h) > 0 && Instant::now() < deadline {
        if ubd_qpair_process_completions(h, 0) < 0 {
            break;
        }
    }
    let Ok(q) = qpair_mut(h) else { return };
    let used: Vec<u32> = (0..q.ctxs.len() as u32)
        .filter(|i| !q.free.contains(i))
        .collect();
    for tag in used {
        let Ok(q) = qpair_mut(h) else { return };
        let ctx = q.ctxs[tag as usize];
        q.free.push(tag);
        if let Some(b) = buf_mut_of(ctx.buf) {
            b.lose();
        }
        let cpl = ubd_completion {
            status: -libc::ETIMEDOUT,
            nvme_sct: 0,
            nvme_sc: 0,
            bytes: 0,
            buf: ctx.buf,
        };
        if let Some(cb) = ctx.cb {
            cb(ctx.cb_arg, &cpl);
        }
    }
}
