//! Counting and reporting a loop-back run (both the ubdirect and the kernel path).

use std::time::{Duration, Instant};

use serde::Serialize;
use ubdirect::dma::pci::PciAddress;
use ubdirect::virtio_net::pattern::{Check, Mismatch};
use ubdirect::virtio_net::NetStats;

/// Time spent per segment of the ubdirect loop.
#[derive(Debug, Default, Clone, Copy)]
pub struct Segments {
    fill: Duration,
    tx: Duration,
    rx: Duration,
    verify: Duration,
}

impl Segments {
    /// Adds one loop iteration's timestamps: start, after fill, after TX, after RX, after verify.
    #[inline]
    pub fn add(&mut self, t0: Instant, fill: Instant, tx: Instant, rx: Instant, verify: Instant) {
        self.fill += fill - t0;
        self.tx += tx - fill;
        self.rx += rx - tx;
        self.verify += verify - rx;
    }

    /// Nanoseconds per frame of each segment.
    pub fn per_frame(&self, frames: u64) -> Option<SegmentsNs> {
        let f = |d: Duration| d.as_nanos() as f64 / frames as f64;
        Some(SegmentsNs {
            fill: f(self.fill),
            tx_burst: f(self.tx),
            rx_burst: f(self.rx),
            verify: f(self.verify),
        })
    }
}

/// Nanoseconds per frame spent in each segment of the ubdirect loop.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SegmentsNs {
    /// Writing the pattern into the (GPU-BAR) buffers: the "GPU write" segment.
    pub fill: f64,
    /// `tx_burst` (descriptor writes, reclaim, doorbell when asked): the device-DMA hand-off.
    pub tx_burst: f64,
    /// `rx_burst` (reaping used entries, refilling the ring): completion handling.
    pub rx_burst: f64,
    /// Reading the received frames back and comparing them.
    pub verify: f64,
}

/// CPU time (user + system) this process has used since `start`: the driver's polling, the
/// copies, and the kernel work done on its behalf (system calls, and softirq work run in its
/// context).
#[derive(Debug, Clone, Copy)]
pub struct CpuClock(f64);

impl CpuClock {
    fn now() -> f64 {
        // SAFETY: rusage is plain old data; all-zero is valid, and getrusage only writes it.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: RUSAGE_SELF with a valid, owned rusage: the call only fills it.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
            return 0.0;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }

    /// Starts counting.
    pub fn start() -> CpuClock {
        CpuClock(Self::now())
    }

    /// CPU seconds used since `start`.
    pub fn seconds(&self) -> f64 {
        (Self::now() - self.0).max(0.0)
    }
}

/// Running counts of a loop-back.
#[derive(Debug, Default)]
pub struct Tally {
    /// Frame size in bytes.
    pub frame_size: usize,
    /// Frames handed to the sending NIC.
    pub sent: u64,
    /// Pattern frames received byte-exact.
    pub received: u64,
    /// Frames never received (sequence gaps, or missing at the stall deadline).
    pub lost: u64,
    /// Frames that were not pattern frames (other traffic on the wire).
    pub foreign: u64,
    /// Pattern frames with a wrong byte or length.
    pub mismatches: u64,
    /// The first mismatch seen.
    pub first_mismatch: Option<Mismatch>,
    /// Times the send side found its ring (or socket) full.
    pub tx_full: u64,
    /// Frames that arrived after a later one (counted, not lost).
    pub reordered: u64,
    /// Next expected sequence number.
    pub expect: u64,
    /// True when the run ended because nothing moved for the stall deadline.
    pub stalled: bool,
}

impl Tally {
    /// An empty tally for frames of `frame_size` bytes.
    pub fn new(frame_size: usize) -> Tally {
        Tally {
            frame_size,
            ..Tally::default()
        }
    }

    /// Counts one received frame's check result.
    #[inline]
    pub fn account(&mut self, c: Check) {
        match c {
            Check::Good(seq) => {
                if seq > self.expect {
                    self.lost += seq - self.expect;
                }
                if seq >= self.expect {
                    self.expect = seq + 1;
                } else if self.lost > 0 {
                    // A late frame: counted as lost when the gap was seen; it was only reordered.
                    self.lost -= 1;
                    self.reordered += 1;
                }
                self.received += 1;
            }
            Check::Foreign => self.foreign += 1,
            Check::Mismatch(m) => {
                self.mismatches += 1;
                // A mismatched frame still arrived: do not also count it as lost.
                if m.seq >= self.expect && m.seq < self.sent {
                    self.lost += m.seq - self.expect;
                    self.expect = m.seq + 1;
                }
                self.first_mismatch.get_or_insert(m);
            }
        }
    }

