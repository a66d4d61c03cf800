//! [`Controller`]: bring-up (NVMe base spec 3.5.1), namespaces, limits and orderly shutdown.

use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ubdirect_core::{DmaMem, Mmio, PciAddress, PciDevice, UbRegistry};
use zerocopy::FromBytes;

use crate::admin_queue::AdminQueue;
use crate::doorbell::ShadowSlot;
use crate::error::{NvmeError, Result};
use crate::info::{ControllerInfo, Namespace};
use crate::spec::command::{admin_opcode, cns, feature};
use crate::spec::identify::{IdentifyController, IdentifyNamespace, OACS_DOORBELL_BUFFER_CONFIG};
use crate::spec::regs::{
    aqa, cq_head_doorbell, sq_tail_doorbell, Cap, Cc, Csts, ShutdownStatus, Version, REG_ACQ,
    REG_AQA, REG_ASQ, REG_CAP, REG_CC, REG_CSTS, REG_VS,
};
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
    /// Use shadow doorbells (Doorbell Buffer Config) when the controller supports them.
    pub shadow_doorbells: bool,
    /// Admin queue entries (capped by CAP.MQES + 1).
    pub admin_entries: u16,
    /// Deadline of each admin command.
    pub admin_timeout: Duration,
    /// Largest single command this driver builds when MDTS is 0 (unlimited) or larger.
    pub max_command_bytes: usize,
    /// Bound on shutdown when the controller reports no RTD3E.
    pub default_shutdown_timeout: Duration,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            io_queues: 16,
            shadow_doorbells: true,
            admin_entries: 32,
            admin_timeout: Duration::from_secs(10),
            max_command_bytes: 2 << 20,
            default_shutdown_timeout: Duration::from_secs(5),
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
    namespaces: Vec<Namespace>,
    io_queues_granted: u16,
    qids: Mutex<Vec<bool>>,
    shadow: Option<ShadowPages>,
    // Dropped by hand in Drop, after the controller is disabled (or leaked if it will not stop).
    admin: ManuallyDrop<Mutex<AdminQueue>>,
    registry: Arc<UbRegistry>,
    dev: Arc<PciDevice>,
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
        let class = dev.class_code() & 0xff_ffff;
        if class != NVME_CLASS_CODE {
            return Err(NvmeError::NotNvme {
                addr: dev.address().to_string(),
                class,
            });
        }
        dev.enable_bus_master()?;
        let mmio = Arc::new(dev.map_bar(0)?);
        let cap_raw = mmio.read64(REG_CAP);
        if cap_raw == u64::MAX {
            return Err(NvmeError::DeviceGone { register: "CAP" });
        }
        let cap = Cap(cap_raw);
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
        let admin_entries = opts
            .admin_entries
            .clamp(2, cap.max_queue_entries().min(4096) as u16);
        let admin = AdminQueue::new(registry, mmio.clone(), admin_entries, cap.dstrd())?;
        let mut ctrl = Controller {
            dev,
            registry: registry.clone(),
            mmio,
            cap,
            version,
            opts,
            info: None,
            namespaces: Vec::new(),
            io_queues_granted: 0,
            qids: Mutex::new(Vec::new()),
            shadow: None,
            admin: ManuallyDrop::new(Mutex::new(admin)),
        };
        // From here on, an error drops `ctrl`, which disables the controller before its admin
        // rings are freed.
        ctrl.disable()?;
        {
            let a = ctrl.admin.get_mut().unwrap_or_else(|e| e.into_inner());
            program_admin(&ctrl.mmio, a);
        }
        ctrl.mmio.write32(REG_CC, Cc::enabled(0, 6, 4).0);
        ctrl.wait_ready(true, "enabling the controller")?;

        let id = ctrl.identify_controller()?;
        let info = ControllerInfo::from_identify(&id);
        if info.sqes & 0xf > 6 || info.cqes & 0xf > 4 {
            return Err(NvmeError::Unsupported {
                what: "64-byte SQ and 16-byte CQ entries (Identify SQES/CQES)",
            });
        }
        ctrl.info = Some(info);
        ctrl.negotiate_queues()?;
        ctrl.load_namespaces()?;
        if ctrl.opts.shadow_doorbells && ctrl.info().oacs & OACS_DOORBELL_BUFFER_CONFIG != 0 {
            ctrl.enable_shadow_doorbells()?;
        }
        tracing::debug!(
            addr = %ctrl.dev.address(),
            mn = %ctrl.info().mn,
            namespaces = ctrl.namespaces.len(),
            io_queues = ctrl.io_queues_granted,
            shadow = ctrl.shadow.is_some(),
            "NVMe controller ready"
        );
        Ok(Arc::new(ctrl))
    }

    /// The PCI device.
    pub fn device(&self) -> &Arc<PciDevice> {
        &self.dev
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
    pub fn namespaces(&self) -> &[Namespace] {
        &self.namespaces
    }
    /// Namespace `nsid`, if active.
    pub fn namespace(&self, nsid: u32) -> Option<&Namespace> {
        self.namespaces.iter().find(|n| n.nsid == nsid)
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
    /// Whether I/O queues use shadow doorbells.
    pub fn shadow_doorbells(&self) -> bool {
        self.shadow.is_some()
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
            // SAFETY: i < 4096 for every qid the controller grants (checked when enabling:
            // (2 * 65536) * 4 would exceed, so enable_shadow_doorbells bounds the queues).
            ShadowSlot {
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

    /// Run one admin command.
    pub(crate) fn admin_exec(&self, sqe: Sqe, command: &'static str) -> Result<crate::spec::Cqe> {
        self.admin().execute(sqe, command, self.opts.admin_timeout)
    }

    /// Read CSTS, turning all-ones into DeviceGone and CFS into ControllerFatal.
    pub fn csts(&self, during: &'static str) -> Result<Csts> {
        let csts = Csts(self.mmio.read32(REG_CSTS));
        if csts.is_all_ones() {
            return Err(NvmeError::DeviceGone { register: "CSTS" });
        }
        if csts.cfs() {
            return Err(NvmeError::ControllerFatal {
                csts: csts.0,
                during,
            });
        }
        Ok(csts)
    }

    fn disable(&self) -> Result<()> {
        let cc = self.mmio.read32(REG_CC);
        if cc == u32::MAX {
            return Err(NvmeError::DeviceGone { register: "CC" });
        }
        if Cc(cc).en() {
            self.mmio.write32(REG_CC, cc & !Cc::EN);
        }
        // A fatal controller may be disabled: CFS does not stop the wait for RDY=0.
        self.wait_ready_raw(false)
    }

    fn wait_ready(&self, ready: bool, during: &'static str) -> Result<()> {
        let timeout = self.cap.timeout();
        let start = Instant::now();
        loop {
            let csts = self.csts(during)?;
            if csts.rdy() == ready {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(NvmeError::ReadyTimeout {
                    ready,
                    timeout,
                    csts: csts.0,
                });
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    fn wait_ready_raw(&self, ready: bool) -> Result<()> {
        let timeout = self.cap.timeout();
        let start = Instant::now();
        loop {
            let csts = Csts(self.mmio.read32(REG_CSTS));
            if csts.is_all_ones() {
                return Err(NvmeError::DeviceGone { register: "CSTS" });
            }
            if csts.rdy() == ready {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(NvmeError::ReadyTimeout {
                    ready,
                    timeout,
                    csts: csts.0,
                });
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Identify Controller (CNS 01h), raw.
    pub fn identify_controller(&self) -> Result<Box<IdentifyController>> {
        let mut a = self.admin();
        let mut sqe = Sqe::new(admin_opcode::IDENTIFY);
        sqe.prp1 = a.data.iova();
        sqe.cdw10 = cns::CONTROLLER as u32;
        a.execute(sqe, "Identify Controller", self.opts.admin_timeout)?;
        Ok(Box::new(read_page::<IdentifyController>(&a.data)))
    }

    /// Identify Namespace (CNS 00h), raw.
    pub fn identify_namespace(&self, nsid: u32) -> Result<Box<IdentifyNamespace>> {
        let mut a = self.admin();
        let mut sqe = Sqe::new(admin_opcode::IDENTIFY);
        sqe.nsid = nsid;
        sqe.prp1 = a.data.iova();
        sqe.cdw10 = cns::NAMESPACE as u32;
        a.execute(sqe, "Identify Namespace", self.opts.admin_timeout)?;
        Ok(Box::new(read_page::<IdentifyNamespace>(&a.data)))
    }

    /// Active Namespace ID list (CNS 02h), all pages.
    pub fn active_namespace_ids(&self) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut start = 0u32;
        loop {
            let mut a = self.admin();
            let mut sqe = Sqe::new(admin_opcode::IDENTIFY);
            sqe.nsid = start;
            sqe.prp1 = a.data.iova();
            sqe.cdw10 = cns::ACTIVE_NS_LIST as u32;
            a.execute(
                sqe,
                "Identify Active Namespace List",
                self.opts.admin_timeout,
            )?;
            let page = read_page::<[u32; 1024]>(&a.data);
            drop(a);
            let ids: Vec<u32> = page.iter().copied().take_while(|&n| n != 0).collect();
            let full = ids.len() == 1024;
            out.extend(ids.iter().copied().filter(|&n| n > start));
            match (full, ids.last()) {
                (true, Some(&last)) if last > start && last < 0xffff_fffe => start = last,
                _ => return Ok(out),
            }
        }
    }

    /// Get Features: returns CQE dword 0.
    pub fn get_features(&self, fid: u8, cdw11: u32) -> Result<u32> {
        let mut sqe = Sqe::new(admin_opcode::GET_FEATURES);
        sqe.cdw10 = fid as u32;
        sqe.cdw11 = cdw11;
        Ok(self.admin_exec(sqe, "Get Features")?.result)
    }

    /// Set Features (not saved): returns CQE dword 0.
    pub fn set_features(&self, fid: u8, cdw11: u32) -> Result<u32> {
        let mut sqe = Sqe::new(admin_opcode::SET_FEATURES);
        sqe.cdw10 = fid as u32;
        sqe.cdw11 = cdw11;
        Ok(self.admin_exec(sqe, "Set Features")?.result)
    }

    fn negotiate_queues(&mut self) -> Result<()> {
        let want = self.opts.io_queues.clamp(1, 1024) as u32 - 1;
        let got = self.set_features(feature::NUMBER_OF_QUEUES, want << 16 | want)?;
        let nsq = (got & 0xffff) + 1;
        let ncq = (got >> 16) + 1;
        let granted = nsq.min(ncq).min(self.opts.io_queues.max(1) as u32) as u16;
        if granted == 0 {
            return Err(NvmeError::Unsupported {
                what: "any I/O queue",
            });
        }
        self.io_queues_granted = granted;
        *self.qids.get_mut().unwrap_or_else(|e| e.into_inner()) = vec![false; granted as usize + 1];
        Ok(())
    }

    fn load_namespaces(&mut self) -> Result<()> {
        let ids = self.active_namespace_ids()?;
        let mut v = Vec::with_capacity(ids.len());
        for nsid in ids {
            let id = self.identify_namespace(nsid)?;
            match Namespace::from_identify(nsid, &id) {
                Some(ns) if ns.nsze > 0 => v.push(ns),
                _ => tracing::warn!(nsid, "namespace skipped: empty or invalid LBA format"),
            }
        }
        self.namespaces = v;
        Ok(())
    }

    fn enable_shadow_doorbells(&mut self) -> Result<()> {
        // Each queue uses two slots of 4 << DSTRD bytes; one page must hold them all.
        let per_queue = 2 * (4usize << self.cap.dstrd());
        if per_queue * (self.io_queues_granted as usize + 1) > PAGE_SIZE {
            tracing::info!("shadow doorbells off: too many queues for one page");
            return Ok(());
        }
        let db = DmaMem::alloc(&self.registry, PAGE_SIZE)?;
        let ei = DmaMem::alloc(&self.registry, PAGE_SIZE)?;
        let mut sqe = Sqe::new(admin_opcode::DOORBELL_BUFFER_CONFIG);
        sqe.prp1 = db.iova();
        sqe.prp2 = ei.iova();
        self.admin_exec(sqe, "Doorbell Buffer Config")?;
        self.shadow = Some(ShadowPages { db, ei });
        if let Some((sq, cq)) = self.shadow_slots(0) {
            self.admin().set_shadow(sq, cq);
        }
        Ok(())
    }

    /// Reserve a free I/O queue id.
    pub(crate) fn alloc_qid(&self) -> Result<u16> {
        let mut q = self.qids.lock().unwrap_or_else(|e| e.into_inner());
        let granted = self.io_queues_granted;
        let i = (1..q.len())
            .find(|&i| !q[i])
            .ok_or(NvmeError::NoQueuesLeft { granted })?;
        q[i] = true;
        Ok(i as u16)
    }

    /// Return an I/O queue id.
    pub(crate) fn free_qid(&self, qid: u16) {
        let mut q = self.qids.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = q.get_mut(qid as usize) {
            *s = false;
        }
    }

    /// I/O queue ids in use.
    pub fn io_queues_in_use(&self) -> usize {
        self.qids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|&&b| b)
            .count()
    }

    /// Reset the controller (CC.EN 1 -> 0 -> 1) and bring the admin queue, the negotiated number
    /// of I/O queues and the shadow doorbells back. Use it after [`NvmeError::Wedged`] or a fatal
    /// status. Refused while any [`crate::IoQueuePair`] of this controller exists (their queues do
    /// not survive a reset): drop them first, then create new ones.
    pub fn reset(&self) -> Result<()> {
        let qids = self.qids.lock().unwrap_or_else(|e| e.into_inner());
        if qids.iter().any(|&b| b) {
            return Err(NvmeError::InvalidArgument(
                "Controller::reset with I/O queue pairs alive: drop every IoQueuePair of this controller first",
            ));
        }
        let mut a = self.admin();
        self.disable()?;
        a.reset();
        program_admin(&self.mmio, &mut a);
        self.mmio.write32(REG_CC, Cc::enabled(0, 6, 4).0);
        self.wait_ready(true, "re-enabling the controller after a reset")?;
        let want = self.io_queues_granted as u32 - 1;
        let mut sqe = Sqe::new(admin_opcode::SET_FEATURES);
        sqe.cdw10 = feature::NUMBER_OF_QUEUES as u32;
        sqe.cdw11 = want << 16 | want;
        let got = a
            .execute(sqe, "Set Features", self.opts.admin_timeout)?
            .result;
        if (got & 0xffff).min(got >> 16) < want {
            return Err(NvmeError::Unsupported {
                what: "as many I/O queues after the reset as before it",
            });
        }
        if let Some(s) = &self.shadow {
            // SAFETY: both pages are PAGE_SIZE bytes of our DMA memory; the controller was just
            // reset and knows no shadow buffer, so nothing else accesses them.
            unsafe {
                std::ptr::write_bytes(s.db.as_ptr(), 0, PAGE_SIZE);
                std::ptr::write_bytes(s.ei.as_ptr(), 0, PAGE_SIZE);
            }
            let mut sqe = Sqe::new(admin_opcode::DOORBELL_BUFFER_CONFIG);
            sqe.prp1 = s.db.iova();
            sqe.prp2 = s.ei.iova();
            a.execute(sqe, "Doorbell Buffer Config", self.opts.admin_timeout)?;
            if let Some((sq, cq)) = self.shadow_slots(0) {
                a.set_shadow(sq, cq);
            }
        }
        drop(qids);
        Ok(())
    }

    fn shutdown(&mut self) -> Result<()> {
        let cc = self.mmio.read32(REG_CC);
        if cc == u32::MAX {
            return Err(NvmeError::DeviceGone { register: "CC" });
        }
        if Cc(cc).en() {
            self.mmio
                .write32(REG_CC, (cc & !Cc::SHN_MASK) | Cc::SHN_NORMAL);
            let rtd3e = self.info.as_ref().map_or(0, |i| i.rtd3e);
            let bound = if rtd3e == 0 {
                self.opts.default_shutdown_timeout
            } else {
                Duration::from_micros(rtd3e as u64)
                    .clamp(Duration::from_secs(1), Duration::from_secs(60))
            };
            let start = Instant::now();
            loop {
                let csts = Csts(self.mmio.read32(REG_CSTS));
                if csts.is_all_ones() {
                    return Err(NvmeError::DeviceGone { register: "CSTS" });
                }
                if csts.shst() == ShutdownStatus::Complete || csts.cfs() {
                    break;
                }
                if start.elapsed() > bound {
                    tracing::warn!(?bound, "NVMe shutdown did not complete; disabling anyway");
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        self.disable()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let mut leak = false;
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "NVMe controller shutdown failed");
            // A controller that did not stop may still DMA: keep its rings and shadow pages
            // mapped rather than hand that memory to someone else. A gone device cannot DMA.
            leak = !matches!(e, NvmeError::DeviceGone { .. });
        }
        if leak {
            if let Some(s) = self.shadow.take() {
                std::mem::forget(s);
            }
        } else {
            // SAFETY: dropped exactly once, here; `admin` is not used after this point.
            unsafe { ManuallyDrop::drop(&mut self.admin) };
        }
    }
}

/// Point the controller at the admin rings (AQA, ASQ, ACQ); the controller must be disabled.
fn program_admin(mmio: &Mmio, a: &mut AdminQueue) {
    let n = a.entries();
    mmio.write32(REG_AQA, aqa(n, n));
    mmio.write64(REG_ASQ, a.sq.iova());
    mmio.write64(REG_ACQ, a.cq.iova());
}

/// Copy a structure out of the admin data page.
fn read_page<T: FromBytes>(mem: &DmaMem) -> T {
    // SAFETY: the admin data buffer is ADMIN_DATA_LEN (>= 4096) bytes, live while the admin
    // lock is held by the caller, and the command that filled it has completed.
    let bytes = unsafe { std::slice::from_raw_parts(mem.as_ptr(), std::mem::size_of::<T>()) };
    T::read_from_bytes(bytes).expect("size matches")
}
