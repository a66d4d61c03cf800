//! What a mapped-file run copies into: [`MappedSink`], host-to-device copies straight out of
//! registered host memory, striped over one or more GPUs ([`CudaSinks`]; host tests use a fake).

use std::time::Duration;

use ubdirect_core::seams::SinkError;

use super::cuda_sinks::CudaSinks;
use super::report::GpuShare;

/// Copies from registered host memory, reaped by tag.
///
/// # Safety
/// The mapped run lets go of (and may unpin and unmap) a window once every copy from it was
/// reported complete: an implementation reports a copy complete through
/// [`MappedSink::poll_host`] only once nothing reads its source any more, and
/// [`MappedSink::synchronize`] returns `Ok` only when no copy reads any source.
pub unsafe trait MappedSink {
    /// Devices the copies are striped over (at least 1).
    fn devices(&self) -> usize;
    /// The device copy `seq` goes to.
    fn device_of(&self, seq: u64) -> usize;
    /// Largest copy the sink takes, in bytes.
    fn max_copy(&self) -> usize;
    /// Queue a copy of `len` bytes at `src` to device `d`, reported later with `tag`. A sink
    /// with no room left refuses it with [`ubdirect_core::seams::SinkErrorKind::Full`].
    ///
    /// # Safety
    /// `[src, src + len)` stays mapped and registered until the copy is reported complete.
    unsafe fn submit_host(
        &mut self,
        d: usize,
        src: *const u8,
        len: usize,
        tag: u64,
    ) -> Result<(), SinkError>;
    /// Reap completed copies: `f(tag, result)` for each.
    fn poll_host(
        &mut self,
        f: &mut dyn FnMut(u64, Result<(), SinkError>),
    ) -> Result<usize, SinkError>;
    /// Copies queued and not yet reaped.
    fn copies_in_flight(&self) -> usize;
    /// Wait until no copy runs.
    fn synchronize(&self) -> Result<(), String>;
    /// Per-device figures over `wall` (empty for one device).
    fn shares(&self, wall: Duration) -> Vec<GpuShare>;
    /// The sink's name for reports.
    fn name(&self) -> String;
}

// SAFETY: CudaSink reports a copy complete only once its event completed (the copy engine is
// done reading), and `synchronize` waits for every stream and the context.
unsafe impl MappedSink for CudaSinks {
    fn devices(&self) -> usize {
        self.len().max(1)
    }
    fn device_of(&self, seq: u64) -> usize {
        self.gpu_of(seq)
    }
    fn max_copy(&self) -> usize {
        self.slot_size()
    }
    unsafe fn submit_host(
        &mut self,
        d: usize,
        src: *const u8,
        len: usize,
        tag: u64,
    ) -> Result<(), SinkError> {
        // SAFETY: forwarded contract.
        unsafe { CudaSinks::submit_host(self, d, src, len, tag) }
    }
    fn poll_host(
        &mut self,
        f: &mut dyn FnMut(u64, Result<(), SinkError>),
    ) -> Result<usize, SinkError> {
        CudaSinks::poll_host(self, f)
    }
    fn copies_in_flight(&self) -> usize {
        CudaSinks::copies_in_flight(self)
    }
    fn synchronize(&self) -> Result<(), String> {
        CudaSinks::synchronize(self)
    }
    fn shares(&self, wall: Duration) -> Vec<GpuShare> {
        CudaSinks::shares(self, wall)
    }
    fn name(&self) -> String {
        super::sink_ext::PipelineSink::name(self)
    }
}
