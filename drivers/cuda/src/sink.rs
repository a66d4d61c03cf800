//! [`CudaSink`]: host -> device stream copies out of registered UB buffers, one event per copy;
//! a buffer goes back to the caller only after its copy's event completed. Several streams
//! overlap copies; an optional checksum kernel runs after each copy on the same stream.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{result, CudaFunction};
use ubdirect_core::seams::{Sink, SinkError, SinkErrorKind};
use ubdirect_core::{UbBuf, UbRegion};

use crate::error::{drv, CudaError};
use crate::gpu::CudaGpu;
use crate::host_register::HostRegistration;
use crate::kernel::load_checksum_kernel;
use crate::slots::Slots;

/// How long a pageable copy waits for the device work still using its slot.
const SLOT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Copy streams per GPU by default (the CLI's `--streams`): host-to-device copies spread
/// round-robin over several streams run on several copy engines at once.
pub const DEFAULT_STREAMS: usize = 4;

/// How to build a [`CudaSink`].
#[derive(Debug, Clone)]
pub struct CudaSinkConfig {
    /// GPU ordinal.
    pub ordinal: usize,
    /// Copy streams to overlap copies over.
    pub streams: usize,
    /// Maximum copies in flight (= device ring slots).
    pub depth: usize,
    /// Largest copy in bytes (= device ring slot size).
    pub block_size: usize,
    /// Run the checksum kernel after every copy (tags are then stream byte offsets).
    pub verify: bool,
}

struct InFlight {
    /// The pool buffer copied from; `None` for a [`CudaSink::submit_host`] copy.
    buf: Option<UbBuf>,
    tag: u64,
}

/// The CUDA sink.
pub struct CudaSink {
    gpu: Arc<CudaGpu>,
    _regs: Vec<HostRegistration>,
    /// The DMA domain of the registered regions: buffers of another domain are refused.
    domain: Option<ubdirect_core::DomainId>,
    streams: Vec<sys::CUstream>,
    events: Vec<sys::CUevent>,
    fifo: Vec<VecDeque<u32>>,
    slots: Vec<Option<InFlight>>,
    ring: Slots,
    next_stream: usize,
    dev: sys::CUdeviceptr,
    slot_size: usize,
    acc: sys::CUdeviceptr,
    kernel: Option<CudaFunction>,
    grid: u32,
}

// SAFETY: the raw CUDA handles are plain driver handles usable from any thread once the
// context is made current (every entry point binds it); the sink is used by one thread at a time.
unsafe impl Send for CudaSink {}

impl std::fmt::Debug for CudaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSink")
            .field("gpu", &self.gpu.name())
            .field("streams", &self.streams.len())
            .field("depth", &self.slots.len())
            .field("slot_size", &self.slot_size)
            .field("verify", &self.kernel.is_some())
            .finish()
    }
}

