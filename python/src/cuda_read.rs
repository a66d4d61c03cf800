//! Reading a file range into CUDA device memory the caller owns (a torch tensor, a cupy array):
//! mapped (the page cache registered in windows, copied in place by the copy engines) or staged
//! (pread / O_DIRECT into pinned buffers, each copied while the next is read).

use std::fs::File;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use ubdirect::cuda::{CudaGpu, FileWindow};

use crate::errors::{Error, Result};
use crate::gpu_state::{self, check, wait, Gpu, StreamEnds, STAGE};
use crate::request::{Io, Request, AUTO_MAPPED_RESIDENT, DIRECT_ALIGN};

/// File windows are this long (the last one of a file ends with it), so that reads of any
/// ranges of a file share their windows and a second pass finds them registered: the CLI's
/// window for its default copy size.
pub const WINDOW: u64 = ubdirect::pipeline::DEFAULT_WINDOW_TARGET;
/// Bytes per copy out of a window: the CLI's default copy size.
pub const COPY: u64 = ubdirect::pipeline::DEFAULT_COPY_SIZE as u64;
const _: () = assert!(WINDOW % COPY == 0, "a copy never straddles two windows");

/// How a CUDA read was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// Copied out of registered page cache.
    Mapped,
    /// Read with O_DIRECT into pinned buffers, then copied.
    Direct,
    /// Read through the page cache into pinned buffers, then copied.
    Buffered,
}

impl Done {
    /// The mode's name, as `io=` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Done::Mapped => "mapped",
            Done::Direct => "direct",
            Done::Buffered => "buffered",
        }
    }
}

/// A read whose copies may still run: [`Pending::wait`] returns once they completed (and lets
/// go of the file windows they read); dropping it waits too.
pub struct Pending {
    state: Arc<Mutex<Gpu>>,
    gpu: Arc<CudaGpu>,
    /// Recorded after the read's copies on every stream; `None` once waited for (or for a read
    /// done before `start` returned).
    ends: Option<StreamEnds>,
    /// The windows the copies read.
    held: Vec<Arc<FileWindow>>,
    what: String,
    /// Bytes read.
    pub len: u64,
    /// The path taken.
    pub done: Done,
}

// SAFETY: the events are CUDA driver handles usable from any thread with the context bound
// (`wait` binds it); the windows are Send + Sync.
unsafe impl Send for Pending {}

impl Pending {
    fn finished(state: &Arc<Mutex<Gpu>>, gpu: &Arc<CudaGpu>, len: u64, done: Done) -> Pending {
        Pending {
            state: state.clone(),
            gpu: gpu.clone(),
            ends: None,
            held: Vec::new(),
            what: String::new(),
            len,
            done,
        }
    }

    /// Wait (with a deadline) until every copy of the read completed.
    pub fn wait(mut self) -> Result<Done> {
        self.settle()?;
        Ok(self.done)
    }

