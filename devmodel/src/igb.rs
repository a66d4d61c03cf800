//! [`IgbModel`]: an Intel 82576 physical function in process: the register file of BAR 0
//! (reset, interrupt masks, MAC in receive-address entry 0, link through CTRL.SLU and a PHY
//! auto-negotiation restart over MDIC, clear-on-read statistics), advanced RX/TX descriptor
//! rings with DD write-back and head pointers, and a wire: frames sent on a TX queue arrive on
//! the peer's RX queue 0 (two models [`connect`]ed) or, with no peer, on the sender's own.
//!
//! As QEMU's igb does, the link comes up only once the driver set CTRL.SLU and restarted
//! auto-negotiation (after a reset STATUS.LU is clear), runts are padded to 60 bytes, frames
//! over 1514 bytes are dropped unless RCTL.LPE raises the limit to RLPML, and a
//! frame waits on the wire until an RX descriptor is posted for it. Everything runs
//! synchronously inside the MMIO access that causes it (each model's state behind its own lock,
//! never two held at once). An [`IgbHostile`] plan rewrites what the device shows the driver.
//!
//! [`vf::IgbVfModel`] is one virtual function of the 82576: its own register window, rings on
//! the same data path, and the mailbox to its PF with the PF driver's answers modelled.

mod access;
mod hostile;
mod regs;
pub mod vf;
mod vf_mbx;
mod wire;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use ubdirect_core::{PciDevice, UbRegistry};

use crate::config::ConfigSpace;
use crate::dma::{DmaFault, HostDma};

pub use hostile::{IgbHostile, RxTweak};
use regs::*;
use wire::{Regs, TxGather};

/// BAR 0's length: the 82576 register file.
pub const BAR0_LEN: u64 = 128 * 1024;

/// What the well-behaved device is.
#[derive(Debug, Clone)]
pub struct IgbModelConfig {
    /// MAC address (loaded into receive-address entry 0 at reset).
    pub mac: [u8; 6],
    /// PCI device id (0x10c9: 82576 copper; 0x10ca is its virtual function).
    pub device_id: u16,
    /// The cable: the link comes up (once the driver asks) only when this is true.
    pub link_up: bool,
}

impl Default for IgbModelConfig {
    fn default() -> Self {
        IgbModelConfig {
            mac: [0x52, 0x54, 0, 0x12, 0x34, 0x57],
            device_id: 0x10c9,
            link_up: true,
        }
    }
}

/// Counters of what the device did (for tests' assertions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IgbModelStats {
    /// Frames taken from TX rings.
    pub tx_frames: u64,
    /// Frames written into RX buffers.
    pub rx_frames: u64,
    /// Device resets (CTRL.RST).
    pub resets: u64,
    /// Tail (RDT/TDT) writes.
    pub tail_writes: u64,
}

struct State {
    regs: Regs,
    inbox: VecDeque<Vec<u8>>,
    gather: Vec<TxGather>,
    stats: IgbModelStats,
    reads: u64,
    autoneg_done: bool,
    cable: bool,
    gone: bool,
    decoding: bool,
    next_tweak: usize,
}

/// An 82576 PF; see the module documentation.
pub struct IgbModel {
    cfg: IgbModelConfig,
    plan: IgbHostile,
    config: ConfigSpace,
    dma: HostDma,
    state: Mutex<State>,
    peer: Mutex<Option<Weak<IgbModel>>>,
}

impl std::fmt::Debug for IgbModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IgbModel").field("cfg", &self.cfg).finish()
    }
}

/// Connects two models with a wire: what one sends, the other receives.
pub fn connect(a: &Arc<IgbModel>, b: &Arc<IgbModel>) {
    *a.peer.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(b));
    *b.peer.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(a));
}

impl IgbModel {
    /// A well-behaved device of `cfg` whose DMA goes through `registry`'s IOVAs.
    pub fn new(registry: &Arc<UbRegistry>, cfg: IgbModelConfig) -> Arc<IgbModel> {
        IgbModel::hostile(registry, cfg, IgbHostile::default())
    }

    /// A device of `cfg` misbehaving as `plan` says.
    pub fn hostile(
        registry: &Arc<UbRegistry>,
        cfg: IgbModelConfig,
        plan: IgbHostile,
    ) -> Arc<IgbModel> {
        let st = State {
            regs: Regs(vec![0; BAR0_LEN as usize / 4]),
            inbox: VecDeque::new(),
            gather: (0..QUEUES).map(|_| TxGather::default()).collect(),
            stats: IgbModelStats::default(),
            reads: 0,
            autoneg_done: false,
            cable: cfg.link_up,
            gone: false,
            decoding: true,
            next_tweak: 0,
        };
        let m = Arc::new(IgbModel {
            config: ConfigSpace::new(0x8086, cfg.device_id, 0x02_00_00),
            dma: HostDma::new(registry.clone()),
            cfg,
            plan,
            state: Mutex::new(st),
            peer: Mutex::new(None),
        });
        m.reset(&mut m.st());
        m.st().stats.resets = 0;
        m
    }

