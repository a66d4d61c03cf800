//! `ubd_env_open_model_for_tests`: an environment over the in-process NVMe device model on a
//! host-only DMA domain, so that the C API's tests run without vfio (the `test-model` feature).

use std::ffi::c_int;

use ubdirect::dma::{DmaDomain, UbRegistry};
use ubdirect::Env;
use ubdirect_devmodel::nvme::{NsConfig, NvmeConfig, NvmeModel};

use crate::env::{pool_settings, ubd_env, ubd_env_opts};
use crate::error::{guard, Error};

/// Open an environment whose one NVMe controller is the in-process device model (address
/// "0000:7f:00.0", namespace 1: 8192 blocks of 512 bytes, 16 KiB per command) on a host-only
/// DMA domain, for tests only. `opts->nvme_addrs` is ignored; the pool is anonymous memory
/// whatever `opts->memory` says. Errors as `ubd_env_open`.
#[no_mangle]
pub extern "C" fn ubd_env_open_model_for_tests(
    opts: *const ubd_env_opts,
    out: *mut *mut ubd_env,
) -> c_int {
    guard(|| {
        // SAFETY: the caller passes a readable ubd_env_opts or NULL (checked).
        let o = unsafe { opts.as_ref() }.ok_or_else(|| Error::null("opts"))?;
        if out.is_null() {
            return Err(Error::null("out"));
        }
        let registry = UbRegistry::new(DmaDomain::host_only());
        let cfg = NvmeConfig {
            mdts: 2,
            namespaces: vec![NsConfig {
                nsid: 1,
                blocks: 8192,
                lbads: 9,
            }],
            ..NvmeConfig::default()
        };
        let model = NvmeModel::new(&registry, cfg);
        let dev = model.attach(&registry);
        let b = pool_settings(o, Env::builder())?
            .pool_memory(ubdirect::PoolMemory::Anonymous)
            .registry(registry)
            .nvme_device(dev);
        let env = b.open()?;
        let h = Box::new(ubd_env {
            env,
            _model: Some(model),
        });
        // SAFETY: `out` is non-NULL (checked) and writable by the caller's contract.
        unsafe { *out = Box::into_raw(h) };
        Ok(0)
    })
}
