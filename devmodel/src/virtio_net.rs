//! [`VirtioNetModel`]: a modern virtio-pci network device in process: vendor capabilities in
//! config space (common, notify, ISR, device configuration, all in BAR 4), the common
//! configuration (feature words, status handshake, queue registers), the net device
//! configuration (MAC, status, max_virtqueue_pairs, MTU), split virtqueues (RX, TX and the
//! control queue), and a wire: frames sent on a TX queue arrive on the peer's RX queue (two
//! models [`connect`]ed) or, with no peer, on the sender's own (echo).
//!
//! Everything runs synchronously inside the MMIO access that causes it: a doorbell write
//! processes its queue, and frames for the peer are delivered into the peer's RX ring before
//! the write returns (each model's state behind its own lock, never two held at once). A
//! [`Hostile`] plan, built from fuzz input or by hand, rewrites what the device shows the
//! driver: any config field or capability byte, any used-ring id/len/index, a device that
//! stops answering, a reset that never completes, or registers reading all-ones.

mod hostile;
mod layout;
mod vq;

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use ubdirect_core::{DeviceModel, PciDevice, UbRegistry};

use crate::config::ConfigSpace;
use crate::dma::{DmaFault, HostDma};

pub use hostile::{Hostile, UsedTweak};
pub use layout::{CapSpec, Layout, BAR};
use vq::{Vq, VqKind};

/// Feature bits the model knows (virtio 1.2 §5.1.3, §6).
pub mod feature {
    /// VIRTIO_NET_F_MTU.
    pub const MTU: u64 = 1 << 3;
    /// VIRTIO_NET_F_MAC.
    pub const MAC: u64 = 1 << 5;
    /// VIRTIO_NET_F_STATUS.
    pub const STATUS: u64 = 1 << 16;
    /// VIRTIO_NET_F_CTRL_VQ.
    pub const CTRL_VQ: u64 = 1 << 17;
    /// VIRTIO_NET_F_CTRL_RX.
    pub const CTRL_RX: u64 = 1 << 18;
    /// VIRTIO_NET_F_MQ.
    pub const MQ: u64 = 1 << 22;
    /// VIRTIO_F_EVENT_IDX.
    pub const EVENT_IDX: u64 = 1 << 29;
    /// VIRTIO_F_VERSION_1.
    pub const VERSION_1: u64 = 1 << 32;
    /// VIRTIO_F_ACCESS_PLATFORM.
    pub const ACCESS_PLATFORM: u64 = 1 << 33;
}

/// Device status bit FEATURES_OK.
const FEATURES_OK: u8 = 8;
/// Device status bit DRIVER_OK.
const DRIVER_OK: u8 = 4;
/// Length of the virtio-net header the driver puts in front of every frame.
pub const NET_HDR_LEN: usize = 12;

/// What the well-behaved device is.
#[derive(Debug, Clone)]
pub struct NetModelConfig {
    /// MAC address (VIRTIO_NET_F_MAC).
    pub mac: [u8; 6],
    /// Queue pairs (VIRTIO_NET_F_MQ offered when > 1).
    pub max_pairs: u16,
    /// Largest size of every queue.
    pub queue_max: u16,
    /// MTU (VIRTIO_NET_F_MTU offered when set).
    pub mtu: Option<u16>,
    /// Control queue with receive-filter control (VIRTIO_NET_F_CTRL_VQ, CTRL_RX).
    pub ctrl_vq: bool,
    /// VIRTIO_F_EVENT_IDX.
    pub event_idx: bool,
    /// Link status reported (VIRTIO_NET_F_STATUS is always offered).
    pub link_up: bool,
    /// Behave like QEMU's virtio-net: until VIRTIO_NET_F_MQ is negotiated (FEATURES_OK),
    /// `num_queues` reads 1 pair + control and the queues beyond read size 0; the other
    /// pairs appear only with the feature.
    pub queues_grow_with_mq: bool,
    /// The NUMA node the modelled device reports (`PciDevice::numa_node`); None: none.
    pub numa_node: Option<u32>,
}

