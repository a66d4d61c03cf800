//! `struct ubd_env`: hugepages checked, the DMA domain, the NVMe controllers named in the
//! options and the buffer pool, opened in one call by the facade's `Env`.

use std::ffi::{c_char, c_int, CStr};

use ubdirect::dma::PoolConfig;
use ubdirect::{Env, Hugepages, PoolMemory};

use crate::error::{guard, Error};

/// The pool's memory is hugepages (what devices DMA into).
pub const UBD_POOL_HUGEPAGES: u32 = 0;
/// The pool's memory is ordinary anonymous memory: only for a host-only domain (tests).
pub const UBD_POOL_ANONYMOUS: u32 = 1;

/// What `ubd_env_open` opens. Fill it with `ubd_env_opts_init` first, then set the fields.
#[repr(C)]
pub struct ubd_env_opts {
    /// PCI addresses ("DDDD:BB:DD.F") of the NVMe controllers to open, bound to vfio-pci.
    /// At least one: the pool's memory is mapped for the devices' DMA.
    pub nvme_addrs: *const *const c_char,
    /// Entries in `nvme_addrs`.
    pub nvme_count: usize,
    /// Bytes per pool buffer (a power of two, 4 KiB or more; default 2 MiB).
    pub block_size: usize,
    /// Buffers in the pool (default 64).
    pub block_count: usize,
    /// `UBD_POOL_HUGEPAGES` (default) or `UBD_POOL_ANONYMOUS`.
    pub memory: u32,
    /// Reserve at least this many 2 MiB hugepages first (needs root); 0 (default): only
    /// verify that the pool fits in the free hugepages.
    pub reserve_hugepages: u32,
    /// NUMA node of the pool's memory; -1 (default): the kernel's choice.
    pub numa_node: i32,
}

/// An open environment. Opaque; opened by `ubd_env_open`, closed by `ubd_env_close`.
pub struct ubd_env {
    pub(crate) env: Env,
    /// The device model behind the controllers (the `test-model` build only).
    #[cfg(any(test, feature = "test-model"))]
    pub(crate) _model: Option<std::sync::Arc<ubdirect_devmodel::nvme::NvmeModel>>,
}

/// Fill `opts` with the defaults: no controller, 64 buffers of 2 MiB in hugepages, verified
/// (not reserved), NUMA node chosen by the kernel. Returns 0, or -EINVAL for a NULL `opts`.
#[no_mangle]
pub extern "C" fn ubd_env_opts_init(opts: *mut ubd_env_opts) -> c_int {
    guard(|| {
        // SAFETY: the caller passes a writable ubd_env_opts or NULL (checked).
        let o = unsafe { opts.as_mut() }.ok_or_else(|| Error::null("opts"))?;
        *o = ubd_env_opts {
            nvme_addrs: std::ptr::null(),
            nvme_count: 0,
            block_size: 2 << 20,
            block_count: 64,
            memory: UBD_POOL_HUGEPAGES,
            reserve_hugepages: 0,
            numa_node: -1,
        };
        Ok(0)
    })
}

/// The settings of `opts` applied to a builder (controllers excluded).
pub(crate) fn pool_settings(
    o: &ubd_env_opts,
    mut b: ubdirect::EnvBuilder,
) -> Result<ubdirect::EnvBuilder, Error> {
    b = b.pool(PoolConfig {
        block_size: o.block_size,
        block_count: o.block_count,
    });
    b = match o.memory {
        UBD_POOL_HUGEPAGES => b.pool_memory(PoolMemory::Hugepages),
        UBD_POOL_ANONYMOUS => b.pool_memory(PoolMemory::Anonymous),
        m => {
            return Err(Error::new(
                libc::EINVAL,
                format!(
                    "pool memory {m} is neither UBD_POOL_HUGEPAGES (0) nor UBD_POOL_ANONYMOUS (1)"
                ),
            ))
        }
    };
    if o.reserve_hugepages > 0 {
        b = b.hugepages(Hugepages::reserve(o.reserve_hugepages.into()));
    }
    if o.numa_node >= 0 {
        b = b.numa(o.numa_node as u32);
    }
    Ok(b)
}

