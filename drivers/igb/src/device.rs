//! [`Igb`]: bring-up of an 82576 physical function over vfio-pci, its queue pairs, device facts
//! (MAC, link, statistics) and a clean shutdown.

use std::sync::Arc;
use std::time::Duration;

use ubdirect_core::pci::{DeviceClaim, PciAddress, PciDevice};
use ubdirect_core::seams::NicStats;
use ubdirect_core::ub::{UbPool, UbRegistry};
use ubdirect_core::Mmio;

use crate::bringup;
use crate::error::{IgbError, Result};
use crate::health::{IdleClock, DEFAULT_HEALTH_INTERVAL};
use crate::hw_stats::HwStats;
use crate::queue::{PairState, QueuePair};
use crate::regs;
use crate::ring::Ring;

/// Largest frame without jumbo frames: 1500-byte MTU + 14-byte header + 4-byte VLAN tag.
pub const MAX_FRAME: usize = 1518;
/// Smallest receive buffer this driver programs (SRRCTL counts in KiB).
pub const MIN_RX_BUF: usize = 2048;
/// Largest receive buffer this driver programs.
pub const MAX_RX_BUF: usize = 16 * 1024;
/// Largest ring (descriptors).
pub const MAX_RING: u16 = 4096;
/// Default ring size.
pub const DEFAULT_RING: u16 = 256;

/// Options for [`Igb::open`].
#[derive(Debug, Clone)]
pub struct IgbConfig {
    /// Queue pairs to use (1: receive-side scaling is not programmed).
    pub queue_pairs: u16,
    /// RX descriptors per pair: a multiple of 8, 8 to 4096 (one always stays empty).
    pub rx_ring_size: u16,
    /// TX descriptors per pair: a multiple of 8, 8 to 4096.
    pub tx_ring_size: u16,
    /// Receive every unicast and multicast frame, not only the device MAC's (default on).
    pub promiscuous: bool,
    /// How long a reset, a PHY access or a queue enable may take (default 1 s).
    pub reset_timeout: Duration,
    /// How long bring-up waits for the link (default 3 s; QEMU's emulated auto-negotiation
    /// takes 0.5 s). Zero: do not wait (check [`Igb::link_up`] yourself).
    pub link_timeout: Duration,
    /// How long a queue pair may move nothing before its next idle burst probes the device
    /// (default 100 ms; 1 ms to 1 hour).
    pub health_interval: Duration,
}

impl Default for IgbConfig {
    fn default() -> Self {
        IgbConfig {
            queue_pairs: 1,
            rx_ring_size: DEFAULT_RING,
            tx_ring_size: DEFAULT_RING,
            promiscuous: true,
            reset_timeout: Duration::from_secs(1),
            link_timeout: Duration::from_secs(3),
            health_interval: DEFAULT_HEALTH_INTERVAL,
        }
    }
}

impl IgbConfig {
    /// Checks every value; the message says what is allowed.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(IgbError::InvalidConfig(m));
        if self.queue_pairs != 1 {
            return bad(format!(
                "{} queue pairs asked for; this driver programs one (no receive-side scaling yet)",
                self.queue_pairs
            ));
        }
        for (what, n) in [
            ("rx_ring_size", self.rx_ring_size),
            ("tx_ring_size", self.tx_ring_size),
        ] {
            if !(8..=MAX_RING).contains(&n) || n % 8 != 0 {
                return bad(format!(
                    "{what} {n} is not a multiple of 8 between 8 and {MAX_RING} (the ring length must be a multiple of 128 bytes)"
                ));
            }
        }
        let hi = self.health_interval;
        if hi < Duration::from_millis(1) || hi > Duration::from_secs(3600) {
            return bad(format!(
                "health_interval {hi:?} is out of range (1 ms to 1 hour)"
            ));
        }
        let rt = self.reset_timeout;
        if rt < Duration::from_millis(1) || rt > Duration::from_secs(60) {
            return bad(format!(
                "reset_timeout {rt:?} is out of range (1 ms to 60 s)"
            ));
        }
        if self.link_timeout > Duration::from_secs(600) {
            return bad(format!(
                "link_timeout {:?} is over 600 s",
                self.link_timeout
            ));
        }
        Ok(())
    }
}

/// Facts read at bring-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IgbInfo {
    /// PCI address.
    pub addr: PciAddress,
    /// PCI device id.
    pub device_id: u16,
    /// MAC address from receive-address entry 0 (the EEPROM's, loaded at reset).
    pub mac: Option<[u8; 6]>,
    /// Largest frame sent or received (no FCS).
    pub max_frame: usize,
    /// Receive buffer size programmed (bytes).
    pub rx_buf_len: usize,
}

