//! The iommufd back end: one IOAS on `/dev/iommu`, devices bound and attached through their
//! vfio cdev (vfio-ioctls' `vfio_cdev` feature), memory mapped by VA (`IOMMU_IOAS_MAP`) or by
//! file (`IOMMU_IOAS_MAP_FILE`: memfd, dma-buf) with rust-vmm's `iommufd-ioctls`.
//! `IOMMU_IOAS_IOVA_RANGES` is not wrapped by that crate: it is issued here with the
//! `iommufd-bindings` structs.

use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use iommufd_bindings::{
    iommu_ioas_iova_ranges, iommu_ioas_map, iommu_iova_range,
    iommufd_ioas_map_flags_IOMMU_IOAS_MAP_FIXED_IOVA as MAP_FIXED_IOVA,
    iommufd_ioas_map_flags_IOMMU_IOAS_MAP_READABLE as MAP_READABLE, IOMMUFD_CMD_IOAS_IOVA_RANGES,
    IOMMUFD_TYPE,
};
use iommufd_ioctls::{IommuFd, IommufdError};
use vfio_ioctls::{VfioError, VfioIommufd};

use super::iommu_info::IommuInfo;
use crate::error::{CoreError, Result};

/// `_IO(IOMMUFD_TYPE, IOMMUFD_CMD_IOAS_IOVA_RANGES)`.
const IOMMU_IOAS_IOVA_RANGES: libc::c_ulong =
    ((IOMMUFD_TYPE as libc::c_ulong) << 8) | IOMMUFD_CMD_IOAS_IOVA_RANGES as libc::c_ulong;

/// Open `/dev/iommu` and allocate an IOAS. Errors say which kernel option or permission is
/// missing.
pub(crate) fn open() -> Result<Arc<VfioIommufd>> {
    let fd = IommuFd::new().map_err(|e| match e {
        // The same variant as a refused /dev/vfio/<group> or device cdev: callers match on it.
        IommufdError::OpenIommufd(io) if io.kind() == std::io::ErrorKind::PermissionDenied => {
            CoreError::PermissionDenied {
                path: "/dev/iommu".into(),
                user: super::domain::current_user(),
            }
        }
        IommufdError::OpenIommufd(io) => {
            let (reason, fix) = match io.kind() {
                std::io::ErrorKind::NotFound => (
                    "/dev/iommu does not exist".to_string(),
                    "boot a kernel with CONFIG_IOMMUFD (and CONFIG_VFIO_DEVICE_CDEV), `modprobe iommufd`, or use UBD_IOMMU_BACKEND=type1".to_string(),
                ),
                _ => (format!("opening /dev/iommu: {io}"), "use UBD_IOMMU_BACKEND=type1".to_string()),
            };
            CoreError::Backend { backend: "iommufd", reason, fix }
        }
        other => CoreError::Backend {
            backend: "iommufd",
            reason: other.to_string(),
            fix: "use UBD_IOMMU_BACKEND=type1".into(),
        },
    })?;
    VfioIommufd::new(Arc::new(fd), None, None)
        .map(Arc::new)
        .map_err(|e| CoreError::Backend {
            backend: "iommufd",
            reason: format!("allocating an IOAS: {e}"),
            fix: "use UBD_IOMMU_BACKEND=type1".into(),
        })
}

/// Map `[vaddr, vaddr+len)` at `iova` with READ permission only.
///
/// # Safety
/// The memory must stay mapped until the range is unmapped from the IOAS.
pub(crate) unsafe fn map_readonly(
    ops: &VfioIommufd,
    iova: u64,
    len: usize,
    vaddr: *mut u8,
) -> std::result::Result<(), i32> {
    let map = iommu_ioas_map {
        size: std::mem::size_of::<iommu_ioas_map>() as u32,
        flags: MAP_READABLE | MAP_FIXED_IOVA,
        ioas_id: ops.ioas().id(),
        __reserved: 0,
        user_va: vaddr as u64,
        length: len as u64,
        iova,
    };
    ops.iommufd().map_iommu_ioas(&map).map_err(errno)
}

