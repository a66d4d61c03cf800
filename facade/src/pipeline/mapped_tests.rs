//! The mapped run on the host: a recording pinner stands in for cuMemHostRegister and a fake
//! sink for the GPU (it reads each copy's source when the copy completes, checking that the
//! source is pinned both when the copy is queued and when it completes).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ubdirect_core::seams::{SinkError, SinkErrorKind};
use ubdirect_cuda::{FileWindowRegistry, HostPinner};

use super::config::{Limit, PipelineConfig};
use super::error::PipelineError;
use super::mapped::{run_mapped, MappedFile};
use super::mapped_options::{MappedOptionError, MappedOptions};
use super::mapped_sink::MappedSink;
use super::report::GpuShare;

const KIB: usize = 1024;
const MIB: usize = 1 << 20;

/// Pins: what is pinned now, when each pin finished, the most pinned at once; slow or failing
/// on request.
#[derive(Default)]
struct Pins {
    live: Mutex<Vec<(usize, usize)>>,
    done_at: Mutex<Vec<Instant>>,
    most: Mutex<usize>,
    delay: Duration,
    /// Refuse the pin with this number (1-based), if any.
    fail_at: Option<usize>,
    count: Mutex<usize>,
}

impl Pins {
    fn covers(&self, p: usize, len: usize) -> bool {
        let live = self.live.lock().unwrap();
        live.iter().any(|&(a, l)| a <= p && p + len <= a + l)
    }
    fn live(&self) -> usize {
        self.live.lock().unwrap().len()
    }
}

impl HostPinner for Pins {
    fn pin(&self, ptr: *const u8, len: usize) -> Result<(), String> {
        let n = {
            let mut c = self.count.lock().unwrap();
            *c += 1;
            *c
        };
        std::thread::sleep(self.delay);
        if self.fail_at == Some(n) {
            return Err("pin refused by the test".into());
        }
        let mut live = self.live.lock().unwrap();
        live.push((ptr as usize, len));
        let mut most = self.most.lock().unwrap();
        *most = (*most).max(live.len());
        self.done_at.lock().unwrap().push(Instant::now());
        Ok(())
    }
    fn unpin(&self, ptr: *const u8, len: usize) {
        let mut live = self.live.lock().unwrap();
        let i = live
            .iter()
            .position(|&r| r == (ptr as usize, len))
            .expect("unpin of a range that is not pinned");
        live.remove(i);
    }
}

/// A GPU stand-in: copies complete after `delay` polls; each reads its source into `device`.
struct FakeSink {
    pins: Arc<Pins>,
    depth: usize,
    max_copy: usize,
    delay: u32,
    queue: VecDeque<(u64, usize, usize, u32)>,
    device: Vec<u8>,
    first_copy_done: Option<Instant>,
    unpinned_source: usize,
}

impl FakeSink {
    fn new(pins: &Arc<Pins>, file_len: usize) -> FakeSink {
        FakeSink {
            pins: pins.clone(),
            depth: 4,
            max_copy: 64 * MIB,
            delay: 3,
            queue: VecDeque::new(),
            device: vec![0; file_len],
            first_copy_done: None,
            unpinned_source: 0,
        }
    }
}

