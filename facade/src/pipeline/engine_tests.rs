//! Host tests of the pipeline loop against an in-memory block queue: data arrives intact and in
//! place, back-pressure (queue out of command slots, sink full) is waited out, device errors and
//! stalls become typed errors, and no buffer is lost on any path.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ubdirect_core::seams::{
    BlockCompletion, BlockError, BlockErrorKind, BlockQueue, Sink, SinkError, SinkErrorKind,
};
use ubdirect_core::util::checksum::checksum_at;
use ubdirect_core::{DmaDomain, PoolConfig, UbBuf, UbPool, UbRegistry};

use super::{run_direct, Limit, NullSink, PipelineConfig, PipelineError, PipelineSink};

/// An in-memory block device: requests complete on poll, `cmd` bytes per command slot.
struct MemQueue {
    data: Vec<u8>,
    lbs: u32,
    depth: usize,
    slots: usize,
    cmd: usize,
    queued: VecDeque<(UbBuf, u64, usize, u64)>,
    flushed: VecDeque<(UbBuf, u64, usize, u64)>,
    fail_at: Option<u64>,
    /// A request covering this offset completes 512 bytes short (status OK).
    short_at: Option<u64>,
    stuck: bool,
    gone: bool,
    flushes: usize,
}

impl MemQueue {
    fn new(len: usize, depth: usize) -> MemQueue {
        let data = (0..len)
            .map(|i| (i as u64).wrapping_mul(0x9E37_79B9) as u8 ^ (i >> 12) as u8)
            .collect();
        MemQueue {
            data,
            lbs: 512,
            depth,
            slots: usize::MAX,
            cmd: usize::MAX,
            queued: VecDeque::new(),
            flushed: VecDeque::new(),
            fail_at: None,
            short_at: None,
            stuck: false,
            gone: false,
            flushes: 0,
        }
    }
    fn used_slots(&self) -> usize {
        self.queued
            .iter()
            .chain(self.flushed.iter())
            .map(|r| r.2.div_ceil(self.cmd))
            .sum()
    }
}