impl CudaSink {
    /// Open the GPU, register `regions` (the pool's host memory, all of one DMA domain) once,
    /// create the streams, events and the device ring. `regions` may be empty (copies then go
    /// through CUDA's staging); otherwise a buffer of another domain is refused at submit.
    pub fn new(cfg: &CudaSinkConfig, regions: &[Arc<UbRegion>]) -> Result<CudaSink, CudaError> {
        if cfg.depth == 0 || cfg.block_size == 0 || cfg.streams == 0 {
            return Err(CudaError::Invalid(format!(
                "CUDA sink needs depth, block size and streams > 0 (got {}, {}, {})",
                cfg.depth, cfg.block_size, cfg.streams
            )));
        }
        let domain = regions.first().map(|r| r.domain());
        if let Some(r) = regions.iter().find(|r| Some(r.domain()) != domain) {
            return Err(CudaError::Invalid(format!(
                "CUDA sink regions must share one DMA domain: region {} is mapped in {}, region {} in {}",
                regions[0].id,
                regions[0].domain(),
                r.id,
                r.domain()
            )));
        }
        let gpu = CudaGpu::open(cfg.ordinal)?;
        gpu.bind()?;
        let mut regs = Vec::with_capacity(regions.len());
        for r in regions {
            regs.push(HostRegistration::new(&gpu, r)?);
        }
        let kernel = if cfg.verify {
            Some(load_checksum_kernel(&gpu)?)
        } else {
            None
        };
        let sms = gpu
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(32)
            .max(1) as u32;
        let bytes = cfg
            .depth
            .checked_mul(cfg.block_size)
            .ok_or_else(|| CudaError::Invalid("device ring size overflows".into()))?;
        // SAFETY: plain allocation in the current (bound) context; freed in Drop.
        let dev = unsafe { result::malloc_sync(bytes) }.map_err(drv("cuMemAlloc (device ring)"))?;
        let mut sink = CudaSink {
            gpu,
            _regs: regs,
            domain,
            streams: Vec::new(),
            events: Vec::new(),
            fifo: Vec::new(),
            slots: Vec::new(),
            ring: Slots::new(cfg.depth),
            next_stream: 0,
            dev,
            slot_size: cfg.block_size,
            acc: 0,
            kernel,
            grid: sms * 2,
        };
        sink.slots.resize_with(cfg.depth, || None);
        if sink.kernel.is_some() {
            // SAFETY: 8-byte allocation in the bound context, freed in Drop.
            sink.acc = unsafe { result::malloc_sync(8) }.map_err(drv("cuMemAlloc (checksum)"))?;
            sink.reset_checksum()?;
        }
        for _ in 0..cfg.streams {
            let s = result::stream::create(result::stream::StreamKind::NonBlocking)
                .map_err(drv("cuStreamCreate"))?;
            sink.streams.push(s);
            sink.fifo.push(VecDeque::with_capacity(cfg.depth));
        }
        for _ in 0..cfg.depth {
            let e = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(drv("cuEventCreate"))?;
            sink.events.push(e);
        }
        Ok(sink)
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<CudaGpu> {
        &self.gpu
    }

    /// Zero the device-side checksum.
    pub fn reset_checksum(&mut self) -> Result<(), CudaError> {
        if self.acc == 0 {
            return Err(CudaError::Invalid(
                "the sink was built without verify".into(),
            ));
        }
        self.gpu.bind()?;
        // SAFETY: `acc` is an 8-byte device allocation of this context.
        unsafe { sys::cuMemsetD8_v2(self.acc, 0, 8) }
            .result()
            .map_err(drv("cuMemsetD8"))
    }

    /// Wait for every stream, then read the device-side checksum of everything copied so far.
    pub fn checksum(&mut self) -> Result<u64, CudaError> {
        if self.acc == 0 {
            return Err(CudaError::Invalid(
                "the sink was built without verify".into(),
            ));
        }
        self.synchronize()?;
        let mut v = [0u64; 1];
        // SAFETY: copies 8 bytes from the 8-byte device allocation `acc` into `v`.
        unsafe { result::memcpy_dtoh_sync(&mut v[..], self.acc) }
            .map_err(drv("cuMemcpyDtoH (checksum)"))?;
        Ok(v[0])
    }

    /// Wait for all copies and kernels (the null stream included).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.gpu.bind()?;
        for &s in &self.streams {
            // SAFETY: `s` is a live stream of this context.
            unsafe { result::stream::synchronize(s) }.map_err(drv("cuStreamSynchronize"))?;
        }
        result::ctx::synchronize().map_err(drv("cuCtxSynchronize"))
    }