    fn settle(&mut self) -> Result<()> {
        let Some(ends) = self.ends.take() else {
            return Ok(());
        };
        let r = self
            .gpu
            .bind()
            .map_err(Error::from)
            .and_then(|()| ends.iter().try_for_each(|&ev| wait(ev, &self.what)));
        if let Err(e) = r {
            // Copies may still read the windows (and record the events): leak both.
            std::mem::forget(std::mem::take(&mut self.held));
            return Err(e);
        }
        self.held.clear();
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        g.give_back_ends(ends);
        Ok(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // The windows must outlive the copies: an error here leaks them (settle says so).
        let _ = self.settle();
    }
}

/// Start reading `req` into device memory `[dst, dst + req.len)` of GPU `ordinal`, choosing
/// the path as the CLI's `--io auto` does: mapped when the range is at least 90 % in the page
/// cache (and the driver registers read-only host memory), else O_DIRECT, else buffered. A
/// mapped read returns once its copies are queued (round-robin over the GPU's copy streams);
/// direct and buffered reads return done.
///
/// `after`: the destination's stream (CUDA Array Interface v3 `stream`: 1 the legacy default
/// stream, 2 the per-thread one, else a handle): the copies start after the work queued on it,
/// which may still use the memory (a tensor's previous owner in torch's caching allocator).
///
/// # Safety
/// `[dst, dst + req.len)` is device memory of GPU `ordinal` that nothing but the work queued on
/// `after` uses until the returned [`Pending`] is waited for (or dropped); `after` is a live
/// stream of that GPU's primary context.
pub unsafe fn start(
    req: &Request,
    dst: u64,
    ordinal: usize,
    io: Io,
    after: Option<u64>,
) -> Result<Pending> {
    let state = gpu_state::gpu(ordinal)?;
    let mut g = state.lock().unwrap_or_else(|p| p.into_inner());
    g.gpu.bind()?;
    let gpu = g.gpu.clone();
    if req.len == 0 {
        return Ok(Pending::finished(&state, &gpu, 0, Done::Buffered));
    }
    if let Some(s) = after {
        g.wait_for_stream(s)?;
    }
    let mapped = match io {
        Io::Mapped => true,
        Io::Auto => req.resident() >= AUTO_MAPPED_RESIDENT && gpu_state::registry(&g.gpu).is_ok(),
        _ => false,
    };
    if mapped {
        // SAFETY: forwarded contract.
        let (held, queued) = unsafe { queue_mapped(req, dst, &mut g) };
        let ends = match g.record_ends() {
            Ok(e) => e,
            Err(e) => {
                // The copies cannot be waited for: their windows must stay.
                std::mem::forget(held);
                return Err(e);
            }
        };
        drop(g);
        let p = Pending {
            state: state.clone(),
            gpu,
            ends: Some(ends),
            held,
            what: format!("copying {} bytes of {}", req.len, req.path),
            len: req.len,
            done: Done::Mapped,
        };
        return match queued {
            Ok(()) => Ok(p),
            Err(e) => {
                p.wait()?;
                Err(e)
            }
        };
    }
    let direct = match io {
        Io::Direct => Some(req.open_direct()?.ok_or_else(|| req.direct_refused())?),
        Io::Auto => req.open_direct()?,
        _ => None,
    };
    // SAFETY: forwarded contract.
    unsafe { read_staged(req, dst, &mut g, direct.as_ref()) }?;
    let done = if direct.is_some() {
        Done::Direct
    } else {
        Done::Buffered
    };
    Ok(Pending::finished(&state, &gpu, req.len, done))
}

/// Read `req` into device memory `[dst, dst + req.len)` of GPU `ordinal`: [`start`], then wait.
///
/// # Safety
/// As [`start`], until the call returns.
pub unsafe fn read(
    req: &Request,
    dst: u64,
    ordinal: usize,
    io: Io,
    after: Option<u64>,
) -> Result<Done> {
    // SAFETY: forwarded contract; the wait below ends the use of `dst`.
    unsafe { start(req, dst, ordinal, io, after) }?.wait()
}

/// Queue copies of `len` bytes from `src` to `dst` in `COPY`-byte pieces, round-robin over the
/// copy streams.
///
/// # Safety
/// `src` stays mapped and registered, and `dst` is device memory nothing else uses, until the
/// streams' copies complete.
unsafe fn copy(g: &mut Gpu, dst: u64, src: *const u8, len: u64) -> Result<()> {
    let mut done = 0u64;
    while done < len {
        let n = COPY.min(len - done);
        let st = g.next_stream();
        // SAFETY: the caller's contract; `done + n <= len`.
        unsafe { copy_on(st, dst + done, src.add(done as usize), n) }?;
        done += n;
    }
    Ok(())
}

/// Queue one copy of `len` bytes from `src` to `dst` on `stream`.
///
/// # Safety
/// As [`copy`]; `stream` is a live stream of the bound context.
unsafe fn copy_on(stream: sys::CUstream, dst: u64, src: *const u8, len: u64) -> Result<()> {
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len as usize, stream) };
    check(r, "cuMemcpyHtoDAsync")
}

/// Record each stream's end and wait for them all.
fn finish(g: &Gpu, what: &str) -> Result<()> {
    for (&ev, &st) in g.dones.iter().zip(&g.streams) {
        // SAFETY: live event and stream of the bound context.
        let r = unsafe { sys::cuEventRecord(ev, st) };
        check(r, "cuEventRecord")?;
    }
    for &ev in &g.dones {
        wait(ev, what)?;
    }
    Ok(())
}

