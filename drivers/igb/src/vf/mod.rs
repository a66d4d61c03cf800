//! [`IgbVf`]: an 82576 SR-IOV virtual function (0x8086:0x10ca) over vfio-pci, beside a PF that
//! stays on the kernel igb driver.
//!
//! Bring-up: a VF reset (VTCTRL.RST), every interrupt masked, a bounded wait for the PF to be
//! out of reset (V2PMAILBOX.RSTI clear), the RESET handshake over the mailbox (the answer
//! carries the MAC the PF driver assigned), SET_LPE for 1518-byte frames, optional SET_MAC_ADDR
//! and SET_VLAN requests, then the VF's own RX/TX rings, programmed and driven by the same code
//! as the PF's ([`QueueRegs::VF`] says where its queue registers are). Every mailbox wait has
//! a deadline and every answer is checked against its request; the rings trust the device no
//! more than the PF driver's do.

mod mbx;
pub mod regs;

use std::sync::Arc;
use std::time::Duration;

use ubdirect_core::pci::{DeviceClaim, PciAddress, PciDevice};
use ubdirect_core::seams::{Nic, NicError, NicQueue, NicStats};
use ubdirect_core::ub::{UbPool, UbRegistry};
use ubdirect_core::Mmio;

use crate::bringup::{self, poll_until};
use crate::device::{check_rx_pool, IgbConfig, MAX_FRAME};
use crate::error::{IgbError, Result};
use crate::health::{IdleClock, DEFAULT_HEALTH_INTERVAL};
use crate::queue::{PairState, QueuePair};
use crate::regs::{QueueRegs, INTEL_VENDOR, QUEUE_ENABLE, STATUS_LU, VF_DEVICE_ID};
use crate::ring::Ring;
use mbx::Mailbox;
use regs::*;

/// VTCTRL: VF reset.
const VTCTRL_RST: u32 = 1 << 26;

/// Options for [`IgbVf::open`].
#[derive(Debug, Clone)]
pub struct IgbVfConfig {
    /// RX descriptors: a multiple of 8, 8 to 4096 (one always stays empty).
    pub rx_ring_size: u16,
    /// TX descriptors: a multiple of 8, 8 to 4096.
    pub tx_ring_size: u16,
    /// How long the VF reset, the PF's readiness and a queue enable may take (default 1 s).
    pub reset_timeout: Duration,
    /// How long each mailbox step (lock, acknowledgement, answer) may take (default 1 s, as
    /// Linux igbvf; 1 ms to 60 s).
    pub mailbox_timeout: Duration,
    /// How long bring-up waits for VTSTATUS.LU (default 3 s; zero: do not wait).
    pub link_timeout: Duration,
    /// How long a queue pair may move nothing before its next idle burst probes the device.
    pub health_interval: Duration,
    /// A MAC to ask the PF driver for (SET_MAC_ADDR) instead of the one it assigned.
    pub mac: Option<[u8; 6]>,
    /// VLAN ids to add to the VF's filter (SET_VLAN), 0 to 4095.
    pub vlans: Vec<u16>,
}

impl Default for IgbVfConfig {
    fn default() -> Self {
        let pf = IgbConfig::default();
        IgbVfConfig {
            rx_ring_size: pf.rx_ring_size,
            tx_ring_size: pf.tx_ring_size,
            reset_timeout: pf.reset_timeout,
            mailbox_timeout: Duration::from_secs(1),
            link_timeout: pf.link_timeout,
            health_interval: DEFAULT_HEALTH_INTERVAL,
            mac: None,
            vlans: Vec::new(),
        }
    }
}

impl IgbVfConfig {
    /// Checks every value (ring sizes and deadlines as [`IgbConfig::validate`]); the message
    /// says what is allowed.
    pub fn validate(&self) -> Result<()> {
        IgbConfig {
            rx_ring_size: self.rx_ring_size,
            tx_ring_size: self.tx_ring_size,
            reset_timeout: self.reset_timeout,
            link_timeout: self.link_timeout,
            health_interval: self.health_interval,
            ..IgbConfig::default()
        }
        .validate()?;
        let bad = |m: String| Err(IgbError::InvalidConfig(m));
        let mt = self.mailbox_timeout;
        if mt < Duration::from_millis(1) || mt > Duration::from_secs(60) {
            return bad(format!(
                "mailbox_timeout {mt:?} is out of range (1 ms to 60 s)"
            ));
        }
        if let Some(m) = self.mac {
            check_mac(m)?;
        }
        if let Some(v) = self.vlans.iter().find(|&&v| v > 4095) {
            return bad(format!("VLAN id {v} is over 4095"));
        }
        Ok(())
    }
}