    /// The classic path for A/B: a synchronous copy from pageable memory (cuMemcpyHtoD), then the
    /// checksum kernel when verifying. `offset` is the data's byte offset in the stream. The copy
    /// takes a device slot no asynchronous copy holds and, when work of an earlier pageable copy
    /// may still use that slot (the DMA from CUDA's staging buffer, the checksum kernel), waits
    /// for the slot's event first.
    pub fn copy_pageable(&mut self, data: &[u8], offset: u64) -> Result<(), CudaError> {
        if data.len() > self.slot_size {
            return Err(CudaError::Invalid(format!(
                "{} bytes exceed the {}-byte device slot",
                data.len(),
                self.slot_size
            )));
        }
        self.gpu.bind()?;
        let Some(t) = self.ring.take_pageable() else {
            return Err(CudaError::Invalid(format!(
                "all {} device slots hold asynchronous copies in flight: poll before a pageable copy",
                self.ring.len()
            )));
        };
        let event = self.events[t.slot as usize];
        if t.wait {
            if let Err(e) = wait_event(event, SLOT_WAIT) {
                // Still in use, or failed: the next taker waits (or fails) again.
                self.ring.pageable_queued(t.slot);
                return Err(e);
            }
        }
        let dst = self.dev + (t.slot as usize * self.slot_size) as u64;
        // SAFETY: `dst` has room for `data.len()` bytes (checked above) and no other work uses
        // the slot (no asynchronous copy holds it; earlier pageable work was waited for); the
        // copy is synchronous with respect to the source buffer, which stays borrowed.
        let r = unsafe { sys::cuMemcpyHtoD_v2(dst, data.as_ptr().cast(), data.len()) }
            .result()
            .map_err(drv("cuMemcpyHtoD"));
        let r = r.and_then(|()| {
            // The legacy null stream orders this kernel after the copy above.
            self.launch_checksum(dst, data.len(), offset, std::ptr::null_mut())
        });
        // SAFETY: a live event of this context, recorded on the null stream after the work above.
        let rec = unsafe { result::event::record(event, std::ptr::null_mut()) }
            .map_err(drv("cuEventRecord (pageable copy)"));
        match rec {
            Ok(()) => self.ring.pageable_queued(t.slot),
            Err(e) => {
                // The slot's work cannot be tracked: wait for all of it before anyone reuses it.
                self.synchronize()?;
                r?;
                return Err(e);
            }
        }
        r
    }

