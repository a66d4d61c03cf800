//! [`Controller`]: bring-up (NVMe base spec 3.5.1), namespaces, limits and orderly shutdown.

mod abort_passthrough;
mod checks;
mod identify_features;
mod lifecycle;
mod shadow_auto;
pub(crate) mod transport;

pub use shadow_auto::{ShadowDecision, ShadowDoorbells, PROBE_DEPTH, PROBE_READS, SAVE_ONE_IN};

use lifecycle::program_admin;
pub(crate) use transport::QidUse;
use transport::QueueIds;

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ubdirect_core::pci::DeviceClaim;
use ubdirect_core::{DmaMem, Mmio, PciAddress, PciDevice, UbRegistry};

use crate::admin_queue::AdminQueue;
use crate::doorbell::ShadowSlot;
use crate::error::{NvmeError, Result};
use crate::info::{ControllerInfo, NamespaceInfo};
use crate::spec::identify::OACS_DOORBELL_BUFFER_CONFIG;
use crate::spec::regs::{cq_head_doorbell, sq_tail_doorbell, Cap, Version, REG_VS};
use crate::spec::Sqe;

/// PCI class code of an NVM Express controller.
pub const NVME_CLASS_CODE: u32 = 0x01_08_02;
/// The memory page size this driver programs (CC.MPS = 0).
pub const PAGE_SIZE: usize = 4096;

/// Options for [`Controller::open`].
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// I/O queue pairs to ask for (Set Features, Number of Queues); the controller may grant fewer.
    pub io_queues: u16,
    /// Shadow doorbells (Doorbell Buffer Config) when the controller supports them: `Auto`
    /// (default) keeps them only where a short probe at open sees them save MMIO writes.
    pub shadow_doorbells: ShadowDoorbells,
    /// Admin queue entries (capped by CAP.MQES + 1).
    pub admin_entries: u16,
    /// Deadline of each admin command.
    pub admin_timeout: Duration,
    /// Largest single command this driver builds when MDTS is 0 (unlimited) or larger.
    pub max_command_bytes: usize,
    /// Bound on shutdown when the controller reports no RTD3E.
    pub default_shutdown_timeout: Duration,
    /// Most active namespaces loaded (a controller reporting more: the first ones, in NSID
    /// order, with a warning). Bounds the Identify commands and memory of bring-up.
    pub max_namespaces: u32,
    /// Wait at most this long for CSTS.RDY to change, instead of CAP.TO (None: CAP.TO, as the
    /// spec says; a shorter bound fails faster on a dead controller, e.g. in tests).
    pub ready_timeout: Option<Duration>,
    /// Open the Controller Memory Buffer at bring-up ([`Controller::cmb`]): map it, register it
    /// as a UB region and enable it as controller memory space. [`NvmeError::NoCmb`] when the
    /// controller has none.
    pub cmb: bool,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            io_queues: 16,
            shadow_doorbells: ShadowDoorbells::Auto,
            admin_entries: 32,
            admin_timeout: Duration::from_secs(10),
            max_command_bytes: 2 << 20,
            default_shutdown_timeout: Duration::from_secs(5),
            max_namespaces: 1024,
            ready_timeout: None,
            cmb: false,
        }
    }
}

/// The shadow doorbell and EventIdx pages (Doorbell Buffer Config).
struct ShadowPages {
    db: DmaMem,
    ei: DmaMem,
}

// SAFETY: plain DMA memory; the per-queue slots are handed to exactly one queue each.
unsafe impl Sync for ShadowPages {}

/// An open, enabled NVMe controller. `Send + Sync`: the admin queue is behind a lock; take one
/// [`crate::IoQueuePair`] per thread for I/O. Dropping it (after every queue pair) shuts the
/// controller down and only then frees its DMA memory.
pub struct Controller {
    // Field order is drop order: the BAR mapping goes before the device, the device (and its
    // DMA domain) last.
    mmio: Arc<Mmio>,
    cap: Cap,
    version: Version,
    opts: ControllerOptions,
    info: Option<ControllerInfo>,
    namespaces: Vec<NamespaceInfo>,
    io_queues_granted: u16,
    /// I/O queue ids (the logic shared with NVMe/TCP: [`transport::create_io_queue`]).
    qids: QueueIds,
    /// An admin command timed out: the admin queue does not answer until a reset, so further
    /// admin commands fail at once instead of each waiting `admin_timeout` (the admin queue's
    /// own flag, read here without its lock).
    admin_wedged: Arc<AtomicBool>,
    /// Resets since open (the generation I/O queues compare against to notice one).
    generation: AtomicU64,
    /// `nvme{addr=...}`: entered around this controller's slow paths so their events name it.
    span: tracing::Span,
    shadow: Option<ShadowPages>,
    /// Whether shadow doorbells are on and why (the `Auto` probe's counts).
    shadow_decision: ShadowDecision,
    /// The Controller Memory Buffer, when opened with [`ControllerOptions::cmb`].
    cmb: Option<Arc<crate::cmb::Cmb>>,
    // Dropped by hand in Drop, after the controller is disabled (or leaked if it will not stop).
    admin: ManuallyDrop<Mutex<AdminQueue>>,
    registry: Arc<UbRegistry>,
    /// This driver's claim on the device: the only way to program it while the controller
    /// lives; released last.
    claim: DeviceClaim,
}

