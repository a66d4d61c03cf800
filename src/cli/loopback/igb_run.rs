//! The loop-back through two Intel 82576 NICs (the igb driver): the same pattern, window, stall
//! rule and report as the virtio-net loop; frames are `NicFrame`s at offset 0 of pool blocks.

use std::sync::Arc;
use std::time::Instant;

use ubdirect::dma::pci::PciDevice;
use ubdirect::dma::seams::NicFrame;
use ubdirect::dma::ub::{UbPool, UbRegistry};
use ubdirect::igb::{Igb, IgbConfig, QueuePair};
use ubdirect::virtio_net::pattern;

use super::report::{RunInfo, Segments, Tally};
use super::{
    check_frame_size, frame_bytes, write_frame, Args, Limit, LoopbackError, LoopbackReport,
    STALL_DEADLINE,
};

/// True for an 82576 physical function: the loop-back drives it with the igb driver.
pub(super) fn is_igb(dev: &PciDevice) -> bool {
    dev.vendor_id() == ubdirect::igb::regs::INTEL_VENDOR
        && ubdirect::igb::regs::PF_DEVICE_IDS.contains(&dev.device_id())
}

/// The two opened NICs and where their buffers come from.
pub(super) struct IgbPair<'a> {
    pub registry: &'a Arc<UbRegistry>,
    pub tx: &'a Arc<PciDevice>,
    pub rx: &'a Arc<PciDevice>,
    pub pool: Arc<UbPool>,
    pub buffers: String,
}

/// Runs the loop-back on two igb NICs.
pub(super) fn run(
    args: &Args,
    limit: Limit,
    p: IgbPair<'_>,
) -> Result<LoopbackReport, LoopbackError> {
    let open = |dev: &Arc<PciDevice>| {
        Igb::from_device(
            p.registry,
            dev.clone(),
            p.pool.clone(),
            IgbConfig::default(),
        )
    };
    let mut a = open(p.tx)?;
    let mut b = open(p.rx)?;
    let max_frame = a.info().max_frame.min(b.info().max_frame);
    let fs = args.frame_size.unwrap_or(max_frame);
    check_frame_size(
        fs,
        max_frame,
        "the 82576's largest frame without jumbo frames",
    )?;
    let (Some(amac), Some(bmac)) = (a.mac(), b.mac()) else {
        return Err(LoopbackError::Setup(
            "an igb NIC has no valid MAC address in its receive-address register".into(),
        ));
    };
    let window = args
        .window
        .unwrap_or(b.pair(0).map(|q| q.rx_ring_size() - 1).unwrap_or(255))
        .max(1);
    let spec = Spec {
        fs,
        window,
        batch: args.batch,
        limit,
        macs: (amac, bmac),
    };
    let start = Instant::now();
    let (mut qa, mut qb) = (a.pair(0).expect("pair 0"), b.pair(0).expect("pair 0"));
    let (t, seg) = drive(&mut qa, &mut qb, &p.pool, &spec, start)?;
    let elapsed = start.elapsed();
    a.shutdown()?;
    b.shutdown()?;
    let mut report = t.report(RunInfo {
        mode: "ubdirect",
        tx: args.tx,
        rx: args.rx,
        max_frame,
        batch: args.batch,
        elapsed,
        buffers: Some(p.buffers),
    });
    report.segments_ns_per_frame = seg.per_frame(t.sent.max(1));
    Ok(report)
}

/// What one loop-back run sends.
struct Spec {
    fs: usize,
    window: usize,
    batch: usize,
    limit: Limit,
    /// (sender, receiver) MAC addresses.
    macs: ([u8; 6], [u8; 6]),
}

/// Sends pattern frames on `qa` and verifies what arrives on `qb` until the limit is reached
/// and every frame is accounted for, or nothing moved for [`STALL_DEADLINE`].
fn drive(
    qa: &mut QueuePair<'_>,
    qb: &mut QueuePair<'_>,
    pool: &Arc<UbPool>,
    spec: &Spec,
    start: Instant,
) -> Result<(Tally, Segments), LoopbackError> {
    let (amac, bmac) = spec.macs;
    let (fs, limit) = (spec.fs, spec.limit);
    let mut t = Tally::new(fs);
    let mut seg = Segments::default();
    let mut txv: Vec<NicFrame> = Vec::with_capacity(spec.batch);
    let mut rxv: Vec<NicFrame> = Vec::with_capacity(spec.batch);
    // Frame bytes on their way into or out of BAR buffers (copied, never sliced).
    let mut scratch = Vec::with_capacity(fs);
    let (mut last_progress, mut now) = (Instant::now(), Instant::now());
    loop {
        let sending = limit.more(t.sent, start);
        if !sending && txv.is_empty() && t.in_flight() == 0 {
            break;
        }
        while sending
            && txv.len() < spec.batch
            && (t.in_flight() as usize) < spec.window
            && limit.remaining(t.sent) > 0
        {
            let Ok(mut buf) = pool.get() else { break };
            let seq = t.sent;
            write_frame(&mut buf, 0, fs, &mut scratch, |b| {
                pattern::fill(b, bmac, amac, seq)
            })?;
            let f = NicFrame::new(buf, 0, fs).map_err(|(_, e)| LoopbackError::Setup(e.message))?;
            txv.push(f);
            t.sent += 1;
        }
        let t_fill = Instant::now();
        let mut moved = false;
        if !txv.is_empty() {
            moved |= qa.tx_burst(&mut txv)? > 0;
            t.tx_full += u64::from(!txv.is_empty());
        } else {
            qa.reclaim_tx()?;
        }
        let t_tx = Instant::now();
        let n = qb.rx_burst(&mut rxv)?;
        let t_rx = Instant::now();
        for f in rxv.drain(..) {
            let got = frame_bytes(f.buf(), f.offset(), f.len(), &mut scratch)?;
            t.account(pattern::verify(got, bmac, amac, fs));
        }
        moved |= n > 0;
        let t_verify = Instant::now();
        seg.add(now, t_fill, t_tx, t_rx, t_verify);
        now = t_verify;
        if moved {
            last_progress = now;
        } else if now - last_progress > STALL_DEADLINE {
            qa.check_health()?;
            qb.check_health()?;
            t.stalled = true;
            t.sent -= txv.len() as u64;
            txv.clear();
            t.lost += t.in_flight();
            break;
        }
    }
    Ok((t, seg))
}
