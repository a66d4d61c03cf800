//! `struct ubd_ctrlr` and `struct ubd_ns`: an NVMe controller of the environment, by PCI
//! address, and its active namespaces.

use std::ffi::{c_char, c_int, CStr};
use std::sync::Arc;

use ubdirect::dma::PciAddress;
use ubdirect::nvme::{Controller, ControllerOptions, Namespace};

use crate::env::{env_ref, ubd_env};
use crate::error::{guard, guard_value, Error};

/// An open NVMe controller. Opaque; from `ubd_ctrlr_open`, closed by `ubd_ctrlr_close`.
pub struct ubd_ctrlr {
    pub(crate) ctrl: Arc<Controller>,
    /// Every active namespace, in NSID order; `ubd_ctrlr_get_ns` lends pointers into it.
    ns: Box<[ubd_ns]>,
}

/// An active namespace of a controller. Opaque; valid while its controller is open.
pub struct ubd_ns {
    pub(crate) ns: Namespace,
}

/// The sysfs directory of `addr`, as the kernel names it.
fn sysfs_dir(addr: PciAddress) -> std::path::PathBuf {
    std::path::Path::new("/sys/bus/pci/devices").join(addr.to_string())
}

/// The controller at `addr`: the environment's own, or one opened now in its DMA domain.
fn find_or_open(env: &ubd_env, text: &str) -> Result<Arc<Controller>, Error> {
    let addr: PciAddress = text
        .parse()
        .map_err(|e| Error::new(libc::EINVAL, format!("PCI address {text:?}: {e}")))?;
    if let Some(c) = env
        .env
        .controllers()
        .iter()
        .find(|c| c.device().address() == addr)
    {
        return Ok(c.clone());
    }
    let dir = sysfs_dir(addr);
    if !dir.exists() {
        return Err(Error::new(
            libc::ENODEV,
            format!(
                "no PCI device {addr} (no {}): check the address with `lspci -D` and bind the controller to vfio-pci",
                dir.display()
            ),
        ));
    }
    let registry = env.env.registry();
    Controller::open(registry, addr, ControllerOptions::default()).map_err(|e| {
        let errno = crate::error::nvme_errno(&e);
        Error::new(errno, format!("opening NVMe controller {addr}: {e}"))
    })
}

/// Open the NVMe controller at PCI address `addr` ("DDDD:BB:DD.F"): one the environment
/// opened, or another bound to vfio-pci, opened now in the environment's DMA domain. On
/// success `*out` is its handle and 0 is returned; -EINVAL for NULL arguments or a malformed
/// address, -ENODEV when no such device exists (or it cannot be driven), -EBUSY when another
/// driver holds it; `ubd_last_error_message` says why. Any thread; each call gives a handle of
/// its own, closed by `ubd_ctrlr_close`.
#[no_mangle]
pub extern "C" fn ubd_ctrlr_open(
    env: *const ubd_env,
    addr: *const c_char,
    out: *mut *mut ubd_ctrlr,
) -> c_int {
    guard(|| {
        let env = env_ref(env)?;
        if addr.is_null() {
            return Err(Error::null("addr"));
        }
        if out.is_null() {
            return Err(Error::null("out"));
        }
        // SAFETY: non-NULL, and the caller passes a NUL-terminated string.
        let text = unsafe { CStr::from_ptr(addr) }
            .to_str()
            .map_err(|_| Error::new(libc::EINVAL, "the PCI address is not UTF-8"))?;
        let ctrl = find_or_open(env, text)?;
        let ns = ctrl
            .namespaces()
            .iter()
            .map(|i| ctrl.namespace(i.nsid).map(|ns| ubd_ns { ns }))
            .collect::<Result<Box<[ubd_ns]>, _>>()?;
        // SAFETY: `out` is non-NULL (checked) and writable by the caller's contract.
        unsafe { *out = Box::into_raw(Box::new(ubd_ctrlr { ctrl, ns })) };
        Ok(0)
    })
}

/// Close the controller handle `*ctrlr` and set `*ctrlr` to NULL (a second call, or NULL, does
/// nothing). Its namespace pointers become invalid. Close waits for nothing: queue pairs still
/// open keep the controller, which shuts down when the last of them and the environment close.
#[no_mangle]
pub extern "C" fn ubd_ctrlr_close(ctrlr: *mut *mut ubd_ctrlr) {
    guard_value((), || {
        // SAFETY: the caller passes a writable handle pointer or NULL.
        let Some(slot) = (unsafe { ctrlr.as_mut() }) else {
            return;
        };
        let h = std::mem::replace(slot, std::ptr::null_mut());
        if !h.is_null() {
            // SAFETY: `h` came from Box::into_raw in ubd_ctrlr_open and is dropped once.
            drop(unsafe { Box::from_raw(h) });
        }
    })
}

/// The controller behind a handle pointer, or -EINVAL for NULL.
pub(crate) fn ctrlr_ref<'a>(ctrlr: *const ubd_ctrlr) -> Result<&'a ubd_ctrlr, Error> {
    // SAFETY: a non-NULL handle comes from `ubd_ctrlr_open` and is open (the caller's contract).
    unsafe { ctrlr.as_ref() }.ok_or_else(|| Error::null("ctrlr"))
}

/// The namespace behind a pointer, or -EINVAL for NULL.
pub(crate) fn ns_ref<'a>(ns: *const ubd_ns) -> Result<&'a ubd_ns, Error> {
    // SAFETY: a non-NULL pointer comes from `ubd_ctrlr_get_ns` of an open controller.
    unsafe { ns.as_ref() }.ok_or_else(|| Error::null("ns"))
}

/// Set `*out` to active namespace `nsid` of the controller (0: the first active one); the
/// pointer stays valid until the controller handle closes. Returns 0, -ENOENT when the
/// namespace is not active, -EINVAL for NULL arguments.
#[no_mangle]
pub extern "C" fn ubd_ctrlr_get_ns(
    ctrlr: *const ubd_ctrlr,
    nsid: u32,
    out: *mut *const ubd_ns,
) -> c_int {
    guard(|| {
        let c = ctrlr_ref(ctrlr)?;
        if out.is_null() {
            return Err(Error::null("out"));
        }
        let found = c.ns.iter().find(|n| nsid == 0 || n.ns.nsid() == nsid);
        let n = found.ok_or_else(|| {
            Error::new(
                libc::ENOENT,
                format!(
                    "namespace {nsid} is not active on NVMe controller {} ({} active)",
                    c.ctrl.device().address(),
                    c.ns.len()
                ),
            )
        })?;
        // SAFETY: `out` is non-NULL (checked) and writable by the caller's contract.
        unsafe { *out = n as *const ubd_ns };
        Ok(0)
    })
}

/// The namespace's ID (NSID); 0 for NULL.
#[no_mangle]
pub extern "C" fn ubd_ns_get_id(ns: *const ubd_ns) -> u32 {
    guard_value(0, || ns_ref(ns).map(|n| n.ns.nsid()).unwrap_or(0))
}

/// Bytes per logical block (sector) of the namespace; 0 for NULL.
#[no_mangle]
pub extern "C" fn ubd_ns_get_sector_size(ns: *const ubd_ns) -> u32 {
    guard_value(0, || ns_ref(ns).map(|n| n.ns.lba_size()).unwrap_or(0))
}

/// Logical blocks (sectors) in the namespace; 0 for NULL.
#[no_mangle]
pub extern "C" fn ubd_ns_get_num_sectors(ns: *const ubd_ns) -> u64 {
    guard_value(0, || ns_ref(ns).map(|n| n.ns.blocks()).unwrap_or(0))
}
