//! The no-IOMMU back end's rules (opt-in, unsafe by nature, as DPDK and SPDK treat it):
//! without an IOMMU a device sees physical addresses, so the only memory it may be given is
//! memory the kernel never moves (hugetlb pages), at its physical address (from
//! `/proc/self/pagemap`, which needs CAP_SYS_ADMIN). The operator must have turned vfio's
//! unsafe no-IOMMU mode on (`UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config`) and the library
//! user must opt in ([`super::DomainOptions::allow_noiommu`]). Device BARs and files
//! (dma-bufs) have no physical address a peer could use safely here: refused.
//!
//! Everything reads under an injectable root / from injected `smaps` text and a physical
//! address lookup, so the rules are tested on the host.

use std::ops::Range;
use std::path::Path;

use super::segments::{contiguous_runs, DmaSegment};
use crate::error::CoreError;

/// The vfio module parameter that makes vfio create no-IOMMU groups (`/dev/vfio/noiommu-N`),
/// relative to the filesystem root.
pub const UNSAFE_MODE_PARAM: &str = "sys/module/vfio/parameters/enable_unsafe_noiommu_mode";

/// The smallest page size the kernel never migrates for us: anything below is ordinary
/// (movable) memory.
const SMALL_PAGE: u64 = 4096;

fn refuse(reason: String, fix: &str) -> CoreError {
    CoreError::Backend {
        backend: "noiommu",
        reason,
        fix: fix.into(),
    }
}

/// Whether the operator enabled vfio's unsafe no-IOMMU mode under `root` ("/" for the real
/// system). The error says what is missing and how to turn it on.
pub fn operator_opt_in(root: &Path) -> Result<(), CoreError> {
    let p = root.join(UNSAFE_MODE_PARAM);
    match std::fs::read_to_string(&p) {
        Ok(v) if matches!(v.trim(), "Y" | "y" | "1") => Ok(()),
        Ok(v) => Err(refuse(
            format!(
                "the operator has not enabled vfio's unsafe no-IOMMU mode (/{UNSAFE_MODE_PARAM} is {:?})",
                v.trim()
            ),
            "run `UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config` as root (it enables the mode and binds the devices), or turn the IOMMU on (intel_iommu=on / amd_iommu=on)",
        )),
        Err(_) => Err(refuse(
            format!("/{UNSAFE_MODE_PARAM} does not exist: the vfio module is not loaded, or the kernel lacks CONFIG_VFIO_NOIOMMU"),
            "`modprobe vfio`, or boot a kernel with CONFIG_VFIO_NOIOMMU=y (Debian's lacks it; see scripts/vm/kernel-config/ubd.config), or turn the IOMMU on",
        )),
    }
}

/// One mapping of `/proc/self/smaps`: its address range and kernel page size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Vma {
    range: Range<usize>,
    page_size: u64,
    /// The last field of the header line (the backing file, or empty).
    name: String,
}

/// The mapping of `smaps` text that contains `addr`.
fn vma_of(smaps: &str, addr: usize) -> Option<Vma> {
    let mut cur: Option<Vma> = None;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                if let Some(v) = cur.take().filter(|v| v.range.contains(&addr)) {
                    return Some(v);
                }
                let name = line.split_whitespace().nth(5).unwrap_or("").to_string();
                cur = Some(Vma {
                    range: a..b,
                    page_size: SMALL_PAGE,
                    name,
                });
                continue;
            }
        }
        if let (Some(v), Some(kb)) = (cur.as_mut(), line.strip_prefix("KernelPageSize:")) {
            let kb = kb.trim().trim_end_matches("kB").trim();
            if let Ok(kb) = kb.parse::<u64>() {
                v.page_size = kb * 1024;
            }
        }
    }
    cur.filter(|v| v.range.contains(&addr))
}

/// The bus address a device must use for `[vaddr, vaddr+len)` without an IOMMU: its physical
/// address, for a range that is physically contiguous (else refused: use
/// [`dma_segments_in`]). `smaps` is this process's `/proc/self/smaps`; `phys` turns a
/// (page-aligned) virtual address into its physical one.
pub fn dma_address_in(
    smaps: &str,
    vaddr: usize,
    len: usize,
    phys: impl FnMut(usize) -> Result<u64, String>,
) -> Result<u64, CoreError> {
    let runs = dma_segments_in(smaps, vaddr, len, phys)?;
    if let [_, second, ..] = runs.as_slice() {
        let want = runs[0].iova + runs[0].len as u64;
        return Err(refuse(
            format!(
                "[{vaddr:#x}, {:#x}) is not physically contiguous: the hugepage at {:#x} is at physical {:#x}, not {want:#x}; a device without an IOMMU sees one address range",
                vaddr + len,
                vaddr + second.offset,
                second.iova
            ),
            "map each hugepage separately, or use 1 GiB hugepages (one page per region)",
        ));
    }
    Ok(runs[0].iova)
}

