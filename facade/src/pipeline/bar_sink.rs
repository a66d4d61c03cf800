//! [`BarSink`]: for pools carved from a device BAR window (a GPU BAR, the test bed's ivshmem).
//! The source DMAs straight into the BAR (peer to peer), so the data has already arrived when
//! the source completes: this sink copies nothing. It releases buffers and remembers, per BAR
//! block, which source range landed there last, so the host can prove it (UBD-HOSTCHECK lines).

use std::sync::Arc;

use ubdirect_core::seams::{Sink, SinkError, SinkErrorKind};
use ubdirect_core::util::checksum::checksum_buf;
use ubdirect_core::{UbBuf, UbRegion};

use super::done_queue::DoneQueue;
use super::sink_ext::PipelineSink;

/// What landed last in one BAR block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed {
    /// Byte offset of the block inside the BAR.
    pub bar_offset: u64,
    /// Source byte offset the data came from.
    pub source_offset: u64,
    /// Bytes.
    pub len: u64,
}

/// The zero-copy BAR sink.
#[derive(Debug)]
pub struct BarSink {
    region: Arc<UbRegion>,
    block_size: usize,
    done: DoneQueue,
    landed: Vec<Option<Landed>>,
    checksum: Option<u64>,
    source_start: u64,
    source_span: u64,
}

impl BarSink {
    /// A sink for buffers from a pool over `region` (a BAR window) with `block_size` blocks.
    /// The stream covers source bytes [`source_start`, `source_start + source_span`) (tags are
    /// stream offsets, wrapped onto the span).
    pub fn new(
        region: Arc<UbRegion>,
        block_size: usize,
        source_start: u64,
        source_span: u64,
        verify: bool,
    ) -> BarSink {
        let blocks = region.len / block_size.max(1);
        BarSink {
            region,
            block_size: block_size.max(1),
            done: DoneQueue::new(blocks),
            landed: vec![None; blocks],
            checksum: verify.then_some(0),
            source_start,
            source_span: source_span.max(1),
        }
    }

    /// Per BAR block, the source range it holds now.
    pub fn landed(&self) -> impl Iterator<Item = &Landed> {
        self.landed.iter().flatten()
    }

    /// One `UBD-HOSTCHECK <name> file-eq <bar_file>:<off> <src_file>:<off> <len>` line per BAR
    /// block, for the test bed's host to compare the BAR's backing file with the source image.
    pub fn hostcheck_lines_at(
        &self,
        name: &str,
        bar_file: &str,
        bar_base: u64,
        src_file: &str,
        src_base: u64,
    ) -> Vec<String> {
        self.landed()
            .map(|l| {
                format!(
                    "UBD-HOSTCHECK {name}-bar{:x} file-eq {bar_file}:{} {src_file}:{} {}",
                    l.bar_offset,
                    bar_base + l.bar_offset,
                    src_base + l.source_offset,
                    l.len
                )
            })
            .collect()
    }
}

impl Sink for BarSink {
    fn submit(&mut self, buf: UbBuf, len: usize, tag: u64) -> Result<(), (UbBuf, SinkError)> {
        let base = self.region.vaddr as usize;
        let p = buf.as_ptr() as usize;
        if p < base || p + len > base + self.region.len || len > buf.len() {
            let msg = format!("buffer at {p:#x}+{len} is not inside the BAR region {}: build the pool over the BAR", self.region.id);
            return Err((buf, SinkError::new(SinkErrorKind::InvalidRequest, msg)));
        }
        if self.done.is_full() {
            return Err((
                buf,
                SinkError::new(SinkErrorKind::Full, "BAR sink full: poll first"),
            ));
        }
        let bar_offset = (p - base) as u64;
        if let Some(slot) = self.landed.get_mut((p - base) / self.block_size) {
            *slot = Some(Landed {
                bar_offset,
                source_offset: self.source_start + tag % self.source_span,
                len: len as u64,
            });
        }
        if let Some(sum) = &mut self.checksum {
            // The CPU reads the BAR with volatile loads (uncached device memory on real
            // hardware: slow, verify only).
            match checksum_buf(&buf, len, tag) {
                Ok(s) => *sum = sum.wrapping_add(s),
                Err(e) => {
                    let msg = format!("reading the BAR for the checksum: {e}");
                    return Err((buf, SinkError::new(SinkErrorKind::InvalidRequest, msg)));
                }
            }
        }
        self.done.push(buf, tag);
        Ok(())
    }

    fn poll(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(UbBuf, u64, Result<(), SinkError>),
    ) -> Result<usize, SinkError> {
        Ok(self.done.poll(max, f))
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }
}

impl PipelineSink for BarSink {
    fn name(&self) -> String {
        match &self.region.kind {
            ubdirect_core::RegionKind::DeviceBar { device, bar } => format!("bar:{device}/{bar}"),
            _ => format!("bar (region {})", self.region.id),
        }
    }
    fn delivered_checksum(&mut self) -> Option<Result<u64, String>> {
        self.checksum.map(Ok)
    }
    fn hostcheck_lines(&self, name: &str, dest_file: &str, src_file: &str) -> Vec<String> {
        self.hostcheck_lines_at(name, dest_file, 0, src_file, 0)
    }
    fn copy_classic(&mut self, _data: &[u8], _offset: u64) -> Result<(), String> {
        Err("the BAR sink has no classic copy path: data reaches the BAR by DMA only (use Mode::Direct)".into())
    }
}
