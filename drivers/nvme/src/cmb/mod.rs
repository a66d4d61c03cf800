//! The NVMe Controller Memory Buffer (CMB): located through CMBLOC / CMBSZ (enabled with
//! CMBMSC.CRE on NVMe 1.4+), its BAR window mmapped through VFIO and registered as a UB region
//! ([`ubdirect_core::RegionKind::BarWindow`]): the controller's own memory as a DMA target for
//! the other devices of the domain. With CMBMSC.CMSE the controller also takes addresses in
//! `[CBA, CBA + size)` as its CMB: the driver sets CBA to the region's IOVA, so one address names
//! a CMB byte for every device, and places I/O submission queues there
//! ([`crate::QueueOptions::sq_in_cmb`]).

pub mod layout;

use std::sync::{Arc, Mutex};

use ubdirect_core::pci::DeviceClaim;
use ubdirect_core::{Mmio, RegionOwner, UbRegion, UbRegistry};

use crate::error::{NvmeError, Result};
use crate::spec::regs::Cap;
pub use layout::CmbLayout;
use layout::{CMBMSC_CMSE, CMBMSC_CRE, CMBSTS_CBAI, REG_CMBLOC, REG_CMBMSC, REG_CMBSTS, REG_CMBSZ};

const PAGE: u64 = 4096;

/// An open Controller Memory Buffer. Owned by its [`crate::Controller`]
/// ([`crate::Controller::cmb`]); its region stays registered until the controller is dropped
/// (then it is unregistered unless a pool still uses it).
pub struct Cmb {
    layout: CmbLayout,
    region: Arc<UbRegion>,
    /// The controller address of the CMB's first byte (CMBMSC.CBA); None for a CMB without
    /// CMBMSC (before NVMe 1.4), whose controller address this driver cannot know.
    cba: Option<u64>,
    /// CMB pages holding submission queues.
    used: Mutex<Vec<bool>>,
    registry: Arc<UbRegistry>,
    device: String,
}

impl std::fmt::Debug for Cmb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cmb")
            .field("layout", &self.layout)
            .field("region", &self.region.id)
            .field("cba", &self.cba.map(|c| format!("{c:#x}")))
            .finish()
    }
}

/// The CMB's location and capabilities from CMBLOC / CMBSZ, after setting CMBMSC.CRE where
/// CAP.CMBS says the registers read zero without it; `None`: the controller has no CMB.
pub(crate) fn read_layout(claim: &DeviceClaim, mmio: &Mmio, cap: Cap) -> Result<Option<CmbLayout>> {
    let dev = claim.device();
    mmio.check_access(REG_CMBSTS, 4)
        .map_err(|_| NvmeError::DeviceInput {
            field: "BAR0 length",
            value: mmio.len() as u64,
            reason: "BAR0 ends before the CMB registers (CMBLOC..CMBSTS)",
        })?;
    if cap.cmbs() {
        mmio.write64(REG_CMBMSC, CMBMSC_CRE);
    }
    let (loc, sz) = (mmio.read32(REG_CMBLOC), mmio.read32(REG_CMBSZ));
    CmbLayout::decode(loc, sz, |b| dev.bar_len(b).ok())
}

impl Cmb {
    /// Find, map and register the CMB of the (disabled) controller behind `mmio`: set
    /// CMBMSC.CRE, decode CMBLOC / CMBSZ ([`CmbLayout::decode`]), register the BAR window, then
    /// set CMBMSC.CBA to its IOVA with CMSE. [`NvmeError::NoCmb`] when there is none.
    pub(crate) fn open(
        claim: &DeviceClaim,
        mmio: &Mmio,
        registry: &Arc<UbRegistry>,
        cap: Cap,
    ) -> Result<Arc<Cmb>> {
        let addr = claim.device().address().to_string();
        let layout =
            read_layout(claim, mmio, cap)?.ok_or(NvmeError::NoCmb { addr: addr.clone() })?;
        let region = registry.register_bar_window(claim, layout.bir, layout.offset, layout.size)?;
        let cba = if cap.cmbs() {
            let cba = region.iova;
            mmio.write64(REG_CMBMSC, cba | CMBMSC_CRE | CMBMSC_CMSE);
            if mmio.read32(REG_CMBSTS) & CMBSTS_CBAI != 0 {
                let _ = registry.unregister(region.id);
                mmio.write64(REG_CMBMSC, 0);
                return Err(NvmeError::DeviceInput {
                    field: "CMBSTS.CBAI",
                    value: cba,
                    reason: "the controller refused the CMB's IOVA as its controller base address (CMBMSC.CBA)",
                });
            }
            Some(cba)
        } else {
            None
        };
        tracing::debug!(addr = %addr, ?layout, iova = region.iova, "NVMe CMB registered");
        Ok(Arc::new(Cmb {
            used: Mutex::new(vec![false; (layout.size / PAGE) as usize]),
            layout,
            region,
            cba,
            registry: registry.clone(),
            device: addr,
        }))
    }