impl Default for NetModelConfig {
    fn default() -> Self {
        NetModelConfig {
            mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56],
            max_pairs: 1,
            queue_max: 256,
            mtu: None,
            ctrl_vq: true,
            event_idx: true,
            link_up: true,
            queues_grow_with_mq: false,
            numa_node: None,
        }
    }
}

impl NetModelConfig {
    /// The feature bits this configuration offers.
    pub fn features(&self) -> u64 {
        use feature::*;
        let mut f = VERSION_1 | ACCESS_PLATFORM | MAC | STATUS;
        if self.mtu.is_some() {
            f |= MTU;
        }
        if self.ctrl_vq {
            f |= CTRL_VQ | CTRL_RX;
            if self.max_pairs > 1 {
                f |= MQ;
            }
        }
        if self.event_idx {
            f |= EVENT_IDX;
        }
        f
    }

    /// Virtqueues: two per pair, plus the control queue.
    pub fn num_queues(&self) -> u16 {
        self.max_pairs
            .saturating_mul(2)
            .saturating_add(self.ctrl_vq as u16)
    }
}

/// Counters of what the device did (for tests' assertions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetModelStats {
    /// Frames taken from TX queues.
    pub tx_frames: u64,
    /// Frames written into RX buffers.
    pub rx_frames: u64,
    /// Frames dropped for want of an RX buffer (or too long for one).
    pub rx_dropped: u64,
    /// Control commands answered.
    pub ctrl_commands: u64,
    /// Resets (device_status written 0).
    pub resets: u64,
    /// Doorbells rung.
    pub notifies: u64,
    /// TX frames whose virtio-net header was not the plain one (all zeros: no offloads).
    pub tx_headers_not_plain: u64,
}

/// Mutable device state.
struct State {
    dfselect: u32,
    gfselect: u32,
    driver_features: [u32; 2],
    status: u8,
    generation: u8,
    qsel: u16,
    config_vector: u16,
    queues: Vec<Vq>,
    /// Frames waiting for an RX buffer, per RX queue pair.
    inbox: Vec<std::collections::VecDeque<Vec<u8>>>,
    /// Receive filters set through the control queue.
    promiscuous: bool,
    all_multi: bool,
    active_pairs: u16,
    stats: NetModelStats,
    reads: u64,
    /// The next [`UsedTweak`] of the plan.
    next_tweak: usize,
}

/// A modern virtio-net device; see the module documentation.
pub struct VirtioNetModel {
    cfg: NetModelConfig,
    layout: Layout,
    plan: Hostile,
    config: ConfigSpace,
    dma: HostDma,
    state: Mutex<State>,
    peer: Mutex<Option<Weak<VirtioNetModel>>>,
}

impl std::fmt::Debug for VirtioNetModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioNetModel")
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// Connects two models with a wire: what one sends, the other receives.
pub fn connect(a: &Arc<VirtioNetModel>, b: &Arc<VirtioNetModel>) {
    *a.peer.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(b));
    *b.peer.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(a));
}

impl VirtioNetModel {
    /// A well-behaved device of `cfg` whose DMA goes through `registry`'s IOVAs.
    pub fn new(registry: &Arc<UbRegistry>, cfg: NetModelConfig) -> Arc<VirtioNetModel> {
        VirtioNetModel::hostile(registry, cfg, Hostile::default())
    }

