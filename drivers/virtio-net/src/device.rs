//! [`VirtioNet`]: bring-up of a virtio-net device over vfio-pci, its queue pairs, device
//! information (MAC, link, MTU) and a clean shutdown.

use std::sync::Arc;
use std::time::Duration;

use ubdirect_core::pci::{PciAddress, PciDevice};
use ubdirect_core::ub::{DmaMem, UbPool, UbRegistry};

use crate::common_cfg::status;
use crate::ctrl_queue::{
    CtrlError, CtrlQueue, CTRL_MQ, CTRL_MQ_VQ_PAIRS_SET, CTRL_RX, CTRL_RX_ALLMULTI,
    CTRL_RX_PROMISC, CTRL_TIMEOUT,
};
use crate::error::{Result, VirtioNetError};
use crate::features::{self, Features};
use crate::frame::{RxFrame, TxFrame};
use crate::health::{IdleClock, DEFAULT_HEALTH_INTERVAL};
use crate::net_config as ncfg;
use crate::net_header::{VirtioNetHdr, NET_HDR_LEN};
use crate::queue_pair::{PairState, Queue, QueuePair};
use crate::ring::{RingLayout, SplitRing};
use crate::stats::NetStats;
use crate::transport::{Transport, RESET_TIMEOUT};

/// PCI vendor id of virtio devices.
pub const VIRTIO_VENDOR: u16 = 0x1af4;
/// PCI device id of a modern (virtio 1.x only) network device.
pub const DEVICE_ID_NET_MODERN: u16 = 0x1041;
/// PCI device id of a transitional network device.
pub const DEVICE_ID_NET_TRANSITIONAL: u16 = 0x1000;
/// Default ring size when the caller does not choose one (capped by the device's maximum).
pub const DEFAULT_QUEUE_SIZE: u16 = 256;

/// Options for [`VirtioNet::open`].
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// RX/TX queue pairs to use (1 unless the device offers multiqueue).
    pub queue_pairs: u16,
    /// RX ring entries per pair (power of two; default: min(device max, 256)).
    pub rx_queue_size: Option<u16>,
    /// TX ring entries per pair (power of two; default: min(device max, 256)).
    pub tx_queue_size: Option<u16>,
    /// How long a queue pair may move nothing (no frame received, no TX buffer finished)
    /// before its next idle burst call reads device_status once and fails with `DeviceGone` /
    /// `DeviceNeedsReset` if the device is dead (default 100 ms; 1 ms to 1 hour). An idle pair
    /// pays one MMIO read per interval; a busy one none.
    pub health_interval: Duration,
    /// How long the device may take to answer one control-queue command (MQ pair count,
    /// receive filters), counted from that command's doorbell (default 2 s; 1 ms to 60 s).
    /// After a timeout the control queue is wedged: every later control command fails with
    /// `ControlQueueWedged` and nothing is sent (the device may still own the command buffer).
    pub ctrl_timeout: Duration,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            queue_pairs: 1,
            rx_queue_size: None,
            tx_queue_size: None,
            health_interval: DEFAULT_HEALTH_INTERVAL,
            ctrl_timeout: CTRL_TIMEOUT,
        }
    }
}

/// Static facts read from the device at bring-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct NetInfo {
    /// PCI address.
    #[serde(skip)]
    pub addr: PciAddress,
    /// MAC address (when the device offers VIRTIO_NET_F_MAC).
    pub mac: Option<[u8; 6]>,
    /// MTU the device reports (VIRTIO_NET_F_MTU), if offered.
    pub mtu: Option<u16>,
    /// Largest frame without the virtio-net header: MTU + 14, or 1514 without the MTU feature.
    pub max_frame: usize,
    /// Queue pairs the device supports (1 without VIRTIO_NET_F_MQ).
    pub max_queue_pairs: u16,
    /// Negotiated feature bits.
    #[serde(skip)]
    pub features: Features,
}