/// The controller addresses of `o`, checked for NULL and UTF-8.
fn addresses(o: &ubd_env_opts) -> Result<Vec<String>, Error> {
    if o.nvme_count == 0 {
        return Ok(Vec::new());
    }
    if o.nvme_addrs.is_null() {
        return Err(Error::null("opts->nvme_addrs"));
    }
    // SAFETY: the caller passes `nvme_count` readable pointers at `nvme_addrs` (non-NULL).
    let ptrs = unsafe { std::slice::from_raw_parts(o.nvme_addrs, o.nvme_count) };
    ptrs.iter()
        .enumerate()
        .map(|(i, &p)| {
            if p.is_null() {
                return Err(Error::null(&format!("opts->nvme_addrs[{i}]")));
            }
            // SAFETY: non-NULL, and the caller passes NUL-terminated strings.
            let s = unsafe { CStr::from_ptr(p) };
            s.to_str().map(str::to_owned).map_err(|_| {
                Error::new(libc::EINVAL, format!("opts->nvme_addrs[{i}] is not UTF-8"))
            })
        })
        .collect()
}

/// Check the hugepages, open the DMA domain, the NVMe controllers of `opts->nvme_addrs` and
/// the pool, in that order; on success `*out` is the environment and 0 is returned. On a
/// failure nothing stays open, `*out` is untouched and a negative errno is returned (-EINVAL
/// for a NULL argument or a malformed address, -ENODEV for an address with no device or no
/// VFIO, -ENOMEM for too few hugepages); `ubd_last_error_message` says why.
/// May be called from any thread; the environment may be used from every thread.
#[no_mangle]
pub extern "C" fn ubd_env_open(opts: *const ubd_env_opts, out: *mut *mut ubd_env) -> c_int {
    guard(|| {
        // SAFETY: the caller passes a readable ubd_env_opts or NULL (checked).
        let o = unsafe { opts.as_ref() }.ok_or_else(|| Error::null("opts"))?;
        if out.is_null() {
            return Err(Error::null("out"));
        }
        let mut b = pool_settings(o, Env::builder())?;
        for a in addresses(o)? {
            b = b.nvme(a);
        }
        let env = b.open()?;
        let h = Box::new(ubd_env {
            env,
            #[cfg(any(test, feature = "test-model"))]
            _model: None,
        });
        // SAFETY: `out` is non-NULL (checked) and writable by the caller's contract.
        unsafe { *out = Box::into_raw(h) };
        Ok(0)
    })
}

/// Close the environment `*env` and set `*env` to NULL (a second call, or NULL, does
/// nothing). Close waits for nothing: controllers, queue pairs and buffers still open keep
/// what they use alive, and it goes when the last of them is closed. Do not use `*env` in
/// another thread while it closes.
#[no_mangle]
pub extern "C" fn ubd_env_close(env: *mut *mut ubd_env) {
    crate::error::guard_value((), || {
        // SAFETY: the caller passes a writable handle pointer or NULL.
        let Some(slot) = (unsafe { env.as_mut() }) else {
            return;
        };
        let h = std::mem::replace(slot, std::ptr::null_mut());
        if !h.is_null() {
            // SAFETY: `h` came from Box::into_raw in an open call and is dropped once (the
            // caller's copy was set to NULL).
            drop(unsafe { Box::from_raw(h) });
        }
    })
}

/// The environment behind a handle pointer, or -EINVAL for NULL.
pub(crate) fn env_ref<'a>(env: *const ubd_env) -> Result<&'a ubd_env, Error> {
    // SAFETY: a non-NULL handle comes from `ubd_env_open` and is open (the caller's contract).
    unsafe { env.as_ref() }.ok_or_else(|| Error::null("env"))
}
