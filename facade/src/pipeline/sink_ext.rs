//! What the pipeline needs from a sink beyond the core `Sink` seam: the checksum of what was
//! delivered (for `--verify`) and the classic copy path (for `--mode copy`).

use ubdirect_core::seams::Sink;

/// A sink the pipeline can verify and A/B against the classic path.
pub trait PipelineSink: Sink {
    /// Short name for reports ("cuda:0", "null", "bar").
    fn name(&self) -> String;
    /// Checksum (see `ubdirect_core::util::checksum::checksum_at`) of everything delivered since
    /// the start, when this sink computes one; `None` when it does not verify.
    fn delivered_checksum(&mut self) -> Option<Result<u64, String>>;
    /// The classic path: consume `data` (pageable memory, stream offset `offset`) synchronously,
    /// e.g. a pageable cudaMemcpy. Used by `--mode copy`.
    fn copy_classic(&mut self, data: &[u8], offset: u64) -> Result<(), String>;
    /// Wait for everything submitted through `copy_classic` to finish.
    fn finish_classic(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// `UBD-HOSTCHECK` lines proving on the host where the data landed (BAR sinks); none by default.
    fn hostcheck_lines(&self, _name: &str, _dest_file: &str, _src_file: &str) -> Vec<String> {
        Vec::new()
    }
}

/// CUDA device memory as a pipeline sink (feature `cuda`).
#[cfg(feature = "cuda")]
impl PipelineSink for ubdirect_cuda::CudaSink {
    fn name(&self) -> String {
        format!("cuda ({})", self.gpu().name())
    }
    fn delivered_checksum(&mut self) -> Option<Result<u64, String>> {
        Some(self.checksum().map_err(|e| e.to_string()))
    }
    fn copy_classic(&mut self, data: &[u8], offset: u64) -> Result<(), String> {
        self.copy_pageable(data, offset).map_err(|e| e.to_string())
    }
    fn finish_classic(&mut self) -> Result<(), String> {
        self.synchronize().map_err(|e| e.to_string())
    }
}