/// An opened, running virtio-net device with its queue pairs.
///
/// Dropping it resets the device (bounded wait), then returns every posted buffer to its pool
/// and releases the ring memory: nothing is freed while the device could still use it.
pub struct VirtioNet {
    transport: Transport,
    pairs: Vec<PairState>,
    ctrl: Option<CtrlQueue>,
    info: NetInfo,
    /// `virtio_net{addr=...}`: entered around bring-up and shutdown so their events name it.
    span: tracing::Span,
}

fn pick_size(want: Option<u16>, max: u16) -> Result<u16> {
    let size = match want {
        Some(s) if s == 0 || !s.is_power_of_two() => {
            return Err(VirtioNetError::InvalidConfig(format!(
                "queue size {s} is not a power of two (use 64, 128, 256, ...)"
            )))
        }
        Some(s) if s > max => {
            return Err(VirtioNetError::InvalidConfig(format!(
                "queue size {s} exceeds the device's maximum of {max}"
            )))
        }
        Some(s) => s,
        None => DEFAULT_QUEUE_SIZE.min(max),
    };
    // A device maximum need not be a power of two: round down.
    Ok(1u16 << (15 - size.leading_zeros().min(15)))
}

impl NetConfig {
    /// Refuse settings out of range.
    fn check(&self) -> Result<()> {
        if self.queue_pairs == 0 {
            return Err(VirtioNetError::InvalidConfig(
                "queue_pairs must be at least 1".into(),
            ));
        }
        let hi = &self.health_interval;
        if *hi < Duration::from_millis(1) || *hi > Duration::from_secs(3600) {
            return Err(VirtioNetError::InvalidConfig(format!(
                "health_interval {hi:?} is out of range (1 ms to 1 hour; default 100 ms): it bounds how long a dead device passes for a quiet link"
            )));
        }
        let ct = self.ctrl_timeout;
        if ct < Duration::from_millis(1) || ct > Duration::from_secs(60) {
            return Err(VirtioNetError::InvalidConfig(format!(
                "ctrl_timeout {ct:?} is out of range (1 ms to 60 s; default 2 s): it bounds every control-queue command"
            )));
        }
        Ok(())
    }
}

/// Refuse a device that is not a virtio network device.
fn check_identity(dev: &PciDevice) -> Result<()> {
    let (vendor, device) = (dev.vendor_id(), dev.device_id());
    if vendor != VIRTIO_VENDOR
        || (device != DEVICE_ID_NET_MODERN && device != DEVICE_ID_NET_TRANSITIONAL)
    {
        return Err(VirtioNetError::NotVirtioNet {
            addr: dev.address(),
            vendor,
            device,
        });
    }
    Ok(())
}

/// Reset the device, acknowledge it and agree on features; (offered, accepted). A device
/// without the features the driver needs is marked FAILED.
fn negotiate(t: &Transport, addr: PciAddress, queue_pairs: u16) -> Result<(Features, Features)> {
    t.access().enable_bus_master()?;
    t.reset(RESET_TIMEOUT)?;
    t.add_status(status::ACKNOWLEDGE)?;
    t.add_status(status::DRIVER)?;
    let offered = t.device_features();
    let accepted = match features::negotiate(offered, queue_pairs) {
        Ok(a) => a,
        Err(missing) => {
            t.add_status(status::FAILED)?;
            return Err(VirtioNetError::MissingFeatures { addr, missing });
        }
    };
    t.set_features(accepted)?;
    t.disable_config_vector()?;
    Ok((offered, accepted))
}

/// The device-specific configuration (MAC, pairs, MTU); a device whose configuration breaks
/// what the features promise is marked FAILED.
fn read_net_config(
    t: &Transport,
    addr: PciAddress,
    offered: Features,
    accepted: Features,
) -> Result<ncfg::NetDeviceConfig> {
    let parsed = match t.read_device_config(|m| {
        let len = Some(m.len());
        ncfg::parse_net_config(offered, accepted, len, |o| m.read8(o), |o| m.read16(o))
    })? {
        Some(r) => r,
        None => ncfg::parse_net_config(offered, accepted, None, |_| 0, |_| 0),
    };
    match parsed {
        Ok(c) => Ok(c),
        Err(source) => {
            t.add_status(status::FAILED)?;
            Err(VirtioNetError::DeviceConfig { addr, source })
        }
    }
}

