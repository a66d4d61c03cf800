//! Per-GPU state the package keeps for the life of the process: the opened GPU, its copy
//! streams, events, and pinned staging buffers (made on first use); and the one registry of
//! file windows (page cache mapped and registered with CUDA) shared by every GPU.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use ubdirect::cuda::{CudaGpu, CudaHostPinner, FileWindowRegistry};

use crate::errors::{Error, Kind, Result};

/// Longest wait for one copy (or a batch of copies) to complete.
pub const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// Bytes per pinned staging buffer (buffered and direct reads into GPU memory).
pub const STAGE: usize = 32 << 20;
/// Staging buffers per GPU (one is read into while the other is copied).
pub const STAGES: usize = 2;
/// Copy streams per GPU, as many as the CLI's CUDA sink: copies queued round-robin over them
/// run on several copy engines at once.
pub const COPY_STREAMS: usize = ubdirect::cuda::DEFAULT_STREAMS;

/// One event per copy stream, recorded at the end of a read's copies.
pub type StreamEnds = [sys::CUevent; COPY_STREAMS];

/// Turn a CUDA status into a result naming the call.
pub fn check(r: sys::CUresult, call: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(Kind::Cuda, format!("{call} failed: {r:?}")))
    }
}

/// A pinned host buffer and the event of the last copy out of it.
pub struct Stage {
    /// Page-aligned pinned memory of `STAGE + 2 * 4096` bytes (room for O_DIRECT's lead-in).
    pub ptr: *mut u8,
    /// Recorded after the last copy out of the buffer.
    pub event: sys::CUevent,
    /// A copy out of the buffer may still run.
    pub busy: bool,
}

/// One GPU's copy machinery.
pub struct Gpu {
    /// The GPU (its primary context, which torch and cupy use too).
    pub gpu: Arc<CudaGpu>,
    /// The copy streams.
    pub streams: Vec<sys::CUstream>,
    /// One per stream: recorded after a batch of copies.
    pub dones: Vec<sys::CUevent>,
    /// The stream the next copy goes to.
    pub next: usize,
    /// Staging buffers, made on first use.
    pub stages: Vec<Stage>,
    /// Event sets of reads that completed, for the next reads to record.
    spare_ends: Vec<StreamEnds>,
}

// SAFETY: CUDA driver handles (streams, events, pinned memory) may be used from any thread once
// the owning context is current; every use binds the context first and holds the Gpu's mutex.
unsafe impl Send for Gpu {}

fn event() -> Result<sys::CUevent> {
    let mut ev = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; the calling thread has the context bound.
    let r =
        unsafe { sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) };
    check(r, "cuEventCreate")?;
    Ok(ev)
}

impl Gpu {
    fn open(ordinal: usize) -> Result<Gpu> {
        let gpu = CudaGpu::open(ordinal)?;
        gpu.bind()?;
        let mut streams = Vec::with_capacity(COPY_STREAMS);
        let mut dones = Vec::with_capacity(COPY_STREAMS);
        for _ in 0..COPY_STREAMS {
            let mut stream = std::ptr::null_mut();
            // SAFETY: out-pointer to a local; the context is bound.
            let r = unsafe {
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                )
            };
            check(r, "cuStreamCreate")?;
            streams.push(stream);
            dones.push(event()?);
        }
        Ok(Gpu {
            gpu,
            streams,
            dones,
            next: 0,
            stages: Vec::new(),
            spare_ends: Vec::new(),
        })
    }

    /// Make the copy streams wait for the work queued so far on `stream` (a CUDA Array
    /// Interface stream value: 1 legacy default, 2 per-thread default, else a handle).
    pub fn wait_for_stream(&mut self, stream: u64) -> Result<()> {
        let s = stream as usize as sys::CUstream;
        // SAFETY: `dones[0]` is a live event of the bound context; `s` is the caller's stream
        // of the same context (the CUDA Array Interface contract), or one of the two special
        // default-stream handles the driver accepts.
        let r = unsafe { sys::cuEventRecord(self.dones[0], s) };
        check(r, "cuEventRecord")?;
        for &st in &self.streams {
            // SAFETY: live stream and event of the bound context.
            let r = unsafe { sys::cuStreamWaitEvent(st, self.dones[0], 0) };
            check(r, "cuStreamWaitEvent")?;
        }
        Ok(())
    }

    /// The stream for the next copy (round-robin).
    pub fn next_stream(&mut self) -> sys::CUstream {
        let s = self.streams[self.next % self.streams.len()];
        self.next = self.next.wrapping_add(1);
        s
    }

    /// Record an event at the end of every copy stream (the copies queued so far); the set
    /// goes back with [`Gpu::give_back_ends`] once they completed.
    pub fn record_ends(&mut self) -> Result<StreamEnds> {
        let ends = match self.spare_ends.pop() {
            Some(e) => e,
            None => {
                let mut e = [std::ptr::null_mut(); COPY_STREAMS];
                for ev in &mut e {
                    *ev = event()?;
                }
                e
            }
        };
        for (&ev, &st) in ends.iter().zip(&self.streams) {
            // SAFETY: live event and stream of the bound context.
            let r = unsafe { sys::cuEventRecord(ev, st) };
            if let Err(e) = check(r, "cuEventRecord") {
                self.spare_ends.push(ends);
                return Err(e);
            }
        }
        Ok(ends)
    }

    /// Keep an event set from [`Gpu::record_ends`] whose events completed, for reuse.
    pub fn give_back_ends(&mut self, ends: StreamEnds) {
        self.spare_ends.push(ends);
    }

    /// Make the staging buffers (once).
    pub fn ensure_stages(&mut self) -> Result<()> {
        while self.stages.len() < STAGES {
            let mut p = std::ptr::null_mut();
            // SAFETY: out-pointer to a local; the context is bound by the caller.
            let r =
                unsafe { sys::cuMemHostAlloc(&mut p, STAGE + 8192, sys::CU_MEMHOSTALLOC_PORTABLE) };
            check(r, "cuMemHostAlloc")?;
            self.stages.push(Stage {
                ptr: p.cast(),
                event: event()?,
                busy: false,
            });
        }
        Ok(())
    }
}

