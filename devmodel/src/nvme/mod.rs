//! [`NvmeModel`]: an NVMe controller in process. Registers (CAP, VS, CC, CSTS, AQA, ASQ, ACQ,
//! doorbells with CAP.DSTRD), admin and I/O queues with phase tags, Identify (controller,
//! namespace, active namespace list), Get/Set Features (Number of Queues), Create/Delete I/O
//! SQ/CQ, Abort, Get Log Page, Doorbell Buffer Config (optional), and Read / Write / Flush /
//! Write Zeroes / Dataset Management / Compare on in-memory namespaces.
//!
//! Commands run synchronously inside the doorbell write that announces them (and again when a
//! CQ head doorbell frees room), so a driver's poll finds the completion on its first look. A
//! [`Tamper`] sees and may rewrite every register read, identify page and completion entry, or
//! swallow commands: the hostile mode ([`Hostile`] is one driven by generated input).

mod cmb;
mod commands;
mod hostile;
mod identify;
pub mod prp;
mod queues;
pub mod regs;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use ubdirect_core::{DeviceModel, UbRegistry};

use crate::config::ConfigSpace;
use crate::dma::{DmaFault, HostDma};

pub use cmb::{CmbConfig, CAP_CMBS};
pub use hostile::{CqeTweak, Hostile};
use queues::{Cq, Sq};

/// One namespace of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsConfig {
    /// Namespace ID (1-based).
    pub nsid: u32,
    /// Size in logical blocks.
    pub blocks: u64,
    /// log2 of the block size (9 = 512 B, 12 = 4 KiB).
    pub lbads: u8,
}

/// What the controller reports and how big it is.
#[derive(Debug, Clone)]
pub struct NvmeConfig {
    /// CAP as read by the driver (see [`regs::cap`]).
    pub cap: u64,
    /// VS.
    pub vs: u32,
    /// BAR0 length in bytes.
    pub bar0_len: u64,
    /// I/O queue pairs the controller grants at most (Set Features, Number of Queues).
    pub max_io_queues: u16,
    /// Identify MDTS (log2 of 4 KiB pages; 0 = unlimited).
    pub mdts: u8,
    /// Active namespaces, backed by zeroed memory.
    pub namespaces: Vec<NsConfig>,
    /// Identify NN; `None` = the largest NSID.
    pub nn: Option<u32>,
    /// Advertise and honour Doorbell Buffer Config (shadow doorbells, OACS bit 8).
    pub shadow_doorbells: bool,
    /// With shadow doorbells: set a CQ's EventIdx half a ring past the head just written (the
    /// driver then needs no MMIO write for most CQ head moves) and read the shadow CQ head when
    /// the CQ looks full: a controller on which shadow doorbells save MMIO writes. False (the
    /// default) behaves like QEMU: EventIdx = the value just seen, nothing saved.
    pub shadow_lazy_cq: bool,
    /// A Controller Memory Buffer (CAP.CMBS set, CMB registers, its BAR); None: no CMB.
    pub cmb: Option<CmbConfig>,
    /// The NUMA node the modelled controller reports (`PciDevice::numa_node`); None: none.
    pub numa_node: Option<u32>,
}

impl Default for NvmeConfig {
    fn default() -> Self {
        NvmeConfig {
            cap: regs::cap(1023, 0, 2),
            vs: 0x0001_0400,
            bar0_len: 0x4000,
            max_io_queues: 4,
            mdts: 5,
            namespaces: vec![NsConfig {
                nsid: 1,
                blocks: 2048,
                lbads: 9,
            }],
            nn: None,
            shadow_doorbells: false,
            shadow_lazy_cq: false,
            cmb: None,
            numa_node: None,
        }
    }
}

