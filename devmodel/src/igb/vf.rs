//! [`IgbVfModel`]: one virtual function of an 82576 (PCI id 0x8086:0x10ca) in process.
//!
//! Its 16 KiB register window: VTCTRL (a reset sets RSTD in the mailbox), VTSTATUS (link from
//! the cable), interrupt masks, RX queue registers at 0x2800 and TX at 0x3800 (0x100 apart),
//! V2PMAILBOX at 0x0C40 (RSTI while the PF is in reset, i.e. no PF driver brought it up) and
//! the 16-word VMBMEM at 0x0800. Inside, the queue registers live in
//! a PF-shaped register file (as the VF's queues are the PF's) so the rings run on the PF
//! model's data path: DD write-back, head pointers, frames waiting for RX descriptors.
//!
//! Frames sent by a VF arrive on its [`connect_vfs`] peer (the PF's internal VF-to-VF switch),
//! or with no peer on its own RX queue 0; a VF receives only frames to its MAC and multicast /
//! broadcast frames. The PF's kernel driver is modelled as it answers the mailbox
//! ([`PfDriver`]); [`IgbVfModel::unbind_pf`] takes it away mid-run.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use ubdirect_core::{DeviceModel, PciDevice, UbRegistry};

use super::regs::{rxdctl, txdctl, QUEUE_ENABLE, RCTL, RLPML, TCTL};
use super::vf_mbx::{Mailbox, Policy, RSTD, RSTI};
use super::wire::{self, Regs, TxGather};
use crate::config::ConfigSpace;
use crate::dma::{DmaFault, HostDma};

pub use super::vf_mbx::PfDriver;

/// BAR 0's length: the VF register window.
pub const VF_BAR0_LEN: u64 = 16 * 1024;
/// Queue pairs of one VF.
const VF_QUEUES: usize = 2;
const VTCTRL: usize = 0x0000;
const VTSTATUS: usize = 0x0008;
const VMBMEM: usize = 0x0800;
const V2PMAILBOX: usize = 0x0c40;
const CTRL_RST: u32 = 1 << 26;

/// What the VF and its PF driver are.
#[derive(Debug, Clone)]
pub struct IgbVfConfig {
    /// The MAC the PF driver gives the VF at RESET (None: the PF has none, RESET is NACKed).
    pub mac: Option<[u8; 6]>,
    /// The cable of the PF: VTSTATUS.LU follows it.
    pub link_up: bool,
    /// How the PF driver answers the mailbox.
    pub pf: PfDriver,
    /// The PF refuses SET_MAC_ADDR (an administratively set MAC).
    pub mac_locked: bool,
    /// The PF refuses SET_VLAN (a port VLAN set by the administrator).
    pub vlan_refused: bool,
    /// The PF driver sends a control message (a link ping) before each answer.
    pub ping_first: bool,
    /// BAR 0's length instead of 16 KiB.
    pub bar_len: Option<u64>,
}

impl Default for IgbVfConfig {
    fn default() -> Self {
        IgbVfConfig {
            mac: Some([0x52, 0x54, 0, 0x12, 0x34, 0x60]),
            link_up: true,
            pf: PfDriver::Answers,
            mac_locked: false,
            vlan_refused: false,
            ping_first: false,
            bar_len: None,
        }
    }
}

struct State {
    /// PF-shaped register file holding this VF's queue registers (queue n at PF queue n).
    regs: Regs,
    /// The rest of the window, as written.
    other: Vec<u32>,
    mbx: Mailbox,
    mac: Option<[u8; 6]>,
    pf: PfDriver,
    inbox: VecDeque<Vec<u8>>,
    gather: Vec<TxGather>,
    tx_frames: u64,
    rx_frames: u64,
    resets: u64,
}

/// An 82576 VF; see the module documentation.
pub struct IgbVfModel {
    cfg: IgbVfConfig,
    config: ConfigSpace,
    dma: HostDma,
    state: Mutex<State>,
    peer: Mutex<Option<Weak<IgbVfModel>>>,
}

impl std::fmt::Debug for IgbVfModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IgbVfModel")
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// Connects two VFs of one PF: what one sends, the other receives (if addressed to it).
pub fn connect_vfs(a: &Arc<IgbVfModel>, b: &Arc<IgbVfModel>) {
    *a.peer.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(b));
    *b.peer.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(a));
}

/// Where VF register `off` lives in the PF-shaped file: RX queue registers at 0x2800 + 0x100 n
/// map to 0xc000 + 0x40 n, TX at 0x3800 to 0xe000.
fn queue_off(off: usize) -> Option<usize> {
    for (vf, pf) in [(0x2800, 0xc000), (0x3800, 0xe000)] {
        if (vf..vf + 0x100 * VF_QUEUES).contains(&off) && (off - vf) % 0x100 < 0x40 {
            let (q, r) = ((off - vf) / 0x100, (off - vf) % 0x100);
            return Some(pf + 0x40 * q + r);
        }
    }
    None
}