/// CAP and VS from BAR0, refusing a controller this driver cannot run: no NVM command set,
/// no 4 KiB memory pages, or capabilities that fail the driver's checks.
fn read_capabilities(mmio: &Mmio) -> Result<(Cap, Version)> {
    // The registers up to ACQ must lie in BAR0 before any of them is read.
    mmio.check_access(checks::REGISTERS_END - 8, 8)?;
    let cap = transport::read_cap(&mut &*mmio)?;
    let version = Version(mmio.read32(REG_VS));
    if cap.css() & 1 == 0 {
        return Err(NvmeError::Unsupported {
            what: "the NVM command set (CAP.CSS bit 0 clear)",
        });
    }
    if cap.min_page_size() > PAGE_SIZE || cap.max_page_size() < PAGE_SIZE {
        return Err(NvmeError::Unsupported {
            what: "a 4 KiB memory page size (CAP.MPSMIN..MPSMAX)",
        });
    }
    checks::check_cap(cap, mmio)?;
    Ok((cap, version))
}

impl Controller {
    /// Open the controller at `addr` in `registry`'s DMA domain, reset and enable it, identify it
    /// and its active namespaces, and negotiate I/O queues.
    pub fn open(
        registry: &Arc<UbRegistry>,
        addr: PciAddress,
        opts: ControllerOptions,
    ) -> Result<Arc<Controller>> {
        let dev = PciDevice::open(registry.domain(), addr)?;
        Self::open_device(registry, dev, opts)
    }

    /// Like [`Controller::open`] for a device that is already open.
    pub fn open_device(
        registry: &Arc<UbRegistry>,
        dev: Arc<PciDevice>,
        opts: ControllerOptions,
    ) -> Result<Arc<Controller>> {
        // ERROR level: the span is enabled whenever any event is, so a warn-only filter still
        // shows which controller a warning is about.
        let span = tracing::error_span!("nvme", addr = %dev.address());
        let _entered = span.enter();
        let class = dev.class_code() & 0xff_ffff;
        if class != NVME_CLASS_CODE {
            return Err(NvmeError::NotNvme {
                addr: dev.address().to_string(),
                class,
            });
        }
        let claim = dev.claim("nvme")?;
        let mmio = Arc::new(claim.access().map_bar(0)?);
        let (cap, version) = read_capabilities(&mmio)?;
        let admin_entries = opts
            .admin_entries
            .clamp(2, cap.max_queue_entries().min(4096) as u16);
        let admin = AdminQueue::new(
            registry,
            mmio.clone(),
            admin_entries,
            cap.dstrd(),
            dev.numa_node(),
        )?;
        let mut ctrl = Controller {
            claim,
            registry: registry.clone(),
            mmio,
            cap,
            version,
            opts,
            info: None,
            namespaces: Vec::new(),
            io_queues_granted: 0,
            qids: QueueIds::default(),
            admin_wedged: admin.wedged_flag(),
            generation: AtomicU64::new(0),
            span: span.clone(),
            shadow: None,
            shadow_decision: ShadowDecision::default(),
            cmb: None,
            admin: ManuallyDrop::new(Mutex::new(admin)),
        };
        // From here on, an error drops `ctrl`, which disables the controller before its admin
        // rings are freed.
        ctrl.enable_with_admin_queue()?;
        ctrl.discover()?;
        tracing::debug!(
            addr = %ctrl.claim.device().address(),
            mn = %ctrl.info().mn,
            namespaces = ctrl.namespaces.len(),
            io_queues = ctrl.io_queues_granted,
            shadow = ctrl.shadow.is_some(),
            "NVMe controller ready"
        );
        shadow_auto::decide(Arc::new(ctrl))
    }

    /// Disable the controller, turn on bus mastering, map the CMB (when asked), program the
    /// admin queue and enable the controller.
    fn enable_with_admin_queue(&mut self) -> Result<()> {
        self.disable()?;
        // Bus mastering only once the controller is disabled: a controller left running by a
        // previous owner gets no chance to DMA with its old queue addresses.
        self.claim.access().enable_bus_master()?;
        if self.opts.cmb {
            let cmb = crate::cmb::Cmb::open(&self.claim, &self.mmio, &self.registry, self.cap)?;
            self.cmb = Some(cmb);
        }
        {
            let a = self.admin.get_mut().unwrap_or_else(|e| e.into_inner());
            program_admin(&self.mmio, a);
        }
        let bound = self.ready_bound();
        transport::enable(
            &mut identify_features::Pcie(self),
            bound,
            "enabling the controller",
        )
    }

