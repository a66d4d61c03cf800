//! `struct ubd_buf`: a buffer of the environment's pool, lent to the driver from a submit
//! until its completion callback.

use std::ffi::{c_int, c_void};

use ubdirect::dma::UbBuf;

use crate::env::{env_ref, ubd_env};
use crate::error::{guard, guard_value, Error};

/// A pool buffer. Opaque; from `ubd_buf_get`, back to the pool with `ubd_buf_put`.
pub struct ubd_buf {
    /// The buffer; `None` while a command holds it, or after it was lost with its queue pair.
    pub(crate) buf: Option<UbBuf>,
    /// A command holds the buffer (from submit until its callback).
    lent: bool,
    data: *mut u8,
    len: usize,
}

impl ubd_buf {
    /// Take the buffer out to lend it to a command: -EBUSY when a command already holds it.
    pub(crate) fn lend(&mut self) -> Result<UbBuf, Error> {
        if self.lent {
            return Err(Error::new(
                libc::EBUSY,
                "the buffer is lent to a command until its completion callback: wait for it",
            ));
        }
        let b = self.buf.take().ok_or_else(|| {
            Error::new(
                libc::EINVAL,
                "the buffer was lost with a queue pair closed while its command was in flight: only ubd_buf_put it",
            )
        })?;
        self.lent = true;
        Ok(b)
    }

    /// The buffer back from a command.
    pub(crate) fn give_back(&mut self, buf: UbBuf) {
        self.buf = Some(buf);
        self.lent = false;
    }

    /// The command holding the buffer never completed (its queue pair closed first): the
    /// handle no longer holds memory and may only be put.
    pub(crate) fn lose(&mut self) {
        self.buf = None;
        self.lent = false;
    }
}

/// The buffer behind a handle pointer, or -EINVAL for NULL.
pub(crate) fn buf_mut<'a>(buf: *mut ubd_buf) -> Result<&'a mut ubd_buf, Error> {
    // SAFETY: a non-NULL pointer comes from `ubd_buf_get` and was not put (caller's contract).
    unsafe { buf.as_mut() }.ok_or_else(|| Error::null("buf"))
}

/// Take a buffer from the environment's pool into `*out`: 0, or -ENOMEM when every buffer is
/// in use (put some back first), -EINVAL for NULL arguments. Any thread (the pool is shared;
/// each thread has a cache of its own). The buffer is the caller's until it is submitted, and
/// again from its completion callback on.
#[no_mangle]
pub extern "C" fn ubd_buf_get(env: *const ubd_env, out: *mut *mut ubd_buf) -> c_int {
    guard(|| {
        let env = env_ref(env)?;
        if out.is_null() {
            return Err(Error::null("out"));
        }
        let mut b = env.env.pool().get()?;
        let (data, len) = (b.as_mut_slice().as_mut_ptr(), b.len());
        let h = Box::new(ubd_buf {
            buf: Some(b),
            lent: false,
            data,
            len,
        });
        // SAFETY: `out` is non-NULL (checked) and writable by the caller's contract.
        unsafe { *out = Box::into_raw(h) };
        Ok(0)
    })
}

/// Give the buffer back to the pool: 0; -EBUSY while a command holds it (put it back from its
/// completion callback or after it), and the buffer stays valid; NULL does nothing. After 0 the
/// pointer is invalid (putting it twice is undefined, as with `free`). Any thread.
#[no_mangle]
pub extern "C" fn ubd_buf_put(buf: *mut ubd_buf) -> c_int {
    guard(|| {
        if buf.is_null() {
            return Ok(0);
        }
        if buf_mut(buf)?.lent {
            return Err(Error::new(
                libc::EBUSY,
                "the buffer is lent to a command until its completion callback: put it back from the callback or after it",
            ));
        }
        // SAFETY: `buf` came from Box::into_raw in ubd_buf_get and no command holds it; the
        // caller gives up the pointer (its UbBuf goes back to the pool).
        drop(unsafe { Box::from_raw(buf) });
        Ok(0)
    })
}

/// The buffer's bytes: `ubd_buf_size` of them, the same address for the buffer's whole life.
/// The caller reads and writes them only while it holds the buffer (not between a submit and
/// its callback). NULL for NULL.
#[no_mangle]
pub extern "C" fn ubd_buf_data(buf: *const ubd_buf) -> *mut c_void {
    guard_value(std::ptr::null_mut(), || {
        // SAFETY: a non-NULL pointer comes from `ubd_buf_get` (caller's contract).
        unsafe { buf.as_ref() }.map_or(std::ptr::null_mut(), |b| b.data.cast())
    })
}

/// The buffer's size in bytes (the pool's block size); 0 for NULL.
#[no_mangle]
pub extern "C" fn ubd_buf_size(buf: *const ubd_buf) -> usize {
    // SAFETY: a non-NULL pointer comes from `ubd_buf_get` (caller's contract).
    guard_value(0, || unsafe { buf.as_ref() }.map_or(0, |b| b.len))
}