/// The errno inside an iommufd or vfio-ioctls error (EIO when it carries none).
pub(crate) fn errno(e: IommufdError) -> i32 {
    match e {
        IommufdError::IommuIoasMap(s)
        | IommufdError::IommuIoasMapFile(s)
        | IommufdError::IommuIoasUnmap(s) => s.errno(),
        _ => libc::EIO,
    }
}

/// [`errno`] for a vfio-ioctls error wrapping an iommufd one.
pub(crate) fn vfio_errno(e: VfioError) -> i32 {
    match e {
        VfioError::IommufdIoctlError(i) => errno(i),
        VfioError::InvalidDmaUnmapSize => libc::EINVAL,
        _ => libc::EIO,
    }
}

/// The IOAS's usable IOVA ranges and its minimum IOVA alignment (as [`IommuInfo`]: the
/// alignment is the only page size iommufd reports).
pub(crate) fn query_info(ops: &VfioIommufd) -> Result<IommuInfo> {
    let (ranges, align) = iova_ranges(ops.iommufd().as_raw_fd(), ops.ioas().id())?;
    let align = align.max(1).next_power_of_two().max(4096);
    Ok(IommuInfo {
        page_sizes: align,
        iova_ranges: ranges,
    })
}

/// `IOMMU_IOAS_IOVA_RANGES`: the allowed ranges (half-open) and `out_iova_alignment`.
fn iova_ranges(fd: RawFd, ioas_id: u32) -> Result<(Vec<Range<u64>>, u64)> {
    let mut cap = 8usize;
    for _ in 0..4 {
        let mut out = vec![iommu_iova_range::default(); cap];
        let mut q = iommu_ioas_iova_ranges {
            size: std::mem::size_of::<iommu_ioas_iova_ranges>() as u32,
            ioas_id,
            num_iovas: cap as u32,
            __reserved: 0,
            allowed_iovas: out.as_mut_ptr() as u64,
            out_iova_alignment: 0,
        };
        // SAFETY: q is a valid iommu_ioas_iova_ranges; the kernel writes at most num_iovas
        // entries into `out`, which has that many.
        let rc = unsafe { libc::ioctl(fd, IOMMU_IOAS_IOVA_RANGES, &mut q) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EMSGSIZE) && (q.num_iovas as usize) <= 4096 {
                cap = (q.num_iovas as usize).max(cap + 1);
                continue;
            }
            return Err(CoreError::Io {
                op: format!("IOMMU_IOAS_IOVA_RANGES on IOAS {ioas_id}"),
                source: err,
            });
        }
        let n = (q.num_iovas as usize).min(cap);
        let ranges = out[..n]
            .iter()
            .filter(|r| r.last >= r.start)
            .map(|r| r.start..r.last.saturating_add(1))
            .collect();
        return Ok((ranges, q.out_iova_alignment));
    }
    Err(CoreError::Backend {
        backend: "iommufd",
        reason: format!("IOMMU_IOAS_IOVA_RANGES on IOAS {ioas_id} keeps asking for more room"),
        fix: "use UBD_IOMMU_BACKEND=type1".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_number_matches_the_uapi() {
        // include/uapi/linux/iommufd.h: IOMMUFD_TYPE ';' (0x3b), IOMMUFD_CMD_IOAS_IOVA_RANGES
        // 0x84: _IO(0x3b, 0x84).
        assert_eq!(IOMMU_IOAS_IOVA_RANGES, 0x3b84);
    }

    #[test]
    fn errno_is_taken_from_map_errors() {
        let e = IommufdError::IommuIoasMap(vmm_sys_util::errno::Error::new(libc::ENOMEM));
        assert_eq!(errno(e), libc::ENOMEM);
        let e = VfioError::IommufdIoctlError(IommufdError::IommuIoasUnmap(
            vmm_sys_util::errno::Error::new(libc::ENOENT),
        ));
        assert_eq!(vfio_errno(e), libc::ENOENT);
    }
}
