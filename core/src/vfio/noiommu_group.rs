//! The no-IOMMU back end's device open: a VFIO container set to `VFIO_NOIOMMU_IOMMU`, the
//! device's no-IOMMU group (`/dev/vfio/noiommu-<group>`) and its device fd, and the DMA
//! addresses of memory (its physical addresses, [`super::noiommu::dma_address`]).
//!
//! Hand-written with vfio-bindings structs and raw ioctls: vfio-ioctls 0.10 opens only
//! `/dev/vfio/<group>` groups with type1v2 (`VfioContainer`), and its `VfioDevice` can only be
//! built through that container or an iommufd, so the no-IOMMU device is its own small type
//! ([`NoIommuDevice`]: region table, config space/BAR access through the fd, reset, the
//! request IRQ) that [`crate::pci::PciDevice`] drives like a `VfioDevice`.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use vfio_bindings::bindings::vfio::{
    vfio_device_info, vfio_group_status, vfio_irq_info, vfio_irq_set, vfio_region_info,
    VFIO_API_VERSION, VFIO_GROUP_FLAGS_VIABLE, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_NOIOMMU_IOMMU,
};

use super::domain::current_user;
use super::preflight::group_members_in;
use super::segments::DmaSegment;
use crate::error::{CoreError, Result};
use crate::pci::PciAddress;

/// `_IO(VFIO_TYPE, VFIO_BASE + n)` (VFIO_TYPE ';', VFIO_BASE 100).
const fn vfio_io(n: libc::c_ulong) -> libc::c_ulong {
    (59 << 8) | (100 + n)
}
const VFIO_GET_API_VERSION: libc::c_ulong = vfio_io(0);
const VFIO_CHECK_EXTENSION: libc::c_ulong = vfio_io(1);
const VFIO_SET_IOMMU: libc::c_ulong = vfio_io(2);
const VFIO_GROUP_GET_STATUS: libc::c_ulong = vfio_io(3);
const VFIO_GROUP_SET_CONTAINER: libc::c_ulong = vfio_io(4);
const VFIO_GROUP_GET_DEVICE_FD: libc::c_ulong = vfio_io(6);
const VFIO_DEVICE_GET_INFO: libc::c_ulong = vfio_io(7);
const VFIO_DEVICE_GET_REGION_INFO: libc::c_ulong = vfio_io(8);
const VFIO_DEVICE_GET_IRQ_INFO: libc::c_ulong = vfio_io(9);
const VFIO_DEVICE_SET_IRQS: libc::c_ulong = vfio_io(10);

/// The fix for the capability the kernel asks of no-IOMMU users.
const RAWIO_FIX: &str = "run as root: vfio's no-IOMMU groups need CAP_SYS_RAWIO (and /proc/self/pagemap needs CAP_SYS_ADMIN for the physical addresses)";

fn refuse(reason: String, fix: &str) -> CoreError {
    CoreError::Backend {
        backend: "noiommu",
        reason,
        fix: fix.into(),
    }
}

/// The no-IOMMU group node of IOMMU group `group`.
pub(crate) fn group_node(group: u32) -> PathBuf {
    PathBuf::from(format!("/dev/vfio/noiommu-{group}"))
}

/// A VFIO container whose "IOMMU" is `VFIO_NOIOMMU_IOMMU`: no translation; devices see
/// physical addresses. Groups join it as their first device opens and leave with their last.
pub(crate) struct NoIommuContainer {
    fd: File,
    state: Mutex<Groups>,
}

#[derive(Default)]
struct Groups {
    /// group -> (its open node, devices open through it).
    open: BTreeMap<u32, (File, usize)>,
    /// VFIO_SET_IOMMU done (it needs a group in the container, and is undone by the kernel
    /// when the last group leaves).
    iommu_set: bool,
}

impl std::fmt::Debug for NoIommuContainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoIommuContainer")
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}