/// Refuse (after a reset) more queue pairs than the device has.
fn check_queue_pairs(
    t: &Transport,
    queue_pairs: u16,
    accepted: Features,
    max_pairs: u16,
) -> Result<()> {
    if queue_pairs <= 1 {
        return Ok(());
    }
    if !accepted.contains(Features::NET_MQ) {
        t.reset(RESET_TIMEOUT)?;
        return Err(VirtioNetError::InvalidConfig(format!(
            "{queue_pairs} queue pairs asked for but the device offers no multiqueue (VIRTIO_NET_F_MQ with a control queue; QEMU: mq=on on a multi-queue netdev): use 1"
        )));
    }
    if queue_pairs > max_pairs {
        t.reset(RESET_TIMEOUT)?;
        return Err(VirtioNetError::InvalidConfig(format!(
            "{queue_pairs} queue pairs asked for; the device has at most {max_pairs}"
        )));
    }
    Ok(())
}

/// The length of an RX buffer: header + the largest frame in one descriptor (no MRG_RXBUF).
/// Pool blocks smaller than that are refused (after a reset).
fn rx_buf_len(t: &Transport, rx_pool: &UbPool, max_frame: usize) -> Result<u32> {
    let need = NET_HDR_LEN + max_frame;
    let block_size = rx_pool.block_size();
    if block_size < need {
        t.reset(RESET_TIMEOUT)?;
        return Err(VirtioNetError::RxBlocksTooSmall {
            block_size,
            need,
            max_frame,
        });
    }
    Ok(need.min(u32::MAX as usize) as u32)
}

/// The typed error for a failed control command.
fn ctrl_error(addr: PciAddress, what: &'static str, e: CtrlError) -> VirtioNetError {
    match e {
        CtrlError::Refused(reason) | CtrlError::Malformed(reason) => {
            VirtioNetError::ControlCommand { addr, what, reason }
        }
        CtrlError::Timeout(waited) => VirtioNetError::ControlTimeout { addr, what, waited },
        CtrlError::Wedged(cause) => VirtioNetError::ControlQueueWedged { addr, what, cause },
    }
}

impl VirtioNet {
    /// Opens the virtio-net device at `addr` (bound to vfio-pci) in the registry's DMA domain,
    /// negotiates features, sets up `cfg.queue_pairs` RX/TX pairs polled without interrupts,
    /// and fills the RX rings from `rx_pool`.
    pub fn open(
        registry: &Arc<UbRegistry>,
        addr: PciAddress,
        rx_pool: Arc<UbPool>,
        cfg: NetConfig,
    ) -> Result<VirtioNet> {
        let dev = PciDevice::open(registry.domain(), addr)?;
        Self::from_device(registry, dev, rx_pool, cfg)
    }

    /// Like [`VirtioNet::open`] for an already opened PCI device.
    pub fn from_device(
        registry: &Arc<UbRegistry>,
        dev: Arc<PciDevice>,
        rx_pool: Arc<UbPool>,
        cfg: NetConfig,
    ) -> Result<VirtioNet> {
        let addr = dev.address();
        // ERROR level: the span is enabled whenever any event is, so a warn-only filter still
        // shows which NIC an event is about.
        let span = tracing::error_span!("virtio_net", addr = %addr);
        let _entered = span.enter();
        check_identity(&dev)?;
        cfg.check()?;
        // RX buffers go to the device by IOVA: they must be mapped in its domain, writable.
        rx_pool.region().check_dma(registry.domain().id())?;
        if rx_pool.region().is_read_only() {
            let region = rx_pool.region().id;
            return Err(VirtioNetError::RxPoolReadOnly { region });
        }
        let t = Transport::open(dev.claim("virtio-net")?)?;
        let (offered, accepted) = negotiate(&t, addr, cfg.queue_pairs)?;
        let ncfg::NetDeviceConfig {
            mac,
            max_pairs,
            mtu,
        } = read_net_config(&t, addr, offered, accepted)?;
        let max_frame = mtu
            .map(|m| m as usize + ncfg::ETH_HLEN)
            .unwrap_or(ncfg::DEFAULT_MAX_FRAME);
        check_queue_pairs(&t, cfg.queue_pairs, accepted, max_pairs)?;
        let info = NetInfo {
            addr,
            mac,
            mtu,
            max_frame,
            max_queue_pairs: max_pairs.max(1),
            features: accepted,
        };
        let rx_buf_len = rx_buf_len(&t, &rx_pool, max_frame)?;
        let mut net = VirtioNet {
            transport: t,
            pairs: Vec::with_capacity(cfg.queue_pairs as usize),
            ctrl: None,
            info,
            span: span.clone(),
        };
        if let Err(e) = net.bring_up(registry, &rx_pool, &cfg, rx_buf_len, max_pairs) {
            // Drop resets the device before the rings and buffers go.
            drop(net);
            return Err(e);
        }
        net.transport.check_health()?;
        tracing::debug!(%addr, ?accepted, ?mac, ?mtu, "virtio-net up");
        Ok(net)
    }