    fn launch_checksum(
        &self,
        dst: sys::CUdeviceptr,
        len: usize,
        offset: u64,
        stream: sys::CUstream,
    ) -> Result<(), CudaError> {
        let Some(k) = &self.kernel else { return Ok(()) };
        let mut p_data = dst;
        let mut p_len = len as u64;
        let mut p_base = offset / 8;
        let mut p_acc = self.acc;
        let mut params: [*mut c_void; 4] = [
            (&mut p_data as *mut u64).cast(),
            (&mut p_len as *mut u64).cast(),
            (&mut p_base as *mut u64).cast(),
            (&mut p_acc as *mut u64).cast(),
        ];
        // SAFETY: the kernel takes (u64*, u64, u64, u64*), matching the four 8-byte params; the
        // driver copies the parameter values at launch, and both device pointers are live.
        unsafe {
            result::launch_kernel(
                k.cu_function(),
                (self.grid, 1, 1),
                (256, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .map_err(drv("cuLaunchKernel (checksum)"))
    }

    /// Queue a copy of `len` bytes at host address `src` (memory registered with CUDA, e.g. a
    /// [`crate::FileWindow`]) into a device slot; [`CudaSink::poll_host`] reports `tag` when it
    /// completed. `Full` when every slot is in flight.
    ///
    /// # Safety
    /// `[src, src + len)` must stay mapped (and registered) until `poll_host` (or `synchronize`,
    /// or dropping the sink) reported the copy complete.
    pub unsafe fn submit_host(
        &mut self,
        src: *const u8,
        len: usize,
        tag: u64,
    ) -> Result<(), SinkError> {
        let slot = self.submit_inner(src, len, len, tag)?;
        self.slots[slot as usize] = Some(InFlight { buf: None, tag });
        Ok(())
    }

    /// Reap completed copies (of either kind) in order per stream: `f(tag, result)` for each;
    /// pool buffers of [`Sink::submit`] copies go back to their pool.
    pub fn poll_host(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(u64, Result<(), SinkError>),
    ) -> Result<usize, SinkError> {
        self.poll_inner(max, &mut |_buf, tag, r| f(tag, r))
    }

    /// Copies in flight.
    pub fn copies_in_flight(&self) -> usize {
        self.ring.in_flight()
    }

    /// Bytes per device ring slot (the largest copy).
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Device ring slots (the most copies in flight).
    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    fn poll_inner(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(Option<UbBuf>, u64, Result<(), SinkError>),
    ) -> Result<usize, SinkError> {
        let mut n = 0;
        for si in 0..self.fifo.len() {
            while n < max {
                let Some(&slot) = self.fifo[si].front() else {
                    break;
                };
                // SAFETY: the event is a live handle recorded on this stream.
                let r = unsafe { sys::cuEventQuery(self.events[slot as usize]) };
                let res = match r {
                    CUresult::CUDA_SUCCESS => Ok(()),
                    CUresult::CUDA_ERROR_NOT_READY => break,
                    other => Err(SinkError::new(
                        SinkErrorKind::Device,
                        format!("copy to GPU failed: {other:?}"),
                    )),
                };
                self.fifo[si].pop_front();
                self.ring.complete(slot);
                match self.slots[slot as usize].take() {
                    Some(InFlight { buf, tag }) => {
                        f(buf, tag, res);
                        n += 1;
                    }
                    None => {
                        return Err(SinkError::new(
                            SinkErrorKind::Other,
                            format!("CUDA sink slot {slot} completed twice (bug)"),
                        ))
                    }
                }
            }
        }
        Ok(n)
    }

    fn submit_inner(
        &mut self,
        src: *const u8,
        avail: usize,
        len: usize,
        tag: u64,
    ) -> Result<u32, SinkError> {
        if len == 0 || len > avail || len > self.slot_size {
            return Err(SinkError::new(
                SinkErrorKind::InvalidRequest,
                format!(
                    "copy of {len} bytes from a {avail}-byte buffer into {}-byte device slots",
                    self.slot_size
                ),
            ));
        }
        if self.kernel.is_some() && tag % 8 != 0 {
            return Err(SinkError::new(
                SinkErrorKind::InvalidRequest,
                format!("verify needs 8-byte aligned stream offsets as tags, got {tag}"),
            ));
        }
        let Some(t) = self.ring.take_async() else {
            return Err(SinkError::new(
                SinkErrorKind::Full,
                format!(
                    "{} copies in flight: poll before submitting more",
                    self.slots.len()
                ),
            ));
        };
        let slot = t.slot;
        let fail = |call: &str, e: cudarc::driver::DriverError| {
            SinkError::new(SinkErrorKind::Device, format!("{call} failed: {e:?}"))
        };
        if let Err(e) = self.gpu.bind() {
            self.ring.undo(t);
            return Err(SinkError::new(SinkErrorKind::Device, e.to_string()));
        }
        let si = self.next_stream;
        self.next_stream = (si + 1) % self.streams.len();
        let stream = self.streams[si];
        if t.wait {
            // A pageable copy's work may still use the slot: the stream waits for its event.
            // SAFETY: live event and stream of this context.
            let r = unsafe { sys::cuStreamWaitEvent(stream, self.events[slot as usize], 0) };
            if let Err(e) = r.result() {
                self.ring.undo(t);
                return Err(fail("cuStreamWaitEvent", e));
            }
        }
        let dst = self.dev + (slot as usize * self.slot_size) as u64;
        // SAFETY: the source (a pool buffer owned by the slot table, or host memory the caller
        // of `submit_host` keeps mapped) lives until this copy's event completes; `dst` is a
        // `slot_size` slot of the device ring and len <= slot_size.
        let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream) }.result();
        if let Err(e) = r {
            self.ring.undo(t);
            return Err(fail("cuMemcpyHtoDAsync", e));
        }
        if let Err(e) = self.launch_checksum(dst, len, tag, stream) {
            // The copy is queued: the slot must wait for the stream before reuse.
            let _ = self.synchronize();
            self.ring.complete(slot);
            return Err(SinkError::new(SinkErrorKind::Device, e.to_string()));
        }
        // SAFETY: event and stream are live handles of this context.
        if let Err(e) = unsafe { result::event::record(self.events[slot as usize], stream) } {
            let _ = self.synchronize();
            self.ring.complete(slot);
            return Err(fail("cuEventRecord", e));
        }
        self.fifo[si].push_back(slot);
        Ok(slot)
    }
}

/// Wait until `event` completed, at most `limit`.
fn wait_event(event: sys::CUevent, limit: std::time::Duration) -> Result<(), CudaError> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        // SAFETY: a live event handle.
        match unsafe { sys::cuEventQuery(event) } {
            CUresult::CUDA_SUCCESS => return Ok(()),
            CUresult::CUDA_ERROR_NOT_READY if std::time::Instant::now() < deadline => {
                std::thread::yield_now()
            }
            CUresult::CUDA_ERROR_NOT_READY => {
                return Err(CudaError::Invalid(format!(
                    "the device work of an earlier pageable copy did not finish within {} s (GPU hung?)",
                    limit.as_secs()
                )))
            }
            other => {
                return Err(CudaError::Invalid(format!(
                    "an earlier pageable copy failed on the device: {other:?}"
                )))
            }
        }
    }
}