impl IgbVfModel {
    /// A VF of `cfg` whose DMA goes through `registry`'s IOVAs.
    pub fn new(registry: &Arc<UbRegistry>, cfg: IgbVfConfig) -> Arc<IgbVfModel> {
        let st = State {
            regs: Regs(vec![0; super::BAR0_LEN as usize / 4]),
            other: vec![0; VF_BAR0_LEN as usize / 4],
            mbx: Mailbox::default(),
            mac: cfg.mac,
            pf: cfg.pf.clone(),
            inbox: VecDeque::new(),
            gather: (0..VF_QUEUES).map(|_| TxGather::default()).collect(),
            tx_frames: 0,
            rx_frames: 0,
            resets: 0,
        };
        let m = Arc::new(IgbVfModel {
            config: ConfigSpace::new(0x8086, 0x10ca, 0x02_00_00),
            dma: HostDma::new(registry.clone()),
            cfg,
            state: Mutex::new(st),
            peer: Mutex::new(None),
        });
        let mut s = m.st();
        m.reset(&mut s);
        s.resets = 0;
        // A PF driver finished the PF's reset (CTRL_EXT.PFRSTD): RSTD; without one the PF
        // stays in reset: RSTI.
        s.mbx.v2p = if s.pf == PfDriver::Gone { RSTI } else { RSTD };
        drop(s);
        m
    }

