//! [`CudaSinks`]: one CUDA sink per GPU (each with its own streams, events and device ring),
//! blocks striped over them round-robin by block sequence number (`--sink cuda:0,1`,
//! `cuda:all`), with per-GPU byte counts for the report.

use std::time::Duration;

use ubdirect_core::seams::{Sink, SinkError};
use ubdirect_core::UbBuf;
use ubdirect_cuda::CudaSink;

use super::report::GpuShare;
use super::sink_ext::PipelineSink;

/// Several CUDA sinks used as one.
pub struct CudaSinks {
    sinks: Vec<CudaSink>,
    ordinals: Vec<usize>,
    bytes: Vec<u64>,
    block_size: u64,
}

impl std::fmt::Debug for CudaSinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSinks")
            .field("ordinals", &self.ordinals)
            .finish()
    }
}

impl CudaSinks {
    /// Stripe blocks of `block_size` bytes over `sinks` (GPU ordinals `ordinals`): block `s`
    /// (tag `s * block_size`) goes to sink `s % n`.
    pub fn new(sinks: Vec<CudaSink>, ordinals: Vec<usize>, block_size: usize) -> CudaSinks {
        let n = sinks.len();
        CudaSinks {
            sinks,
            ordinals,
            bytes: vec![0; n],
            block_size: block_size.max(1) as u64,
        }
    }

    /// How many GPUs.
    pub fn len(&self) -> usize {
        self.sinks.len()
    }

    /// True when there is no GPU (never, once built by the CLI).
    pub fn is_empty(&self) -> bool {
        self.sinks.is_empty()
    }

    /// Largest copy each GPU's device ring slot holds (the smallest over the GPUs).
    pub fn slot_size(&self) -> usize {
        self.sinks.iter().map(|s| s.slot_size()).min().unwrap_or(0)
    }

    /// The GPU block `seq` goes to.
    pub fn gpu_of(&self, seq: u64) -> usize {
        (seq % self.sinks.len().max(1) as u64) as usize
    }

    /// Queue a copy of host memory registered with CUDA on GPU `g`.
    ///
    /// # Safety
    /// As [`CudaSink::submit_host`]: the memory stays mapped until the copy is reaped.
    pub unsafe fn submit_host(
        &mut self,
        g: usize,
        src: *const u8,
        len: usize,
        tag: u64,
    ) -> Result<(), SinkError> {
        // SAFETY: forwarded contract.
        unsafe { self.sinks[g].submit_host(src, len, tag) }?;
        self.bytes[g] += len as u64;
        Ok(())
    }

    /// Reap completed copies of every GPU: `f(tag, result)`.
    pub fn poll_host(
        &mut self,
        f: &mut dyn FnMut(u64, Result<(), SinkError>),
    ) -> Result<usize, SinkError> {
        let mut n = 0;
        for s in &mut self.sinks {
            n += s.poll_host(usize::MAX, f)?;
        }
        Ok(n)
    }

    /// Copies in flight on all GPUs.
    pub fn copies_in_flight(&self) -> usize {
        self.sinks.iter().map(|s| s.copies_in_flight()).sum()
    }

    /// Wait for every GPU's copies.
    pub fn synchronize(&self) -> Result<(), String> {
        for s in &self.sinks {
            s.synchronize().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Forget the per-GPU byte counts (between runs on the same sinks).
    pub fn reset_counts(&mut self) {
        self.bytes.iter_mut().for_each(|b| *b = 0);
    }

    /// Per-GPU figures over `wall` (empty for a single GPU: the run's own figures say it all).
    pub fn shares(&self, wall: Duration) -> Vec<GpuShare> {
        if self.sinks.len() < 2 {
            return Vec::new();
        }
        let s = wall.as_secs_f64().max(1e-9);
        self.sinks
            .iter()
            .zip(&self.ordinals)
            .zip(&self.bytes)
            .map(|((sink, o), &b)| GpuShare {
                gpu: format!("cuda:{o} ({})", sink.gpu().name()),
                bytes: b,
                gb_per_s: b as f64 / 1e9 / s,
            })
            .collect()
    }
}

impl Sink for CudaSinks {
    fn submit(&mut self, buf: UbBuf, len: usize, tag: u64) -> Result<(), (UbBuf, SinkError)> {
        let g = self.gpu_of(tag / self.block_size);
        self.sinks[g].submit(buf, len, tag)?;
        self.bytes[g] += len as u64;
        Ok(())
    }

    fn poll(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(UbBuf, u64, Result<(), SinkError>),
    ) -> Result<usize, SinkError> {
        let mut n = 0;
        for s in &mut self.sinks {
            if n >= max {
                break;
            }
            n += s.poll(max - n, f)?;
        }
        Ok(n)
    }

    fn in_flight(&self) -> usize {
        self.sinks.iter().map(|s| s.in_flight()).sum()
    }
}

impl PipelineSink for CudaSinks {
    fn name(&self) -> String {
        match &self.sinks[..] {
            [one] => PipelineSink::name(one),
            many => format!(
                "cuda:{} ({}x {})",
                self.ordinals
                    .iter()
                    .map(|o| o.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                many.len(),
                many[0].gpu().name()
            ),
        }
    }

    fn delivered_checksum(&mut self) -> Option<Result<u64, String>> {
        // The checksum is a sum over words: the GPUs' partial sums add up to the whole.
        let mut sum = 0u64;
        for s in &mut self.sinks {
            match s.checksum() {
                Ok(v) => sum = sum.wrapping_add(v),
                Err(e) => return Some(Err(e.to_string())),
            }
        }
        Some(Ok(sum))
    }

    fn copy_classic(&mut self, data: &[u8], offset: u64) -> Result<(), String> {
        let g = self.gpu_of(offset / self.block_size);
        self.bytes[g] += data.len() as u64;
        self.sinks[g].copy_classic(data, offset)
    }

    fn finish_classic(&mut self) -> Result<(), String> {
        self.synchronize()
    }
}