/// What a hostile controller may do; every method's default is the well-behaved answer.
pub trait Tamper: Send {
    /// The value a register read of `size` bytes at BAR0 offset `off` returns.
    fn register(&mut self, off: u64, size: u8, value: u64) -> u64 {
        let _ = (off, size);
        value
    }
    /// Rewrite an Identify page (CNS `cns`, NSID `nsid`) before it is transferred.
    fn identify(&mut self, cns: u8, nsid: u32, page: &mut [u8; 4096]) {
        let _ = (cns, nsid, page);
    }
    /// Whether to execute and complete the command just fetched from SQ `qid` (false: it is
    /// swallowed and never completes).
    fn answer(&mut self, qid: u16, opcode: u8) -> bool {
        let _ = (qid, opcode);
        true
    }
    /// Whether a write of `value` to SQ `qid`'s tail doorbell reaches the controller (false:
    /// it is lost, as if the MMIO write never arrived).
    fn sq_doorbell(&mut self, qid: u16, value: u16) -> bool {
        let _ = (qid, value);
        true
    }
    /// Rewrite a completion entry (phase tag included) before it is posted to CQ `cqid`.
    fn completion(&mut self, cqid: u16, cqe: &mut [u8; 16]) {
        let _ = (cqid, cqe);
    }
}

/// Counters of what the model saw.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Admin commands fetched, by opcode.
    pub admin: BTreeMap<u8, u64>,
    /// I/O commands fetched, by opcode.
    pub io: BTreeMap<u8, u64>,
    /// Completions posted.
    pub completions: u64,
    /// Commands a tamper swallowed.
    pub swallowed: u64,
    /// SQ tail doorbell writes a tamper lost.
    pub lost_doorbells: u64,
    /// Doorbell writes naming no queue or a value past the queue's end (ignored).
    pub bad_doorbells: u64,
    /// Register writes outside the defined registers and doorbells.
    pub bad_writes: u64,
    /// Times commands waited in an SQ because its CQ was full (the head doorbell lagged).
    pub cq_full_waits: u64,
}

impl Stats {
    /// Admin commands of `opcode` fetched.
    pub fn admin_count(&self, opcode: u8) -> u64 {
        self.admin.get(&opcode).copied().unwrap_or(0)
    }
    /// I/O commands of `opcode` fetched.
    pub fn io_count(&self, opcode: u8) -> u64 {
        self.io.get(&opcode).copied().unwrap_or(0)
    }
}

/// Controller state behind the model's lock.
pub(crate) struct State {
    pub(crate) cfg: NvmeConfig,
    /// CC, AQA, ASQ, ACQ as written (bytes 0x14..0x38 of BAR0; the rest is unused).
    pub(crate) regs: [u8; 0x40],
    pub(crate) rdy: bool,
    pub(crate) shst_complete: bool,
    pub(crate) cfs: bool,
    pub(crate) sqs: BTreeMap<u16, Sq>,
    pub(crate) cqs: BTreeMap<u16, Cq>,
    /// I/O queues granted by Set Features (0 until then).
    pub(crate) granted: u16,
    pub(crate) storage: BTreeMap<u32, Vec<u8>>,
    /// Shadow doorbell and EventIdx pages (Doorbell Buffer Config).
    pub(crate) shadow: Option<(u64, u64)>,
    pub(crate) stats: Stats,
    pub(crate) tamper: Option<Box<dyn Tamper>>,
    /// CMBMSC as written.
    pub(crate) cmbmsc: u64,
}

/// An NVMe controller model. Attach it with [`crate::attach`] (or [`NvmeModel::attach`]).
pub struct NvmeModel {
    config: ConfigSpace,
    pub(crate) dma: HostDma,
    bar0_len: u64,
    /// The CMB's BAR and its length.
    cmb_bar: Option<(u8, u64)>,
    numa_node: Option<u32>,
    /// Set once the model wants the device back (a modelled unbind or hot-unplug request).
    removal: std::sync::atomic::AtomicBool,
    st: Mutex<State>,
}