    /// Frames sent and not yet accounted for.
    pub fn in_flight(&self) -> u64 {
        self.sent.saturating_sub(self.expect)
    }

    /// The final report of `run` (without driver statistics).
    pub fn report(&self, run: RunInfo) -> LoopbackReport {
        let RunInfo {
            mode,
            tx,
            rx,
            max_frame,
            batch,
            elapsed,
            buffers,
        } = run;
        let secs = elapsed.as_secs_f64().max(1e-9);
        let bytes = self.received * self.frame_size as u64;
        LoopbackReport {
            mode,
            tx: tx.to_string(),
            rx: rx.to_string(),
            buffers,
            frame_size: self.frame_size,
            max_frame,
            batch,
            frames_sent: self.sent,
            frames_received: self.received,
            bytes_received: bytes,
            seconds: secs,
            frames_per_s: self.received as f64 / secs,
            bytes_per_s: bytes as f64 / secs,
            drops: self.lost,
            foreign: self.foreign,
            mismatches: self.mismatches,
            first_mismatch: self.first_mismatch,
            tx_full: self.tx_full,
            reordered: self.reordered,
            stalled: self.stalled,
            tx_stats: None,
            rx_stats: None,
            segments_ns_per_frame: None,
            cpu_seconds: 0.0,
            cpu_s_per_gb: None,
        }
    }
}

/// What a loop-back run was, beside the counts of its [`Tally`].
pub struct RunInfo {
    /// The report's mode ("ubdirect", "kernel", ...).
    pub mode: &'static str,
    /// Sending NIC.
    pub tx: PciAddress,
    /// Receiving NIC.
    pub rx: PciAddress,
    /// The largest frame both NICs carry.
    pub max_frame: usize,
    /// Frames per burst.
    pub batch: usize,
    /// How long it ran.
    pub elapsed: Duration,
    /// Where the frames lived.
    pub buffers: Option<String>,
}

/// What `ubdirect loopback` prints (text or `--json`).
#[derive(Debug, Serialize)]
pub struct LoopbackReport {
    /// "ubdirect" (userspace driver, zero copy), "kernel" (AF_PACKET sendmmsg/recvmmsg) or
    /// "kernel-tpacket-v3" (PACKET_MMAP rings).
    pub mode: &'static str,
    /// Sending NIC.
    pub tx: String,
    /// Receiving NIC.
    pub rx: String,
    /// Where the frames lived ("gpu-bar 0000:00:06.0/2", "hugepages", or none for kernel).
    pub buffers: Option<String>,
    /// Frame size in bytes (Ethernet header included, no FCS).
    pub frame_size: usize,
    /// Largest frame the devices allow.
    pub max_frame: usize,
    /// Frames per burst.
    pub batch: usize,
    /// Frames sent.
    pub frames_sent: u64,
    /// Frames received byte-exact.
    pub frames_received: u64,
    /// Bytes received byte-exact.
    pub bytes_received: u64,
    /// Seconds from first send to last receive.
    pub seconds: f64,
    /// Frames per second received.
    pub frames_per_s: f64,
    /// Bytes per second received.
    pub bytes_per_s: f64,
    /// Frames sent but never received.
    pub drops: u64,
    /// Non-pattern frames seen.
    pub foreign: u64,
    /// Pattern frames with a wrong byte or length.
    pub mismatches: u64,
    /// The first mismatch (frame sequence number, byte offset, expected, got).
    pub first_mismatch: Option<Mismatch>,
    /// Times the sender found its ring or socket full.
    pub tx_full: u64,
    /// Frames that arrived after a later frame (not lost, not an error for a datagram path).
    pub reordered: u64,
    /// The run ended because nothing moved for the stall deadline.
    pub stalled: bool,
    /// Sending NIC's driver counters (ubdirect mode).
    pub tx_stats: Option<NetStats>,
    /// Receiving NIC's driver counters (ubdirect mode).
    pub rx_stats: Option<NetStats>,
    /// Where the time went, per frame (ubdirect mode).
    pub segments_ns_per_frame: Option<SegmentsNs>,
    /// CPU seconds (user + system) the process used during the run.
    pub cpu_seconds: f64,
    /// CPU seconds per GB (1e9 bytes) received byte-exact; none when nothing was received.
    pub cpu_s_per_gb: Option<f64>,
}

impl LoopbackReport {
    /// Records the CPU time of the run and its cost per GB received.
    pub fn with_cpu(mut self, cpu_seconds: f64) -> LoopbackReport {
        self.cpu_seconds = cpu_seconds;
        self.cpu_s_per_gb =
            (self.bytes_received > 0).then(|| cpu_seconds / (self.bytes_received as f64 / 1e9));
        self
    }

