//! One RX/TX queue pair: the burst API. Owned by one thread. Nothing here allocates or makes a
//! syscall: RX buffers come from the pool, TX buffers go back to theirs once the device wrote
//! DD, and the only register writes are the tails (one per burst at most).
//!
//! Every value the device writes is checked before use: a descriptor is looked at only if the
//! driver posted it, a received length beyond the buffer is [`IgbError::BadRxLength`], and a
//! head pointer beyond the ring (read only by the idle probe) is [`IgbError::HeadOutOfRange`].
//! Either leaves the pair dead: every later burst returns the same error.

use std::sync::Arc;

use ubdirect_core::barrier::{rmb, wmb};
use ubdirect_core::pci::PciAddress;
use ubdirect_core::seams::{NicFrame, NicStats, MIN_FRAME};
use ubdirect_core::ub::UbPool;
use ubdirect_core::Mmio;

use crate::desc::{RX_DD, RX_EOP};
use crate::error::{IgbError, Result};
use crate::health::IdleClock;
use crate::regs;
use crate::ring::Ring;

/// The cause of `DeviceGone` when a VF's mailbox shows the PF was reset.
const PF_RESET: &str = "V2PMAILBOX.RSTI is set: the PF was reset (its igb driver went down or was unbound) and the VF's configuration with it; open the VF again once the PF driver is up";