/// An opened, running 82576 with its queue pairs, polled without interrupts.
///
/// Dropping it resets the device (bounded wait), then returns every posted buffer to its pool
/// and frees the rings; when the reset cannot be confirmed (the device is gone) they are leaked
/// instead, since the device may still write them.
pub struct Igb {
    regs: Arc<Mmio>,
    pairs: Vec<PairState>,
    info: IgbInfo,
    reset_timeout: Duration,
    hw: HwStats,
    span: tracing::Span,
    /// This driver's claim on the device: the only way to program it while the NIC is open;
    /// released last.
    claim: DeviceClaim,
}

/// Checks the ids: an 82576 PF, not its VF, nothing else.
fn check_ids(dev: &PciDevice) -> Result<()> {
    let (addr, vendor, device) = (dev.address(), dev.vendor_id(), dev.device_id());
    if vendor == regs::INTEL_VENDOR && device == regs::VF_DEVICE_ID {
        return Err(IgbError::VirtualFunction { addr });
    }
    if vendor != regs::INTEL_VENDOR || !regs::PF_DEVICE_IDS.contains(&device) {
        return Err(IgbError::NotIgb {
            addr,
            vendor,
            device,
        });
    }
    Ok(())
}

/// The receive buffer size for `pool`'s blocks: whole KiB, 2 to 16 KiB.
fn rx_buf_len(pool: &UbPool) -> Result<usize> {
    let bs = pool.block_size();
    if bs < MIN_RX_BUF {
        return Err(IgbError::RxBlocksTooSmall {
            block_size: bs,
            need: MIN_RX_BUF,
        });
    }
    Ok(bs.min(MAX_RX_BUF) / 1024 * 1024)
}

/// Checks `pool` can feed an RX ring of `ring` descriptors of a device in `registry`'s domain:
/// blocks of 2 KiB or more, enough of them, mapped in the domain and writable. Returns the
/// receive buffer size to program.
pub(crate) fn check_rx_pool(registry: &UbRegistry, pool: &UbPool, ring: u16) -> Result<usize> {
    let buf_len = rx_buf_len(pool)?;
    let need = ring as usize - 1;
    let blocks = pool.block_count();
    if blocks < need {
        return Err(IgbError::RxPoolTooSmall { blocks, need });
    }
    // RX buffers go to the device by IOVA: they must be mapped in its domain, writable.
    pool.region().check_dma(registry.domain().id())?;
    if pool.region().is_read_only() {
        let region = pool.region().id;
        return Err(IgbError::RxPoolReadOnly { region });
    }
    Ok(buf_len)
}

impl Igb {
    /// Opens the 82576 PF at `addr` (bound to vfio-pci) in the registry's DMA domain, resets
    /// it, brings the link up and fills the RX ring(s) from `rx_pool`.
    pub fn open(
        registry: &Arc<UbRegistry>,
        addr: PciAddress,
        rx_pool: Arc<UbPool>,
        cfg: IgbConfig,
    ) -> Result<Igb> {
        cfg.validate()?;
        let dev = PciDevice::open(registry.domain(), addr)?;
        Self::from_device(registry, dev, rx_pool, cfg)
    }

    /// Like [`Igb::open`] for an already opened PCI device (or a device model).
    pub fn from_device(
        registry: &Arc<UbRegistry>,
        dev: Arc<PciDevice>,
        rx_pool: Arc<UbPool>,
        cfg: IgbConfig,
    ) -> Result<Igb> {
        let addr = dev.address();
        let span = tracing::error_span!("igb", addr = %addr);
        let _entered = span.enter();
        cfg.validate()?;
        check_ids(&dev)?;
        let buf_len = check_rx_pool(registry, &rx_pool, cfg.rx_ring_size)?;
        let bar = dev.bar_len(0)?;
        if bar < regs::BAR0_LEN {
            return Err(IgbError::BarTooSmall {
                addr,
                len: bar,
                need: regs::BAR0_LEN,
            });
        }
        let claim = dev.claim("igb")?;
        let regs = Arc::new(claim.access().map_bar(0)?);
        claim.access().enable_bus_master()?;
        bringup::reset(&regs, addr, cfg.reset_timeout)?;
        let info = IgbInfo {
            addr,
            device_id: dev.device_id(),
            mac: bringup::read_mac(&regs),
            max_frame: MAX_FRAME,
            rx_buf_len: buf_len,
        };
        let mut igb = Igb {
            claim,
            regs,
            pairs: Vec::with_capacity(cfg.queue_pairs as usize),
            info,
            reset_timeout: cfg.reset_timeout,
            hw: HwStats::default(),
            span: span.clone(),
        };
        // From here on Drop resets the device before any ring or buffer is freed.
        igb.setup(registry, rx_pool, &cfg)?;
        tracing::debug!(%addr, mac = ?info.mac, "igb up");
        Ok(igb)
    }