    /// The [`PciDevice`] for this model, to hand to `Igb::from_device`.
    pub fn attach(self: &Arc<Self>, registry: &Arc<UbRegistry>) -> Arc<PciDevice> {
        crate::attach(registry, self.clone())
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the device did so far.
    pub fn stats(&self) -> IgbModelStats {
        self.st().stats
    }

    /// Every DMA the model's IOMMU refused.
    pub fn dma_faults(&self) -> Vec<DmaFault> {
        self.dma.faults()
    }

    /// MMIO reads so far (what [`IgbHostile::all_ones_after`] counts).
    pub fn reads(&self) -> u64 {
        self.st().reads
    }

    /// A register's value as stored, without a read's side effects.
    pub fn reg(&self, off: usize) -> u32 {
        self.st().regs.get(off)
    }

    /// Plugs or pulls the cable: STATUS.LU follows at once.
    pub fn set_cable(&self, up: bool) {
        let mut s = self.st();
        s.cable = up;
        self.deliver(&mut s);
    }

    /// The device disappears: every register read returns all-ones from now on, writes are
    /// lost, nothing more is sent or received.
    pub fn vanish(&self) {
        self.st().gone = true;
    }

    /// The BAR stops decoding (as with memory decoding turned off in the command register):
    /// every register reads 0 from now on, writes are lost, nothing is sent or received.
    pub fn stop_decoding(&self) {
        self.st().decoding = false;
    }

    /// Frames waiting on the wire for an RX descriptor.
    pub fn waiting(&self) -> usize {
        self.st().inbox.len()
    }

    /// Puts `frame` on the wire towards this device and delivers it if a buffer is posted.
    pub fn inject(&self, frame: &[u8]) {
        self.receive(vec![frame.to_vec()]);
    }

    fn receive(&self, frames: Vec<Vec<u8>>) {
        let mut s = self.st();
        s.inbox.extend(frames);
        self.deliver(&mut s);
    }

    fn link(&self, s: &State) -> bool {
        s.cable && s.autoneg_done && s.regs.get(CTRL) & CTRL_SLU != 0
    }

    fn deliver(&self, s: &mut State) {
        if s.gone || !s.decoding || !self.link(s) || !self.config.bus_master() {
            return;
        }
        let plan = &self.plan.rx;
        let mut next = s.next_tweak;
        let mut tweak = || {
            let t = plan.get(next).copied().unwrap_or_default();
            next += 1;
            t
        };
        let State { regs, inbox, .. } = s;
        let q = (0, self.plan.oversized_rx);
        let (n, bytes) = wire::receive(regs, &self.dma, q, inbox, &mut tweak);
        s.next_tweak = next;
        s.stats.rx_frames += n;
        let add = |s: &mut State, off: usize, v: u64| {
            let w = s.regs.get(off);
            s.regs.set(off, w.wrapping_add(v as u32));
        };
        add(s, GPRC, n);
        add(s, TPR, n);
        let gorc = u64::from(s.regs.get(GORCL)) | (u64::from(s.regs.get(GORCH)) << 32);
        let gorc = gorc.wrapping_add(bytes);
        s.regs.set(GORCL, gorc as u32);
        s.regs.set(GORCH, (gorc >> 32) as u32);
    }

    fn transmit(&self, q: usize) {
        let mut s = self.st();
        if s.gone || !s.decoding || !self.config.bus_master() {
            return;
        }
        let State { regs, gather, .. } = &mut *s;
        let out = wire::transmit(regs, &self.dma, q, &mut gather[q], !self.plan.tx_never_done);
        let n = out.len() as u64;
        let bytes: u64 = out.iter().map(|f| f.len() as u64 + 4).sum();
        s.stats.tx_frames += n;
        let (gptc, tpt) = (s.regs.get(GPTC), s.regs.get(TPT));
        s.regs.set(GPTC, gptc.wrapping_add(n as u32));
        s.regs.set(TPT, tpt.wrapping_add(n as u32));
        let gotc = u64::from(s.regs.get(GOTCL)) | (u64::from(s.regs.get(GOTCH)) << 32);
        let gotc = gotc.wrapping_add(bytes);
        s.regs.set(GOTCL, gotc as u32);
        s.regs.set(GOTCH, (gotc >> 32) as u32);
        let link = self.link(&s);
        drop(s);
        if out.is_empty() || !link {
            return;
        }
        let peer = self
            .peer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(Weak::upgrade);
        match peer {
            Some(p) => p.receive(out),
            None => self.receive(out),
        }
    }

    fn reset(&self, s: &mut State) {
        s.stats.resets += 1;
        s.regs.0.iter_mut().for_each(|w| *w = 0);
        s.inbox.clear();
        s.gather.iter_mut().for_each(|g| *g = TxGather::default());
        s.autoneg_done = false;
        let r = &mut s.regs;
        r.set(CTRL, 1 | (2 << 8));
        r.set(EECD, (1 << 8) | (1 << 9));
        r.set(RXDCTL0, QUEUE_ENABLE | (1 << 16));
        r.set(TXDCTL0, QUEUE_ENABLE);
        r.set(TCTL, (1 << 3) | (0xf << 4) | (0x40 << 12));
        let m = self.cfg.mac;
        r.set(RAL0, u32::from_le_bytes([m[0], m[1], m[2], m[3]]));
        r.set(RAH0, u32::from_le_bytes([m[4], m[5], 0, 0]) | (1 << 31));
    }
}

const RXDCTL0: usize = rxdctl(0);
const TXDCTL0: usize = txdctl(0);