/// Why a pair stopped: kept so every later burst returns the same error.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dead {
    Gone(&'static str),
    BadRxLength { index: u16, len: u16 },
    HeadOutOfRange { reg: &'static str, head: u32 },
}

/// The state of one RX and one TX queue of an 82576. Owned by the [`crate::Igb`] for its whole
/// life; callers reach it through [`QueuePair`].
pub(crate) struct PairState {
    pub(crate) addr: PciAddress,
    pub(crate) queue: usize,
    pub(crate) regs: Arc<Mmio>,
    /// Where this function's queue registers are (PF or VF window).
    pub(crate) layout: regs::QueueRegs,
    pub(crate) rx: Ring,
    pub(crate) tx: Ring,
    pub(crate) rx_pool: Arc<UbPool>,
    /// The device's DMA domain: TX buffers of another domain are refused.
    pub(crate) domain: ubdirect_core::DomainId,
    /// Receive buffer size programmed in SRRCTL (bytes).
    pub(crate) rx_buf_len: usize,
    pub(crate) max_frame: usize,
    pub(crate) stats: NicStats,
    pub(crate) idle: IdleClock,
    pub(crate) dead: Option<Dead>,
    /// Dropping the rest of a frame the device spread over several descriptors.
    pub(crate) discarding: bool,
}

impl PairState {
    fn dead_error(&self, d: Dead) -> IgbError {
        let (addr, queue) = (self.addr, self.queue);
        match d {
            Dead::Gone(cause) => IgbError::DeviceGone { addr, cause },
            Dead::BadRxLength { index, len } => IgbError::BadRxLength {
                addr,
                queue,
                index,
                len,
                buf: self.rx_buf_len,
            },
            Dead::HeadOutOfRange { reg, head } => IgbError::HeadOutOfRange {
                addr,
                queue,
                reg,
                head,
                size: if reg == "RDH" {
                    self.rx.size()
                } else {
                    self.tx.size()
                },
            },
        }
    }

    #[inline(always)]
    fn alive(&self) -> Result<()> {
        match self.dead {
            None => Ok(()),
            Some(d) => Err(self.dead_error(d)),
        }
    }

    fn die(&mut self, d: Dead) -> IgbError {
        self.dead = Some(d);
        self.dead_error(d)
    }

    #[inline(always)]
    fn idle_poll(&mut self) -> Result<()> {
        if self.idle.idle_poll() {
            return self.probe();
        }
        Ok(())
    }

    /// The register and bit that stay set while the function's receiver runs, and what a clear
    /// bit means: RCTL.EN on the PF; on a VF (which has no RCTL) its RX queue's enable bit,
    /// which a PF reset or a function-level reset clears.
    fn alive_reg(&self) -> (usize, u32, &'static str) {
        if self.layout == regs::QueueRegs::PF {
            (
                regs::RCTL,
                regs::RCTL_EN,
                "RCTL.EN reads 0: the device was reset behind the driver's back",
            )
        } else {
            (
                self.layout.rxdctl(self.queue),
                regs::QUEUE_ENABLE,
                "the VF's RXDCTL.ENABLE reads 0: its queues were reset behind the driver's back (the PF was reset, or its igb driver unbound)",
            )
        }
    }

    /// Reads STATUS, RCTL (on a VF: RXDCTL, then V2PMAILBOX.RSTI) and the pair's head pointers
    /// once: a dead device or a malformed
    /// head is sticky, a link that is down is reported on this call only.
    #[cold]
    pub(crate) fn probe(&mut self) -> Result<()> {
        self.alive()?;
        let status = self.regs.read32(regs::STATUS);
        if status == u32::MAX {
            return Err(self.die(Dead::Gone("STATUS reads all-ones (0xffffffff)")));
        }
        if status == 0 {
            return Err(self.die(Dead::Gone(crate::bringup::STATUS_ZERO)));
        }
        let (off, bit, cause) = self.alive_reg();
        if self.regs.read32(off) & bit == 0 {
            return Err(self.die(Dead::Gone(cause)));
        }
        if self.layout == regs::QueueRegs::VF
            && self.regs.read32(crate::vf::regs::V2PMAILBOX) & crate::vf::regs::MBX_RSTI != 0
        {
            return Err(self.die(Dead::Gone(PF_RESET)));
        }
        for (reg, off, size) in [
            ("RDH", self.layout.rdh(self.queue), self.rx.size()),
            ("TDH", self.layout.tdh(self.queue), self.tx.size()),
        ] {
            let head = self.regs.read32(off);
            if head >= u32::from(size) {
                return Err(self.die(Dead::HeadOutOfRange { reg, head }));
            }
        }
        if status & regs::STATUS_LU == 0 {
            return Err(IgbError::LinkDown {
                addr: self.addr,
                waited: None,
            });
        }
        Ok(())
    }

    /// Posts pool buffers into every free RX slot and moves the tail once. Counts a refill
    /// failure when the pool runs dry (the ring runs with what it has).
    pub(crate) fn refill_rx(&mut self) -> usize {
        let mut n = 0;
        while self.rx.free() > 0 {
            let Ok(buf) = self.rx_pool.get() else {
                self.stats.rx_refill_failures += 1;
                break;
            };
            let t = self.rx.tail;
            self.rx.desc.post_rx(t, buf.iova());
            self.rx.slots[t as usize] = Some(buf);
            self.rx.tail = self.rx.next(t);
            self.rx.in_flight += 1;
            n += 1;
        }
        if n > 0 {
            wmb();
            self.regs
                .write32(self.layout.rdt(self.queue), u32::from(self.rx.tail));
        }
        n
    }

    /// Takes the next completed RX descriptor: `Ok(None)` when none is done yet.
    fn pop_rx(&mut self) -> Result<Option<NicFrame>> {
        let i = self.rx.clean;
        let status = self.rx.desc.rx_status(i);
        if status & RX_DD == 0 {
            return Ok(None);
        }
        rmb();
        let len = self.rx.desc.rx_len(i);
        let buf = self.rx.slots[i as usize].take();
        self.rx.clean = self.rx.next(i);
        self.rx.in_flight -= 1;
        let Some(buf) = buf else {
            // Unreachable: every in-flight descriptor holds a buffer.
            return Ok(None);
        };
        if status & RX_EOP == 0 || self.discarding {
            // A frame spread over several buffers (never with the sizes this driver programs):
            // dropped whole, up to and including its EOP descriptor.
            self.discarding = status & RX_EOP == 0;
            self.stats.rx_drops += u64::from(status & RX_EOP != 0);
            return Ok(None);
        }
        if len as usize > self.rx_buf_len {
            return Err(self.die(Dead::BadRxLength { index: i, len }));
        }
        if (len as usize) < MIN_FRAME {
            self.stats.rx_drops += 1;
            return Ok(None);
        }
        match NicFrame::new(buf, 0, len as usize) {
            Ok(f) => Ok(Some(f)),
            // The pool's blocks are at least rx_buf_len: unreachable.
            Err(_) => Ok(None),
        }
    }

    /// See [`QueuePair::rx_burst`].
    pub(crate) fn rx_burst(&mut self, out: &mut Vec<NicFrame>) -> Result<usize> {
        self.alive()?;
        let room = out.capacity() - out.len();
        if room == 0 {
            return Err(IgbError::EmptyBurst(
                "rx_burst needs spare capacity in `out`: create it with Vec::with_capacity(batch) and drain it between calls",
            ));
        }
        let mut got = 0;
        let mut seen = 0;
        while got < room && self.rx.in_flight > 0 {
            let before = self.rx.in_flight;
            let f = self.pop_rx()?;
            if self.rx.in_flight == before {
                break;
            }
            seen += 1;
            if let Some(f) = f {
                self.stats.rx_packets += 1;
                self.stats.rx_bytes += f.len() as u64;
                out.push(f);
                got += 1;
            }
        }
        self.refill_rx();
        if seen > 0 {
            self.idle.progress();
        } else {
            self.idle_poll()?;
        }
        Ok(got)
    }

    /// See [`QueuePair::reclaim_tx`].
    pub(crate) fn reclaim_tx(&mut self) -> Result<usize> {
        self.alive()?;
        let mut n = 0;
        while self.tx.in_flight > 0 && self.tx.desc.tx_done(self.tx.clean) {
            let i = self.tx.clean;
            self.tx.slots[i as usize] = None;
            self.tx.clean = self.tx.next(i);
            self.tx.in_flight -= 1;
            n += 1;
        }
        if n > 0 {
            self.idle.progress();
        } else if self.tx.in_flight > 0 {
            self.idle_poll()?;
        }
        Ok(n)
    }

    fn check_frames(&self, frames: &[NicFrame]) -> Result<()> {
        for (index, f) in frames.iter().enumerate() {
            let len = f.len();
            if len > self.max_frame {
                let max = self.max_frame;
                return Err(IgbError::FrameTooLarge { index, len, max });
            }
            if len < MIN_FRAME {
                let min = MIN_FRAME;
                return Err(IgbError::FrameTooShort { index, len, min });
            }
            let region = f.buf().region();
            region.check_dma(self.domain)?;
            region.check_file()?;
        }
        Ok(())
    }

    /// See [`QueuePair::tx_burst`].
    pub(crate) fn tx_burst(&mut self, frames: &mut Vec<NicFrame>) -> Result<usize> {
        if frames.is_empty() {
            return Err(IgbError::EmptyBurst(
                "tx_burst got no frames; call reclaim_tx() to only return finished buffers",
            ));
        }
        self.check_frames(frames)?;
        self.reclaim_tx()?;
        let k = frames.len().min(self.tx.free() as usize);
        if k < frames.len() {
            self.stats.tx_ring_full += 1;
        }
        if k == 0 {
            return Ok(0);
        }
        for f in frames.drain(..k) {
            let (buf, off, len) = f.into_parts();
            let t = self.tx.tail;
            self.tx.desc.post_tx(t, buf.iova() + off as u64, len as u16);
            self.tx.slots[t as usize] = Some(buf);
            self.tx.tail = self.tx.next(t);
            self.tx.in_flight += 1;
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += len as u64;
        }
        wmb();
        self.regs
            .write32(self.layout.tdt(self.queue), u32::from(self.tx.tail));
        Ok(k)
    }
}

/// Driver counters summed over `pairs` (the PF's and the VF's `stats`).
pub(crate) fn summed_stats(pairs: &[PairState]) -> NicStats {
    let mut s = NicStats::default();
    for p in pairs {
        s += p.stats;
    }
    s
}

/// The end of a shutdown: `pairs` (rings and posted buffers) go back when `quiet` says the
/// device stopped; on an error they are leaked on purpose, as the device may still write them.
pub(crate) fn release_after(quiet: Result<()>, pairs: Vec<PairState>) -> Result<()> {
    if quiet.is_err() {
        std::mem::forget(pairs);
    }
    quiet
}

/// One RX queue and one TX queue of an [`Igb`](crate::Igb), borrowed from it
/// ([`Igb::pair`](crate::Igb::pair)). `Send`: hand one to a thread. Nothing here allocates.
/// Frames are [`NicFrame`]s: a TX frame may start at any offset of its buffer, an RX frame
/// starts at offset 0.
pub struct QueuePair<'a> {
    st: &'a mut PairState,
}