    fn setup(
        &mut self,
        registry: &Arc<UbRegistry>,
        rx_pool: Arc<UbPool>,
        cfg: &IgbConfig,
    ) -> Result<()> {
        let (r, addr) = (&self.regs, self.info.addr);
        bringup::link_up(r, addr, cfg.reset_timeout)?;
        let numa = self.claim.device().numa_node();
        for q in 0..cfg.queue_pairs as usize {
            let rx = Ring::new(registry, cfg.rx_ring_size, numa)?;
            let tx = Ring::new(registry, cfg.tx_ring_size, numa)?;
            // Pushed before programming: from now on Drop resets the device before the ring
            // memory goes.
            self.pairs.push(PairState {
                addr,
                queue: q,
                regs: r.clone(),
                layout: regs::QueueRegs::PF,
                rx,
                tx,
                rx_pool: rx_pool.clone(),
                domain: registry.domain().id(),
                rx_buf_len: self.info.rx_buf_len,
                max_frame: self.info.max_frame,
                stats: NicStats::default(),
                idle: IdleClock::new(cfg.health_interval),
                dead: None,
                discarding: false,
            });
            let p = self.pairs.last().expect("pushed above");
            bringup::setup_rx(
                r,
                (addr, q, regs::QueueRegs::PF),
                &p.rx,
                self.info.rx_buf_len,
                cfg.reset_timeout,
            )?;
            bringup::setup_tx(r, (addr, q, regs::QueueRegs::PF), &p.tx, cfg.reset_timeout)?;
        }
        bringup::enable_rx_tx(r, cfg.promiscuous, self.info.max_frame);
        for p in self.pairs.iter_mut() {
            p.refill_rx();
        }
        if !cfg.link_timeout.is_zero() {
            bringup::wait_link(r, addr, cfg.link_timeout)?;
        }
        // Start the counters from zero.
        HwStats::default().accumulate(r);
        Ok(())
    }

    /// The tracing span of this device (`igb{addr=...}`).
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Facts read at bring-up.
    pub fn info(&self) -> &IgbInfo {
        &self.info
    }

    /// The MAC address, when receive-address entry 0 holds a valid one.
    pub fn mac(&self) -> Option<[u8; 6]> {
        self.info.mac
    }

    /// Link state from STATUS.LU. `DeviceGone` when STATUS reads all-ones. Not for the I/O path.
    pub fn link_up(&self) -> Result<bool> {
        let s = self.regs.read32(regs::STATUS);
        if s == u32::MAX {
            return Err(IgbError::DeviceGone {
                addr: self.info.addr,
                cause: "STATUS reads all-ones (0xffffffff)",
            });
        }
        Ok(s & regs::STATUS_LU != 0)
    }

    /// Reads the device's statistics registers (clear on read) and returns the totals since
    /// bring-up. `DeviceGone` when the device reads all-ones (the totals are left as they were).
    pub fn hw_stats(&mut self) -> Result<HwStats> {
        self.link_up()?;
        let mut next = self.hw;
        next.accumulate(&self.regs);
        self.link_up()?;
        self.hw = next;
        Ok(self.hw)
    }

    /// Queue pair `i`, as a handle borrowing this device.
    pub fn pair(&mut self, i: usize) -> Option<QueuePair<'_>> {
        self.pairs.get_mut(i).map(QueuePair::new)
    }

    /// Number of queue pairs in use.
    pub fn pair_count(&self) -> usize {
        self.pairs.len()
    }

    /// Driver counters summed over all pairs.
    pub fn stats(&self) -> NicStats {
        crate::queue::summed_stats(&self.pairs)
    }

    /// Resets the device and returns every buffer to its pool once the reset is confirmed.
    /// Also done by drop; call it to see the error. On any error the rings and posted buffers
    /// are leaked on purpose (the device may still write them).
    pub fn shutdown(mut self) -> Result<()> {
        let r = self.quiesce();
        crate::queue::release_after(r, std::mem::take(&mut self.pairs))
    }

    fn quiesce(&mut self) -> Result<()> {
        let _entered = self.span.clone().entered();
        bringup::reset(&self.regs, self.info.addr, self.reset_timeout)?;
        for p in self.pairs.iter_mut() {
            p.rx.drain();
            p.tx.drain();
        }
        Ok(())
    }
}

impl Drop for Igb {
    fn drop(&mut self) {
        if self.pairs.is_empty() {
            return;
        }
        if let Err(e) = self.quiesce() {
            tracing::error!(addr = %self.info.addr, error = %e,
                "igb reset failed at shutdown: leaking ring memory and buffers rather than freeing memory the device may still write");
            std::mem::forget(std::mem::take(&mut self.pairs));
        }
    }
}