    /// Set up the queue pairs and the control queue, set DRIVER_OK, then the pair count and
    /// the first RX buffers. On an error the caller drops `self`, which resets the device.
    fn bring_up(
        &mut self,
        registry: &Arc<UbRegistry>,
        rx_pool: &Arc<UbPool>,
        cfg: &NetConfig,
        rx_buf_len: u32,
        max_pairs: u16,
    ) -> Result<()> {
        let addr = self.info.addr;
        for p in 0..cfg.queue_pairs {
            let rx = self.open_queue(registry, 2 * p, cfg.rx_queue_size)?;
            let tx = self.open_queue(registry, 2 * p + 1, cfg.tx_queue_size)?;
            self.pairs.push(PairState {
                addr,
                rx,
                tx,
                rx_pool: rx_pool.clone(),
                domain: registry.domain().id(),
                rx_buf_len,
                max_frame: self.info.max_frame,
                stats: NetStats::default(),
                idle: IdleClock::new(cfg.health_interval),
                probe: self.transport.probe(),
                dead: None,
            });
        }
        let ring_total: usize = self.pairs.iter().map(|p| p.rx_ring_size()).sum();
        let blocks = rx_pool.stats().block_count;
        if blocks < ring_total {
            return Err(VirtioNetError::RxPoolTooSmall {
                blocks,
                need: ring_total,
                pairs: self.pairs.len(),
                ring: self.pairs[0].rx_ring_size(),
            });
        }
        let t = &self.transport;
        let accepted = self.info.features;
        // The control queue follows the data queues: index 2 x max pairs with MQ, else 2.
        if accepted.contains(Features::NET_CTRL_VQ) {
            let q = ncfg::ctrl_queue_index(accepted, max_pairs, t.num_queues())
                .map_err(|source| VirtioNetError::DeviceConfig { addr, source })?;
            self.ctrl = Some(CtrlQueue::new(t, registry, q, cfg.ctrl_timeout)?);
        }
        t.add_status(status::DRIVER_OK)?;
        t.check_health()?;
        if cfg.queue_pairs > 1 {
            let c = self.ctrl.as_mut().expect("MQ implies the control queue");
            c.command(
                CTRL_MQ,
                CTRL_MQ_VQ_PAIRS_SET,
                &cfg.queue_pairs.to_le_bytes(),
            )
            .map_err(|e| ctrl_error(addr, "MQ_VQ_PAIRS_SET", e))?;
        }
        for p in self.pairs.iter_mut() {
            p.refill_rx();
        }
        Ok(())
    }