/// Wait (polling, with a deadline) until `ev` completed; `what` names the work in the error.
pub fn wait(ev: sys::CUevent, what: &str) -> Result<()> {
    let deadline = Instant::now() + WAIT_LIMIT;
    let mut polls = 0u32;
    loop {
        // SAFETY: a live event of the bound context.
        match unsafe { sys::cuEventQuery(ev) } {
            sys::CUresult::CUDA_SUCCESS => return Ok(()),
            sys::CUresult::CUDA_ERROR_NOT_READY => {}
            r => return check(r, "cuEventQuery"),
        }
        if Instant::now() > deadline {
            return Err(Error::new(
                Kind::Cuda,
                format!(
                    "{what} did not complete within {} s (GPU hung or reset?)",
                    WAIT_LIMIT.as_secs()
                ),
            ));
        }
        polls += 1;
        if polls < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Process-wide GPUs, opened on first use.
static GPUS: Mutex<Vec<Option<Arc<Mutex<Gpu>>>>> = Mutex::new(Vec::new());

/// GPU `ordinal`'s state (opened on first use).
pub fn gpu(ordinal: usize) -> Result<Arc<Mutex<Gpu>>> {
    let mut all = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    if all.len() <= ordinal {
        all.resize_with(ordinal + 1, || None);
    }
    if let Some(g) = &all[ordinal] {
        return Ok(g.clone());
    }
    let g = Arc::new(Mutex::new(Gpu::open(ordinal)?));
    all[ordinal] = Some(g.clone());
    Ok(g)
}

/// Most bytes of file windows kept registered: the facade's default (half the RAM), as the
/// CLI's `--map-cap`.
fn map_cap() -> u64 {
    ubdirect::pipeline::map_cap(&ubdirect::pipeline::MappedSettings::default())
}

static REGISTRY: OnceLock<Arc<FileWindowRegistry>> = OnceLock::new();

/// The file-window registry, pinning through `gpu` on first use (registrations are PORTABLE:
/// every GPU's copy engines read them). Fails when the driver cannot register read-only host
/// memory.
pub fn registry(gpu: &Arc<CudaGpu>) -> Result<Arc<FileWindowRegistry>> {
    if let Some(r) = REGISTRY.get() {
        return Ok(r.clone());
    }
    let pinner = Arc::new(CudaHostPinner::new(gpu)?);
    Ok(REGISTRY
        .get_or_init(|| Arc::new(FileWindowRegistry::new(pinner, map_cap())))
        .clone())
}

/// Bytes of file windows registered now.
pub fn registered_bytes() -> u64 {
    REGISTRY.get().map(|r| r.held_bytes()).unwrap_or(0)
}

/// Let go of every registered file window that no read holds.
pub fn release_windows() {
    if let Some(r) = REGISTRY.get() {
        r.clear();
    }
}

/// The ordinal of the GPU holding device pointer `ptr`; a clear error when it is not CUDA
/// device memory.
pub fn ordinal_of(ptr: u64) -> Result<usize> {
    let count = CudaGpu::count();
    if count == 0 {
        ubdirect::cuda::driver_available()?;
        return Err(Error::new(
            Kind::CudaUnavailable,
            "the CUDA driver sees no GPU: a CUDA destination cannot be read into here",
        ));
    }
    let mut ordinal: i32 = -1;
    // SAFETY: out-pointer to a local i32 (the attribute's type); cuInit ran in CudaGpu::count.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS || ordinal < 0 {
        return Err(Error::invalid(format!(
            "the destination's address {ptr:#x} is not CUDA memory this process can see ({r:?})"
        )));
    }
    Ok(ordinal as usize)
}