    /// Identify the enabled controller, negotiate I/O queues, load the active namespaces and
    /// turn on shadow doorbells when asked and offered.
    fn discover(&mut self) -> Result<()> {
        let id = self.identify_controller()?;
        let info = ControllerInfo::from_identify(&id);
        checks::check_entry_sizes(info.sqes, info.cqes)?;
        self.info = Some(info);
        self.negotiate_queues()?;
        self.load_namespaces()?;
        if self.opts.shadow_doorbells != ShadowDoorbells::Off
            && self.info().oacs & OACS_DOORBELL_BUFFER_CONFIG != 0
        {
            self.enable_shadow_doorbells()?;
        }
        Ok(())
    }

    /// The tracing span of this controller (`nvme{addr=0000:00:04.0}`): the driver enters it
    /// around its slow paths (bring-up, resets, recovery, timeouts, shutdown) so every event
    /// there names the device; enter it around your own events about this controller.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The PCI device (held by this driver: [`PciDevice::access`] refuses to program it while
    /// the controller lives).
    pub fn device(&self) -> &Arc<PciDevice> {
        self.claim.device()
    }
    /// The UB registry whose DMA domain the controller lives in.
    pub fn registry(&self) -> &Arc<UbRegistry> {
        &self.registry
    }
    /// The controller registers.
    pub(crate) fn mmio(&self) -> &Arc<Mmio> {
        &self.mmio
    }
    /// Controller Capabilities.
    pub fn cap(&self) -> Cap {
        self.cap
    }
    /// NVMe version register.
    pub fn version(&self) -> Version {
        self.version
    }
    /// Identify Controller data.
    pub fn info(&self) -> &ControllerInfo {
        self.info
            .as_ref()
            .expect("identify data is set before the controller is handed out")
    }
    /// Active namespaces with a usable LBA format, in NSID order.
    pub fn namespaces(&self) -> &[NamespaceInfo] {
        &self.namespaces
    }
    /// Identify data of namespace `nsid`, if active.
    pub fn namespace_info(&self, nsid: u32) -> Option<&NamespaceInfo> {
        self.namespaces.iter().find(|n| n.nsid == nsid)
    }
    /// The I/O handle of active namespace `nsid`: [`NvmeError::NamespaceMissing`] when it is not
    /// active, [`NvmeError::Unsupported`] when its format carries metadata.
    pub fn namespace(&self, nsid: u32) -> Result<crate::Namespace> {
        match self.namespace_info(nsid) {
            Some(info) => crate::Namespace::new(info, self.max_command_bytes()),
            None => Err(NvmeError::NamespaceMissing {
                nsid,
                active: self.namespaces.len(),
            }),
        }
    }
    /// The I/O handle of the first active namespace (lowest nsid).
    pub fn first_namespace(&self) -> Result<crate::Namespace> {
        match self.namespaces.first() {
            Some(info) => crate::Namespace::new(info, self.max_command_bytes()),
            None => Err(NvmeError::NamespaceMissing { nsid: 1, active: 0 }),
        }
    }
    /// I/O queue pairs granted by the controller.
    pub fn io_queues_granted(&self) -> u16 {
        self.io_queues_granted
    }
    /// Largest I/O queue in entries (CAP.MQES + 1).
    pub fn max_queue_entries(&self) -> u32 {
        self.cap.max_queue_entries()
    }
    /// Bytes per command this driver will build (MDTS, capped by the options).
    pub fn max_command_bytes(&self) -> usize {
        let cap = self.opts.max_command_bytes.max(PAGE_SIZE) / PAGE_SIZE * PAGE_SIZE;
        self.info()
            .max_transfer(PAGE_SIZE)
            .map_or(cap, |m| m.min(cap))
    }
    /// Whether shadow doorbells are on, and why (see [`ShadowDoorbells::Auto`]).
    pub fn shadow_decision(&self) -> &ShadowDecision {
        &self.shadow_decision
    }
    /// Whether I/O queues use shadow doorbells.
    pub fn shadow_doorbells(&self) -> bool {
        self.shadow.is_some()
    }
    /// The Controller Memory Buffer, when the controller was opened with
    /// [`ControllerOptions::cmb`].
    pub fn cmb(&self) -> Option<&Arc<crate::cmb::Cmb>> {
        self.cmb.as_ref()
    }
    /// Where the Controller Memory Buffer lies and what it supports, whether or not the
    /// controller was opened with [`ControllerOptions::cmb`]; `None`: the controller has none.
    /// Reading it sets CMBMSC.CRE where CAP.CMBS asks for it (the CMB itself stays off).
    pub fn cmb_layout(&self) -> Result<Option<crate::cmb::CmbLayout>> {
        match &self.cmb {
            Some(cmb) => Ok(Some(*cmb.layout())),
            None => crate::cmb::read_layout(&self.claim, &self.mmio, self.cap),
        }
    }
    /// Options the controller was opened with.
    pub fn options(&self) -> &ControllerOptions {
        &self.opts
    }