    /// A device of `cfg` misbehaving as `plan` says.
    pub fn hostile(
        registry: &Arc<UbRegistry>,
        cfg: NetModelConfig,
        plan: Hostile,
    ) -> Arc<VirtioNetModel> {
        let layout = plan.layout.unwrap_or_default();
        let config = ConfigSpace::new(0x1af4, 0x1041, 0x02_00_00);
        layout.write_caps(&config);
        for &(off, v) in &plan.config_pokes {
            config.set_bytes(off, &[v]);
        }
        let nq = plan.num_queues.unwrap_or(cfg.num_queues());
        let st = State {
            dfselect: 0,
            gfselect: 0,
            driver_features: [0; 2],
            status: 0,
            generation: 0,
            qsel: 0,
            config_vector: 0xffff,
            queues: (0..nq.min(4096)).map(|_| Vq::default()).collect(),
            inbox: vec![Default::default(); cfg.max_pairs.clamp(1, 4096) as usize],
            promiscuous: true,
            all_multi: false,
            active_pairs: 1,
            stats: NetModelStats::default(),
            reads: 0,
            next_tweak: 0,
        };
        Arc::new(VirtioNetModel {
            dma: HostDma::new(registry.clone()),
            cfg,
            layout,
            plan,
            config,
            state: Mutex::new(st),
            peer: Mutex::new(None),
        })
    }