// SAFETY: a copy is reported complete only after its source was read (in `poll_host`); nothing
// reads a source afterwards.
unsafe impl MappedSink for FakeSink {
    fn devices(&self) -> usize {
        1
    }
    fn device_of(&self, _seq: u64) -> usize {
        0
    }
    fn max_copy(&self) -> usize {
        self.max_copy
    }
    unsafe fn submit_host(
        &mut self,
        _d: usize,
        src: *const u8,
        len: usize,
        tag: u64,
    ) -> Result<(), SinkError> {
        if self.queue.len() == self.depth {
            return Err(SinkError::new(SinkErrorKind::Full, "full"));
        }
        if !self.pins.covers(src as usize, len) {
            self.unpinned_source += 1;
        }
        self.queue.push_back((tag, src as usize, len, self.delay));
        Ok(())
    }
    fn poll_host(
        &mut self,
        f: &mut dyn FnMut(u64, Result<(), SinkError>),
    ) -> Result<usize, SinkError> {
        let Some(front) = self.queue.front_mut() else {
            return Ok(0);
        };
        if front.3 > 0 {
            front.3 -= 1;
            return Ok(0);
        }
        let (tag, src, len, _) = self.queue.pop_front().unwrap();
        if !self.pins.covers(src, len) {
            self.unpinned_source += 1;
        }
        let at = tag as usize % self.device.len();
        // SAFETY: the run keeps the window holding [src, src + len) mapped until this copy is
        // reported complete (below).
        let data = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
        self.device[at..at + len].copy_from_slice(data);
        self.first_copy_done.get_or_insert_with(Instant::now);
        f(tag, Ok(()));
        Ok(1)
    }
    fn copies_in_flight(&self) -> usize {
        self.queue.len()
    }
    fn synchronize(&self) -> Result<(), String> {
        Ok(())
    }
    fn shares(&self, _wall: Duration) -> Vec<GpuShare> {
        Vec::new()
    }
    fn name(&self) -> String {
        "fake GPU".into()
    }
}

/// A temporary file of `len` bytes, each byte a function of its offset.
fn data_file(tag: &str, len: usize) -> (std::path::PathBuf, std::fs::File, Vec<u8>) {
    let p = std::env::temp_dir().join(format!("ubd-mapped-{tag}-{}", std::process::id()));
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
    std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
    let f = std::fs::File::open(&p).unwrap();
    (p, f, data)
}

fn cfg(bytes: u64, copy: usize, window: u64, threads: usize) -> PipelineConfig {
    PipelineConfig {
        qd: 4,
        limit: Limit::Bytes(bytes),
        mapped: MappedOptions {
            copy_size: Some(copy),
            window: Some(window),
            register_threads: threads,
        },
        ..PipelineConfig::default()
    }
}

#[test]
fn a_cold_pass_streams_while_later_windows_register_and_reads_only_registered_memory() {
    let len = 8 * MIB;
    let (p, f, data) = data_file("cold", len);
    let pins = Arc::new(Pins {
        delay: Duration::from_millis(40),
        ..Default::default()
    });
    let reg = FileWindowRegistry::new(pins.clone(), 1 << 30);
    let src = MappedFile {
        file: &f,
        name: "test file".into(),
        registry: &reg,
        resident: 1.0,
    };
    let mut sink = FakeSink::new(&pins, len);
    let r = run_mapped(
        &src,
        &mut sink,
        &cfg(len as u64, 64 * KIB, MIB as u64, 2),
        "t",
    )
    .unwrap();
    assert_eq!(r.bytes, len as u64);
    assert!(sink.device == data, "the copies delivered other bytes");
    assert_eq!(sink.unpinned_source, 0, "a copy read memory not registered");
    let m = r.mapped.unwrap();
    assert_eq!(
        (m.windows_registered, m.copy_size, m.window),
        (8, 64 << 10, 1 << 20)
    );
    assert_eq!(r.block_size, 64 * KIB);
    let last_pin = *pins.done_at.lock().unwrap().iter().max().unwrap();
    assert!(
        sink.first_copy_done.unwrap() < last_pin,
        "no copy completed before the last window was registered: registration did not overlap the copies"
    );
    assert!(m.register_wait_s > 0.0 && m.register_s > 0.0);
    // Every window fits the cap: all kept registered for the next run, which reuses them.
    assert_eq!(pins.live(), 8);
    let r = run_mapped(
        &src,
        &mut sink,
        &cfg(len as u64, 64 * KIB, MIB as u64, 2),
        "t",
    )
    .unwrap();
    let m = r.mapped.unwrap();
    assert_eq!((m.windows_registered, m.windows_reused), (0, 8));
    drop(reg);
    assert_eq!(pins.live(), 0);
    std::fs::remove_file(p).unwrap();
}