    /// The [`PciDevice`] for this model, to hand to `IgbVf::from_device`.
    pub fn attach(self: &Arc<Self>, registry: &Arc<UbRegistry>) -> Arc<PciDevice> {
        crate::attach(registry, self.clone())
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every DMA the model's IOMMU refused.
    pub fn dma_faults(&self) -> Vec<DmaFault> {
        self.dma.faults()
    }

    /// The VF's MAC as the PF driver holds it (changed by an accepted SET_MAC_ADDR).
    pub fn mac(&self) -> Option<[u8; 6]> {
        self.st().mac
    }

    /// VLAN ids the PF driver added to this VF's filter.
    pub fn vlans(&self) -> Vec<u16> {
        self.st().mbx.vlans.clone()
    }

    /// Mailbox requests the VF posted (REQ writes).
    pub fn mailbox_requests(&self) -> u64 {
        self.st().mbx.requests
    }

    /// VF resets (VTCTRL.RST) since the model was made.
    pub fn resets(&self) -> u64 {
        self.st().resets
    }

    /// Frames taken from TX rings and written into RX buffers.
    pub fn frames(&self) -> (u64, u64) {
        let s = self.st();
        (s.tx_frames, s.rx_frames)
    }

    /// The PF's driver is unbound: the PF is reset (its queues, this VF's among them, stop;
    /// V2PMAILBOX shows RSTI) and nothing answers the mailbox any more.
    pub fn unbind_pf(&self) {
        let mut s = self.st();
        s.pf = PfDriver::Gone;
        s.mbx.v2p |= RSTI;
        s.mbx.cts = false;
        for q in 0..VF_QUEUES {
            for off in [rxdctl(q), txdctl(q)] {
                let v = s.regs.get(off);
                s.regs.set(off, v & !QUEUE_ENABLE);
            }
        }
    }

    /// The PF's driver takes its interface down: the PF is reset (V2PMAILBOX shows RSTI) and
    /// nothing answers the mailbox, but the VF's queue registers keep their enable bits (as
    /// QEMU's 82576 does).
    pub fn pf_down(&self) {
        let mut s = self.st();
        s.pf = PfDriver::Gone;
        s.mbx.v2p |= RSTI;
        s.mbx.cts = false;
    }

    /// Puts `frame` on the wire towards this VF.
    pub fn inject(&self, frame: &[u8]) {
        self.receive(vec![frame.to_vec()]);
    }

    fn accepts(&self, s: &State, f: &[u8]) -> bool {
        f.len() >= 6 && (f[0] & 1 != 0 || s.mac.is_some_and(|m| m[..] == f[..6]))
    }

    fn receive(&self, frames: Vec<Vec<u8>>) {
        let mut s = self.st();
        for f in frames {
            if self.accepts(&s, &f) {
                s.inbox.push_back(f);
            }
        }
        self.deliver(&mut s);
    }

    fn deliver(&self, s: &mut State) {
        if !self.cfg.link_up || !self.config.bus_master() {
            return;
        }
        let State { regs, inbox, .. } = s;
        let (n, _) = wire::receive(regs, &self.dma, (0, false), inbox, &mut || {
            super::RxTweak::default()
        });
        s.rx_frames += n;
    }

    fn transmit(&self, q: usize) {
        let mut s = self.st();
        if !self.config.bus_master() || q >= VF_QUEUES {
            return;
        }
        let State { regs, gather, .. } = &mut *s;
        let out = wire::transmit(regs, &self.dma, q, &mut gather[q], true);
        s.tx_frames += out.len() as u64;
        drop(s);
        if out.is_empty() || !self.cfg.link_up {
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

    /// A VF reset: queues back to their defaults (disabled), the PF's receiver and transmitter
    /// on (the PF driver keeps them on); the mailbox bits stay (they tell of the PF's reset).
    fn reset(&self, s: &mut State) {
        s.resets += 1;
        s.regs.0.iter_mut().for_each(|w| *w = 0);
        s.other.iter_mut().for_each(|w| *w = 0);
        s.inbox.clear();
        s.gather.iter_mut().for_each(|g| *g = TxGather::default());
        s.regs.set(RCTL, 2 | (1 << 5));
        // The PF driver's pool limit until the VF asks for more (SET_LPE): 1514-byte frames.
        s.regs.set(RLPML, 1518);
        s.regs.set(TCTL, 2);
        s.mbx.cts = false;
    }

    fn read_reg(&self, s: &mut State, off: usize) -> u32 {
        match off {
            VTSTATUS => 1 | if self.cfg.link_up { 2 } else { 0 } | (2 << 6) | (1 << 19),
            V2PMAILBOX => s.mbx.read_v2p(),
            _ if (VMBMEM..VMBMEM + 64).contains(&off) => s.mbx.mem[(off - VMBMEM) / 4],
            _ => match queue_off(off) {
                Some(o) => s.regs.get(o),
                None => s.other.get(off / 4).copied().unwrap_or(0),
            },
        }
    }

    /// Returns Some(q) when TX queue q's tail moved, Some(usize::MAX) when RX may proceed.
    fn write_reg(&self, s: &mut State, off: usize, v: u32) -> Option<usize> {
        match off {
            VTCTRL if v & CTRL_RST != 0 => self.reset(s),
            VTSTATUS => {}
            V2PMAILBOX => {
                let policy = Policy {
                    driver: &s.pf.clone(),
                    mac_locked: self.cfg.mac_locked,
                    vlan_refused: self.cfg.vlan_refused,
                    ping_first: self.cfg.ping_first,
                };
                s.mbx.write_v2p(v, &policy, &mut s.mac);
                if let Some(lpe) = s.mbx.lpe.take() {
                    s.regs.set(RLPML, lpe);
                }
            }
            _ if (VMBMEM..VMBMEM + 64).contains(&off) => {
                // The buffer takes writes only from its holder.
                if s.mbx.v2p & super::vf_mbx::VFU != 0 {
                    s.mbx.mem[(off - VMBMEM) / 4] = v;
                }
            }
            _ => match queue_off(off) {
                Some(o) if o & 0x3f == 0x08 => s.regs.set(o, v & 0xf_ff80),
                Some(o) if o & 0x3f == 0x18 => {
                    s.regs.set(o, v & 0xffff);
                    return Some(if o >= 0xe000 {
                        (o - 0xe000) / 0x40
                    } else {
                        usize::MAX
                    });
                }
                Some(o) => s.regs.set(o, v),
                None => {
                    if let Some(w) = s.other.get_mut(off / 4) {
                        *w = v;
                    }
                }
            },
        }
        None
    }
}

impl DeviceModel for IgbVfModel {
    fn config_read(&self, off: u16, buf: &mut [u8]) {
        self.config.read(off, buf)
    }

    fn config_write(&self, off: u16, data: &[u8]) {
        self.config.write(off, data)
    }

    fn bar_len(&self, bar: u8) -> u64 {
        match bar {
            0 => self.cfg.bar_len.unwrap_or(VF_BAR0_LEN),
            _ => 0,
        }
    }

    fn mmio_read(&self, bar: u8, off: u64, size: u8) -> u64 {
        if bar != 0 || size != 4 || off >= VF_BAR0_LEN {
            return 0;
        }
        let mut s = self.st();
        u64::from(self.read_reg(&mut s, off as usize))
    }

    fn mmio_write(&self, bar: u8, off: u64, size: u8, val: u64) {
        if bar != 0 || size != 4 || off >= VF_BAR0_LEN {
            return;
        }
        let mut s = self.st();
        match self.write_reg(&mut s, off as usize, val as u32) {
            Some(usize::MAX) => self.deliver(&mut s),
            Some(q) => {
                drop(s);
                self.transmit(q);
            }
            None => {}
        }
    }
}
