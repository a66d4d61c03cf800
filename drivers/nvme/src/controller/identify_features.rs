//! Admin commands of bring-up and inspection: Identify (controller, namespace, active list),
//! Get/Set Features, queue negotiation, namespaces, Doorbell Buffer Config.

use ubdirect_core::DmaMem;
use zerocopy::FromBytes;

use crate::error::{NvmeError, Result};
use crate::info::NamespaceInfo;
use crate::spec::command::{admin_opcode, cns};
use crate::spec::identify::{IdentifyController, IdentifyNamespace, IDENTIFY_LEN};
use crate::spec::Sqe;

use super::transport::{self, ControllerTransport, Registers};
use super::{Controller, ShadowPages, PAGE_SIZE};

/// The PCIe transport of the shared controller logic: BAR0 registers, the admin rings.
pub(super) struct Pcie<'a>(pub(super) &'a Controller);

impl Registers for Pcie<'_> {
    type Error = NvmeError;
    fn read_cap(&mut self) -> Result<u64> {
        (&*self.0.mmio).read_cap()
    }
    fn read_csts(&mut self) -> Result<u32> {
        (&*self.0.mmio).read_csts()
    }
    fn write_cc(&mut self, cc: u32) -> Result<()> {
        (&*self.0.mmio).write_cc(cc)
    }
}

impl ControllerTransport for Pcie<'_> {
    fn identify(
        &mut self,
        cns: u8,
        nsid: u32,
        what: &'static str,
        page: &mut [u8; IDENTIFY_LEN],
    ) -> Result<()> {
        let mut a = self.0.admin();
        let mut sqe = Sqe::new(admin_opcode::IDENTIFY);
        sqe.nsid = nsid;
        sqe.prp1 = a.data.iova();
        sqe.cdw10 = cns as u32;
        a.execute(sqe, what, self.0.opts.admin_timeout)?;
        *page = read_page::<[u8; IDENTIFY_LEN]>(&a.data);
        Ok(())
    }
    fn set_features(&mut self, fid: u8, cdw11: u32) -> Result<u32> {
        self.0.set_features(fid, cdw11)
    }
}

impl Controller {
    /// Identify Controller (CNS 01h), raw.
    pub fn identify_controller(&self) -> Result<Box<IdentifyController>> {
        transport::identify_controller(&mut Pcie(self))
    }

    /// Identify Namespace (CNS 00h), raw.
    pub fn identify_namespace(&self, nsid: u32) -> Result<Box<IdentifyNamespace>> {
        transport::identify_namespace(&mut Pcie(self), nsid)
    }

    /// Active Namespace ID list (CNS 02h), all pages: at most
    /// [`super::ControllerOptions::max_namespaces`] NSIDs, each valid (1..=NN) and above the
    /// one before; the list ends at the first entry that is not (with a warning).
    pub fn active_namespace_ids(&self) -> Result<Vec<u32>> {
        let _entered = self.span().enter();
        let nn = self.info.as_ref().map_or(u32::MAX, |i| i.nn);
        let cap = self.opts.max_namespaces as usize;
        let mut out: Vec<u32> = Vec::new();
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
            let full = page[1023] != 0;
            for &id in page.iter().take_while(|&&n| n != 0) {
                let prev = out.last().copied().unwrap_or(start);
                if id <= prev || id > nn || id >= 0xffff_fffe {
                    tracing::warn!(
                        id,
                        prev,
                        nn,
                        "active namespace list: NSID not above the previous one or above NN; list cut here"
                    );
                    return Ok(out);
                }
                if out.len() == cap {
                    tracing::warn!(
                        cap,
                        "more active namespaces than ControllerOptions::max_namespaces; using the first {cap}"
                    );
                    return Ok(out);
                }
                out.push(id);
            }
            if full && out.len() == cap {
                tracing::warn!(
                    cap,
                    "more active namespaces than ControllerOptions::max_namespaces; using the first {cap}"
                );
                return Ok(out);
            }
            match out.last() {
                Some(&last) if full && last > start => start = last,
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

    pub(super) fn negotiate_queues(&mut self) -> Result<()> {
        let granted = transport::negotiate_queues(&mut Pcie(self), self.opts.io_queues)?;
        // Doorbells of every queue used must lie in BAR0 (CAP.DSTRD comes from the device).
        let fit = super::checks::queues_with_doorbells(&self.mmio, self.cap.dstrd(), granted);
        if fit == 0 {
            return Err(NvmeError::DeviceInput {
                field: "CAP.DSTRD",
                value: self.cap.dstrd() as u64,
                reason: "puts the doorbells of I/O queue 1 outside BAR0",
            });
        }
        if fit < granted {
            tracing::warn!(
                granted,
                fit,
                dstrd = self.cap.dstrd(),
                "only the first {fit} I/O queues have doorbells inside BAR0"
            );
        }
        let granted = fit;
        self.io_queues_granted = granted;
        self.qids = super::QueueIds::new(granted);
        Ok(())
    }

    pub(super) fn load_namespaces(&mut self) -> Result<()> {
        let ids = self.active_namespace_ids()?;
        let mut v = Vec::with_capacity(ids.len());
        let max_cmd = self.max_command_bytes();
        for nsid in ids {
            let id = self.identify_namespace(nsid)?;
            let ns = match NamespaceInfo::from_identify(nsid, &id) {
                Ok(ns) => ns,
                Err(e) => {
                    tracing::warn!(nsid, error = %e, "namespace skipped");
                    continue;
                }
            };
            let ns = match self.with_command_set(ns) {
                Ok(ns) => ns,
                Err(e @ NvmeError::DeviceInput { .. }) => {
                    tracing::warn!(nsid, error = %e, "namespace skipped");
                    continue;
                }
                Err(e) => return Err(e),
            };
            if ns.lba_size as usize > max_cmd {
                tracing::warn!(
                    nsid,
                    lba_size = ns.lba_size,
                    max_cmd,
                    "namespace skipped: its block is larger than the largest command"
                );
            } else if ns.nsze == 0 {
                tracing::warn!(nsid, "namespace skipped: size 0");
            } else {
                v.push(ns);
            }
        }
        self.namespaces = v;
        Ok(())
    }

    /// `ns` with the command set its Namespace Identification Descriptor list names (NVMe 1.3
    /// and later; before that, or when the controller refuses the list, the NVM command set).
    fn with_command_set(&self, mut ns: NamespaceInfo) -> Result<NamespaceInfo> {
        if !self.version().at_least(1, 3) {
            return Ok(ns);
        }
        match transport::namespace_command_set(&mut Pcie(self), ns.nsid) {
            Ok(set) => ns.command_set = set.unwrap_or_default(),
            Err(NvmeError::Command { status, .. }) => tracing::debug!(
                nsid = ns.nsid,
                %status,
                "no Namespace Identification Descriptor list: NVM command set assumed"
            ),
            Err(e) => return Err(e),
        }
        Ok(ns)
    }

    pub(super) fn enable_shadow_doorbells(&mut self) -> Result<()> {
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
}

/// Copy a structure out of the admin data page.
pub(super) fn read_page<T: FromBytes>(mem: &DmaMem) -> T {
    // SAFETY: the admin data buffer is ADMIN_DATA_LEN (>= 4096) bytes, live while the admin
    // lock is held by the caller, and the command that filled it has completed.
    let bytes = unsafe { std::slice::from_raw_parts(mem.as_ptr(), std::mem::size_of::<T>()) };
    T::read_from_bytes(bytes).expect("size matches")
}