/// The physically contiguous pieces of `[vaddr, vaddr+len)` and their bus (physical)
/// addresses, split per hugepage where the pages are scattered. `smaps` is this process's
/// `/proc/self/smaps`; `phys` turns a (page-aligned) virtual address into its physical one.
/// Refused: memory that is not mapped, spans mappings, or is not hugetlb memory (the kernel may
/// move ordinary pages while a device DMAs to them).
pub fn dma_segments_in(
    smaps: &str,
    vaddr: usize,
    len: usize,
    phys: impl FnMut(usize) -> Result<u64, String>,
) -> Result<Vec<DmaSegment>, CoreError> {
    let end = vaddr.checked_add(len).filter(|_| len > 0).ok_or_else(|| {
        refuse(
            format!("{len} bytes at {vaddr:#x} is not a memory range"),
            "map a non-empty range",
        )
    })?;
    let vma = vma_of(smaps, vaddr).ok_or_else(|| {
        refuse(
            format!("{vaddr:#x} is not mapped in this process"),
            "map hugepage memory the process owns (a hugepage pool or region)",
        )
    })?;
    if end > vma.range.end {
        return Err(refuse(
            format!(
                "[{vaddr:#x}, {end:#x}) runs past its mapping [{:#x}, {:#x})",
                vma.range.start, vma.range.end
            ),
            "map each mapping separately",
        ));
    }
    if vma.page_size <= SMALL_PAGE {
        return Err(refuse(
            format!(
                "[{vaddr:#x}, {end:#x}) is ordinary memory of {} KiB pages ({}): the kernel may move such pages (migration, compaction, swap) while a device writes to their old physical address",
                vma.page_size / 1024,
                if vma.name.is_empty() { "anonymous" } else { vma.name.as_str() }
            ),
            "without an IOMMU, give devices hugepage memory only (a hugepage pool or region; reserve hugepages with scripts/setup.sh config)",
        ));
    }
    contiguous_runs(vaddr, len, vma.page_size as usize, phys).map_err(|(at, e)| {
        refuse(
            format!("no physical address for {at:#x}: {e}"),
            "run as root (pagemap hides frame numbers without CAP_SYS_ADMIN) and touch the memory first",
        )
    })
}

/// [`dma_segments_in`] for this process (`/proc/self/smaps` and `/proc/self/pagemap`).
pub fn dma_segments(vaddr: usize, len: usize) -> Result<Vec<DmaSegment>, CoreError> {
    dma_segments_in(&smaps()?, vaddr, len, pagemap_phys)
}

fn smaps() -> Result<String, CoreError> {
    std::fs::read_to_string("/proc/self/smaps").map_err(|e| {
        refuse(
            format!("reading /proc/self/smaps: {e}"),
            "run on Linux with /proc mounted",
        )
    })
}

fn pagemap_phys(a: usize) -> Result<u64, String> {
    ubdirect_hugepages::virt_to_phys(a as *const u8).map_err(|e| e.to_string())
}

/// [`dma_address_in`] for this process (`/proc/self/smaps` and `/proc/self/pagemap`).
pub fn dma_address(vaddr: usize, len: usize) -> Result<u64, CoreError> {
    dma_address_in(&smaps()?, vaddr, len, pagemap_phys)
}