/// Refuses a zero or multicast MAC (the PF driver would NACK it).
fn check_mac(m: [u8; 6]) -> Result<()> {
    if m == [0; 6] || m[0] & 1 != 0 {
        return Err(IgbError::InvalidConfig(format!(
            "MAC {m:02x?} is zero or multicast: a VF needs a unicast address"
        )));
    }
    Ok(())
}

/// Facts read at bring-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IgbVfInfo {
    /// PCI address of the VF.
    pub addr: PciAddress,
    /// The VF's MAC: the one the PF driver assigned at RESET, or the one set since (None when
    /// the PF driver has none for it and none was set).
    pub mac: Option<[u8; 6]>,
    /// Largest frame sent or received (no FCS).
    pub max_frame: usize,
    /// Receive buffer size programmed (bytes).
    pub rx_buf_len: usize,
}

/// An opened, running 82576 VF with one queue pair, polled without interrupts.
///
/// Dropping it resets the VF (bounded wait for its queues to stop), then returns every posted
/// buffer to its pool and frees the rings; when the stop cannot be confirmed they are leaked
/// instead, since the device may still write them.
pub struct IgbVf {
    regs: Arc<Mmio>,
    mbx: Mailbox,
    pairs: Vec<PairState>,
    info: IgbVfInfo,
    reset_timeout: Duration,
    span: tracing::Span,
    /// This driver's claim on the device; released last.
    claim: DeviceClaim,
}

/// Checks the ids: an 82576 VF, nothing else.
fn check_ids(dev: &PciDevice) -> Result<()> {
    let (addr, vendor, device) = (dev.address(), dev.vendor_id(), dev.device_id());
    if vendor != INTEL_VENDOR || device != VF_DEVICE_ID {
        return Err(IgbError::NotIgbVf {
            addr,
            vendor,
            device,
        });
    }
    let bar = dev.bar_len(0)?;
    if bar < VF_BAR0_LEN {
        return Err(IgbError::BarTooSmall {
            addr,
            len: bar,
            need: VF_BAR0_LEN,
        });
    }
    Ok(())
}

/// Asks the PF driver for frames of up to [`MAX_FRAME`] bytes (SET_LPE, FCS counted) and
/// returns the VF's largest frame: [`MAX_FRAME`], or 1514 bytes when the PF driver refuses
/// (its pool limit for untagged frames stays).
fn receive_limit(mbx: &mut Mailbox) -> Result<usize> {
    match mbx.set_lpe(MAX_FRAME as u32 + 4) {
        Ok(()) => Ok(MAX_FRAME),
        Err(IgbError::MailboxNack { addr, .. }) => {
            tracing::warn!(%addr, "the PF driver refused SET_LPE: frames up to 1514 bytes only");
            Ok(MAX_FRAME - 4)
        }
        Err(e) => Err(e),
    }
}

/// Resets the VF (VTCTRL.RST) with every interrupt masked. All-ones is `DeviceGone`.
fn reset_vf(r: &Mmio, addr: PciAddress) -> Result<()> {
    let ctrl = r.read32(VTCTRL);
    if ctrl == u32::MAX || r.read32(VTSTATUS) == u32::MAX {
        return Err(IgbError::DeviceGone {
            addr,
            cause: "VTCTRL/VTSTATUS read all-ones before the VF reset",
        });
    }
    r.write32(VTEIMC, u32::MAX);
    r.write32(VTEIAC, 0);
    r.write32(VTCTRL, ctrl | VTCTRL_RST);
    r.write32(VTEIMC, u32::MAX);
    Ok(())
}