    /// Shadow slots (SQ tail, CQ head) of queue `qid`, when shadow doorbells are on.
    pub(crate) fn shadow_slots(&self, qid: u16) -> Option<(ShadowSlot, ShadowSlot)> {
        let s = self.shadow.as_ref()?;
        let dstrd = self.cap.dstrd();
        let slot = |off: usize| {
            let i = off - crate::spec::regs::REG_DOORBELL_BASE;
            ShadowSlot {
                // SAFETY: i < 4096 for every qid the controller grants (checked when enabling:
                // (2 * 65536) * 4 would exceed, so enable_shadow_doorbells bounds the queues).
                db: unsafe { s.db.as_ptr().add(i) }.cast::<u32>(),
                // SAFETY: same offset within the EventIdx page.
                ei: unsafe { s.ei.as_ptr().add(i) }.cast::<u32>(),
            }
        };
        Some((
            slot(sq_tail_doorbell(qid, dstrd)),
            slot(cq_head_doorbell(qid, dstrd)),
        ))
    }

    /// Lock the admin queue (poisoning is ignored: the queue state stays consistent).
    pub(crate) fn admin(&self) -> MutexGuard<'_, AdminQueue> {
        self.admin.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run one admin command. Once one has timed out (see [`Controller::admin_wedged`]) the
    /// next fail at once with [`NvmeError::Wedged`] (queue 0) until [`Controller::reset`].
    pub(crate) fn admin_exec(&self, sqe: Sqe, command: &'static str) -> Result<crate::spec::Cqe> {
        self.admin().execute(sqe, command, self.opts.admin_timeout)
    }

    /// Admin SQ tail doorbell writes repeated (same value) for commands the controller had not
    /// answered after an eighth of `admin_timeout` (at most 1 s), since the controller was
    /// opened: each is a write the controller may have lost.
    pub fn admin_doorbell_kicks(&self) -> u64 {
        self.admin().doorbell_kicks()
    }

    /// Whether an admin command timed out since the controller was opened or last reset: the
    /// admin queue is considered dead and admin commands (Abort, Delete I/O queue) are not sent.
    pub fn admin_wedged(&self) -> bool {
        self.admin_wedged.load(Ordering::Relaxed)
    }

    /// Controller resets since open: [`Controller::reset`] and the automatic resets of queue
    /// pairs that recover ([`crate::Recovery`]).
    pub fn resets(&self) -> u64 {
        self.generation()
    }

    /// The reset generation (one relaxed load: I/O queues compare it on every poll).
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Read CSTS of the enabled controller: all-ones is [`NvmeError::DeviceGone`], CFS
    /// [`NvmeError::ControllerFatal`], RDY=0 [`NvmeError::ControllerNotReady`].
    pub fn csts_enabled(&self, during: &'static str) -> Result<crate::spec::regs::Csts> {
        crate::admin_queue::read_csts_enabled(&self.mmio, during)
    }

    /// The I/O queue ids (for [`transport::create_io_queue`]).
    pub(crate) fn qids(&self) -> &QueueIds {
        &self.qids
    }

    /// Reserve a free I/O queue id.
    pub(crate) fn alloc_qid(&self) -> Result<u16> {
        self.qids.alloc()
    }

    /// Return an I/O queue id.
    pub(crate) fn free_qid(&self, qid: u16) {
        self.qids.set(qid, QidUse::Free);
    }

    /// Keep an I/O queue id out of use until the next reset: its device-side queues could not
    /// be deleted.
    pub(crate) fn leak_qid(&self, qid: u16) {
        self.qids.set(qid, QidUse::Leaked);
    }

    fn count_qids(&self, what: QidUse) -> usize {
        self.qids.count(what)
    }

    /// I/O queue ids held by live queue pairs.
    pub fn io_queues_in_use(&self) -> usize {
        self.count_qids(QidUse::Live)
    }

    /// I/O queue ids whose queue pair was dropped without deleting its device-side queues
    /// (controller wedged or gone); [`Controller::reset`] frees them.
    pub fn io_queues_leaked(&self) -> usize {
        self.count_qids(QidUse::Leaked)
    }
}