/// The refusal of device memory (a BAR, a dma-buf or another file) on the no-IOMMU back end;
/// `what` names it ("BAR 2 of 0000:00:05.0").
pub fn device_memory_refusal(what: &str) -> CoreError {
    refuse(
        format!("{what} cannot be registered: without an IOMMU there is no address translation to give a peer device a safe bus address for device memory or files"),
        "turn the IOMMU on (intel_iommu=on / amd_iommu=on) and use the type1 or iommufd back end for BAR and dma-buf regions",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const HUGE: &str = "\
7f0000000000-7f0000600000 rw-s 00000000 00:0f 1234                       /memfd:ubd (deleted)
Size:               6144 kB
KernelPageSize:     2048 kB
MMUPageSize:        2048 kB
7f0000600000-7f0000700000 rw-p 00000000 00:00 0 
Size:               1024 kB
KernelPageSize:        4 kB
MMUPageSize:           4 kB
";
    const H: usize = 0x7f00_0000_0000;
    const MB2: usize = 2 << 20;

    /// A fake pagemap: hugepage i of the first mapping at `frames[i]`.
    fn fake(frames: &'static [u64]) -> impl FnMut(usize) -> Result<u64, String> {
        move |a| {
            assert_eq!(a % MB2, 0, "asked for an unaligned page {a:#x}");
            frames
                .get((a - H) / MB2)
                .copied()
                .ok_or_else(|| "not present".to_string())
        }
    }

    #[test]
    fn a_hugepage_range_maps_to_its_physical_address() {
        let frames: &[u64] = &[0x1_0000_0000, 0x1_0020_0000, 0x5000_0000];
        let a = dma_address_in(HUGE, H + 0x1234, MB2, fake(frames)).unwrap();
        assert_eq!(a, 0x1_0000_1234);
        // One whole page elsewhere.
        assert_eq!(
            dma_address_in(HUGE, H + 2 * MB2, MB2, fake(frames)).unwrap(),
            0x5000_0000
        );
    }

    #[test]
    fn hugepages_not_physically_contiguous_are_refused() {
        let frames: &[u64] = &[0x1_0000_0000, 0x1_0020_0000, 0x5000_0000];
        let e = dma_address_in(HUGE, H, 3 * MB2, fake(frames)).unwrap_err();
        let m = e.to_string();
        assert!(m.starts_with("DMA back end noiommu:"), "{m}");
        assert!(m.contains("not physically contiguous"), "{m}");
        assert!(m.contains("physical 0x50000000, not 0x100400000"), "{m}");
        assert!(m.contains("map each hugepage separately"), "{m}");
    }

    #[test]
    fn scattered_hugepages_are_split_into_per_run_segments() {
        let frames: &[u64] = &[0x1_0000_0000, 0x1_0020_0000, 0x5000_0000];
        let r = dma_segments_in(HUGE, H + 0x1000, 3 * MB2 - 0x1000, fake(frames)).unwrap();
        assert_eq!(
            r,
            vec![
                DmaSegment {
                    offset: 0,
                    len: 2 * MB2 - 0x1000,
                    iova: 0x1_0000_1000
                },
                DmaSegment {
                    offset: 2 * MB2 - 0x1000,
                    len: MB2,
                    iova: 0x5000_0000
                },
            ]
        );
        // The single-range question still refuses them.
        assert!(dma_address_in(HUGE, H, 3 * MB2, fake(frames)).is_err());
        // Ordinary memory is refused whatever the split.
        let m = dma_segments_in(HUGE, H + 3 * MB2, 4096, |_| Ok(0))
            .unwrap_err()
            .to_string();
        assert!(m.contains("ordinary memory"), "{m}");
    }

    #[test]
    fn ordinary_memory_is_refused_because_pages_move() {
        let e = dma_address_in(HUGE, H + 3 * MB2, 4096, |_| Ok(0x1000)).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("ordinary memory of 4 KiB pages (anonymous)"),
            "{m}"
        );
        assert!(m.contains("hugepage memory only"), "{m}");
    }

    #[test]
    fn unmapped_spanning_and_empty_ranges_are_refused() {
        let m = dma_address_in(HUGE, 0x1000, 4096, fake(&[]))
            .unwrap_err()
            .to_string();
        assert!(m.contains("0x1000 is not mapped"), "{m}");
        let m = dma_address_in(HUGE, H + 2 * MB2, 2 * MB2, fake(&[0, 0, 0]))
            .unwrap_err()
            .to_string();
        assert!(m.contains("runs past its mapping"), "{m}");
        let m = dma_address_in(HUGE, H, 0, fake(&[]))
            .unwrap_err()
            .to_string();
        assert!(m.contains("is not a memory range"), "{m}");
    }

    #[test]
    fn a_hidden_frame_number_names_the_capability() {
        let e = dma_address_in(HUGE, H, MB2, |_| Err("pfn hidden".into())).unwrap_err();
        assert!(e.to_string().contains("CAP_SYS_ADMIN"), "{e}");
    }

    #[test]
    fn the_operator_opt_in_is_read_from_the_vfio_parameter() {
        let d = tempfile::tempdir().unwrap();
        let m = operator_opt_in(d.path()).unwrap_err().to_string();
        assert!(m.contains("CONFIG_VFIO_NOIOMMU"), "{m}");
        let p = d.path().join(UNSAFE_MODE_PARAM);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "N\n").unwrap();
        let m = operator_opt_in(d.path()).unwrap_err().to_string();
        assert!(m.contains("is \"N\""), "{m}");
        assert!(
            m.contains("UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config"),
            "{m}"
        );
        std::fs::write(&p, "Y\n").unwrap();
        operator_opt_in(d.path()).unwrap();
    }

    #[test]
    fn device_memory_is_refused_naming_it() {
        let m = device_memory_refusal("BAR 2 of 0000:00:05.0").to_string();
        assert!(
            m.contains("BAR 2 of 0000:00:05.0 cannot be registered"),
            "{m}"
        );
        assert!(m.contains("iommufd"), "{m}");
    }

    #[test]
    fn this_process_heap_memory_is_refused() {
        // Ordinary heap memory: refused whatever the privileges.
        let v = vec![1u8; 8192];
        let e = dma_address(v.as_ptr() as usize, 4096).unwrap_err();
        assert!(e.to_string().contains("ordinary memory"), "{e}");
    }
}
