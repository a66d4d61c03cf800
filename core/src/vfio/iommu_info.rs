//! VFIO_IOMMU_GET_INFO with its capability chain (valid IOVA ranges), which vfio-ioctls does
//! not wrap: the ioctl is issued here with vfio-bindings structs.

use std::ops::Range;
use std::os::fd::RawFd;

use vfio_bindings::bindings::vfio::{
    vfio_info_cap_header, vfio_iommu_type1_info, VFIO_IOMMU_INFO_CAPS, VFIO_IOMMU_INFO_PGSIZES,
    VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE,
};

use crate::error::{CoreError, Result};

/// `_IO(VFIO_TYPE, VFIO_BASE + 12)`.
const VFIO_IOMMU_GET_INFO: libc::c_ulong = (59 << 8) | (100 + 12);

/// What the IOMMU behind a domain accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IommuInfo {
    /// Bitmap of supported IOMMU page sizes (bit n set: 2^n bytes).
    pub page_sizes: u64,
    /// Valid IOVA ranges, half-open.
    pub iova_ranges: Vec<Range<u64>>,
}

impl IommuInfo {
    /// The smallest supported IOMMU page size.
    pub fn min_page(&self) -> u64 {
        1u64 << self.page_sizes.trailing_zeros().min(63)
    }

    /// Query a type1 container (a group must already be attached).
    pub(crate) fn query(container_fd: RawFd) -> Result<IommuInfo> {
        let hdr = std::mem::size_of::<vfio_iommu_type1_info>();
        let mut buf: Vec<u64> = vec![0; hdr.div_ceil(8)];
        // The kernel says how much room the capability chain needs; a second call fits it.
        for attempt in 0.. {
            let argsz = (buf.len() * 8) as u32;
            let info = buf.as_mut_ptr().cast::<vfio_iommu_type1_info>();
            // SAFETY: buf is at least sizeof(vfio_iommu_type1_info) bytes and 8-byte aligned.
            unsafe { (*info).argsz = argsz };
            // SAFETY: the kernel writes at most argsz bytes into buf, which has argsz bytes.
            let rc = unsafe { libc::ioctl(container_fd, VFIO_IOMMU_GET_INFO, info) };
            if rc != 0 {
                return Err(CoreError::last_os("VFIO_IOMMU_GET_INFO"));
            }
            // SAFETY: the kernel filled the header.
            let want = unsafe { (*info).argsz } as usize;
            if want <= buf.len() * 8 {
                break;
            }
            if attempt >= 3 || want > 1 << 20 {
                return Err(CoreError::VfioUnavailable {
                    reason: format!(
                        "VFIO_IOMMU_GET_INFO keeps asking for more room ({want} bytes)"
                    ),
                });
            }
            buf = vec![0; want.div_ceil(8)];
        }
        // SAFETY: viewing the u64 buffer as bytes; length is exact.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len() * 8) };
        parse(bytes)
    }
}

