//! Controller state changes: CSTS checks, disable / wait for ready (bounded by CAP.TO), reset,
//! orderly shutdown (CC.SHN, bounded by RTD3E) and the drop that keeps memory of a controller
//! that would not stop.

use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ubdirect_core::Mmio;

use crate::admin_queue::{read_csts, AdminQueue};
use crate::error::{NvmeError, Result};
use crate::info::NamespaceInfo;
use crate::spec::command::{admin_opcode, cns, feature};
use crate::spec::identify::IdentifyNamespace;
use crate::spec::regs::{
    aqa, Cc, Csts, ShutdownStatus, REG_ACQ, REG_AQA, REG_ASQ, REG_CC, REG_CSTS,
};
use crate::spec::Sqe;

use super::identify_features::Pcie;
use super::transport;
use super::{Controller, QidUse, PAGE_SIZE};

impl Controller {
    /// Read CSTS, turning all-ones into DeviceGone and CFS into ControllerFatal.
    pub fn csts(&self, during: &'static str) -> Result<Csts> {
        read_csts(&self.mmio, Some(during))
    }

    pub(super) fn disable(&self) -> Result<()> {
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

    pub(super) fn wait_ready(&self, ready: bool, during: &'static str) -> Result<()> {
        transport::wait_ready(&mut Pcie(self), ready, self.ready_bound(), Some(during))
    }

    /// [`Self::wait_ready`] that ignores CFS (a fatal controller may still be disabled).
    fn wait_ready_raw(&self, ready: bool) -> Result<()> {
        transport::wait_ready(&mut Pcie(self), ready, self.ready_bound(), None)
    }

    /// How long CSTS.RDY may take to change: CAP.TO, or the options' override.
    pub(super) fn ready_bound(&self) -> Duration {
        self.opts.ready_timeout.unwrap_or(self.cap.timeout())
    }

    /// Reset the controller (CC.EN 1 -> 0 -> 1) and bring the admin queue, the negotiated number
    /// of I/O queues and the shadow doorbells back, and read the namespaces again (a namespace
    /// whose size or format changed is [`NvmeError::NamespaceChanged`]). Use it after
    /// [`NvmeError::Wedged`], [`NvmeError::ControllerNotReady`] or a fatal status. Refused while
    /// any [`crate::IoQueuePair`] of this controller exists (their queues do not survive a
    /// reset): drop them first, then create new ones; queue pairs opened with a
    /// [`crate::Recovery`] other than `Report` reset the controller themselves. Queue pairs that
    /// were dropped without deleting their device-side queues do not block it: disabling the
    /// controller deletes every queue on the device side, so their ids are free again
    /// afterwards (their memory stays leaked).
    pub fn reset(&self) -> Result<()> {
        let _entered = self.span.enter();
        let mut qids = self.qids.lock();
        if qids.contains(&QidUse::Live) {
            return Err(NvmeError::InvalidArgument(
                "Controller::reset with I/O queue pairs alive: drop every IoQueuePair of this controller first",
            ));
        }
        self.reset_locked(&mut qids)
    }

    /// The reset of an I/O queue pair's recovery: done only when nobody reset the controller
    /// since generation `seen` (the queue pairs that notice a fault together reset it once);
    /// live queue pairs stay and re-create their queues when they see the new generation.
    pub(crate) fn recover(&self, seen: u64) -> Result<()> {
        let _entered = self.span.enter();
        let mut qids = self.qids.lock();
        if self.generation() != seen {
            return Ok(());
        }
        self.reset_locked(&mut qids)
    }

    fn reset_locked(&self, qids: &mut [QidUse]) -> Result<()> {
        let mut a = self.admin();
        self.disable()?;
        // The controller is disabled: no queue of a dropped-but-leaked pair exists any more.
        for u in qids.iter_mut() {
            if *u == QidUse::Leaked {
                *u = QidUse::Free;
            }
        }
        // Also clears the wedged flag: the timed-out admin command died with the disable.
        a.reset();
        if let Some(c) = &self.cmb {
            c.reprogram(&self.mmio);
        }
        program_admin(&self.mmio, &mut a);
        self.mmio.write32(REG_CC, Cc::enabled(0, 6, 4).0);
        // A BAR that no longer decodes drops the write (QEMU then reads 0, real hardware
        // all-ones): waiting CAP.TO for RDY would be in vain.
        let cc = self.mmio.read32(REG_CC);
        if cc == u32::MAX {
            return Err(NvmeError::DeviceGone { register: "CC" });
        }
        if !Cc(cc).en() {
            return Err(NvmeError::ControllerNotReady {
                csts: self.mmio.read32(REG_CSTS),
                during: "re-enabling the controller after a reset (CC.EN does not keep the value written: the BAR no longer decodes)",
            });
        }
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
            // reset and knows no shadow buffer, so it does not access them.
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
        for ns in &self.namespaces {
            let mut sqe = Sqe::new(admin_opcode::IDENTIFY);
            sqe.nsid = ns.nsid;
            sqe.prp1 = a.data.iova();
            sqe.cdw10 = cns::NAMESPACE as u32;
            a.execute(sqe, "Identify Namespace", self.opts.admin_timeout)?;
            let id = super::identify_features::read_page::<IdentifyNamespace>(&a.data);
            let same = NamespaceInfo::from_identify(ns.nsid, &id).is_ok_and(|n| {
                n.nsze == ns.nsze
                    && n.lba_size == ns.lba_size
                    && n.metadata_size == ns.metadata_size
            });
            if !same {
                return Err(NvmeError::NamespaceChanged { nsid: ns.nsid });
            }
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
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
        let _entered = self.span.clone().entered();
        let mut leak = false;
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "NVMe controller shutdown failed");
            // A controller that did not stop may still DMA: keep its rings and shadow pages
            // mapped rather than hand that memory to someone else. A gone device cannot DMA;
            // registers reading all-ones also mean memory decoding is off, so config space
            // decides.
            leak = !(matches!(e, NvmeError::DeviceGone { .. }) && cannot_dma(self.device()));
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

/// Whether a function whose registers read all-ones can no longer DMA: its config space is gone
/// too (all-ones or unreadable: removed, or dead on the link), or bus mastering is off. With
/// config space answering and bus mastering on, the registers may only have stopped decoding
/// while the device still masters the bus.
fn cannot_dma(dev: &ubdirect_core::PciDevice) -> bool {
    const BUS_MASTER: u16 = 1 << 2;
    match dev.config_read_u32(0) {
        Err(_) | Ok(u32::MAX) => true,
        Ok(_) => dev
            .config_read_u16(4)
            .is_ok_and(|cmd| cmd & BUS_MASTER == 0),
    }
}

/// Point the controller at the admin rings (AQA, ASQ, ACQ); the controller must be disabled.
pub(super) fn program_admin(mmio: &Mmio, a: &mut AdminQueue) {
    let n = a.entries();
    mmio.write32(REG_AQA, aqa(n, n));
    mmio.write64(REG_ASQ, a.sq.iova());
    mmio.write64(REG_ACQ, a.cq.iova());
}
