//! The NVM commands on a namespace through a queue pair, each with a completion callback:
//! `ubd_ns_cmd_read(ns, qpair, buf, lba, lba_count, cb, cb_arg, flags)` as in SPDK.

use std::ffi::{c_int, c_void};

use ubdirect::nvme::qpair::{Deallocate, Flush, IoCommand, QueuePair, Read, Write, WriteZeroes};
use ubdirect::nvme::{IoBuf, IoBufs, IoFlags, Lba};

use crate::buf::{buf_mut, ubd_buf};
use crate::ctrlr::{ns_ref, ubd_ns};
use crate::error::{guard, Error};
use crate::qpair::{qpair_mut, ubd_cmd_cb, ubd_qpair, Ctx};

/// Force Unit Access: a write reaches non-volatile media before it completes.
pub const UBD_IO_FLAGS_FUA: u32 = 0x4000_0000;
/// Limited Retry: the controller applies limited error recovery (fails faster).
pub const UBD_IO_FLAGS_LIMITED_RETRY: u32 = 0x8000_0000;

/// What a submit asks.
#[derive(Clone, Copy)]
enum Op {
    Read,
    Write,
    Flush,
    WriteZeroes,
    Deallocate,
}

/// One submit's arguments, as C passed them.
struct Submit {
    op: Op,
    ns: *const ubd_ns,
    qp: *mut ubd_qpair,
    buf: *mut ubd_buf,
    lba: u64,
    count: u64,
    ctx: Ctx,
    flags: u32,
}

/// The command of `s` carrying `payload`.
fn command(
    s: &Submit,
    ns: &ubdirect::nvme::Namespace,
    payload: IoBufs,
) -> Result<IoCommand<IoBufs>, Error> {
    let lba = Lba(s.lba);
    Ok(match s.op {
        Op::Read => Read::new(ns, lba, payload),
        Op::Write => Write::new(ns, lba, payload),
        Op::Flush => Flush::new(ns),
        Op::WriteZeroes => WriteZeroes::new(ns, lba, s.count),
        Op::Deallocate => {
            let blocks = u32::try_from(s.count).map_err(|_| {
                Error::new(
                    libc::EINVAL,
                    format!(
                        "deallocate of {} blocks: at most {} per command",
                        s.count,
                        u32::MAX
                    ),
                )
            })?;
            Deallocate::new(ns, lba, blocks)
        }
    })
}

/// The window of `s`'s buffer for a data command: `count` blocks from its start.
fn window(s: &Submit, lba_size: u32) -> Result<IoBufs, Error> {
    let h = buf_mut(s.buf)?;
    let len = s
        .count
        .checked_mul(lba_size.into())
        .and_then(|l| usize::try_from(l).ok())
        .ok_or_else(|| {
            Error::new(
                libc::EINVAL,
                format!("{} blocks do not fit in memory", s.count),
            )
        })?;
    let b = h.lend()?;
    match IoBuf::prefix(b, len) {
        Ok(w) => Ok(IoBufs::One(w)),
        Err(e) => {
            h.give_back(e.buf);
            Err(Error::new(
                libc::EINVAL,
                format!("{} blocks of {lba_size} bytes: {}", s.count, e.error),
            ))
        }
    }
}

/// Check and queue `s`; a refused submit leaves the buffer with the caller.
fn submit(s: Submit) -> Result<c_int, Error> {
    let ns = ns_ref(s.ns)?.ns;
    let h = qpair_mut(s.qp)?;
    let flags = IoFlags::from_bits(s.flags).ok_or_else(|| {
        Error::new(
            libc::EINVAL,
            format!(
                "I/O flags {:#x}: only UBD_IO_FLAGS_FUA and UBD_IO_FLAGS_LIMITED_RETRY are defined",
                s.flags
            ),
        )
    })?;
    let Some(&tag) = h.free.last() else {
        return Err(Error::new(
            libc::EAGAIN,
            format!("the queue pair has {} commands in flight, its depth: process completions, then submit again", h.ctxs.len()),
        ));
    };
    let data = matches!(s.op, Op::Read | Op::Write);
    let payload = if data {
        window(&s, ns.lba_size())?
    } else {
        IoBufs::None
    };
    let cmd = match command(&s, &ns, payload) {
        Ok(c) => c.flags(flags).tag(tag.into()),
        Err(e) => return Err(e),
    };
    match QueuePair::submit(&mut h.qp, cmd) {
        Ok(()) => {
            h.free.pop();
            h.ctxs[tag as usize] = Ctx {
                buf: if data { s.buf } else { std::ptr::null_mut() },
                ..s.ctx
            };
            // Submits from completion callbacks go out together when the callbacks are done.
            if !h.delay_doorbell && !h.dispatching {
                QueuePair::ring(&mut h.qp);
            }
            Ok(0)
        }
        Err(rej) => {
            if let IoBufs::One(w) = rej.bufs {
                buf_mut(s.buf)?.give_back(w.into_buf());
            }
            Err(rej.error.into())
        }
    }
}

/// The callback context of a submit.
fn ctx(cb: ubd_cmd_cb, cb_arg: *mut c_void) -> Ctx {
    Ctx {
        cb,
        cb_arg,
        buf: std::ptr::null_mut(),
    }
}