    /// The [`PciDevice`] for this model, to hand to `VirtioNet::from_device`.
    pub fn attach(self: &Arc<Self>, registry: &Arc<UbRegistry>) -> Arc<PciDevice> {
        crate::attach(registry, self.clone())
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the device did so far.
    pub fn stats(&self) -> NetModelStats {
        self.st().stats
    }

    /// Every DMA the model's IOMMU refused (a driver bug or a hostile ring).
    pub fn dma_faults(&self) -> Vec<DmaFault> {
        self.dma.faults()
    }

    /// device_status as last written by the driver.
    pub fn device_status(&self) -> u8 {
        self.st().status
    }

    /// (promiscuous, all-multicast) as set through the control queue.
    pub fn rx_filters(&self) -> (bool, bool) {
        let s = self.st();
        (s.promiscuous, s.all_multi)
    }

    /// Queue pairs activated by the MQ control command (1 until then).
    pub fn active_pairs(&self) -> u16 {
        self.st().active_pairs
    }

    /// Buffers the driver has made available on queue `q` that the device has not consumed
    /// (RX buffers waiting for frames).
    pub fn avail_pending(&self, q: u16) -> u16 {
        let s = self.st();
        s.queues
            .get(q as usize)
            .map(|v| v.pending(&self.dma))
            .unwrap_or(0)
    }

    /// Puts `frame` on the wire towards this device (as if a peer sent it) and delivers it
    /// if an RX buffer is posted.
    pub fn inject(&self, frame: &[u8]) {
        self.receive(0, vec![frame.to_vec()]);
    }

    /// Frames arriving for RX pair `pair`: queued, then delivered into posted RX buffers.
    fn receive(&self, pair: usize, frames: Vec<Vec<u8>>) {
        let mut s = self.st();
        let pair = if pair < s.inbox.len() { pair } else { 0 };
        s.inbox[pair].extend(frames);
        self.deliver(&mut s, pair);
    }

    /// Moves waiting frames of `pair` into posted RX buffers of queue 2 x pair.
    fn deliver(&self, s: &mut State, pair: usize) {
        let q = 2 * pair;
        if pair >= s.inbox.len()
            || !self.running(s)
            || q >= s.queues.len()
            || !s.queues[q].enabled()
        {
            return;
        }
        while !s.inbox[pair].is_empty() {
            let Some((id, addr, len)) = s.queues[q].next_avail(&self.dma, VqKind::Rx) else {
                break;
            };
            let frame = s.inbox[pair].pop_front().expect("front above");
            let total = NET_HDR_LEN + frame.len();
            let written = if total <= len as usize {
                let mut b = vec![0u8; total];
                b[NET_HDR_LEN..].copy_from_slice(&frame);
                self.dma.write(addr, &b).map(|_| total as u32).unwrap_or(0)
            } else {
                s.stats.rx_dropped += 1;
                0
            };
            if written > 0 {
                s.stats.rx_frames += 1;
            }
            self.complete(s, q, id, written);
        }
        let ev = s.queues[q].event_idx_on;
        s.queues[q].publish_avail_event(&self.dma, ev);
    }

    /// Writes one used element, through the plan's tweak if it has one left.
    fn complete(&self, s: &mut State, q: usize, id: u16, len: u32) {
        let tweak = self.plan.used.get(s.next_tweak).copied();
        if tweak.is_some() {
            s.next_tweak += 1;
        }
        s.queues[q].push_used(&self.dma, id, len, tweak);
    }

    fn running(&self, s: &State) -> bool {
        s.status & DRIVER_OK != 0 && self.config.bus_master()
    }

    fn offered(&self) -> u64 {
        self.plan.features.unwrap_or(self.cfg.features())
    }

    /// The device-configuration image (MAC, status, max_virtqueue_pairs, MTU).
    fn device_cfg(&self) -> Vec<u8> {
        if let Some(b) = &self.plan.device_cfg {
            return b.clone();
        }
        let mut b = vec![0u8; 12];
        b[..6].copy_from_slice(&self.cfg.mac);
        b[6..8].copy_from_slice(&(self.cfg.link_up as u16).to_le_bytes());
        b[8..10].copy_from_slice(&self.cfg.max_pairs.to_le_bytes());
        b[10..12].copy_from_slice(&self.cfg.mtu.unwrap_or(1500).to_le_bytes());
        b
    }

    fn notify(&self, q: u16) {
        let mut s = self.st();
        s.stats.notifies += 1;
        if self.plan.silent_after.is_some_and(|n| s.stats.notifies > n) {
            return;
        }
        let qi = q as usize;
        if !self.running(&s) || qi >= s.queues.len() || !s.queues[qi].enabled() {
            return;
        }
        let pairs = self.cfg.max_pairs as usize;
        let is_ctrl = self.cfg.ctrl_vq && qi == 2 * pairs;
        if is_ctrl {
            if self
                .plan
                .ctrl_silent_after
                .is_some_and(|n| s.stats.ctrl_commands >= n)
            {
                return;
            }
            while let Some((id, cmd)) = s.queues[qi].next_ctrl(&self.dma) {
                let ack = self.control(&mut s, &cmd);
                let len = match s.queues[qi].ctrl_ack_addr {
                    Some(a) if self.dma.write(a, &[ack]).is_ok() => 1,
                    _ => 0,
                };
                s.stats.ctrl_commands += 1;
                self.complete(&mut s, qi, id, len);
            }
            let ev = s.queues[qi].event_idx_on;
            s.queues[qi].publish_avail_event(&self.dma, ev);
            return;
        }
        if qi % 2 == 0 {
            self.deliver(&mut s, qi / 2);
            return;
        }
        let mut out = Vec::new();
        while let Some((id, mut b)) = s.queues[qi].next_tx(&self.dma) {
            if b.len() > NET_HDR_LEN {
                if b[..NET_HDR_LEN].iter().any(|&x| x != 0) {
                    s.stats.tx_headers_not_plain += 1;
                }
                out.push(b.split_off(NET_HDR_LEN));
                s.stats.tx_frames += 1;
            }
            self.complete(&mut s, qi, id, 0);
        }
        let ev = s.queues[qi].event_idx_on;
        s.queues[qi].publish_avail_event(&self.dma, ev);
        drop(s);
        if out.is_empty() {
            return;
        }
        let peer = self
            .peer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(Weak::upgrade);
        match peer {
            Some(p) => p.receive(qi / 2, out),
            None => self.receive(qi / 2, out),
        }
    }

    /// Answers one control command: VIRTIO_NET_OK (0) or VIRTIO_NET_ERR (1).
    fn control(&self, s: &mut State, cmd: &[u8]) -> u8 {
        match cmd {
            [0, 0, on, ..] => {
                s.promiscuous = *on != 0;
                0
            }
            [0, 1, on, ..] => {
                s.all_multi = *on != 0;
                0
            }
            [4, 0, lo, hi, ..] => {
                let n = u16::from_le_bytes([*lo, *hi]);
                if n == 0 || n > self.cfg.max_pairs {
                    return 1;
                }
                s.active_pairs = n;
                0
            }
            _ => 1,
        }
    }

    fn reset(&self, s: &mut State) {
        s.stats.resets += 1;
        s.status = 0;
        s.driver_features = [0; 2];
        s.qsel = 0;
        s.config_vector = 0xffff;
        for q in s.queues.iter_mut() {
            *q = Vq::default();
        }
        for i in s.inbox.iter_mut() {
            i.clear();
        }
        s.promiscuous = true;
        s.all_multi = false;
        s.active_pairs = 1;
    }

    /// Queues the device shows now (QEMU adds the MQ pairs only once MQ is negotiated).
    fn visible_queues(&self, s: &State) -> usize {
        let mq_on = s.status & 8 != 0 && (u64::from(s.driver_features[0]) & feature::MQ) != 0;
        if self.cfg.queues_grow_with_mq && !mq_on {
            s.queues.len().min(2 + self.cfg.ctrl_vq as usize)
        } else {
            s.queues.len()
        }
    }

    fn common_read(&self, s: &mut State, off: u64) -> Option<u64> {
        let qsel = s.qsel as usize;
        let visible = self.visible_queues(s);
        let q = s.queues.get(qsel).filter(|_| qsel < visible);
        let queue_max = self.plan.queue_max.unwrap_or(self.cfg.queue_max);
        Some(match off {
            0x00 => s.dfselect.into(),
            0x04 => match s.dfselect {
                0 => self.offered() & 0xffff_ffff,
                1 => self.offered() >> 32,
                _ => 0,
            },
            0x08 => s.gfselect.into(),
            0x0c => s
                .driver_features
                .get(s.gfselect as usize)
                .copied()
                .unwrap_or(0)
                .into(),
            0x10 => s.config_vector.into(),
            0x12 => visible as u64,
            0x14 => {
                if self.plan.reset_stuck && s.status == 0 && s.stats.resets > 0 {
                    0x01
                } else {
                    s.status.into()
                }
            }
            0x15 => {
                if self.plan.generation_flips {
                    s.generation = s.generation.wrapping_add(1);
                }
                s.generation.into()
            }
            0x16 => s.qsel.into(),
            0x18 => q.map(|q| q.size.unwrap_or(queue_max)).unwrap_or(0).into(),
            0x1a => {
                if self.plan.msix_stuck {
                    0
                } else {
                    q.map(|q| q.vector).unwrap_or(0xffff).into()
                }
            }
            0x1c => q.map(|q| q.enable).unwrap_or(0).into(),
            0x1e => self.plan.notify_off.unwrap_or(qsel as u16).into(),
            0x20 | 0x24 | 0x28 | 0x2c | 0x30 | 0x34 => {
                let q = q?;
                let v = match off & !7 {
                    0x20 => q.desc,
                    0x28 => q.driver,
                    _ => q.device,
                };
                if off & 4 == 0 {
                    v & 0xffff_ffff
                } else {
                    v >> 32
                }
            }
            _ => 0,
        })
    }

    fn common_write(&self, s: &mut State, off: u64, size: u8, v: u64) {
        let qsel = s.qsel as usize;
        match (off, size) {
            (0x00, 4) => s.dfselect = v as u32,
            (0x08, 4) => s.gfselect = v as u32,
            (0x0c, 4) => {
                if let Some(w) = s.driver_features.get_mut(s.gfselect as usize) {
                    *w = v as u32;
                }
            }
            (0x10, 2) => s.config_vector = v as u16,
            (0x14, 1) => {
                let v = v as u8;
                if v == 0 {
                    self.reset(s);
                    return;
                }
                let mut v = v;
                if v & FEATURES_OK != 0 && s.status & FEATURES_OK == 0 {
                    let drv =
                        u64::from(s.driver_features[0]) | (u64::from(s.driver_features[1]) << 32);
                    if self.plan.refuse_features_ok || drv & !self.offered() != 0 {
                        v &= !FEATURES_OK;
                    }
                    let ev = drv & feature::EVENT_IDX != 0;
                    for q in s.queues.iter_mut() {
                        q.event_idx_on = ev;
                    }
                }
                s.status = v;
            }
            (0x16, 2) => s.qsel = v as u16,
            _ => {
                let Some(q) = s.queues.get_mut(qsel) else {
                    return;
                };
                let set_half = |field: &mut u64, hi: bool| {
                    if hi {
                        *field = (*field & 0xffff_ffff) | (v << 32);
                    } else {
                        *field = (*field & !0xffff_ffff) | (v & 0xffff_ffff);
                    }
                };
                match (off, size) {
                    (0x18, 2) => q.size = Some(v as u16),
                    (0x1a, 2) => q.vector = v as u16,
                    (0x1c, 2) => {
                        q.enable = v as u16;
                        q.enable_check();
                    }
                    (0x20 | 0x24, 4) => set_half(&mut q.desc, off == 0x24),
                    (0x28 | 0x2c, 4) => set_half(&mut q.driver, off == 0x2c),
                    (0x30 | 0x34, 4) => set_half(&mut q.device, off == 0x34),
                    _ => {}
                }
            }
        }
    }
}

/// Little-endian bytes `[off, off+size)` of `image` (missing bytes read 0).
fn extract(image: &[u8], off: u64, size: u8) -> u64 {
    let mut v = 0u64;
    for i in 0..size as u64 {
        let b = image.get((off + i) as usize).copied().unwrap_or(0);
        v |= u64::from(b) << (8 * i);
    }
    v
}

impl DeviceModel for VirtioNetModel {
    fn numa_node(&self) -> Option<u32> {
        self.cfg.numa_node
    }
    fn config_read(&self, off: u16, buf: &mut [u8]) {
        self.config.read(off, buf)
    }