impl<'a> QueuePair<'a> {
    pub(crate) fn new(st: &'a mut PairState) -> QueuePair<'a> {
        QueuePair { st }
    }

    /// The largest frame (no FCS) sent or received.
    pub fn max_frame(&self) -> usize {
        self.st.max_frame
    }

    /// This pair's counters.
    pub fn stats(&self) -> NicStats {
        self.st.stats
    }

    /// RX buffers posted to the device.
    pub fn rx_posted(&self) -> usize {
        self.st.rx.in_flight as usize
    }

    /// TX frames the device has not finished yet.
    pub fn tx_in_flight(&self) -> usize {
        self.st.tx.in_flight as usize
    }

    /// RX ring size (descriptors; one always stays empty).
    pub fn rx_ring_size(&self) -> usize {
        self.st.rx.size() as usize
    }

    /// TX ring size (descriptors; one always stays empty).
    pub fn tx_ring_size(&self) -> usize {
        self.st.tx.size() as usize
    }

    /// Probes the device now (STATUS, RCTL, head pointers) instead of waiting for the health
    /// interval: `DeviceGone`, `HeadOutOfRange` (sticky) or `LinkDown`.
    pub fn check_health(&mut self) -> Result<()> {
        self.st.probe()
    }

    /// Receives up to the spare capacity of `out` (never grows it), then refills the RX ring
    /// from the pool. Returns frames appended.
    ///
    /// Errors: [`IgbError::EmptyBurst`] when `out` has no spare capacity;
    /// [`IgbError::BadRxLength`] for a length beyond the buffer (frames appended before it stay
    /// in `out`); after the health interval without progress, [`IgbError::DeviceGone`],
    /// [`IgbError::HeadOutOfRange`] or [`IgbError::LinkDown`]. All but `EmptyBurst` and
    /// `LinkDown` are sticky.
    #[inline]
    pub fn rx_burst(&mut self, out: &mut Vec<NicFrame>) -> Result<usize> {
        self.st.rx_burst(out)
    }

    /// Returns TX buffers the device finished (DD written back) to their pools; returns how
    /// many. Errors as [`QueuePair::rx_burst`] for a dead device.
    #[inline]
    pub fn reclaim_tx(&mut self) -> Result<usize> {
        self.st.reclaim_tx()
    }

    /// Sends frames from the front of `frames` as far as the TX ring has room (after
    /// reclaiming): sent frames leave the `Vec`, unsent ones stay in order. One tail write per
    /// burst. Every frame is checked first: one too long ([`IgbError::FrameTooLarge`]), too
    /// short ([`IgbError::FrameTooShort`]), in a buffer of another DMA domain, or in a file
    /// region whose file changed since it was registered (`CoreError::FileChanged`) fails the
    /// burst with nothing sent.
    #[inline]
    pub fn tx_burst(&mut self, frames: &mut Vec<NicFrame>) -> Result<usize> {
        self.st.tx_burst(frames)
    }
}

impl ubdirect_core::seams::NicQueue for QueuePair<'_> {
    fn max_frame(&self) -> usize {
        self.st.max_frame
    }
    fn tx_headroom(&self) -> usize {
        0
    }
    fn rx_burst(
        &mut self,
        out: &mut Vec<NicFrame>,
    ) -> std::result::Result<usize, ubdirect_core::seams::NicError> {
        self.st.rx_burst(out).map_err(Into::into)
    }
    fn tx_burst(
        &mut self,
        frames: &mut Vec<NicFrame>,
    ) -> std::result::Result<usize, ubdirect_core::seams::NicError> {
        self.st.tx_burst(frames).map_err(Into::into)
    }
    fn reclaim_tx(&mut self) -> std::result::Result<usize, ubdirect_core::seams::NicError> {
        self.st.reclaim_tx().map_err(Into::into)
    }
    fn stats(&self) -> NicStats {
        self.st.stats
    }
}