/// Read `lba_count` blocks from `lba` of `ns` into the start of `buf` through `qpair` (which
/// must belong to the namespace's controller); `flags`: 0 or `UBD_IO_FLAGS_*`. Returns 0 when
/// queued: `buf` is lent to the driver until `cb(cb_arg, cpl)` runs from
/// `ubd_qpair_process_completions` on this thread (`cpl->buf` hands it back; `cb` may be NULL).
/// A refused submit returns a negative errno and calls nothing back: the buffer stays the
/// caller's (-EAGAIN: the queue pair is full, process completions first; -ERANGE: past the
/// namespace's end; -EINVAL: NULL arguments, unknown flags, or a buffer too small for the
/// blocks; -EBUSY: the buffer is already lent). The queue pair's thread only.
#[no_mangle]
#[allow(clippy::too_many_arguments)] // SPDK's signature, which C storage engines know
pub extern "C" fn ubd_ns_cmd_read(
    ns: *const ubd_ns,
    qpair: *mut ubd_qpair,
    buf: *mut ubd_buf,
    lba: u64,
    lba_count: u32,
    cb: ubd_cmd_cb,
    cb_arg: *mut c_void,
    flags: u32,
) -> c_int {
    guard(|| {
        if buf.is_null() {
            return Err(Error::null("buf"));
        }
        submit(Submit {
            op: Op::Read,
            ns,
            qp: qpair,
            buf,
            lba,
            count: lba_count.into(),
            ctx: ctx(cb, cb_arg),
            flags,
        })
    })
}

/// Write the first `lba_count` blocks of `buf` to `lba` of `ns` (`UBD_IO_FLAGS_FUA`: on media
/// before it completes). Ownership, callback and errors as `ubd_ns_cmd_read`.
#[no_mangle]
#[allow(clippy::too_many_arguments)] // SPDK's signature, which C storage engines know
pub extern "C" fn ubd_ns_cmd_write(
    ns: *const ubd_ns,
    qpair: *mut ubd_qpair,
    buf: *mut ubd_buf,
    lba: u64,
    lba_count: u32,
    cb: ubd_cmd_cb,
    cb_arg: *mut c_void,
    flags: u32,
) -> c_int {
    guard(|| {
        if buf.is_null() {
            return Err(Error::null("buf"));
        }
        submit(Submit {
            op: Op::Write,
            ns,
            qp: qpair,
            buf,
            lba,
            count: lba_count.into(),
            ctx: ctx(cb, cb_arg),
            flags,
        })
    })
}

/// Flush `ns`'s volatile write cache to media; `cpl->buf` is NULL. Errors as
/// `ubd_ns_cmd_read`. The queue pair's thread only.
#[no_mangle]
pub extern "C" fn ubd_ns_cmd_flush(
    ns: *const ubd_ns,
    qpair: *mut ubd_qpair,
    cb: ubd_cmd_cb,
    cb_arg: *mut c_void,
) -> c_int {
    guard(|| {
        submit(Submit {
            op: Op::Flush,
            ns,
            qp: qpair,
            buf: std::ptr::null_mut(),
            lba: 0,
            count: 0,
            ctx: ctx(cb, cb_arg),
            flags: 0,
        })
    })
}

/// Zero `lba_count` blocks from `lba` of `ns` without a data transfer; `cpl->buf` is NULL.
/// `flags` must be 0. Errors as `ubd_ns_cmd_read`. The queue pair's thread only.
#[no_mangle]
pub extern "C" fn ubd_ns_cmd_write_zeroes(
    ns: *const ubd_ns,
    qpair: *mut ubd_qpair,
    lba: u64,
    lba_count: u64,
    cb: ubd_cmd_cb,
    cb_arg: *mut c_void,
    flags: u32,
) -> c_int {
    guard(|| {
        if flags != 0 {
            return Err(Error::new(
                libc::EINVAL,
                format!("write zeroes takes no I/O flags ({flags:#x} given)"),
            ));
        }
        submit(Submit {
            op: Op::WriteZeroes,
            ns,
            qp: qpair,
            buf: std::ptr::null_mut(),
            lba,
            count: lba_count,
            ctx: ctx(cb, cb_arg),
            flags: 0,
        })
    })
}

/// Tell the device that `lba_count` blocks from `lba` of `ns` hold nothing (Dataset
/// Management, deallocate); `cpl->buf` is NULL. Errors as `ubd_ns_cmd_read`. The queue
/// pair's thread only.
#[no_mangle]
pub extern "C" fn ubd_ns_cmd_deallocate(
    ns: *const ubd_ns,
    qpair: *mut ubd_qpair,
    lba: u64,
    lba_count: u32,
    cb: ubd_cmd_cb,
    cb_arg: *mut c_void,
) -> c_int {
    guard(|| {
        submit(Submit {
            op: Op::Deallocate,
            ns,
            qp: qpair,
            buf: std::ptr::null_mut(),
            lba,
            count: lba_count.into(),
            ctx: ctx(cb, cb_arg),
            flags: 0,
        })
    })
}