impl IgbVf {
    /// Opens the 82576 VF at `addr` (bound to vfio-pci) in the registry's DMA domain: VF reset,
    /// mailbox handshake with the PF driver, MAC and VLAN requests, RX ring filled from
    /// `rx_pool`.
    pub fn open(
        registry: &Arc<UbRegistry>,
        addr: PciAddress,
        rx_pool: Arc<UbPool>,
        cfg: IgbVfConfig,
    ) -> Result<IgbVf> {
        cfg.validate()?;
        let dev = PciDevice::open(registry.domain(), addr)?;
        Self::from_device(registry, dev, rx_pool, cfg)
    }

    /// Like [`IgbVf::open`] for an already opened PCI device (or a device model).
    pub fn from_device(
        registry: &Arc<UbRegistry>,
        dev: Arc<PciDevice>,
        rx_pool: Arc<UbPool>,
        cfg: IgbVfConfig,
    ) -> Result<IgbVf> {
        let addr = dev.address();
        let span = tracing::error_span!("igb-vf", addr = %addr);
        let _entered = span.enter();
        cfg.validate()?;
        check_ids(&dev)?;
        let rx_buf_len = check_rx_pool(registry, &rx_pool, cfg.rx_ring_size)?;
        let claim = dev.claim("igb-vf")?;
        let regs = Arc::new(claim.access().map_bar(0)?);
        claim.access().enable_bus_master()?;
        reset_vf(&regs, addr)?;
        let mut mbx = Mailbox::new(regs.clone(), addr, cfg.mailbox_timeout);
        mbx.wait_pf_ready(cfg.reset_timeout)?;
        let mut mac = mbx.reset()?;
        let max_frame = receive_limit(&mut mbx)?;
        if let Some(m) = cfg.mac {
            mbx.set_mac(m)?;
            mac = Some(m);
        }
        for &v in &cfg.vlans {
            mbx.set_vlan(v, true)?;
        }
        let info = IgbVfInfo {
            addr,
            mac,
            max_frame,
            rx_buf_len,
        };
        let mut vf = IgbVf {
            claim,
            regs,
            mbx,
            pairs: Vec::with_capacity(1),
            info,
            reset_timeout: cfg.reset_timeout,
            span: span.clone(),
        };
        // From here on Drop resets the VF before any ring or buffer is freed.
        vf.setup(registry, rx_pool, &cfg)?;
        tracing::debug!(%addr, mac = ?info.mac, "igb VF up");
        Ok(vf)
    }

    fn setup(
        &mut self,
        registry: &Arc<UbRegistry>,
        rx_pool: Arc<UbPool>,
        cfg: &IgbVfConfig,
    ) -> Result<()> {
        let (r, addr, l) = (&self.regs, self.info.addr, QueueRegs::VF);
        let numa = self.claim.device().numa_node();
        let rx = Ring::new(registry, cfg.rx_ring_size, numa)?;
        let tx = Ring::new(registry, cfg.tx_ring_size, numa)?;
        // Pushed before programming: from now on Drop resets the VF before the ring memory goes.
        self.pairs.push(PairState {
            addr,
            queue: 0,
            regs: r.clone(),
            layout: l,
            rx,
            tx,
            rx_pool,
            domain: registry.domain().id(),
            rx_buf_len: self.info.rx_buf_len,
            max_frame: self.info.max_frame,
            stats: NicStats::default(),
            idle: IdleClock::new(cfg.health_interval),
            dead: None,
            discarding: false,
        });
        let p = self.pairs.last_mut().expect("pushed above");
        let rt = cfg.reset_timeout;
        bringup::setup_rx(r, (addr, 0, l), &p.rx, self.info.rx_buf_len, rt)?;
        bringup::setup_tx(r, (addr, 0, l), &p.tx, rt)?;
        p.refill_rx();
        if !cfg.link_timeout.is_zero() {
            bringup::wait_link(r, addr, cfg.link_timeout)?;
        }
        Ok(())
    }

    /// The tracing span of this VF (`igb-vf{addr=...}`).
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Facts read at bring-up (the MAC follows [`IgbVf::set_mac`]).
    pub fn info(&self) -> &IgbVfInfo {
        &self.info
    }

    /// The VF's MAC address (see [`IgbVfInfo::mac`]).
    pub fn mac(&self) -> Option<[u8; 6]> {
        self.info.mac
    }

