//! [`Env`]: an NVMe controller bound to vfio-pci, opened through the facade's `Env` (DMA
//! domain, controller, hugepage pool), with one queue pair: identify, and blocking reads and
//! writes of logical blocks into bytes or writable buffers.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use ubdirect::dma::PoolConfig;
use ubdirect::nvme::{IoBuf, IoFlags, IoQueuePair, Lba, Namespace, QueueOptions};

use crate::errors::{Error, Kind, Result};

/// How long one block read or write may take.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

struct Open {
    env: ubdirect::Env,
    ns: Namespace,
    qp: IoQueuePair,
}

/// An opened NVMe controller and its first namespace.
#[pyclass(module = "ubdirect")]
pub struct Env {
    inner: Mutex<Option<Open>>,
    addr: String,
}

fn device(e: impl std::fmt::Display) -> Error {
    Error::new(Kind::Device, e.to_string())
}

fn env_error(e: ubdirect::EnvError) -> Error {
    let kind = match &e {
        ubdirect::EnvError::Address { .. }
        | ubdirect::EnvError::Duplicate { .. }
        | ubdirect::EnvError::PoolConfig(_) => Kind::InvalidArgument,
        _ => Kind::Device,
    };
    Error::new(kind, e.to_string())
}

impl Env {
    fn open(addr: &str, block_size: usize, blocks: usize) -> Result<Open> {
        let env = ubdirect::Env::builder()
            .nvme(addr)
            .pool(PoolConfig {
                block_size,
                block_count: blocks,
            })
            .open()
            .map_err(env_error)?;
        let ctrl = env.controller(0).clone();
        let ns = ctrl.first_namespace().map_err(device)?;
        let qp = IoQueuePair::new(&ctrl, QueueOptions::default()).map_err(device)?;
        Ok(Open { env, ns, qp })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Open) -> Result<T>) -> Result<T> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match g.as_mut() {
            Some(o) => f(o),
            None => Err(Error::invalid(format!(
                "the environment of {} is closed",
                self.addr
            ))),
        }
    }

    /// Check `[lba, lba + bytes / lba_size)` against the namespace; returns the block count.
    fn blocks_of(o: &Open, lba: u64, bytes: usize) -> Result<u64> {
        let lbs = o.ns.lba_size() as usize;
        if bytes == 0 || bytes % lbs != 0 {
            return Err(Error::invalid(format!(
                "{bytes} bytes is not a positive multiple of the namespace's {lbs}-byte logical block"
            )));
        }
        let n = (bytes / lbs) as u64;
        if lba.checked_add(n).is_none_or(|e| e > o.ns.blocks()) {
            return Err(Error::invalid(format!(
                "blocks {lba}..{} are not inside namespace {} ({} blocks)",
                lba.saturating_add(n),
                o.ns.nsid(),
                o.ns.blocks()
            )));
        }
        Ok(n)
    }

    /// Move `data.len()` bytes between `data` and the device at `lba`, one pool block at a time.
    fn transfer(o: &mut Open, lba: u64, data: &mut [u8], write: bool) -> Result<()> {
        Env::blocks_of(o, lba, data.len())?;
        let lbs = o.ns.lba_size() as usize;
        let chunk = o.env.pool().block_size() / lbs * lbs;
        let mut done = 0usize;
        while done < data.len() {
            let n = chunk.min(data.len() - done);
            let at = Lba(lba + (done / lbs) as u64);
            let mut buf = IoBuf::prefix(o.env.pool().get().map_err(device)?, n).map_err(device)?;
            if write {
                buf.as_mut_slice().copy_from_slice(&data[done..done + n]);
                o.qp.write_blocking(&o.ns, at, buf, IoFlags::FUA, IO_TIMEOUT)
                    .map_err(|r| device(r.error))?;
            } else {
                let back =
                    o.qp.read_blocking(&o.ns, at, buf, IO_TIMEOUT)
                        .map_err(|r| device(r.error))?;
                data[done..done + n].copy_from_slice(back.as_slice());
            }
            done += n;
        }
        Ok(())
    }
}

#[pymethods]
impl Env {
    /// Open the NVMe controller at PCI address `nvme` (bound to vfio-pci) with a pool of
    /// `pool_blocks` hugepage blocks of `block_size` bytes.
    #[new]
    #[pyo3(signature = (nvme, block_size = 2 << 20, pool_blocks = 4))]
    fn new(py: Python<'_>, nvme: String, block_size: usize, pool_blocks: usize) -> PyResult<Env> {
        let open = py.detach(|| Env::open(&nvme, block_size, pool_blocks))?;
        Ok(Env {
            inner: Mutex::new(Some(open)),
            addr: nvme,
        })
    }

    /// The controller and its first namespace: model, serial, firmware, nsid, blocks,
    /// block_size.
    fn identify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (info, nsid, blocks, lbs) = self.with(|o| {
            let i = o.env.controller(0).info().clone();
            Ok((i, o.ns.nsid(), o.ns.blocks(), o.ns.lba_size()))
        })?;
        let d = PyDict::new(py);
        d.set_item("address", &self.addr)?;
        d.set_item("model", info.mn.trim())?;
        d.set_item("serial", info.sn.trim())?;
        d.set_item("firmware", info.fr.trim())?;
        d.set_item("nsid", nsid)?;
        d.set_item("blocks", blocks)?;
        d.set_item("block_size", lbs)?;
        Ok(d)
    }

    /// Read `count` logical blocks from `lba` and return them as bytes.
    fn read(&self, py: Python<'_>, lba: u64, count: u64) -> PyResult<Vec<u8>> {
        let v = py.detach(|| {
            self.with(|o| {
                let bytes = count
                    .checked_mul(u64::from(o.ns.lba_size()))
                    .filter(|&b| b <= 1 << 32)
                    .ok_or_else(|| {
                        Error::invalid(format!("{count} blocks is too many for one read"))
                    })?;
                let mut v = vec![0u8; bytes as usize];
                Env::transfer(o, lba, &mut v, false)?;
                Ok(v)
            })
        })?;
        Ok(v)
    }

    /// Read blocks from `lba` into host memory at `addr` (`nbytes`, a whole number of blocks).
    /// Used by `ubdirect.Env.read_into`, which resolves a writable buffer to its address.
    fn _read_to(&self, py: Python<'_>, lba: u64, addr: usize, nbytes: usize) -> PyResult<()> {
        // SAFETY: the Python caller holds a writable buffer export of [addr, addr + nbytes)
        // for the duration of this call.
        let data = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, nbytes) };
        Ok(py.detach(|| self.with(|o| Env::transfer(o, lba, data, false)))?)
    }

    /// Write `data` (a whole number of blocks) at `lba` (FUA: on media when it returns).
    fn write(&self, py: Python<'_>, lba: u64, data: Vec<u8>) -> PyResult<()> {
        let mut data = data;
        Ok(py.detach(|| self.with(|o| Env::transfer(o, lba, &mut data, true)))?)
    }

    /// Close the queue pair, the controller and the pool (later calls raise).
    fn close(&self, py: Python<'_>) {
        let open = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(|| drop(open));
    }

    fn __repr__(&self) -> String {
        format!("Env(nvme={:?})", self.addr)
    }
}
