//! [`NullSink`]: consumes buffers immediately (measures the source alone); optionally checksums
//! the data on the CPU so a source can be verified without a GPU.

use ubdirect_core::seams::{Sink, SinkError, SinkErrorKind};
use ubdirect_core::util::checksum::{checksum_at, checksum_buf};
use ubdirect_core::UbBuf;

use super::done_queue::DoneQueue;
use super::sink_ext::PipelineSink;

/// A sink that hands every buffer straight back.
#[derive(Debug)]
pub struct NullSink {
    done: DoneQueue,
    checksum: Option<u64>,
    scratch: Vec<u8>,
}

impl NullSink {
    /// A null sink holding up to `depth` buffers between submit and poll; with `verify` it
    /// checksums every buffer's data on the CPU (this reads the data: not free).
    pub fn new(depth: usize, verify: bool) -> NullSink {
        NullSink {
            done: DoneQueue::new(depth),
            checksum: verify.then_some(0),
            scratch: Vec::new(),
        }
    }
}

impl Sink for NullSink {
    fn submit(&mut self, buf: UbBuf, len: usize, tag: u64) -> Result<(), (UbBuf, SinkError)> {
        if len > buf.len() {
            let msg = format!("{len} bytes from a {}-byte buffer", buf.len());
            return Err((buf, SinkError::new(SinkErrorKind::InvalidRequest, msg)));
        }
        // Refuse before counting: a refused buffer comes back, is resubmitted and must be
        // checksummed once, when it is accepted.
        if self.done.is_full() {
            return Err((
                buf,
                SinkError::new(SinkErrorKind::Full, "null sink full: poll first"),
            ));
        }
        if let Some(sum) = &mut self.checksum {
            match checksum_buf(&buf, len, tag) {
                Ok(s) => *sum = sum.wrapping_add(s),
                Err(e) => {
                    let msg = format!("reading the buffer for the checksum: {e}");
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

impl PipelineSink for NullSink {
    fn name(&self) -> String {
        "null".into()
    }
    fn delivered_checksum(&mut self) -> Option<Result<u64, String>> {
        self.checksum.map(Ok)
    }
    fn copy_classic(&mut self, data: &[u8], offset: u64) -> Result<(), String> {
        // The classic path's last hop: one more CPU copy into the consumer's memory.
        self.scratch.clear();
        self.scratch.extend_from_slice(data);
        if let Some(sum) = &mut self.checksum {
            *sum = sum.wrapping_add(checksum_at(&self.scratch, offset));
        }
        Ok(())
    }
}