impl BlockQueue for MemQueue {
    fn block_size(&self) -> u32 {
        self.lbs
    }
    fn capacity(&self) -> u64 {
        self.data.len() as u64
    }
    fn depth(&self) -> usize {
        self.depth
    }
    fn max_transfer(&self) -> usize {
        1 << 30
    }
    fn submit_read(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<(), (UbBuf, BlockError)> {
        if offset % u64::from(self.lbs) != 0 || len % self.lbs as usize != 0 || len > buf.len() {
            return Err((
                buf,
                BlockError::new(BlockErrorKind::InvalidRequest, "unaligned"),
            ));
        }
        if self.in_flight() >= self.depth || self.used_slots() + len.div_ceil(self.cmd) > self.slots
        {
            return Err((buf, BlockError::new(BlockErrorKind::QueueFull, "full")));
        }
        self.queued.push_back((buf, offset, len, tag));
        Ok(())
    }
    fn submit_write(
        &mut self,
        buf: UbBuf,
        _o: u64,
        _l: usize,
        _t: u64,
    ) -> Result<(), (UbBuf, BlockError)> {
        Err((
            buf,
            BlockError::new(BlockErrorKind::InvalidRequest, "read-only"),
        ))
    }
    fn ring(&mut self) -> Result<(), BlockError> {
        self.flushes += 1;
        self.flushed.extend(self.queued.drain(..));
        Ok(())
    }
    fn poll(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(BlockCompletion),
    ) -> Result<usize, BlockError> {
        if self.stuck {
            return Ok(0);
        }
        if self.gone && !self.flushed.is_empty() {
            return Err(BlockError::new(BlockErrorKind::DeviceGone, "all-ones"));
        }
        let mut n = 0;
        while n < max {
            let Some((mut buf, off, len, tag)) = self.flushed.pop_front() else {
                break;
            };
            let end = (off as usize + len).min(self.data.len());
            let got = end - off as usize;
            buf.as_mut_slice()[..got].copy_from_slice(&self.data[off as usize..end]);
            let result = if self
                .fail_at
                .is_some_and(|f| f >= off && f < off + len as u64)
            {
                Err(BlockError::new(
                    BlockErrorKind::Device,
                    format!("media error at {off}"),
                ))
            } else if self
                .short_at
                .is_some_and(|f| f >= off && f < off + len as u64)
            {
                Ok(got - 512)
            } else {
                Ok(got)
            };
            f(BlockCompletion { buf, tag, result });
            n += 1;
        }
        Ok(n)
    }
    fn in_flight(&self) -> usize {
        self.queued.len() + self.flushed.len()
    }
}

/// A sink that refuses every second submission as full (exercises the backlog).
struct FussySink {
    inner: NullSink,
    toggle: bool,
}

impl Sink for FussySink {
    fn submit(&mut self, buf: UbBuf, len: usize, tag: u64) -> Result<(), (UbBuf, SinkError)> {
        self.toggle = !self.toggle;
        if self.toggle {
            return Err((buf, SinkError::new(SinkErrorKind::Full, "busy")));
        }
        self.inner.submit(buf, len, tag)
    }
    fn poll(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(UbBuf, u64, Result<(), SinkError>),
    ) -> Result<usize, SinkError> {
        self.inner.poll(max, f)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

impl PipelineSink for FussySink {
    fn name(&self) -> String {
        "fussy".into()
    }
    fn delivered_checksum(&mut self) -> Option<Result<u64, String>> {
        self.inner.delivered_checksum()
    }
    fn copy_classic(&mut self, data: &[u8], offset: u64) -> Result<(), String> {
        self.inner.copy_classic(data, offset)
    }
}

const BS: usize = 64 << 10;

fn pool(blocks: usize) -> Arc<UbPool> {
    let cfg = PoolConfig {
        block_size: BS,
        block_count: blocks,
    };
    UbPool::with_anonymous(&UbRegistry::new(DmaDomain::host_only()), cfg, None).unwrap()
}

fn cfg(qd: usize, start: u64, bytes: u64) -> PipelineConfig {
    PipelineConfig {
        block_size: BS,
        qd,
        limit: Limit::Bytes(bytes),
        verify: true,
        progress: false,
        stall_timeout: Duration::from_millis(300),
        start,
        ..PipelineConfig::default()
    }
}

#[test]
fn delivers_every_byte_in_place_with_a_short_last_block() {
    let len = 10 * BS + 1000; // not a multiple of the block or the LBA
    let mut q = MemQueue::new(len, 8);
    let pool = pool(8);
    let mut sink = NullSink::new(8, true);
    let r = run_direct(&mut q, &mut sink, &pool, &cfg(4, 0, len as u64), "t", "mem").unwrap();
    assert_eq!(r.bytes, len as u64);
    assert_eq!(r.blocks, 11);
    assert_eq!(
        sink.delivered_checksum().unwrap().unwrap(),
        checksum_at(&q.data, 0)
    );
    assert!(
        q.flushes >= 1 && q.flushes <= 11,
        "doorbells are batched: {} flushes",
        q.flushes
    );
    assert_eq!(pool.stats().in_use, 0);
    assert_eq!(r.latency.count, 11);
}

#[test]
fn start_offset_and_byte_limit() {
    let len = 16 * BS;
    let mut q = MemQueue::new(len, 8);
    let pool = pool(4);
    let mut sink = NullSink::new(4, true);
    let start = 3 * BS as u64 + 512;
    let bytes = 5 * BS as u64 + 4096;
    let r = run_direct(&mut q, &mut sink, &pool, &cfg(2, start, bytes), "t", "mem").unwrap();
    assert_eq!(r.bytes, bytes);
    let want = checksum_at(&q.data[start as usize..(start + bytes) as usize], 0);
    assert_eq!(sink.delivered_checksum().unwrap().unwrap(), want);
}

#[test]
fn command_slot_back_pressure_and_a_full_sink_are_waited_out() {
    let len = 32 * BS;
    let mut q = MemQueue::new(len, 64);
    q.cmd = 16 << 10; // 4 commands per block
    q.slots = 10; // room for 2 blocks at a time although qd asks for 8
    let pool = pool(16);
    let mut sink = FussySink {
        inner: NullSink::new(16, true),
        toggle: false,
    };
    let r = run_direct(&mut q, &mut sink, &pool, &cfg(8, 0, len as u64), "t", "mem").unwrap();
    assert_eq!(r.bytes, len as u64);
    assert_eq!(
        sink.delivered_checksum().unwrap().unwrap(),
        checksum_at(&q.data, 0)
    );
    assert_eq!(pool.stats().in_use, 0);
}

#[test]
fn a_device_error_stops_the_run_with_a_typed_error() {
    let len = 16 * BS;
    let mut q = MemQueue::new(len, 8);
    q.fail_at = Some(5 * BS as u64 + 7);
    let pool = pool(8);
    let mut sink = NullSink::new(8, false);
    let e = run_direct(&mut q, &mut sink, &pool, &cfg(4, 0, len as u64), "t", "mem").unwrap_err();
    match e {
        PipelineError::Source(b) => {
            assert_eq!(b.kind, BlockErrorKind::Device);
            assert!(b.message.contains("media error"), "{}", b.message);
        }
        other => panic!("unexpected {other}"),
    }
    assert_eq!(q.in_flight(), 0, "the run drained what it had submitted");
    assert_eq!(pool.stats().in_use, 0, "no buffer lost");
}

/// Runs 8 blocks at queue depth 4 over `q` through a 4-buffer pool, expecting an error;
/// returns the error, how long the run took and the pool (to check what is still in use).
fn run_eight_blocks_expecting_an_error(q: &mut MemQueue) -> (PipelineError, Duration, Arc<UbPool>) {
    let pool = pool(4);
    let mut sink = NullSink::new(4, false);
    let t = std::time::Instant::now();
    let e = run_direct(q, &mut sink, &pool, &cfg(4, 0, 8 * BS as u64), "t", "mem").unwrap_err();
    (e, t.elapsed(), pool)
}

#[test]
fn a_stuck_device_is_reported_as_stalled_not_waited_on_forever() {
    let mut q = MemQueue::new(8 * BS, 8);
    q.stuck = true;
    let (e, elapsed, pool) = run_eight_blocks_expecting_an_error(&mut q);
    assert!(
        matches!(e, PipelineError::Stalled { in_flight: 4, .. }),
        "{e}"
    );
    assert!(elapsed < Duration::from_secs(5));
    // The queue still owns its buffers (a real device may still write them).
    assert_eq!(pool.stats().in_use, 4);
}

#[test]
fn refuses_a_block_size_the_pool_cannot_hold() {
    let mut q = MemQueue::new(8 * BS, 8);
    let pool = pool(2);
    let mut sink = NullSink::new(2, false);
    let c = PipelineConfig {
        block_size: 2 * BS,
        ..cfg(2, 0, 4 * BS as u64)
    };
    let e = run_direct(&mut q, &mut sink, &pool, &c, "t", "mem").unwrap_err();
    assert!(
        e.to_string()
            .contains("smaller than PipelineConfig::block_size"),
        "{e}"
    );
}

#[test]
fn duration_mode_wraps_around_the_source() {
    let mut q = MemQueue::new(4 * BS, 8);
    let pool = pool(4);
    let mut sink = NullSink::new(4, false);
    let c = PipelineConfig {
        limit: Limit::Duration(Duration::from_millis(150)),
        verify: false,
        ..cfg(2, 0, 0)
    };
    let r = run_direct(&mut q, &mut sink, &pool, &c, "t", "mem").unwrap();
    assert!(
        r.bytes > 4 * BS as u64,
        "more than one pass in 150 ms: {}",
        r.bytes
    );
    assert_eq!(r.bytes % BS as u64, 0);
}

#[test]
fn a_device_gone_error_ends_the_run_at_once_and_keeps_the_buffers_in_flight() {
    let mut q = MemQueue::new(8 * BS, 8);
    q.gone = true;
    let (e, elapsed, pool) = run_eight_blocks_expecting_an_error(&mut q);
    assert!(
        matches!(&e, PipelineError::Source(b) if b.kind == BlockErrorKind::DeviceGone),
        "{e}"
    );
    assert!(e.is_fatal());
    // The drain bound is 10 s; a fatal error must not wait for it.
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    // Requests the device may still write keep their buffers out of the pool.
    assert_eq!(pool.stats().in_use, q.in_flight());
    assert_eq!(q.in_flight(), 4);
}

#[test]
fn a_short_read_is_an_error_not_a_hole_in_the_stream() {
    let len = 16 * BS;
    let mut q = MemQueue::new(len, 8);
    q.short_at = Some(6 * BS as u64 + 100);
    let pool = pool(8);
    // Without --verify nothing else would notice the missing bytes.
    let mut sink = NullSink::new(8, false);
    let c = PipelineConfig {
        verify: false,
        ..cfg(4, 0, len as u64)
    };
    let e = run_direct(&mut q, &mut sink, &pool, &c, "t", "mem").unwrap_err();
    match &e {
        PipelineError::ShortRead { offset, got, want } => {
            assert_eq!(*offset, 6 * BS as u64);
            assert_eq!((*got, *want), (BS as u64 - 512, BS as u64));
        }
        other => panic!("unexpected {other}"),
    }
    assert!(e.to_string().contains("short read"), "{e}");
    assert_eq!(q.in_flight(), 0, "the run drained what it had submitted");
    assert_eq!(pool.stats().in_use, 0, "no buffer lost");
}

#[test]
fn a_null_sink_counts_a_block_it_refused_as_full_once() {
    // Unit: a refused buffer is not checksummed; accepted after a poll, it counts once.
    let p = pool(2);
    let mut sink = NullSink::new(1, true);
    let mut a = p.get().unwrap();
    let mut b = p.get().unwrap();
    a.as_mut_slice()[..8].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    b.as_mut_slice()[..8].copy_from_slice(&[9, 10, 11, 12, 13, 14, 15, 16]);
    sink.submit(a, 8, 0).map_err(|(_, e)| e).unwrap();
    let (b, e) = sink.submit(b, 8, 8).unwrap_err();
    assert_eq!(e.kind, SinkErrorKind::Full);
    assert_eq!(sink.poll(usize::MAX, &mut |_, _, r| r.unwrap()).unwrap(), 1);
    sink.submit(b, 8, 8).map_err(|(_, e)| e).unwrap();
    let want: Vec<u8> = (1..=16).collect();
    assert_eq!(
        sink.delivered_checksum().unwrap().unwrap(),
        checksum_at(&want, 0)
    );

    // Through the loop: a one-deep null sink under queue depth 4 refuses often; the checksum
    // of what was delivered still equals the source's.
    let len = 12 * BS;
    let mut q = MemQueue::new(len, 8);
    let pool = pool(8);
    let mut sink = NullSink::new(1, true);
    let r = run_direct(&mut q, &mut sink, &pool, &cfg(4, 0, len as u64), "t", "mem").unwrap();
    assert_eq!(r.bytes, len as u64);
    assert_eq!(
        sink.delivered_checksum().unwrap().unwrap(),
        checksum_at(&q.data, 0)
    );
    assert_eq!(pool.stats().in_use, 0);
}