    /// Virtqueue `q` with `want` entries (or the default), its ring in DMA memory on the
    /// device's NUMA node, handed to the device.
    fn open_queue(&self, registry: &Arc<UbRegistry>, q: u16, want: Option<u16>) -> Result<Queue> {
        let (t, addr) = (&self.transport, self.info.addr);
        let max = if q < t.num_queues() {
            t.queue_max_size(q)
        } else {
            0
        };
        if max == 0 {
            return Err(VirtioNetError::QueueUnavailable {
                addr,
                queue: q,
                num_queues: t.num_queues(),
            });
        }
        let size = pick_size(want, max)?;
        let layout = RingLayout::new(size).expect("power of two <= 32768");
        // The ring, then the plain header of TX chains, on the device's NUMA node.
        let hdr_off = layout.total.next_multiple_of(16);
        let mem = DmaMem::alloc_on(registry, hdr_off + NET_HDR_LEN, t.device().numa_node())?;
        // SAFETY: [hdr_off, hdr_off + NET_HDR_LEN) lies inside `mem` (allocated that long),
        // which nothing else uses yet; the ring below covers only [0, layout.total).
        unsafe {
            let hdr = std::slice::from_raw_parts_mut(mem.as_ptr().add(hdr_off), NET_HDR_LEN);
            VirtioNetHdr::write_plain(hdr);
        }
        let event_idx = self.info.features.contains(Features::EVENT_IDX);
        // SAFETY: DmaMem is zeroed, page aligned, at least layout.total bytes, and lives in
        // the Queue beside the ring for as long as the ring does.
        let ring = unsafe { SplitRing::new(mem.as_ptr(), mem.iova(), size, event_idx) }.map_err(
            |source| VirtioNetError::Ring {
                addr,
                queue: q,
                source,
            },
        )?;
        let doorbell = t.setup_queue(q, &ring)?;
        let slots = (0..size)
            .map(|_| None)
            .collect::<Vec<_>>()
            .into_boxed_slice();
        Ok(Queue {
            index: q,
            ring,
            slots,
            doorbell,
            hdr_iova: mem.iova() + hdr_off as u64,
            _mem: mem,
        })
    }

    /// The tracing span of this device (`virtio_net{addr=0000:00:05.0}`): the driver enters
    /// it around bring-up and shutdown so every event there names the device; enter it around
    /// your own events about this NIC.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The NUMA nodes the device's host memory was placed on: each queue pair's RX and TX
    /// rings, then the control queue's ring and command page (the device's node).
    pub fn host_memory_numa(&self) -> Vec<Option<u32>> {
        let mut v: Vec<Option<u32>> = self
            .pairs
            .iter()
            .flat_map(|p| [p.rx._mem.region().numa, p.tx._mem.region().numa])
            .collect();
        if let Some(c) = &self.ctrl {
            v.extend(c.numa_nodes());
        }
        v
    }
    /// Facts read at bring-up.
    pub fn info(&self) -> &NetInfo {
        &self.info
    }

    /// The MAC address, when the device has one.
    pub fn mac(&self) -> Option<[u8; 6]> {
        self.info.mac
    }

    /// The largest frame (without the virtio-net header) this device sends or receives.
    pub fn max_frame(&self) -> usize {
        self.info.max_frame
    }

    /// Link state: `Some(up)` with VIRTIO_NET_F_STATUS, `None` when the device does not report
    /// it (then the link is always up). Reads the device config: not for the I/O path.
    pub fn link_up(&self) -> Result<Option<bool>> {
        if !self.info.features.contains(Features::NET_STATUS) {
            return Ok(None);
        }
        self.transport.check_health()?;
        let s = self
            .transport
            .read_device_config(|m| m.read16(ncfg::STATUS))?;
        Ok(s.map(|s| s & ncfg::STATUS_LINK_UP != 0))
    }

    fn rx_mode(&mut self, cmd: u8, what: &'static str, on: bool) -> Result<()> {
        let addr = self.info.addr;
        if !self.info.features.contains(Features::NET_CTRL_RX) {
            return Err(VirtioNetError::ControlCommand {
                addr,
                what,
                reason: "the device offers no VIRTIO_NET_F_CTRL_RX (receive-filter control)".into(),
            });
        }
        let c = self
            .ctrl
            .as_mut()
            .expect("CTRL_RX implies the control queue");
        c.command(CTRL_RX, cmd, &[on as u8])
            .map_err(|e| ctrl_error(addr, what, e))
    }

    /// Promiscuous receive on or off (the device's default after reset is on). Off: the device
    /// delivers only frames for its MAC, broadcast, and multicast per `set_all_multicast`.
    /// A control-queue command: not for the I/O path.
    pub fn set_promiscuous(&mut self, on: bool) -> Result<()> {
        self.rx_mode(CTRL_RX_PROMISC, "RX_PROMISC", on)
    }