    /// True when every frame sent came back byte-exact.
    pub fn ok(&self) -> bool {
        self.mismatches == 0
            && self.drops == 0
            && self.frames_received == self.frames_sent
            && self.frames_sent > 0
    }

    /// Human-readable summary.
    pub fn text(&self) -> String {
        let mut s = format!(
            "loopback ({}) {} -> {}{}: {} frames of {} B (max {}), batch {}\n  received {} byte-exact in {:.3} s: {:.0} frames/s, {:.2} MB/s\n  drops {}, mismatches {}, foreign {}, reordered {}, tx ring/socket full {}{}",
            self.mode,
            self.tx,
            self.rx,
            self.buffers.as_deref().map(|b| format!(" [buffers: {b}]")).unwrap_or_default(),
            self.frames_sent,
            self.frame_size,
            self.max_frame,
            self.batch,
            self.frames_received,
            self.seconds,
            self.frames_per_s,
            self.bytes_per_s / 1e6,
            self.drops,
            self.mismatches,
            self.foreign,
            self.reordered,
            self.tx_full,
            if self.stalled { " (stalled: nothing moved for the deadline)" } else { "" },
        );
        s += &format!("\n  CPU {:.3} s", self.cpu_seconds);
        if let Some(c) = self.cpu_s_per_gb {
            s += &format!(", {c:.2} CPU-s/GB");
        }
        if let Some(g) = &self.segments_ns_per_frame {
            s += &format!(
                "\n  per frame: pattern fill {:.0} ns, tx_burst {:.0} ns, rx_burst {:.0} ns, verify {:.0} ns",
                g.fill, g.tx_burst, g.rx_burst, g.verify
            );
        }
        if let Some(m) = &self.first_mismatch {
            s += &format!(
                "\n  first mismatch: frame {} offset {}: expected {:#x}, got {:#x}",
                m.seq, m.offset, m.expected, m.got
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_count_as_lost_and_mismatch_is_kept() {
        let mut t = Tally::new(60);
        t.sent = 10;
        t.account(Check::Good(0));
        t.account(Check::Good(1));
        t.account(Check::Good(4)); // 2, 3 lost
        t.account(Check::Foreign);
        let m = Mismatch {
            seq: 5,
            offset: 30,
            expected: 1,
            got: 2,
        };
        t.account(Check::Mismatch(m));
        assert_eq!((t.received, t.lost, t.foreign, t.mismatches), (3, 2, 1, 1));
        assert_eq!(t.in_flight(), 4);
        let r = t.report(RunInfo {
            mode: "kernel",
            tx: "00:07.0".parse().unwrap(),
            rx: "00:08.0".parse().unwrap(),
            max_frame: 1514,
            batch: 32,
            elapsed: Duration::from_secs(1),
            buffers: None,
        });
        assert!(!r.ok());
        assert_eq!(r.first_mismatch, Some(m));
        assert!(r.text().contains("frame 5 offset 30"));
        assert_eq!(r.bytes_received, 180);
        assert_eq!(r.cpu_s_per_gb, None);
        let r = r.with_cpu(0.9);
        assert!((r.cpu_s_per_gb.unwrap() - 0.9 / 180e-9).abs() < 1.0);
        assert!(r.text().contains("CPU-s/GB"), "{}", r.text());
    }

    #[test]
    fn every_mode_s_report_matches_the_json_schema() {
        for mode in ["ubdirect", "kernel", "kernel-tpacket-v3", "kernel-af-xdp"] {
            let mut t = Tally::new(1514);
            t.sent = 2;
            t.account(Check::Good(0));
            t.account(Check::Good(1));
            let r = t
                .report(RunInfo {
                    mode,
                    tx: "00:07.0".parse().unwrap(),
                    rx: "00:08.0".parse().unwrap(),
                    max_frame: 1514,
                    batch: 32,
                    elapsed: Duration::from_millis(10),
                    buffers: Some("TPACKET_V3 RX ring".into()),
                })
                .with_cpu(0.01);
            let doc = crate::cli::json::document("loopback", &r).unwrap();
            crate::cli::json::validate(&doc).unwrap_or_else(|e| panic!("{mode}: {e}"));
            assert!(doc["cpu_s_per_gb"].as_f64().unwrap() > 0.0);
        }
    }

    #[test]
    fn late_frames_are_reordered_not_lost() {
        let mut t = Tally::new(60);
        t.sent = 4;
        for s in [0, 2, 1, 3] {
            t.account(Check::Good(s));
        }
        assert_eq!(
            (t.received, t.lost, t.reordered, t.in_flight()),
            (4, 0, 1, 0)
        );
    }
}
