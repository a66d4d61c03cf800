//! Virtual to physical address translation through `/proc/self/pagemap` (for no-IOMMU setups
//! and diagnostics only: with an IOMMU devices see IOVAs, never physical addresses).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use crate::HugeError;

const PAGEMAP: &str = "/proc/self/pagemap";
const PRESENT: u64 = 1 << 63;
const PFN_MASK: u64 = (1 << 55) - 1;

/// The physical address behind `ptr` in this process. The page must be present (touch it
/// first); reading frame numbers needs CAP_SYS_ADMIN.
pub fn virt_to_phys(ptr: *const u8) -> Result<u64, HugeError> {
    let addr = ptr as usize;
    let page = page_size();
    let f = File::open(PAGEMAP).map_err(|source| HugeError::Io {
        op: "open",
        path: PathBuf::from(PAGEMAP),
        source,
    })?;
    let mut entry = [0u8; 8];
    f.read_exact_at(&mut entry, (addr / page) as u64 * 8)
        .map_err(|source| HugeError::Io {
            op: "read",
            path: PathBuf::from(PAGEMAP),
            source,
        })?;
    decode(u64::from_ne_bytes(entry), addr, page)
}

/// Turn one pagemap entry into a physical address.
fn decode(entry: u64, addr: usize, page: usize) -> Result<u64, HugeError> {
    if entry & PRESENT == 0 {
        return Err(HugeError::NoPhysAddr {
            addr,
            reason: "page not present (touch or populate it first)",
        });
    }
    let pfn = entry & PFN_MASK;
    if pfn == 0 {
        return Err(HugeError::NoPhysAddr {
            addr,
            reason: "the kernel hides frame numbers without CAP_SYS_ADMIN (run as root)",
        });
    }
    Ok(pfn * page as u64 + (addr % page) as u64)
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_entries() {
        assert_eq!(
            decode(PRESENT | 0x1234, 0x5678, 4096).unwrap(),
            0x1234 * 4096 + 0x678
        );
        assert!(matches!(
            decode(0x1234, 0, 4096),
            Err(HugeError::NoPhysAddr { reason, .. }) if reason.contains("not present")
        ));
        assert!(matches!(
            decode(PRESENT, 0, 4096),
            Err(HugeError::NoPhysAddr { reason, .. }) if reason.contains("CAP_SYS_ADMIN")
        ));
    }

    #[test]
    fn own_stack_page_translates_or_names_permission() {
        let x = [7u8; 64];
        match virt_to_phys(x.as_ptr()) {
            Ok(pa) => assert_eq!(pa % 4096, x.as_ptr() as u64 % 4096),
            Err(HugeError::NoPhysAddr { reason, .. }) => assert!(reason.contains("CAP_SYS_ADMIN")),
            Err(e) => panic!("unexpected {e}"),
        }
    }
}