    /// Link state from VTSTATUS.LU. `DeviceGone` when it reads all-ones. Not for the I/O path.
    pub fn link_up(&self) -> Result<bool> {
        let s = self.regs.read32(VTSTATUS);
        if s == u32::MAX {
            return Err(IgbError::DeviceGone {
                addr: self.info.addr,
                cause: "VTSTATUS reads all-ones (0xffffffff)",
            });
        }
        Ok(s & STATUS_LU != 0)
    }

    /// Asks the PF driver to give the VF `mac` (SET_MAC_ADDR). [`IgbError::MailboxNack`] when
    /// it refuses, [`IgbError::MailboxTimeout`] when it does not answer.
    pub fn set_mac(&mut self, mac: [u8; 6]) -> Result<()> {
        check_mac(mac)?;
        self.mbx.set_mac(mac)?;
        self.info.mac = Some(mac);
        Ok(())
    }

    /// Asks the PF driver to add (`on`) or remove VLAN `vid` (0 to 4095) from the VF's filter
    /// (SET_VLAN). Errors as [`IgbVf::set_mac`].
    pub fn set_vlan(&mut self, vid: u16, on: bool) -> Result<()> {
        if vid > 4095 {
            return Err(IgbError::InvalidConfig(format!(
                "VLAN id {vid} is over 4095"
            )));
        }
        self.mbx.set_vlan(vid, on)
    }

    /// Queue pair `i` (a VF has one here: 0), as a handle borrowing this VF.
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

    /// Resets the VF and returns every buffer to its pool once its queues read stopped. Also
    /// done by drop; call it to see the error. On any error the rings and posted buffers are
    /// leaked on purpose (the device may still write them).
    pub fn shutdown(mut self) -> Result<()> {
        let r = self.quiesce();
        crate::queue::release_after(r, std::mem::take(&mut self.pairs))
    }

    /// VF reset, then a bounded wait for every queue's enable bit to read 0.
    fn quiesce(&mut self) -> Result<()> {
        let _entered = self.span.clone().entered();
        let (r, addr) = (&self.regs, self.info.addr);
        reset_vf(r, addr)?;
        let l = QueueRegs::VF;
        let mut last = 0;
        let stopped = poll_until(self.reset_timeout, || {
            last = r.read32(l.rxdctl(0)) | r.read32(l.txdctl(0));
            (last & QUEUE_ENABLE == 0).then_some(())
        });
        if last == u32::MAX {
            return Err(IgbError::DeviceGone {
                addr,
                cause: "RXDCTL/TXDCTL read all-ones after the VF reset",
            });
        }
        if stopped.is_none() {
            return Err(IgbError::ResetTimeout {
                addr,
                waited: self.reset_timeout,
                ctrl: last,
            });
        }
        for p in self.pairs.iter_mut() {
            p.rx.drain();
            p.tx.drain();
        }
        Ok(())
    }
}

impl Drop for IgbVf {
    fn drop(&mut self) {
        if self.pairs.is_empty() {
            return;
        }
        if let Err(e) = self.quiesce() {
            tracing::error!(addr = %self.info.addr, error = %e,
                "igb VF reset failed at shutdown: leaking ring memory and buffers rather than freeing memory the device may still write");
            std::mem::forget(std::mem::take(&mut self.pairs));
        }
    }
}

impl Nic for IgbVf {
    fn driver(&self) -> &'static str {
        "igb-vf"
    }

    fn mac(&self) -> Option<[u8; 6]> {
        IgbVf::mac(self)
    }

    fn link_up(&self) -> std::result::Result<Option<bool>, NicError> {
        IgbVf::link_up(self).map(Some).map_err(Into::into)
    }

    fn max_frame(&self) -> usize {
        self.info.max_frame
    }

    fn pair_count(&self) -> usize {
        IgbVf::pair_count(self)
    }

    fn stats(&self) -> NicStats {
        IgbVf::stats(self)
    }

    fn queue(&mut self, i: usize) -> Option<Box<dyn NicQueue + '_>> {
        self.pair(i).map(|p| Box::new(p) as Box<dyn NicQueue + '_>)
    }
}