/// `ioctl(fd, req, arg)` as a Result carrying errno.
fn ioctl_ptr<T>(fd: RawFd, req: libc::c_ulong, arg: *mut T) -> std::io::Result<i32> {
    // SAFETY: every caller passes a request whose argument is `T`, sized by its argsz field
    // (or a NUL-terminated string), valid for the kernel to read and write.
    let rc = unsafe { libc::ioctl(fd, req, arg) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// `ioctl(fd, req, value)` for the requests that take an integer.
fn ioctl_val(fd: RawFd, req: libc::c_ulong, val: libc::c_ulong) -> std::io::Result<i32> {
    // SAFETY: the request takes its argument by value; no memory is passed.
    let rc = unsafe { libc::ioctl(fd, req, val) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl NoIommuContainer {
    /// Open `/dev/vfio/vfio` and check it offers `VFIO_NOIOMMU_IOMMU`.
    pub(crate) fn open() -> Result<Arc<NoIommuContainer>> {
        let path = "/dev/vfio/vfio";
        let fd = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::PermissionDenied => CoreError::PermissionDenied {
                    path: path.into(),
                    user: current_user(),
                },
                _ => CoreError::VfioUnavailable {
                    reason: format!("opening {path}: {e}"),
                },
            })?;
        let raw = fd.as_raw_fd();
        let v = ioctl_val(raw, VFIO_GET_API_VERSION, 0).map_err(|e| CoreError::Io {
            op: "VFIO_GET_API_VERSION".into(),
            source: e,
        })?;
        if v != VFIO_API_VERSION as i32 {
            return Err(CoreError::VfioUnavailable {
                reason: format!("VFIO API version {v}, expected {VFIO_API_VERSION}"),
            });
        }
        let has = ioctl_val(raw, VFIO_CHECK_EXTENSION, VFIO_NOIOMMU_IOMMU.into()).unwrap_or(0);
        if has <= 0 {
            return Err(refuse(
                "the VFIO container does not offer VFIO_NOIOMMU_IOMMU: vfio's unsafe no-IOMMU mode is off, or the kernel lacks CONFIG_VFIO_NOIOMMU".into(),
                "run `UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config` as root on a kernel with CONFIG_VFIO_NOIOMMU, or turn the IOMMU on and use type1/iommufd",
            ));
        }
        Ok(Arc::new(NoIommuContainer {
            fd,
            state: Mutex::new(Groups::default()),
        }))
    }

    /// Open `addr` (in no-IOMMU group `group`): the group joins the container on first use,
    /// the container's IOMMU becomes `VFIO_NOIOMMU_IOMMU`, then `VFIO_GROUP_GET_DEVICE_FD`.
    pub(crate) fn open_device(
        self: &Arc<Self>,
        addr: PciAddress,
        group: u32,
    ) -> Result<NoIommuDevice> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.open.contains_key(&group) {
            let g = self.join(addr, group, &mut st)?;
            st.open.insert(group, (g, 0));
        }
        let gfd = st
            .open
            .get(&group)
            .map(|(f, _)| f.as_raw_fd())
            .unwrap_or(-1);
        let name = std::ffi::CString::new(addr.to_string()).map_err(|_| {
            CoreError::InvalidArgument(format!("PCI address {addr} holds a NUL byte"))
        })?;
        let dev = match ioctl_ptr(gfd, VFIO_GROUP_GET_DEVICE_FD, name.as_ptr().cast_mut()) {
            Ok(fd) => {
                // SAFETY: the kernel returned a fresh fd that nothing else owns.
                unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) }
            }
            Err(e) => {
                Self::leave_if_unused(&mut st, group);
                return Err(match e.raw_os_error() {
                    Some(libc::EBUSY) => refuse(
                        format!("{addr} is already open (in this or another process)"),
                        "close the other user of the device first",
                    ),
                    Some(libc::EPERM) => refuse(
                        format!("VFIO_GROUP_GET_DEVICE_FD of {addr}: {e}"),
                        RAWIO_FIX,
                    ),
                    _ => CoreError::Io {
                        op: format!(
                            "VFIO_GROUP_GET_DEVICE_FD of {addr} in {}",
                            group_node(group).display()
                        ),
                        source: e,
                    },
                });
            }
        };
        if let Some((_, n)) = st.open.get_mut(&group) {
            *n += 1;
        }
        drop(st);
        // From here the device's Drop releases the group on every error path.
        NoIommuDevice::new(dev, addr, group, self.clone())
    }

    /// Open the group node, check it is viable, put it in the container and (first group)
    /// set the container's IOMMU type.
    fn join(&self, addr: PciAddress, group: u32, st: &mut Groups) -> Result<File> {
        let node = group_node(group);
        let g = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&node)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EACCES) => CoreError::PermissionDenied {
                    path: node.clone(),
                    user: current_user(),
                },
                Some(libc::EPERM) => refuse(format!("opening {}: {e}", node.display()), RAWIO_FIX),
                Some(libc::EBUSY) => CoreError::GroupBusy { addr, group },
                Some(libc::ENOENT) => refuse(
                    format!("{} does not exist: IOMMU group {group} of {addr} is not a vfio no-IOMMU group (the IOMMU is on, or vfio's no-IOMMU mode was off when the device was bound)", node.display()),
                    "with the IOMMU on, use the type1 or iommufd back end (unset UBD_IOMMU_BACKEND); else rebind with `UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config`",
                ),
                _ => CoreError::Io {
                    op: format!("opening {}", node.display()),
                    source: e,
                },
            })?;
        let mut status = vfio_group_status {
            argsz: std::mem::size_of::<vfio_group_status>() as u32,
            flags: 0,
        };
        ioctl_ptr(g.as_raw_fd(), VFIO_GROUP_GET_STATUS, &mut status).map_err(|e| {
            CoreError::Io {
                op: format!("VFIO_GROUP_GET_STATUS on {}", node.display()),
                source: e,
            }
        })?;
        if status.flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(CoreError::GroupNotViable {
                addr,
                group,
                others: group_members_in(std::path::Path::new("/"), group, addr),
            });
        }
        let mut cfd = self.fd.as_raw_fd();
        ioctl_ptr(g.as_raw_fd(), VFIO_GROUP_SET_CONTAINER, &mut cfd)
            .map_err(|_| CoreError::GroupBusy { addr, group })?;
        if !st.iommu_set || st.open.is_empty() {
            ioctl_val(self.fd.as_raw_fd(), VFIO_SET_IOMMU, VFIO_NOIOMMU_IOMMU.into()).map_err(
                |e| match e.raw_os_error() {
                    Some(libc::EPERM) => refuse(format!("VFIO_SET_IOMMU(VFIO_NOIOMMU_IOMMU): {e}"), RAWIO_FIX),
                    _ => refuse(
                        format!("VFIO_SET_IOMMU(VFIO_NOIOMMU_IOMMU) on the container: {e}"),
                        "check vfio's no-IOMMU mode is on (`UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config`)",
                    ),
                },
            )?;
            st.iommu_set = true;
        }
        Ok(g)
    }

    /// Close `group`'s node when no device uses it (it leaves the container).
    fn leave_if_unused(st: &mut Groups, group: u32) {
        if st.open.get(&group).is_some_and(|(_, n)| *n == 0) {
            st.open.remove(&group);
        }
        if st.open.is_empty() {
            st.iommu_set = false;
        }
    }

    /// A device of `group` closed.
    fn device_closed(&self, group: u32) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, n)) = st.open.get_mut(&group) {
            *n = n.saturating_sub(1);
        }
        Self::leave_if_unused(&mut st, group);
    }
}

