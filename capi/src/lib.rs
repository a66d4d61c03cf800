//! # libubdirect: the C API of ubdirect
//!
//! SPDK's model over the Rust drivers, behind opaque handles: open an environment
//! (`ubd_env_open`: hugepages, the DMA domain, NVMe controllers, the buffer pool), a controller
//! by PCI address (`ubd_ctrlr_open`) and its namespaces (`ubd_ctrlr_get_ns`), one queue pair
//! per thread (`ubd_qpair_alloc`), pool buffers (`ubd_buf_get` / `ubd_buf_put`); submit
//! read / write / flush / write zeroes / deallocate with a completion callback and its
//! argument (`ubd_ns_cmd_read(ns, qpair, buf, lba, lba_count, cb, cb_arg, flags)`), then
//! `ubd_qpair_process_completions` calls the callbacks on the polling thread.
//!
//! Errors are negative errno values; `ubd_strerror` names them and `ubd_last_error_message`
//! gives the library's message for the thread's last failure. Every entry point checks its
//! pointers for NULL and catches panics (a panic becomes -EIO with its message).
//!
//! A buffer is lent to the driver from a submit that returns 0 until its callback, which hands
//! it back; a refused submit leaves it with the caller.
//!
//! The header `include/ubdirect.h` is generated from these doc comments by cbindgen.

#![deny(missing_docs)]
// The C names of the API (`struct ubd_env`, `ubd_cmd_cb`) are its Rust names.
#![allow(non_camel_case_types)]
// Every entry point is called from C with raw pointers: each checks them for NULL and says in
// its doc comment what else it needs; being `unsafe` in Rust would tell C nothing.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

mod buf;
mod cmd;
mod ctrlr;
mod env;
mod error;
#[cfg(any(test, feature = "test-model"))]
mod model;
mod pipeline;
mod qpair;

#[cfg(test)]
mod tests;

pub use cmd::{UBD_IO_FLAGS_FUA, UBD_IO_FLAGS_LIMITED_RETRY};
pub use env::{UBD_POOL_ANONYMOUS, UBD_POOL_HUGEPAGES};