#[test]
fn a_registration_failing_mid_pass_ends_the_run_clearly_and_leaves_nothing_registered() {
    let len = 8 * MIB;
    let (p, f, _) = data_file("fail", len);
    let pins = Arc::new(Pins {
        delay: Duration::from_millis(5),
        fail_at: Some(4),
        ..Default::default()
    });
    let reg = FileWindowRegistry::new(pins.clone(), 1 << 30);
    let src = MappedFile {
        file: &f,
        name: "test file".into(),
        registry: &reg,
        resident: 1.0,
    };
    let mut sink = FakeSink::new(&pins, len);
    let e = run_mapped(
        &src,
        &mut sink,
        &cfg(len as u64, 64 * KIB, MIB as u64, 1),
        "t",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("test file")
            && e.contains("file bytes 3145728..4194304")
            && e.contains("pin refused by the test"),
        "{e}"
    );
    assert_eq!(sink.copies_in_flight(), 0);
    assert_eq!(sink.unpinned_source, 0);
    assert_eq!(reg.len(), 0, "the failed run left windows registered");
    assert_eq!(pins.live(), 0, "the failed run left windows pinned");
    std::fs::remove_file(p).unwrap();
}

#[test]
fn under_a_small_cap_windows_are_let_go_and_a_few_registered_ahead() {
    let len = 8 * MIB;
    let (p, f, data) = data_file("cap", len);
    let pins = Arc::new(Pins::default());
    // Room for four 1 MiB windows (plus a page each): two ahead of the current one.
    let reg = FileWindowRegistry::new(pins.clone(), 4 * (MIB as u64 + 4096));
    let src = MappedFile {
        file: &f,
        name: "test file".into(),
        registry: &reg,
        resident: 1.0,
    };
    let mut sink = FakeSink::new(&pins, len);
    let r = run_mapped(
        &src,
        &mut sink,
        &cfg(2 * len as u64, 256 * KIB, MIB as u64, 3),
        "t",
    )
    .unwrap();
    assert_eq!(r.bytes, 2 * len as u64);
    assert!(sink.device == data);
    assert_eq!(sink.unpinned_source, 0);
    let most = *pins.most.lock().unwrap();
    assert!(
        most <= 5,
        "{most} windows pinned at once under a 4-window cap"
    );
    assert!(
        r.mapped.unwrap().windows_registered >= 16,
        "two passes register every window twice"
    );
    drop(reg);
    assert_eq!(pins.live(), 0);
    std::fs::remove_file(p).unwrap();
}

#[test]
fn copy_sizes_the_run_cannot_use_are_refused_before_anything_is_registered() {
    let (p, f, _) = data_file("bad", MIB);
    let pins = Arc::new(Pins::default());
    let reg = FileWindowRegistry::new(pins.clone(), 1 << 30);
    let src = MappedFile {
        file: &f,
        name: "test file".into(),
        registry: &reg,
        resident: 1.0,
    };
    let mut sink = FakeSink::new(&pins, MIB);
    let e = run_mapped(
        &src,
        &mut sink,
        &cfg(MIB as u64, 4 * MIB, 4 * MIB as u64, 1),
        "t",
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            PipelineError::MappedOption(MappedOptionError::CopySizeTooLarge { .. })
        ),
        "{e}"
    );
    let e = run_mapped(&src, &mut sink, &cfg(MIB as u64, 5000, 5000, 1), "t").unwrap_err();
    assert!(
        matches!(
            e,
            PipelineError::MappedOption(MappedOptionError::CopySizeUnaligned { size: 5000 })
        ),
        "{e}"
    );
    sink.max_copy = 64 * KIB;
    let e = run_mapped(
        &src,
        &mut sink,
        &cfg(MIB as u64, 128 * KIB, MIB as u64, 1),
        "t",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("at most 65536 bytes") && e.contains("131072-byte copy size"),
        "{e}"
    );
    assert_eq!(*pins.count.lock().unwrap(), 0, "something was registered");
    std::fs::remove_file(p).unwrap();
}