/// A device opened through its no-IOMMU group: the region table and the fd that config space,
/// BAR mmaps, reset and IRQ setup go through. Closing it (drop) releases its group.
pub(crate) struct NoIommuDevice {
    file: Option<File>,
    flags: u32,
    regions: Vec<vfio_region_info>,
    group: u32,
    container: Arc<NoIommuContainer>,
}

impl NoIommuDevice {
    fn new(
        file: File,
        addr: PciAddress,
        group: u32,
        container: Arc<NoIommuContainer>,
    ) -> Result<NoIommuDevice> {
        let mut d = NoIommuDevice {
            file: Some(file),
            flags: 0,
            regions: Vec::new(),
            group,
            container,
        };
        let fd = d.as_raw_fd();
        let mut info = vfio_device_info {
            argsz: std::mem::size_of::<vfio_device_info>() as u32,
            ..Default::default()
        };
        ioctl_ptr(fd, VFIO_DEVICE_GET_INFO, &mut info).map_err(|e| CoreError::Io {
            op: format!("VFIO_DEVICE_GET_INFO on {addr}"),
            source: e,
        })?;
        d.flags = info.flags;
        for index in 0..info.num_regions {
            let mut r = vfio_region_info {
                argsz: std::mem::size_of::<vfio_region_info>() as u32,
                index,
                ..Default::default()
            };
            // A region the kernel will not describe reads as absent (size 0).
            if ioctl_ptr(fd, VFIO_DEVICE_GET_REGION_INFO, &mut r).is_err() {
                r = vfio_region_info {
                    index,
                    ..Default::default()
                };
            }
            d.regions.push(r);
        }
        Ok(d)
    }