impl Sink for CudaSink {
    fn submit(&mut self, buf: UbBuf, len: usize, tag: u64) -> Result<(), (UbBuf, SinkError)> {
        if let Some(domain) = self.domain {
            if let Err(e) = buf.region().check_dma(domain) {
                return Err((
                    buf,
                    SinkError::new(SinkErrorKind::InvalidRequest, e.to_string()),
                ));
            }
        }
        // The GPU reads the block: a file region's file must be as it was registered.
        if let Err(e) = buf.region().check_file() {
            return Err((
                buf,
                SinkError::new(SinkErrorKind::InvalidRequest, e.to_string()),
            ));
        }
        match self.submit_inner(buf.as_ptr(), buf.len(), len, tag) {
            Ok(slot) => {
                self.slots[slot as usize] = Some(InFlight {
                    buf: Some(buf),
                    tag,
                });
                Ok(())
            }
            Err(e) => Err((buf, e)),
        }
    }

    fn poll(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(UbBuf, u64, Result<(), SinkError>),
    ) -> Result<usize, SinkError> {
        // Host copies (submit_host) complete here too; they have no buffer to hand back.
        self.poll_inner(max, &mut |buf, tag, r| {
            if let Some(buf) = buf {
                f(buf, tag, r)
            }
        })
    }

    fn in_flight(&self) -> usize {
        self.ring.in_flight()
    }
}

impl Drop for CudaSink {
    fn drop(&mut self) {
        if let Err(e) = self.synchronize() {
            // Copies may still read these buffers: leak them rather than hand them back.
            tracing::error!("CUDA sink drop: {e}; leaking in-flight buffers");
            for s in self.slots.iter_mut() {
                if let Some(InFlight { buf: Some(b), .. }) = s.take() {
                    std::mem::forget(b);
                }
            }
            return;
        }
        self.slots.clear();
        for &e in &self.events {
            // SAFETY: live event of this context, no longer recorded on any stream.
            unsafe { result::event::destroy(e) }.ok();
        }
        for &s in &self.streams {
            // SAFETY: live stream, drained above.
            unsafe { result::stream::destroy(s) }.ok();
        }
        // SAFETY: device allocations made in `new`, not used by any pending work.
        unsafe {
            result::free_sync(self.dev).ok();
            if self.acc != 0 {
                result::free_sync(self.acc).ok();
            }
        }
    }
}