/// The mapped path: each window the range touches is acquired (registered on first use, kept
/// for later reads) and copies out of it queued; returns the windows, which must outlive the
/// copies, and whether every copy was queued.
///
/// # Safety
/// As [`start`].
unsafe fn queue_mapped(req: &Request, dst: u64, g: &mut Gpu) -> (Vec<Arc<FileWindow>>, Result<()>) {
    let mut held: Vec<Arc<FileWindow>> = Vec::new();
    let registry = match gpu_state::registry(&g.gpu) {
        Ok(r) => r,
        Err(e) => return (held, Err(e)),
    };
    let end = req.offset + req.len;
    let mut pos = req.offset;
    while pos < end {
        let wstart = pos / WINDOW * WINDOW;
        let wlen = WINDOW.min(req.size - wstart);
        let win = match registry.acquire(&req.file, wstart, wlen) {
            Ok(w) => w,
            Err(e) => {
                let msg = format!(
                    "{}: the window of file bytes {wstart}..{}: {e}",
                    req.path,
                    wstart + wlen
                );
                return (held, Err(Error::new(crate::errors::Kind::File, msg)));
            }
        };
        let n = (wstart + wlen).min(end) - pos;
        // SAFETY: `win` maps file bytes [wstart, wstart + wlen) and is held in `held` until
        // the copies completed (or leaked if they never do); pos - wstart + n <= wlen.
        let r = unsafe {
            copy(
                g,
                dst + (pos - req.offset),
                win.as_ptr().add((pos - wstart) as usize),
                n,
            )
        };
        held.push(win);
        if r.is_err() {
            return (held, r);
        }
        pos += n;
    }
    (held, Ok(()))
}

/// Read `need` bytes at `offset` of an O_DIRECT file into `buf` (whose length is a multiple of
/// 4096), tolerating a short final read at the end of the file.
fn read_direct(file: &File, buf: &mut [u8], offset: u64, need: usize, path: &str) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut got = 0usize;
    while got < need {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => {
                return Err(Error::file(
                    format!("{path}: short read at offset {}", offset + got as u64),
                    std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                ))
            }
            Ok(n) => {
                got += n;
                // An O_DIRECT read ends short (unaligned) only at the end of the file.
                if n % DIRECT_ALIGN as usize != 0 && got < need {
                    return Err(Error::file(
                        format!("{path}: short read at offset {}", offset + got as u64),
                        std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::file(
                    format!("{path}: O_DIRECT read at offset {}", offset + got as u64),
                    e,
                ))
            }
        }
    }
    Ok(())
}

/// The staged path: `STAGE`-byte pieces read into the pinned buffers in turn, each copied to
/// the GPU while the next is read.
///
/// # Safety
/// As [`read`].
unsafe fn read_staged(req: &Request, dst: u64, g: &mut Gpu, direct: Option<&File>) -> Result<()> {
    g.ensure_stages()?;
    let end = req.offset + req.len;
    let what = format!("copying {} bytes of {}", req.len, req.path);
    let mut pos = req.offset;
    let mut i = 0usize;
    let mut res = Ok(());
    while pos < end {
        let n = (STAGE as u64).min(end - pos);
        let k = i % g.stages.len();
        if g.stages[k].busy {
            res = wait(g.stages[k].event, &what);
            g.stages[k].busy = false;
            if res.is_err() {
                break;
            }
        }
        let stage = g.stages[k].ptr;
        // SAFETY: the stage holds STAGE + 8192 bytes and no copy reads it (its event completed).
        let buf = unsafe { std::slice::from_raw_parts_mut(stage, STAGE + 8192) };
        let lead = match direct {
            Some(f) => {
                let a0 = pos / DIRECT_ALIGN * DIRECT_ALIGN;
                let lead = (pos - a0) as usize;
                let alen = (lead as u64 + n).next_multiple_of(DIRECT_ALIGN) as usize;
                res = read_direct(f, &mut buf[..alen], a0, lead + n as usize, &req.path);
                lead
            }
            None => {
                res =
                    crate::request::pread_exact(&req.file, &mut buf[..n as usize], pos, &req.path);
                0
            }
        };
        if res.is_err() {
            break;
        }
        let st = g.next_stream();
        // SAFETY: the stage is pinned memory we own, not reused before its event completes.
        res = unsafe { copy_on(st, dst + (pos - req.offset), stage.add(lead), n) };
        if res.is_ok() {
            // SAFETY: live event and stream of the bound context.
            res = check(
                unsafe { sys::cuEventRecord(g.stages[k].event, st) },
                "cuEventRecord",
            );
        }
        g.stages[k].busy = true;
        if res.is_err() {
            break;
        }
        pos += n;
        i += 1;
    }
    let fin = finish(g, &what);
    if fin.is_ok() {
        for s in &mut g.stages {
            s.busy = false;
        }
    }
    res.and(fin)
}