    fn config_write(&self, off: u16, data: &[u8]) {
        self.config.write(off, data)
    }

    fn bar_len(&self, bar: u8) -> u64 {
        if bar == BAR {
            self.plan.bar_len.unwrap_or(layout::BAR_LEN)
        } else {
            0
        }
    }

    fn mmio_read(&self, bar: u8, off: u64, size: u8) -> u64 {
        let mut s = self.st();
        s.reads += 1;
        if self.plan.all_ones_after.is_some_and(|n| s.reads > n) {
            return u64::MAX >> (64 - 8 * u32::from(size));
        }
        if bar != BAR {
            return 0;
        }
        let l = &self.layout;
        if let Some(o) = l.common.inside(off) {
            // Registers are read whole; a narrower read of a wider register sees its low bytes.
            return match self.common_read(&mut s, o) {
                Some(v) => v & (u64::MAX >> (64 - 8 * u32::from(size))),
                None => 0,
            };
        }
        if let Some(o) = l.device.inside(off) {
            drop(s);
            return extract(&self.device_cfg(), o, size);
        }
        0
    }

    fn mmio_write(&self, bar: u8, off: u64, size: u8, val: u64) {
        if bar != BAR {
            return;
        }
        let l = self.layout;
        if let Some(o) = l.common.inside(off) {
            let mut s = self.st();
            self.common_write(&mut s, o, size, val);
            return;
        }
        if let Some(o) = l.notify.inside(off) {
            let mult = u64::from(l.notify_mult.max(1));
            if size == 2 && o % mult == 0 {
                self.notify(val as u16);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extract_reads_little_endian_and_zero_past_the_end() {
        let img = [1u8, 2, 3];
        assert_eq!(extract(&img, 0, 2), 0x0201);
        assert_eq!(extract(&img, 2, 2), 0x0003);
        assert_eq!(extract(&img, 9, 1), 0);
    }

    #[test]
    fn features_follow_the_config() {
        let c = NetModelConfig {
            max_pairs: 2,
            ..NetModelConfig::default()
        };
        assert_ne!(c.features() & feature::MQ, 0);
        assert_eq!(c.num_queues(), 5);
        let c = NetModelConfig {
            ctrl_vq: false,
            ..NetModelConfig::default()
        };
        assert_eq!(c.features() & (feature::MQ | feature::CTRL_VQ), 0);
        assert_eq!(c.num_queues(), 2);
    }
}