    /// Receive all multicast frames on or off (control-queue command).
    pub fn set_all_multicast(&mut self, on: bool) -> Result<()> {
        self.rx_mode(CTRL_RX_ALLMULTI, "RX_ALLMULTI", on)
    }

    /// Reads device_status once: `DeviceGone` when it reads all-ones, 0 or lacks DRIVER_OK
    /// (removed, reset behind the driver's back, or a BAR that stopped decoding: QEMU reads 0),
    /// `DeviceNeedsReset` for DEVICE_NEEDS_RESET / FAILED. The burst calls do the same on
    /// their own after `NetConfig::health_interval` without progress; call this to ask sooner.
    pub fn check_health(&self) -> Result<()> {
        self.transport.check_health()
    }

    /// Queue pair `i`, as a handle that borrows this device (the pair's rings and buffers
    /// never leave it: see [`QueuePair`]).
    pub fn pair(&mut self, i: usize) -> Option<QueuePair<'_>> {
        self.pairs.get_mut(i).map(QueuePair::new)
    }

    /// Handles to all queue pairs, e.g. to hand one to each thread of a
    /// `std::thread::scope`. Allocates the `Vec` of handles: call it once, not per burst.
    pub fn pairs_mut(&mut self) -> Vec<QueuePair<'_>> {
        self.pairs.iter_mut().map(QueuePair::new).collect()
    }

    /// Number of queue pairs in use.
    pub fn pair_count(&self) -> usize {
        self.pairs.len()
    }

    /// Counters summed over all pairs.
    pub fn stats(&self) -> NetStats {
        let mut s = NetStats::default();
        for p in &self.pairs {
            s += p.stats();
        }
        s
    }

    /// [`QueuePair::rx_burst`] on pair 0.
    #[inline]
    pub fn rx_burst(&mut self, out: &mut Vec<RxFrame>) -> Result<usize> {
        self.pairs[0].rx_burst(out)
    }

    /// [`QueuePair::tx_burst`] on pair 0.
    #[inline]
    pub fn tx_burst(&mut self, frames: &mut Vec<TxFrame>) -> Result<usize> {
        self.pairs[0].tx_burst(frames)
    }

    /// [`QueuePair::reclaim_tx`] on pair 0.
    #[inline]
    pub fn reclaim_tx(&mut self) -> Result<usize> {
        self.pairs[0].reclaim_tx()
    }

    /// Resets the device, waits for it, and returns every buffer to its pool. Also done by
    /// drop; call it to see the error.
    ///
    /// The buffers go back only when the reset is confirmed: device_status reads 0 within
    /// the reset deadline *and* the BAR still decodes (num_queues reads what it read at open).
    /// A device that vanished reads 0 in QEMU (all-ones on real hardware), so a status of 0
    /// alone would look like a completed reset although the reset write was lost and the
    /// device may still DMA. On any error (`DeviceGone`, `ResetTimeout`) the rings and every
    /// posted buffer are leaked on purpose: they stay mapped and out of the pool.
    pub fn shutdown(mut self) -> Result<()> {
        let r = self.quiesce();
        if r.is_err() {
            // The device may still DMA: never free its memory.
            std::mem::forget(std::mem::take(&mut self.pairs));
            std::mem::forget(self.ctrl.take());
        }
        r
    }

    fn quiesce(&mut self) -> Result<()> {
        self.transport.reset(RESET_TIMEOUT)?;
        for p in self.pairs.iter_mut() {
            p.rx.drain();
            p.tx.drain();
        }
        Ok(())
    }
}

impl Drop for VirtioNet {
    fn drop(&mut self) {
        let _entered = self.span.clone().entered();
        if self.pairs.is_empty() {
            return;
        }
        if let Err(e) = self.quiesce() {
            tracing::error!(addr = %self.info.addr, error = %e,
                "virtio-net reset failed at shutdown: leaking ring memory and buffers rather than freeing memory the device may still write");
            std::mem::forget(std::mem::take(&mut self.pairs));
            std::mem::forget(self.ctrl.take());
        }
    }
}