    /// Write CMBMSC again after a controller reset (a no-op for a CMB without CMBMSC).
    pub(crate) fn reprogram(&self, mmio: &Mmio) {
        if let Some(cba) = self.cba {
            mmio.write64(REG_CMBMSC, cba | CMBMSC_CRE | CMBMSC_CMSE);
        }
    }

    /// Where the CMB lies and what it supports.
    pub fn layout(&self) -> &CmbLayout {
        &self.layout
    }

    /// The UB region over the CMB: its IOVA is a DMA target for every device of the domain, its
    /// `vaddr` the CPU mapping (device memory: read and write it with volatile accesses). Carve
    /// it with a [`ubdirect_core::UbPool`] for peer-to-peer buffers, or leave it to
    /// [`crate::QueueOptions::sq_in_cmb`]: a region is carved once.
    pub fn region(&self) -> &Arc<UbRegion> {
        &self.region
    }

    /// The controller base address (CMBMSC.CBA, equal to the region's IOVA), when the
    /// controller memory space is enabled.
    pub fn controller_base(&self) -> Option<u64> {
        self.cba
    }

    /// `bytes` (rounded up to 4 KiB) of the CMB for an I/O submission queue: the lowest free
    /// run. The first takes the region for the driver ([`RegionOwner::DmaSlab`]).
    pub(crate) fn alloc_sq(self: &Arc<Self>, bytes: usize) -> Result<CmbSlice> {
        if !self.layout.sqs {
            return Err(NvmeError::CmbNoSqs {
                addr: self.device.clone(),
            });
        }
        if self.cba.is_none() {
            return Err(NvmeError::Unsupported {
                what: "I/O submission queues in a CMB without CMBMSC (NVMe before 1.4: its controller address is unknown): leave the queues in host memory",
            });
        }
        let pages = (bytes as u64).div_ceil(PAGE).max(1) as usize;
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let first = first_free_run(&used, pages).ok_or_else(|| NvmeError::CmbTooSmall {
            addr: self.device.clone(),
            need: pages as u64 * PAGE,
            free: largest_free_run(&used) as u64 * PAGE,
            size: self.layout.size,
        })?;
        if !used.contains(&true) {
            self.region.claim(RegionOwner::DmaSlab)?;
        }
        used[first..first + pages]
            .iter_mut()
            .for_each(|u| *u = true);
        Ok(CmbSlice {
            cmb: self.clone(),
            first,
            pages,
        })
    }

    fn free(&self, first: usize, pages: usize) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used[first..first + pages]
            .iter_mut()
            .for_each(|u| *u = false);
        if !used.contains(&true) {
            self.region.release(RegionOwner::DmaSlab);
        }
    }
}

impl Drop for Cmb {
    fn drop(&mut self) {
        // The controller is disabled by now (the Cmb goes with it). A pool still carving the
        // region keeps it registered: its blocks stay valid memory.
        if let Err(e) = self.registry.unregister(self.region.id) {
            tracing::debug!(error = %e, "NVMe CMB region left registered");
        }
    }
}

fn first_free_run(used: &[bool], pages: usize) -> Option<usize> {
    let mut run = 0;
    for (i, &u) in used.iter().enumerate() {
        run = if u { 0 } else { run + 1 };
        if run == pages {
            return Some(i + 1 - pages);
        }
    }
    None
}

fn largest_free_run(used: &[bool]) -> usize {
    used.split(|&u| u).map(<[bool]>::len).max().unwrap_or(0)
}

/// Pages of the CMB holding one submission queue; returned to the CMB on drop.
pub(crate) struct CmbSlice {
    cmb: Arc<Cmb>,
    first: usize,
    pages: usize,
}

impl CmbSlice {
    /// CPU address of the first byte (device memory).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.cmb
            .region
            .vaddr
            .wrapping_add(self.first * PAGE as usize)
    }
    /// The controller (and IOMMU) address of the first byte.
    pub(crate) fn iova(&self) -> u64 {
        self.cmb.region.iova + self.first as u64 * PAGE
    }
}