/// Parse a filled `vfio_iommu_type1_info` with its capability chain. Every offset is checked.
pub(crate) fn parse(b: &[u8]) -> Result<IommuInfo> {
    let bad = |why: &str| CoreError::VfioUnavailable {
        reason: format!("malformed VFIO_IOMMU_GET_INFO reply: {why}"),
    };
    let u32_at =
        |o: usize| -> Option<u32> { Some(u32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?)) };
    let u64_at =
        |o: usize| -> Option<u64> { Some(u64::from_ne_bytes(b.get(o..o + 8)?.try_into().ok()?)) };
    let hdr = std::mem::size_of::<vfio_iommu_type1_info>();
    let flags = u32_at(4).ok_or_else(|| bad("short header"))?;
    let page_sizes = if flags & VFIO_IOMMU_INFO_PGSIZES != 0 {
        u64_at(8).ok_or_else(|| bad("short header"))?
    } else {
        4096
    };
    if page_sizes == 0 {
        return Err(bad("empty page-size bitmap"));
    }
    let mut iova_ranges = Vec::new();
    let mut found = false;
    if flags & VFIO_IOMMU_INFO_CAPS != 0 {
        let mut off = u32_at(16).ok_or_else(|| bad("short header"))? as usize;
        let cap_hdr = std::mem::size_of::<vfio_info_cap_header>();
        let mut hops = 0;
        while off >= hdr && hops < 64 {
            hops += 1;
            let id = u32_at(off).ok_or_else(|| bad("capability past the end"))? & 0xffff;
            let next = u32_at(off + 4).ok_or_else(|| bad("capability past the end"))? as usize;
            if id == VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE {
                let n = u32_at(off + cap_hdr).ok_or_else(|| bad("short IOVA range capability"))?;
                for i in 0..n as usize {
                    let at = off + cap_hdr + 8 + i * 16;
                    let (Some(s), Some(e)) = (u64_at(at), u64_at(at + 8)) else {
                        return Err(bad("IOVA range list past the end"));
                    };
                    if e >= s {
                        iova_ranges.push(s..e.saturating_add(1));
                    }
                }
                found = true;
            }
            if next <= off {
                break;
            }
            off = next;
        }
    }
    if !found {
        // Old kernels without the capability: the whole 48-bit space.
        iova_ranges.push(0..(1u64 << 48));
    }
    Ok(IommuInfo {
        page_sizes,
        iova_ranges,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(ranges: &[(u64, u64)]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&0u32.to_ne_bytes()); // argsz (filled later)
        b.extend_from_slice(&(VFIO_IOMMU_INFO_PGSIZES | VFIO_IOMMU_INFO_CAPS).to_ne_bytes());
        b.extend_from_slice(&0x4020_1000u64.to_ne_bytes());
        b.extend_from_slice(&24u32.to_ne_bytes()); // cap_offset
        b.extend_from_slice(&0u32.to_ne_bytes());
        // A migration capability first, then the IOVA ranges.
        b.extend_from_slice(&2u16.to_ne_bytes());
        b.extend_from_slice(&1u16.to_ne_bytes());
        b.extend_from_slice(&48u32.to_ne_bytes()); // next
        b.extend_from_slice(&[0u8; 16]);
        b.extend_from_slice(&(VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE as u16).to_ne_bytes());
        b.extend_from_slice(&1u16.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes()); // last
        b.extend_from_slice(&(ranges.len() as u32).to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        for &(s, e) in ranges {
            b.extend_from_slice(&s.to_ne_bytes());
            b.extend_from_slice(&e.to_ne_bytes());
        }
        let n = b.len() as u32;
        b[0..4].copy_from_slice(&n.to_ne_bytes());
        b
    }

    #[test]
    fn parses_the_guest_reply() {
        let info = parse(&reply(&[(0, 0xfedf_ffff), (0xfef0_0000, (1 << 48) - 1)])).unwrap();
        assert_eq!(info.page_sizes, 0x4020_1000);
        assert_eq!(info.min_page(), 4096);
        assert_eq!(
            info.iova_ranges,
            vec![0..0xfee0_0000, 0xfef0_0000..(1 << 48)]
        );
    }

    #[test]
    fn truncated_reply_is_an_error_not_a_panic() {
        let full = reply(&[(0, 0xffff), (0x20000, 0x2ffff)]);
        for cut in 0..full.len() {
            let r = parse(&full[..cut]);
            if let Err(e) = r {
                assert!(
                    e.to_string().contains("malformed VFIO_IOMMU_GET_INFO"),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn no_capability_means_whole_space() {
        let mut b = reply(&[]);
        b[4..8].copy_from_slice(&VFIO_IOMMU_INFO_PGSIZES.to_ne_bytes());
        let info = parse(&b).unwrap();
        assert_eq!(info.iova_ranges, vec![0..(1u64 << 48)]);
    }
}