impl NvmeModel {
    /// A well-behaved controller reaching driver memory through `registry`.
    pub fn new(registry: &Arc<UbRegistry>, cfg: NvmeConfig) -> Arc<NvmeModel> {
        let storage = cfg
            .namespaces
            .iter()
            .map(|n| (n.nsid, vec![0u8; (n.blocks << n.lbads) as usize]))
            .collect();
        Arc::new(NvmeModel {
            config: ConfigSpace::new(0x1b36, 0x0010, 0x01_08_02),
            dma: HostDma::new(registry.clone()),
            bar0_len: cfg.bar0_len,
            cmb_bar: cfg.cmb.map(|c| (c.bir, c.bar_len)),
            numa_node: cfg.numa_node,
            removal: std::sync::atomic::AtomicBool::new(false),
            st: Mutex::new(State {
                cfg,
                regs: [0; 0x40],
                rdy: false,
                shst_complete: false,
                cfs: false,
                sqs: BTreeMap::new(),
                cqs: BTreeMap::new(),
                granted: 0,
                storage,
                shadow: None,
                stats: Stats::default(),
                tamper: None,
                cmbmsc: 0,
            }),
        })
    }

    /// A controller whose every answer passes through `tamper`.
    pub fn hostile(
        registry: &Arc<UbRegistry>,
        cfg: NvmeConfig,
        tamper: Box<dyn Tamper>,
    ) -> Arc<NvmeModel> {
        let m = NvmeModel::new(registry, cfg);
        m.lock().tamper = Some(tamper);
        m
    }

    /// The model as a [`ubdirect_core::PciDevice`] in `registry`'s domain.
    pub fn attach(self: &Arc<Self>, registry: &Arc<UbRegistry>) -> Arc<ubdirect_core::PciDevice> {
        crate::attach(registry, self.clone())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.lock().stats.clone()
    }

    /// DMA the model's IOMMU refused so far.
    pub fn dma_faults(&self) -> Vec<DmaFault> {
        self.dma.faults()
    }

    /// Whether the controller is enabled and ready (CSTS.RDY).
    pub fn ready(&self) -> bool {
        self.lock().rdy
    }

    /// I/O SQs that exist on the device side now.
    pub fn io_sq_count(&self) -> usize {
        self.lock().sqs.keys().filter(|&&q| q != 0).count()
    }

    /// Copy `buf.len()` bytes of namespace `nsid` at byte offset `off` (what the medium holds).
    pub fn read_medium(&self, nsid: u32, off: usize, buf: &mut [u8]) {
        let st = self.lock();
        let m = &st.storage[&nsid];
        buf.copy_from_slice(&m[off..off + buf.len()]);
    }

    /// CMBMSC as the driver last wrote it.
    pub fn cmbmsc(&self) -> u64 {
        self.lock().cmbmsc
    }

    /// Ask for the device back, as the kernel does on unbind or hot-unplug.
    pub fn request_removal(&self) {
        self.removal
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Replace the tamper (None: well-behaved from now on).
    pub fn set_tamper(&self, tamper: Option<Box<dyn Tamper>>) {
        self.lock().tamper = tamper;
    }
}

impl DeviceModel for NvmeModel {
    fn numa_node(&self) -> Option<u32> {
        self.numa_node
    }
    fn removal_requested(&self) -> bool {
        self.removal.load(std::sync::atomic::Ordering::Acquire)
    }
    fn config_read(&self, off: u16, buf: &mut [u8]) {
        self.config.read(off, buf)
    }
    fn config_write(&self, off: u16, data: &[u8]) {
        self.config.write(off, data)
    }
    fn bar_len(&self, bar: u8) -> u64 {
        match self.cmb_bar {
            _ if bar == 0 => self.bar0_len,
            Some((bir, len)) if bir == bar => len,
            _ => 0,
        }
    }
    fn mmio_read(&self, bar: u8, off: u64, size: u8) -> u64 {
        let mut st = self.lock();
        let v = if bar == 0 { st.read_reg(off, size) } else { 0 };
        match st.tamper.as_mut() {
            Some(t) => t.register(off, size, v),
            None => v,
        }
    }
    fn mmio_write(&self, bar: u8, off: u64, size: u8, val: u64) {
        if bar != 0 {
            return;
        }
        let mut st = self.lock();
        st.write_reg(self, off, size, val);
    }
}