    /// The device fd (-1 once closed).
    pub(crate) fn as_raw_fd(&self) -> RawFd {
        self.file.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// VFIO_DEVICE_GET_INFO flags.
    pub(crate) fn flags(&self) -> u32 {
        self.flags
    }

    fn region(&self, index: u32) -> vfio_region_info {
        self.regions
            .get(index as usize)
            .copied()
            .unwrap_or_default()
    }

    /// Offset of region `index` in the device fd.
    pub(crate) fn get_region_offset(&self, index: u32) -> u64 {
        self.region(index).offset
    }

    /// Size of region `index` (0: absent).
    pub(crate) fn get_region_size(&self, index: u32) -> u64 {
        self.region(index).size
    }

    /// VFIO_REGION_INFO_FLAG_* of region `index`.
    pub(crate) fn get_region_flags(&self, index: u32) -> u32 {
        self.region(index).flags
    }

    /// The number of interrupts of IRQ index `index` (0: none, or the kernel would not say).
    pub(crate) fn irq_count(&self, index: u32) -> u32 {
        let mut i = vfio_irq_info {
            argsz: std::mem::size_of::<vfio_irq_info>() as u32,
            index,
            ..Default::default()
        };
        match ioctl_ptr(self.as_raw_fd(), VFIO_DEVICE_GET_IRQ_INFO, &mut i) {
            Ok(_) => i.count,
            Err(_) => 0,
        }
    }

    /// Make `eventfd` the trigger of interrupt 0 of IRQ index `index` (VFIO_DEVICE_SET_IRQS,
    /// DATA_EVENTFD | ACTION_TRIGGER).
    pub(crate) fn set_irq_eventfd(&self, index: u32, eventfd: RawFd) -> std::io::Result<()> {
        #[repr(C)]
        struct SetOne {
            set: vfio_irq_set,
            fd: i32,
        }
        let mut arg = SetOne {
            set: vfio_irq_set {
                argsz: std::mem::size_of::<SetOne>() as u32,
                flags: VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                index,
                start: 0,
                count: 1,
                ..Default::default()
            },
            fd: eventfd,
        };
        ioctl_ptr(self.as_raw_fd(), VFIO_DEVICE_SET_IRQS, &mut arg).map(|_| ())
    }

    /// Close the device fd, then release the group (idempotent).
    pub(crate) fn close(&mut self) {
        if let Some(f) = self.file.take() {
            drop(f);
            self.container.device_closed(self.group);
        }
    }
}

impl Drop for NoIommuDevice {
    fn drop(&mut self) {
        self.close();
    }
}

/// The bus addresses of `[vaddr, vaddr+len)` for a device without an IOMMU: its physically
/// contiguous pieces ([`super::noiommu::dma_segments`]); the first must honour `align`, and
/// every piece must lie inside `limit` (a device's DMA width); refused otherwise, naming the
/// rule.
pub(crate) fn dma_segments_for(
    vaddr: usize,
    len: usize,
    align: u64,
    limit: Option<&Range<u64>>,
    lookup: impl FnOnce(usize, usize) -> Result<Vec<DmaSegment>>,
) -> Result<Vec<DmaSegment>> {
    let segs = lookup(vaddr, len)?;
    let a = segs.first().map_or(0, |s| s.iova);
    if align > 1 && a % align != 0 {
        return Err(refuse(
            format!("[{vaddr:#x}, +{len:#x}) is at physical address {a:#x}, not aligned to the {align:#x} bytes asked for: without an IOMMU the bus address cannot be chosen"),
            "ask for at most the hugepage size as alignment, or use 1 GiB hugepages",
        ));
    }
    if let Some(l) = limit {
        for s in &segs {
            let end = s.iova.saturating_add(s.len as u64);
            if s.iova < l.start || end > l.end {
                return Err(refuse(
                    format!("[{vaddr:#x}, +{len:#x}) is at physical [{:#x}, {end:#x}) (bytes {:#x}.. of it), outside the DMA range [{:#x}, {:#x}) this domain is restricted to (the device's DMA width)", s.iova, s.offset, l.start, l.end),
                    "allocate the hugepages low in memory (e.g. reserve them at boot), or turn the IOMMU on",
                ));
            }
        }
    }
    Ok(segs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ioctl_numbers_are_the_kernels() {
        // include/uapi/linux/vfio.h: _IO(';', 100 + n).
        assert_eq!(VFIO_GET_API_VERSION, 0x3b64);
        assert_eq!(VFIO_SET_IOMMU, 0x3b66);
        assert_eq!(VFIO_GROUP_SET_CONTAINER, 0x3b68);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(VFIO_DEVICE_SET_IRQS, 0x3b6e);
        assert_eq!(group_node(3), PathBuf::from("/dev/vfio/noiommu-3"));
    }

    #[test]
    fn the_dma_address_is_the_physical_one_and_keeps_its_rules() {
        let phys = |a: u64| {
            move |_: usize, len: usize| {
                Ok(vec![DmaSegment {
                    offset: 0,
                    len,
                    iova: a,
                }])
            }
        };
        assert_eq!(
            dma_segments_for(0x7f00_0000_0000, 4096, 4096, None, phys(0x1_2340_0000)).unwrap()[0]
                .iova,
            0x1_2340_0000
        );
        // A second piece outside the limit is refused, naming its bytes.
        let limit = 0..(1u64 << 32);
        let two = |_: usize, _: usize| {
            Ok(vec![
                DmaSegment {
                    offset: 0,
                    len: 2 << 20,
                    iova: 0x4000_0000,
                },
                DmaSegment {
                    offset: 2 << 20,
                    len: 2 << 20,
                    iova: 1 << 33,
                },
            ])
        };
        let m = dma_segments_for(0, 4 << 20, 2 << 20, Some(&limit), two)
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("(bytes 0x200000.. of it), outside the DMA range"),
            "{m}"
        );
        let m = dma_segments_for(0x7f00_0000_0000, 4096, 2 << 20, None, phys(0x1000))
            .unwrap_err()
            .to_string();
        assert!(m.starts_with("DMA back end noiommu:"), "{m}");
        assert!(m.contains("not aligned to the 0x200000 bytes"), "{m}");
        let limit = 0..(1u64 << 32);
        let m = dma_segments_for(0, 4096, 4096, Some(&limit), phys(1 << 33))
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("outside the DMA range [0x0, 0x100000000)"),
            "{m}"
        );
        let e = dma_segments_for(0, 4096, 4096, None, |_, _| {
            Err(CoreError::InvalidArgument("no".into()))
        })
        .unwrap_err();
        assert!(matches!(e, CoreError::InvalidArgument(_)), "{e}");
    }
}