impl Drop for CmbSlice {
    fn drop(&mut self) {
        self.cmb.free(self.first, self.pages);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ubdirect_core::{CoreError, DmaDomain, PoolConfig, UbPool};

    /// A Cmb over anonymous memory of `pages` pages (the allocator and its errors do not
    /// depend on what backs the region).
    fn fake(pages: usize, sqs: bool, cba: bool) -> (Arc<UbRegistry>, Arc<Cmb>) {
        let registry = UbRegistry::new(DmaDomain::host_only());
        let region = registry
            .register_anonymous(pages * PAGE as usize, None)
            .unwrap();
        let layout = CmbLayout {
            bir: 2,
            offset: 0,
            size: pages as u64 * PAGE,
            sqs,
            cqs: false,
            lists: true,
            rds: true,
            wds: true,
        };
        let cmb = Arc::new(Cmb {
            layout,
            cba: cba.then_some(region.iova),
            region,
            used: Mutex::new(vec![false; pages]),
            registry: registry.clone(),
            device: "0000:00:0b.0".into(),
        });
        (registry, cmb)
    }

    #[test]
    fn sqs_are_placed_first_fit_and_too_small_names_need_and_free() {
        let (_r, cmb) = fake(8, true, true);
        let a = cmb.alloc_sq(3 * 4096).unwrap();
        let b = cmb.alloc_sq(64).unwrap();
        assert_eq!((a.first, a.pages, b.first, b.pages), (0, 3, 3, 1));
        assert_eq!(b.iova(), cmb.region.iova + 3 * PAGE);
        assert_eq!(b.as_ptr(), cmb.region.vaddr.wrapping_add(3 * 4096));
        assert_eq!(cmb.region.owner(), Some(RegionOwner::DmaSlab));
        let e = cmb.alloc_sq(5 * 4096).err().expect("no 5-page run left");
        assert!(
            matches!(
                e,
                NvmeError::CmbTooSmall {
                    need: 20480,
                    free: 16384,
                    size: 32768,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("smaller queue depth"), "{e}");
        drop(a);
        // The freed run is found again, below b.
        let c = cmb.alloc_sq(2 * 4096).unwrap();
        assert_eq!(c.first, 0);
        drop((b, c));
        assert_eq!(
            cmb.region.owner(),
            None,
            "the last SQ gives the region back"
        );
    }

    #[test]
    fn no_sqs_and_no_cmbmsc_are_refused() {
        let (_r, cmb) = fake(4, false, true);
        let e = cmb.alloc_sq(4096).err().unwrap();
        assert!(matches!(e, NvmeError::CmbNoSqs { .. }), "{e}");
        assert!(e.to_string().contains("CMBSZ.SQS=0"), "{e}");
        assert_eq!(cmb.region.owner(), None, "refusal changed nothing");
        let (_r, cmb) = fake(4, true, false);
        let e = cmb.alloc_sq(4096).err().unwrap();
        assert!(matches!(e, NvmeError::Unsupported { .. }), "{e}");
    }

    #[test]
    fn a_pooled_cmb_holds_no_sq_and_the_reverse() {
        let (r, cmb) = fake(4, true, true);
        let cfg = PoolConfig {
            block_size: 4096,
            block_count: 4,
        };
        let pool = UbPool::new(&r, cmb.region.clone(), cfg).unwrap();
        let e = cmb.alloc_sq(4096).err().unwrap();
        assert!(
            matches!(e, NvmeError::Core(CoreError::RegionTaken { .. })),
            "{e}"
        );
        assert_eq!(cmb.used.lock().unwrap().iter().filter(|&&u| u).count(), 0);
        drop(pool);
        let sq = cmb.alloc_sq(4096).unwrap();
        assert!(UbPool::new(&r, cmb.region.clone(), cfg).is_err());
        drop(sq);
    }

    #[test]
    fn free_runs() {
        let u = [true, false, false, true, false, false, false, true];
        assert_eq!(first_free_run(&u, 1), Some(1));
        assert_eq!(first_free_run(&u, 2), Some(1));
        assert_eq!(first_free_run(&u, 3), Some(4));
        assert_eq!(first_free_run(&u, 4), None);
        assert_eq!(largest_free_run(&u), 3);
        assert_eq!(largest_free_run(&[true; 4]), 0);
    }
}
